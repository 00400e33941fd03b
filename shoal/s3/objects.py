"""Object operations: PutObject, GetObject, HeadObject, DeleteObject, DeleteObjects,
CopyObject."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TypedDict
from urllib.parse import unquote_plus

from shoal.metadata import (
    BucketNotFound,
    CommitUnknown,
    InvalidName,
    MetadataError,
    ObjectVersion,
    ObjectWrite,
)
from shoal.metadata.names import MAX_OBJECT_NAME_BYTES, check_object_name
from shoal.metadata.objects import ANY_VERSION, PutResult, WriteCondition
from shoal.s3 import headers as h
from shoal.s3 import http, payload, tags
from shoal.s3 import xml as s3xml
from shoal.s3.app import Call, answer_while_working, handles, refuse_foreign_bucket
from shoal.s3.errors import (
    AccessDenied,
    InvalidArgument,
    InvalidRequest,
    KeyTooLongError,
    MalformedXML,
    NoSuchKey,
    NotImplementedByShoal,
    PreconditionFailed,
    S3Error,
    from_domain,
)
from shoal.s3.refusals import PUBLIC_READ, canned_acl
from shoal.s3.router import Endpoint
from shoal.storage.checksums import S3_CHECKSUMS

XML = "application/xml"
MAX_DELETE_KEYS = 1000
MAX_DELETE_BODY = 2 * 1024 * 1024
MAX_PART_NUMBER = 10000


def part_number(call: Call) -> int:
    """The partNumber of a request (UploadPart, or GET and HEAD of one part)."""
    try:
        number = int(call.query.get("partNumber", ""))
    except ValueError:
        number = 0
    if not 1 <= number <= MAX_PART_NUMBER:
        raise InvalidArgument(f"Part number must be an integer between 1 and {MAX_PART_NUMBER}")
    return number


def check_key(key: str) -> None:
    """S3's codes for bad keys: KeyTooLongError past 1024 bytes, InvalidArgument otherwise."""
    try:
        check_object_name(key)
    except InvalidName as exc:
        if len(key.encode("utf-8", "surrogateescape")) > MAX_OBJECT_NAME_BYTES:
            raise KeyTooLongError() from None
        raise InvalidArgument(str(exc)) from None


def check_null_version(call: Call) -> None:
    """Buckets are unversioned: every object is its "null" version, and only that exists."""
    version = call.query.get("versionId")
    if version is not None and version != "null":
        raise InvalidArgument("Invalid version id specified")


class WriteConditions(TypedDict):
    """The keyword arguments of Objects.put and Uploads.complete that condition a write."""

    if_match: WriteCondition
    if_none_match: WriteCondition


def conditional_write(call: Call) -> WriteConditions:
    """If-Match and If-None-Match on a write (each `*` or an ETag), as put/complete
    arguments: the metadata tier checks them in the statement that writes the row."""
    if_none_match = call.request.headers.get("If-None-Match")
    try:
        unless = _write_condition(if_none_match)
    except PreconditionFailed:
        # Neither `*` nor an ETag (`true`, a typo): S3 takes only `*` on a write and answers
        # any other value 501. Shoal also takes an ETag, but never writes past a condition
        # it cannot read.
        raise NotImplementedByShoal(Header="If-None-Match") from None
    return {
        "if_match": _write_condition(call.request.headers.get("If-Match")),
        "if_none_match": unless,
    }


def _write_condition(header: str | None) -> WriteCondition:
    """`*`, or the MD5 bytes of one ETag (PreconditionFailed if it is none Shoal makes)."""
    if header is None:
        return None
    if header.strip() == "*":
        return ANY_VERSION
    return h.etag_bytes(header)


