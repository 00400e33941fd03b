"""Multipart uploads: CreateMultipartUpload, UploadPart, UploadPartCopy,
CompleteMultipartUpload, AbortMultipartUpload, ListParts, ListMultipartUploads."""

from __future__ import annotations

import re
import uuid

from shoal.metadata import (
    CommitUnknown,
    MetadataError,
    ObjectNotFound,
    ObjectVersion,
    PartWrite,
    UploadNotFound,
)
from shoal.s3 import headers as h
from shoal.s3 import http, payload
from shoal.s3 import xml as s3xml
from shoal.s3.app import Call, handles
from shoal.s3.bucket import owner_tree
from shoal.s3.errors import InvalidArgument, InvalidPart, InvalidRange, MalformedXML, NoSuchUpload
from shoal.s3.listing import max_keys
from shoal.s3.objects import check_key, conditional_write, copy_source
from shoal.s3.router import Endpoint

XML = "application/xml"
MAX_COMPLETE_BODY = 4 * 1024 * 1024
MAX_PART_NUMBER = 10000


def upload_id(call: Call) -> uuid.UUID:
    try:
        return uuid.UUID(call.query["uploadId"])
    except (KeyError, ValueError):
        raise NoSuchUpload() from None


def part_number(call: Call) -> int:
    try:
        number = int(call.query.get("partNumber", ""))
    except ValueError:
        number = 0
    if not 1 <= number <= MAX_PART_NUMBER:
        raise InvalidArgument(f"Part number must be an integer between 1 and {MAX_PART_NUMBER}")
    return number


@handles(Endpoint.CreateMultipartUpload)
async def create_multipart_upload(call: Call) -> http.Response:
    check_key(call.key)
    algorithm = call.request.headers.get("x-amz-checksum-algorithm")
    upload = await call.store.uploads.create(
        call.account,
        call.bucket,
        call.key,
        content_type=call.request.headers.get("Content-Type") or None,
        headers=h.object_headers(call.request.headers),
        properties={"checksum_algorithm": algorithm.lower()} if algorithm else {},
    )
    body = s3xml.document(
        "InitiateMultipartUploadResult",
        {
            "Bucket": call.bucket,
            "Key": call.key,
            "UploadId": str(upload.id),
        },
    )
    headers = {"x-amz-checksum-algorithm": algorithm} if algorithm else {}
    return http.Response(body=body, content_type=XML, headers=headers)


@handles(Endpoint.UploadPart)
async def upload_part(call: Call) -> http.Response:
    check_key(call.key)
    upload = await call.store.uploads.get(call.account, call.bucket, call.key, upload_id(call))
    number = part_number(call)
    length = payload.declared_length(call.request.headers)
    checksums = payload.requested_checksums(call.request.headers)
    stored = await payload.store_body(
        call.data, call.body(), call.request.headers, call.verified.trailers, length, checksums
    )
    await _record_part(call, upload.id, number, stored)
    headers = {"ETag": f'"{stored.result.md5.hex()}"'}
    headers |= {f"x-amz-checksum-{k}": v for k, v in stored.checksums.items()}
    return http.Response(headers=headers)


@handles(Endpoint.UploadPartCopy)
async def upload_part_copy(call: Call) -> http.Response:
    check_key(call.key)
    upload = await call.store.uploads.get(call.account, call.bucket, call.key, upload_id(call))
    number = part_number(call)
    source = await copy_source(call)
    start, end = _copy_range(
        call.request.headers.get("x-amz-copy-source-range"), source.content_length
    )
    stored = await payload.store_body(
        call.data, payload.read_version(call.data, source, start, end), {}, {}, end - start, []
    )
    await _record_part(call, upload.id, number, stored)
    body = s3xml.document(
        "CopyPartResult",
        {
            "LastModified": source.modified,
            "ETag": f'"{stored.result.md5.hex()}"',
        },
    )
    return http.Response(body=body, content_type=XML)


async def _record_part(call: Call, upload: uuid.UUID, number: int, stored: payload.Stored) -> None:
    part = PartWrite(
        id=stored.version_id,
        part_number=number,
        content_length=stored.result.size,
        content_md5=stored.result.md5,
        sharks=stored.result.sharks,
        properties=stored.properties(),
        under_replicated=stored.result.under_replicated,
    )
    try:
        await call.store.uploads.put_part(call.account, call.bucket, call.key, upload, part)
    except MetadataError as exc:
        # Only a part known not to be recorded drops its blocks (as objects._commit).
        if not isinstance(exc, CommitUnknown):
            await payload.discard(call.data, stored.version_id, stored.result)
        raise


def _copy_range(header: str | None, size: int) -> tuple[int, int]:
    """[start, end) of x-amz-copy-source-range, which must be `bytes=first-last`."""
    if header is None:
        return 0, size
    match = re.fullmatch(r"bytes=([0-9]+)-([0-9]+)", header.strip())
    if not match:
        raise InvalidArgument(
            "The x-amz-copy-source-range value must be of the form bytes=first-last"
        )
    first, last = h.range_number(match[1]), h.range_number(match[2])
    if first > last or last >= size:
        raise InvalidRange(ActualObjectSize=str(size))
    return first, last + 1


