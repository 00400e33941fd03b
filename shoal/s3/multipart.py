"""Multipart uploads: CreateMultipartUpload, UploadPart, UploadPartCopy,
CompleteMultipartUpload, AbortMultipartUpload, ListParts, ListMultipartUploads."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping

from shoal.metadata import (
    CommitUnknown,
    CommonPrefix,
    MetadataError,
    ObjectVersion,
    ObjectWrite,
    PartWrite,
    Upload,
    UploadNotFound,
)
from shoal.s3 import headers as h
from shoal.s3 import http, payload, tags
from shoal.s3 import xml as s3xml
from shoal.s3.app import Call, answer_while_working, handles
from shoal.s3.bucket import owner_tree
from shoal.s3.errors import (
    BadDigest,
    InvalidArgument,
    InvalidPart,
    InvalidRequest,
    MalformedXML,
    NoSuchUpload,
)
from shoal.s3.listing import encoder, max_keys, whole_number
from shoal.s3.objects import (
    MAX_PART_NUMBER,
    check_key,
    conditional_write,
    copy_source,
    part_number,
)
from shoal.s3.refusals import PUBLIC_READ, canned_acl
from shoal.s3.router import Endpoint
from shoal.storage.checksums import (
    FULL_OBJECT_CHECKSUMS,
    S3_CHECKSUMS,
    composite_checksum,
    full_object_crc,
)

XML = "application/xml"
MAX_COMPLETE_BODY = 4 * 1024 * 1024
# The largest part-number-marker S3 takes (a signed 32-bit integer).
MAX_MARKER = 2**31 - 1
CHECKSUM_TYPES = ("COMPOSITE", "FULL_OBJECT")
_CHECKSUM_TAGS = {name: f"Checksum{name.upper()}" for name in S3_CHECKSUMS}


def upload_id(call: Call) -> uuid.UUID:
    try:
        return uuid.UUID(call.query["uploadId"])
    except (KeyError, ValueError):
        raise NoSuchUpload() from None


@handles(Endpoint.CreateMultipartUpload)
async def create_multipart_upload(call: Call) -> http.Response:
    check_key(call.key)
    checksum = _upload_checksum(call.request.headers)
    tag_set = tags.from_header(call.request.headers)
    public = canned_acl(call.request.headers) == PUBLIC_READ
    upload = await call.store.uploads.create(
        call.account,
        call.bucket,
        call.key,
        content_type=call.request.headers.get("Content-Type") or None,
        headers=h.object_headers(call.request.headers),
        # The upload's properties become the completed object's: so do its tags and ACL.
        properties=checksum
        | ({"tags": tag_set} if tag_set else {})
        | ({"acl": PUBLIC_READ} if public else {}),
    )
    body = s3xml.document(
        "InitiateMultipartUploadResult",
        {
            "Bucket": call.bucket,
            "Key": call.key,
            "UploadId": str(upload.id),
        },
    )
    headers = {}
    if checksum:
        headers["x-amz-checksum-algorithm"] = checksum["checksum_algorithm"].upper()
        headers["x-amz-checksum-type"] = checksum["checksum_type"]
    return http.Response(body=body, content_type=XML, headers=headers)


def _upload_checksum(headers: Mapping[str, str]) -> dict[str, str]:
    """The checksum an upload is created with: x-amz-checksum-algorithm and -type, checked.

    COMPOSITE (a checksum of the parts' checksums) is the default, but CRC64NVME exists only
    as FULL_OBJECT (the CRC of all the bytes), which the SHA algorithms cannot be."""
    algorithm = (headers.get("x-amz-checksum-algorithm") or "").lower()
    kind = (headers.get("x-amz-checksum-type") or "").upper()
    if not algorithm:
        if kind:
            raise InvalidRequest(
                "The x-amz-checksum-type header can only be used with the "
                "x-amz-checksum-algorithm header."
            )
        return {}
    if algorithm not in S3_CHECKSUMS:
        raise InvalidRequest(f"Checksum algorithm {algorithm.upper()} is not supported")
    kind = kind or ("FULL_OBJECT" if algorithm == "crc64nvme" else "COMPOSITE")
    if kind not in CHECKSUM_TYPES:
        raise InvalidRequest("The x-amz-checksum-type header must be COMPOSITE or FULL_OBJECT")
    usable = FULL_OBJECT_CHECKSUMS if kind == "FULL_OBJECT" else set(S3_CHECKSUMS) - {"crc64nvme"}
    if algorithm not in usable:
        raise InvalidRequest(
            f"The {kind} checksum type cannot be used with the {algorithm} checksum algorithm."
        )
    return {"checksum_algorithm": algorithm, "checksum_type": kind}


@handles(Endpoint.UploadPart)
async def upload_part(call: Call) -> http.Response:
    check_key(call.key)
    upload = await call.store.uploads.get(call.account, call.bucket, call.key, upload_id(call))
    number = part_number(call)
    length = payload.declared_length(call.request.headers)
    checksums = payload.requested_checksums(call.request.headers)
    algorithm = upload.properties.get("checksum_algorithm")
    if algorithm and checksums and checksums != [algorithm]:
        raise InvalidRequest(
            "Checksum Type mismatch occurred, expected checksum Type: "
            f"{algorithm}, actual checksum Type: {checksums[0]}"
        )
    if algorithm:
        checksums = [algorithm]  # the upload's checksum needs every part's
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
    algorithm = upload.properties.get("checksum_algorithm")
    checksums = [algorithm] if algorithm else []

    async def copy() -> bytes:
        stored = await payload.store_body(
            call.data,
            payload.read_version(call.data, source, start, end),
            {},
            {},
            end - start,
            checksums,
        )
        await _record_part(call, upload.id, number, stored)
        return s3xml.document(
            "CopyPartResult",
            {
                "LastModified": source.modified,
                "ETag": f'"{stored.result.md5.hex()}"',
                **checksum_elements(stored.checksums),
            },
        )

    # A large part answers 200 at once and keeps the connection alive while it copies.
    return await answer_while_working(call, end - start, copy)


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
    await payload.check_lifetime(call.data, stored, call.gateway.config.write_lifetime)
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
        # Not a GET's 416: a copy must have every byte it names (S3 answers the same).
        raise InvalidArgument(f"Range specified is not valid for source object of size: {size}")
    return first, last + 1


@handles(Endpoint.CompleteMultipartUpload)
async def complete_multipart_upload(call: Call) -> http.Response:
    check_key(call.key)
    # Its x-amz-checksum-* headers state the object's checksums, not its body's.
    body = await call.read_body(MAX_COMPLETE_BODY, digests_of_body=False)
    request = s3xml.parse(body, "CompleteMultipartUpload")
    chosen = []
    claimed_checksums: dict[int, dict[str, str]] = {}
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
        claimed_checksums[number] = {
            name: value.strip()
            for name in S3_CHECKSUMS
            if (value := s3xml.text_of(part, _CHECKSUM_TAGS[name], required=False))
        }
    if not chosen:
        raise MalformedXML("CompleteMultipartUpload names no parts")
    completing = upload_id(call)
    made: ObjectWrite | ObjectVersion
    try:
        checksums = await _completed_checksums(call, completing, chosen, claimed_checksums)
        completed = await call.store.uploads.complete(
            call.account,
            call.bucket,
            call.key,
            completing,
            chosen,
            **conditional_write(call),
            properties=checksums,
        )
        # The answer is the version this made, whatever a write of the key does next.
        made = completed.written
    except UploadNotFound:
        # A second Complete with the same parts (S3 answers it as the first, for a while), or
        # the retry of a completion whose answer was lost (CommitUnknown, a 503): the upload
        # is gone and the live object is what it made. Same answer again.
        again = await call.store.uploads.made_by(
            call.account, call.bucket, call.key, completing, chosen
        )
        if again is None:
            raise
        made = again
    body = s3xml.document(
        "CompleteMultipartUploadResult",
        {
            "Location": call.object_url,
            "Bucket": call.bucket,
            "Key": call.key,
            "ETag": f'"{made.etag}"',
            **checksum_elements(made.properties.get("checksums", {})),
            "ChecksumType": made.properties.get("checksum_type"),
        },
    )
    return http.Response(body=body, content_type=XML)


async def _completed_checksums(
    call: Call,
    upload: uuid.UUID,
    chosen: list[tuple[int, bytes]],
    claimed: dict[int, dict[str, str]],
) -> dict[str, object]:
    """The object checksum of an upload created with one, from its parts' stored checksums,
    checked against those the request names (BadDigest if one differs); {} for no checksum.
    The metadata tier checks the parts' ETags again when it completes, against a part
    uploaded again meanwhile."""
    found = await call.store.uploads.get(call.account, call.bucket, call.key, upload)
    algorithm = found.properties.get("checksum_algorithm")
    if not algorithm:
        return {}
    # An upload created before checksum types were kept has the default, COMPOSITE.
    kind = found.properties.get("checksum_type", "COMPOSITE")
    stored = await call.store.uploads.list_parts(
        call.account, call.bucket, call.key, upload, after=0, limit=MAX_PART_NUMBER + 1
    )
    by_number = {p.part_number: p for p in stored}
    values: list[tuple[str, int]] = []
    for number, md5 in chosen:
        part = by_number.get(number)
        if part is None or part.content_md5 != md5:
            raise InvalidPart()
        value = part.properties.get("checksums", {}).get(algorithm)
        sent = claimed[number].get(algorithm)
        if value is None:
            raise InvalidRequest(f"Part {number} was uploaded without a {algorithm} checksum.")
        if sent is None and kind == "COMPOSITE":
            raise InvalidRequest(
                f"The upload was created using a {algorithm} checksum. The complete request "
                f"must include the checksum for each part. It was missing for part {number} "
                "in the request."
            )
        if sent is not None and sent != value:
            raise BadDigest(
                f"The {algorithm.upper()} you specified for part {number} did not match."
            )
        values.append((value, part.content_length))
    if kind == "COMPOSITE":
        whole = composite_checksum(algorithm, [value for value, _ in values])
    else:
        whole = full_object_crc(algorithm, values)
    _check_whole_object(call, algorithm, kind, whole, sum(size for _, size in values))
    return {"checksums": {algorithm: whole}, "checksum_type": kind}


def _check_whole_object(call: Call, algorithm: str, kind: str, whole: str, size: int) -> None:
    """The object checksum, type and size a Complete request may state must be the object's."""
    headers = call.request.headers
    sent_kind = headers.get("x-amz-checksum-type")
    if sent_kind is not None and sent_kind.upper() != kind:
        raise InvalidRequest(
            f"The upload was created using the {kind} checksum mode. The complete request "
            f"must use the same checksum mode."
        )
    sent = headers.get(f"x-amz-checksum-{algorithm}")
    # A composite value may be stated with or without its "-N".
    if sent is not None and sent.strip() not in (whole, whole.split("-")[0]):
        raise BadDigest(
            f"The {algorithm.upper()} you specified did not match the calculated checksum."
        )
    sent_size = headers.get("x-amz-mp-object-size")
    if sent_size is not None and sent_size.strip() != str(size):
        raise InvalidRequest(
            f"The provided x-amz-mp-object-size {sent_size} does not match the object size {size}"
        )


def _upload_checksum_elements(properties: Mapping[str, str]) -> dict[str, str]:
    """ChecksumAlgorithm and ChecksumType of an upload created with a checksum."""
    algorithm = properties.get("checksum_algorithm")
    if not algorithm:
        return {}
    return {
        "ChecksumAlgorithm": algorithm.upper(),
        "ChecksumType": properties.get("checksum_type", "COMPOSITE"),
    }


def checksum_elements(checksums: Mapping[str, str]) -> dict[str, str]:
    """Checksums in S3 form as the XML elements ChecksumCRC32, ChecksumSHA256, ..."""
    return {_CHECKSUM_TAGS[name]: value for name, value in sorted(checksums.items())}


@handles(Endpoint.AbortMultipartUpload)
async def abort_multipart_upload(call: Call) -> http.Response:
    check_key(call.key)
    await call.store.uploads.abort(call.account, call.bucket, call.key, upload_id(call))
    return http.Response(status=204)


@handles(Endpoint.ListParts)
async def list_parts(call: Call) -> http.Response:
    check_key(call.key)
    after = whole_number(call.query.get("part-number-marker", "0"))
    if after is None or not 0 <= after <= MAX_MARKER:
        raise InvalidArgument(
            f"Argument part-number-marker must be an integer between 0 and {MAX_MARKER}",
            ArgumentName="part-number-marker",
            ArgumentValue=call.query.get("part-number-marker", ""),
        )
    limit = max_keys(call, "max-parts")
    upload = await call.store.uploads.get(call.account, call.bucket, call.key, upload_id(call))
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
                    **checksum_elements(p.properties.get("checksums", {})),
                }
                for p in parts
            ],
            **_upload_checksum_elements(upload.properties),
        },
    )
    return http.Response(body=body, content_type=XML)