@handles(Endpoint.PutObject)
async def put_object(call: Call) -> http.Response:
    check_key(call.key)
    await call.store.buckets.get(call.account, call.bucket)
    length = payload.declared_length(call.request.headers)
    kept = h.object_headers(call.request.headers)
    tag_set = tags.from_header(call.request.headers)
    acl = canned_acl(call.request.headers)
    checksums = payload.requested_checksums(call.request.headers)
    stored = await payload.store_body(
        call.data,
        call.body(),
        call.request.headers,
        call.verified.trailers,
        length,
        checksums,
        call.gateway.config.inline_max_bytes,
    )
    content_type = call.request.headers.get("Content-Type") or None
    await _commit(call, _object_write(stored, content_type, kept, tag_set, acl), stored)
    response_headers = {"ETag": f'"{stored.result.md5.hex()}"'}
    response_headers |= {f"x-amz-checksum-{k}": v for k, v in stored.checksums.items()}
    if stored.checksums:
        response_headers["x-amz-checksum-type"] = "FULL_OBJECT"  # a single PUT's always is
    return http.Response(headers=response_headers)


def _object_write(
    stored: payload.Stored,
    content_type: str | None,
    headers: dict[str, str],
    tag_set: tags.Tags,
    acl: str | None,
) -> ObjectWrite:
    properties = stored.properties()
    if tag_set:
        properties["tags"] = tag_set
    if acl == PUBLIC_READ:  # private (the default) is kept as no ACL at all
        properties["acl"] = acl
    return ObjectWrite(
        id=stored.version_id,
        content_length=stored.result.size,
        content_md5=stored.result.md5,
        sharks=stored.result.sharks,
        content_type=content_type,
        headers=headers,
        properties=properties,
        data=stored.data,
        under_replicated=stored.result.under_replicated,
    )


async def _commit(call: Call, write: ObjectWrite, stored: payload.Stored) -> PutResult:
    """Commit the row that makes the stored blocks visible.

    The blocks are dropped only when the row is known not to have committed: the metadata
    tier refused the write (a MetadataError other than CommitUnknown). After anything else (the
    answer lost with the connection, an unexpected error, the client gone) the row may name
    them, and dropping them would leave a row whose every GET fails: they stay, and
    `shoal pipeline orphans` finds them if no row names them."""
    await payload.check_lifetime(call.data, stored, call.gateway.config.write_lifetime)
    try:
        return await call.store.objects.put(
            call.account, call.bucket, call.key, write, **conditional_write(call)
        )
    except MetadataError as exc:
        if not isinstance(exc, CommitUnknown):
            await payload.discard(call.data, stored.version_id, stored.result)
        raise


@handles(Endpoint.HeadObject)
async def head_object(call: Call) -> http.StreamResponse:
    return await _get(call, send_body=False)


@handles(Endpoint.GetObject)
async def get_object(call: Call) -> http.StreamResponse:
    return await _get(call, send_body=True)


async def _get(call: Call, send_body: bool) -> http.StreamResponse:
    check_key(call.key)
    check_null_version(call)
    version = await call.store.objects.get(call.account, call.bucket, call.key, with_data=send_body)
    if call.public_only and version.properties.get("acl") != PUBLIC_READ:
        raise AccessDenied()  # replaced by a private version since access.py checked
    headers = h.response_headers(version)
    try:
        h.check_conditions(version, call.request.headers)
    except h.NotModified:
        kept = {k: v for k, v in headers.items() if k in ("ETag", "Last-Modified")}
        return http.StreamResponse(status=304, headers=kept)  # a head alone, as a HEAD's
    h.apply_overrides(headers, call.query)
    size = version.content_length
    checksum_mode = call.request.headers.get("x-amz-checksum-mode", "").upper() == "ENABLED"
    if "partNumber" in call.query:
        if "Range" in call.request.headers:
            raise InvalidRequest("Cannot specify both Range header and partNumber query parameter")
        start, end, part_checksums = h.object_part(version, part_number(call))
        wanted: tuple[int, int] | None = (start, end) if size else None
        if "parts" in version.properties:  # only a multipart object has a parts count
            headers["x-amz-mp-parts-count"] = str(len(version.properties["parts"]))
        if checksum_mode:
            headers |= part_checksums
    else:
        ranged = h.if_range_holds(version, call.request.headers.get("If-Range"))
        wanted = h.byte_range(call.request.headers.get("Range") if ranged else None, size)
        start, end = wanted or (0, size)
        if checksum_mode and wanted is None:
            headers |= h.checksum_headers(version)  # whole-object checksums fit only whole reads
    response = http.StreamResponse(status=206 if wanted else 200, headers=headers)
    response.content_length = end - start
    if wanted:
        response.headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    if not send_body:
        return response
    await response.prepare(call.request)
    async for chunk in payload.read_version(call.data, version, start, end):
        await response.write(chunk)
    await response.write_eof()
    return response