@handles(Endpoint.CompleteMultipartUpload)
async def complete_multipart_upload(call: Call) -> http.Response:
    check_key(call.key)
    request = s3xml.parse(await call.read_body(MAX_COMPLETE_BODY), "CompleteMultipartUpload")
    chosen = []
    for part in request.findall("Part"):
        try:
            number = int(s3xml.text_of(part, "PartNumber") or "")
        except ValueError:
            raise MalformedXML("PartNumber must be an integer") from None
        etag = s3xml.text_of(part, "ETag") or ""
        try:
            md5 = bytes.fromhex(etag.strip().strip('"'))
        except ValueError:
            raise InvalidPart() from None
        chosen.append((number, md5))
    if not chosen:
        raise MalformedXML("CompleteMultipartUpload names no parts")
    completing = upload_id(call)
    try:
        await call.store.uploads.complete(
            call.account,
            call.bucket,
            call.key,
            completing,
            chosen,
            **conditional_write(call),  # type: ignore[arg-type]
        )
    except UploadNotFound:
        # A second Complete with the same parts (S3 answers it as the first, for a while), or
        # the retry of a completion whose answer was lost (CommitUnknown, a 503): the upload
        # is gone and the live object is what it made. Same answer again.
        version = await _live_version(call)
        if version is None or not _completed_as(version, completing, chosen):
            raise
    version = await call.store.objects.get(call.account, call.bucket, call.key, with_data=False)
    body = s3xml.document(
        "CompleteMultipartUploadResult",
        {
            "Location": f"/{call.bucket}/{call.key}",
            "Bucket": call.bucket,
            "Key": call.key,
            "ETag": f'"{version.etag}"',
        },
    )
    return http.Response(body=body, content_type=XML)


async def _live_version(call: Call) -> ObjectVersion | None:
    try:
        return await call.store.objects.get(call.account, call.bucket, call.key, with_data=False)
    except ObjectNotFound:
        return None


def _completed_as(
    version: ObjectVersion, upload: uuid.UUID, chosen: list[tuple[int, bytes]]
) -> bool:
    """Did completing `upload` with the `chosen` parts (number, MD5) make `version`? A
    Complete of a completed upload with other parts is NoSuchUpload, as in S3."""
    if version.properties.get("upload_id") != str(upload):
        return False
    made = [(p["part_number"], bytes.fromhex(p["md5"])) for p in version.properties["parts"]]
    return made == chosen


@handles(Endpoint.AbortMultipartUpload)
async def abort_multipart_upload(call: Call) -> http.Response:
    check_key(call.key)
    await call.store.uploads.abort(call.account, call.bucket, call.key, upload_id(call))
    return http.Response(status=204)


@handles(Endpoint.ListParts)
async def list_parts(call: Call) -> http.Response:
    check_key(call.key)
    try:
        after = int(call.query.get("part-number-marker", "0"))
    except ValueError:
        raise InvalidArgument("part-number-marker must be an integer") from None
    limit = max_keys(call, "max-parts")
    parts = await call.store.uploads.list_parts(
        call.account, call.bucket, call.key, upload_id(call), after=after, limit=limit + 1
    )
    truncated = len(parts) > limit > 0  # max-parts=0: an empty page, nothing to go on from
    parts = parts[:limit]
    body = s3xml.document(
        "ListPartsResult",
        {
            "Bucket": call.bucket,
            "Key": call.key,
            "UploadId": str(upload_id(call)),
            "Initiator": owner_tree(call),
            "Owner": owner_tree(call),
            "StorageClass": "STANDARD",
            "PartNumberMarker": after,
            "NextPartNumberMarker": parts[-1].part_number if truncated else None,
            "MaxParts": limit,
            "IsTruncated": truncated,
            "Part": [
                {
                    "PartNumber": p.part_number,
                    "LastModified": p.created,
                    "ETag": f'"{p.etag}"',
                    "Size": p.content_length,
                }
                for p in parts
            ],
        },
    )
    return http.Response(body=body, content_type=XML)


@handles(Endpoint.ListMultipartUploads)
async def list_multipart_uploads(call: Call) -> http.Response:
    limit = max_keys(call, "max-uploads")
    key_marker = call.query.get("key-marker", "")
    id_marker = call.query.get("upload-id-marker")
    try:
        after_id = uuid.UUID(id_marker) if id_marker else None
    except ValueError:
        raise InvalidArgument("Invalid uploadId marker") from None
    uploads = await call.store.uploads.list(
        call.account,
        call.bucket,
        prefix=call.query.get("prefix", ""),
        key_marker=key_marker,
        upload_id_marker=after_id,
        limit=limit + 1,
    )
    truncated = len(uploads) > limit > 0  # max-uploads=0: an empty page, nothing to go on from
    uploads = uploads[:limit]
    body = s3xml.document(
        "ListMultipartUploadsResult",
        {
            "Bucket": call.bucket,
            "KeyMarker": key_marker,
            "UploadIdMarker": id_marker or "",
            "NextKeyMarker": uploads[-1].name if truncated else None,
            "NextUploadIdMarker": str(uploads[-1].id) if truncated else None,
            "Prefix": call.query.get("prefix", ""),
            "MaxUploads": limit,
            "IsTruncated": truncated,
            "Upload": [
                {
                    "Key": u.name,
                    "UploadId": str(u.id),
                    "Initiator": owner_tree(call),
                    "Owner": owner_tree(call),
                    "StorageClass": "STANDARD",
                    "Initiated": u.created,
                }
                for u in uploads
            ],
        },
    )
    return http.Response(body=body, content_type=XML)