@handles(Endpoint.ListMultipartUploads)
async def list_multipart_uploads(call: Call) -> http.Response:
    encode = encoder(call)  # encoding-type=url: keys, prefixes and markers percent-encoded
    limit = max_keys(call, "max-uploads")
    prefix = call.query.get("prefix", "")
    delimiter = call.query.get("delimiter", "")
    key_marker = call.query.get("key-marker", "")
    id_marker = call.query.get("upload-id-marker")
    try:
        after_id = uuid.UUID(id_marker) if id_marker else None
    except ValueError:
        raise InvalidArgument("Invalid uploadId marker") from None
    entries = await call.store.uploads.page(
        call.account,
        call.bucket,
        prefix=prefix,
        delimiter=delimiter,
        key_marker=key_marker,
        upload_id_marker=after_id,
        limit=limit + 1,
    )
    truncated = len(entries) > limit > 0  # max-uploads=0: an empty page, nothing to go on from
    entries = entries[:limit]
    last = entries[-1] if truncated else None
    body = s3xml.document(
        "ListMultipartUploadsResult",
        {
            "Bucket": call.bucket,
            "KeyMarker": encode(key_marker),
            "UploadIdMarker": id_marker or "",
            "NextKeyMarker": encode(_entry_key(last)) if last is not None else None,
            "NextUploadIdMarker": str(last.id) if isinstance(last, Upload) else None,
            "Delimiter": encode(delimiter or None),
            "Prefix": encode(prefix),
            "MaxUploads": limit,
            "IsTruncated": truncated,
            "EncodingType": call.query.get("encoding-type"),
            "Upload": [
                {
                    "Key": encode(u.name),
                    "UploadId": str(u.id),
                    "Initiator": owner_tree(call),
                    "Owner": owner_tree(call),
                    "StorageClass": "STANDARD",
                    "Initiated": u.created,
                    **_upload_checksum_elements(u.properties),
                }
                for u in entries
                if isinstance(u, Upload)
            ],
            "CommonPrefixes": [
                {"Prefix": encode(p.prefix)} for p in entries if isinstance(p, CommonPrefix)
            ],
        },
    )
    return http.Response(body=body, content_type=XML)


def _entry_key(entry: Upload | CommonPrefix) -> str:
    return entry.name if isinstance(entry, Upload) else entry.prefix