@handles(Endpoint.DeleteObject)
async def delete_object(call: Call) -> http.Response:
    check_key(call.key)
    check_null_version(call)
    await _remove(call, call.key, delete_condition(call.request.headers.get("If-Match")))
    return http.Response(status=204)


def delete_condition(value: str | None) -> WriteCondition:
    """A conditional delete's If-Match (DeleteObject's header, an <ETag> of DeleteObjects):
    `*`, the key must exist; an ETag, its live version must have it (a value that is no ETag
    Shoal makes matches no version); None, no condition."""
    try:
        return _write_condition(value)
    except PreconditionFailed:
        return NO_ETAG


# The ETag bytes no version has (every content_md5 is 16 bytes).
NO_ETAG = b""


async def _remove(call: Call, key: str, condition: WriteCondition) -> None:
    """Delete the live version of `key`, if `condition` holds: the ETag is compared in the
    statement that deletes (PreconditionFailed when another version is live), and a
    condition on a key with no live version is NoSuchKey, as in S3."""
    if_match = condition if isinstance(condition, bytes) else None
    removed = await call.store.objects.remove(call.account, call.bucket, key, if_match=if_match)
    if removed is None and condition is not None:
        raise NoSuchKey()


@handles(Endpoint.DeleteObjects)
async def delete_objects(call: Call) -> http.Response:
    await call.store.buckets.get(call.account, call.bucket)
    body = await call.read_body(MAX_DELETE_BODY)
    request = s3xml.parse(body, "Delete")
    quiet_text = s3xml.text_of(request, "Quiet", required=False, stripped=True) or "false"
    if quiet_text.lower() not in ("true", "false"):
        raise MalformedXML("<Quiet> is true or false")
    quiet = quiet_text.lower() == "true"
    targets = request.findall("Object")
    if not targets or len(targets) > MAX_DELETE_KEYS:
        raise MalformedXML(f"Delete names 1 to {MAX_DELETE_KEYS} objects")
    # Every <Object> is read before the first delete: a malformed one deletes nothing.
    named = [
        (
            s3xml.text_of(t, "Key") or "",
            s3xml.text_of(t, "VersionId", required=False),
            delete_condition(s3xml.text_of(t, "ETag", required=False)),
        )
        for t in targets
    ]
    payload.require_digest(call.request.headers, call.verified.trailers)
    deleted, errors = [], []

    def refused(key: str, version: str | None, exc: Exception) -> None:
        error = exc if isinstance(exc, S3Error) else from_domain(exc)
        if error is None:
            raise exc
        errors.append(
            {"Key": key, "VersionId": version, "Code": error.code, "Message": error.message}
        )

    wanted = []
    for key, version, condition in named:
        try:
            if version not in (None, "null"):
                raise NoSuchKey("The specified version does not exist.")
            check_key(key)
        except S3Error as exc:
            refused(key, version, exc)
            continue
        wanted.append((key, version, condition))
    # One statement per vnode for all the keys it holds, not one delete per key; a key with
    # an <ETag> is deleted alone, its condition checked in its own statement (those run
    # together), and answered for its own <Object> (a key may be named twice).
    unconditional = await call.store.objects.delete_many(
        call.account, call.bucket, [key for key, _, condition in wanted if condition is None]
    )
    conditional = await asyncio.gather(
        *(_remove(call, key, condition) for key, _, condition in wanted if condition is not None),
        return_exceptions=True,
    )
    answers = iter(conditional)
    for key, version, condition in wanted:
        failure = unconditional[key] if condition is None else next(answers)
        if failure is None:
            deleted.append({"Key": key, "VersionId": version})
        elif isinstance(failure, Exception):
            refused(key, version, failure)
        else:
            raise failure  # a BaseException (a cancellation): not the key's answer
    body = s3xml.document(
        "DeleteResult",
        {
            "Deleted": [] if quiet else deleted,
            "Error": errors,
        },
    )
    return http.Response(body=body, content_type=XML)


@handles(Endpoint.CopyObject)
async def copy_object(call: Call) -> http.Response:
    check_key(call.key)
    await call.store.buckets.get(call.account, call.bucket)
    source = await copy_source(call)
    directive = call.request.headers.get("x-amz-metadata-directive", "COPY").upper()
    if directive not in ("COPY", "REPLACE"):
        raise InvalidArgument("Unknown metadata directive.")
    checksums = _copy_checksums(call.request.headers, source)
    same_object = (source.bucket_id, source.name) == (
        (await call.store.buckets.get(call.account, call.bucket)).id,
        call.key,
    )
    new_checksum = checksums != sorted(source.properties.get("checksums", {}))
    if same_object and directive == "COPY" and not new_checksum:
        raise InvalidRequest(
            "This copy request is illegal because it is trying to copy an object to itself "
            "without changing the object's metadata, storage class, website redirect location "
            "or encryption attributes."
        )
    if directive == "REPLACE":
        content_type = call.request.headers.get("Content-Type") or None
        kept = h.object_headers(call.request.headers)
    else:
        content_type, kept = source.content_type, {k: v for k, v in source.headers.items() if v}
    tag_set = tags.of_copy(call.request.headers, tags.of_version(source.properties))
    acl = canned_acl(call.request.headers)  # as S3: a copy's ACL is its own, not its source's

    async def copy() -> bytes:
        stored = await payload.store_body(
            call.data,
            payload.read_version(call.data, source),
            {},
            {},
            source.content_length,
            checksums,
            call.gateway.config.inline_max_bytes,
        )
        copied = await _commit(
            call, _object_write(stored, content_type, kept, tag_set, acl), stored
        )
        # The answer is the version this copy made, whatever a write of the key does next.
        return s3xml.document(
            "CopyObjectResult",
            {
                "LastModified": copied.modified,
                "ETag": f'"{copied.written.etag}"',
                **{f"Checksum{k.upper()}": v for k, v in stored.checksums.items()},
                "ChecksumType": "FULL_OBJECT" if stored.checksums else None,
            },
        )

    # A large copy answers 200 at once and keeps the connection alive while it copies.
    return await answer_while_working(call, source.content_length, copy)


def _copy_checksums(headers: Mapping[str, str], source: ObjectVersion) -> list[str]:
    """The checksums a copy gets: the one `x-amz-checksum-algorithm` asks for, else its
    source's (computed anew from the bytes, as the copy reads them)."""
    asked = headers.get("x-amz-checksum-algorithm")
    if asked is None:
        return sorted(source.properties.get("checksums", {}))
    algorithm = asked.strip().lower()
    if algorithm not in S3_CHECKSUMS:
        raise InvalidRequest(
            "Checksum algorithm provided is unsupported. Please try again with any of the "
            f"valid types: [{', '.join(name.upper() for name in S3_CHECKSUMS)}]"
        )
    return [algorithm]


async def copy_source(call: Call) -> ObjectVersion:
    """The object named by x-amz-copy-source, with the copy-source conditions checked."""
    raw = call.request.headers["x-amz-copy-source"]
    path, _, query = raw.partition("?")
    if query and query not in ("versionId=null",):
        raise InvalidArgument("Invalid version id specified")
    # Decoded as S3 does: `+` is a space (s5cmd sends keys so), `%2B` a plus.
    bucket, _, key = unquote_plus(path, errors="surrogateescape").lstrip("/").partition("/")
    if not bucket or not key:
        raise InvalidArgument("Copy Source must mention the source bucket and key: bucket/key")
    check_key(key)
    try:
        source = await call.store.objects.get(call.account, bucket, key)
    except BucketNotFound:
        await refuse_foreign_bucket(call, bucket)
        raise
    h.check_conditions(source, call.request.headers, prefix="x-amz-copy-source-")
    return source
