"""GetObjectAttributes: an object's ETag, checksum, parts, storage class and size in one
answer, without its data (the aws cli and the SDKs ask for it)."""

from __future__ import annotations

from typing import Any

from shoal.metadata import ObjectVersion
from shoal.s3 import headers as h
from shoal.s3 import http
from shoal.s3 import xml as s3xml
from shoal.s3.app import Call, handles
from shoal.s3.errors import InvalidArgument
from shoal.s3.listing import whole_number
from shoal.s3.multipart import checksum_elements
from shoal.s3.objects import MAX_PART_NUMBER, check_key, check_null_version
from shoal.s3.router import Endpoint

XML = "application/xml"
ATTRIBUTES = ("ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize")
DEFAULT_MAX_PARTS = 1000


@handles(Endpoint.GetObjectAttributes)
async def get_object_attributes(call: Call) -> http.Response:
    check_key(call.key)
    check_null_version(call)
    wanted = _wanted_attributes(call.request.headers.get("x-amz-object-attributes"))
    version = await call.store.objects.get(call.account, call.bucket, call.key, with_data=False)
    answer: dict[str, Any] = {}
    if "ETag" in wanted:
        answer["ETag"] = version.etag  # unquoted here, unlike the ETag header
    checksums = version.properties.get("checksums", {})
    if "Checksum" in wanted and checksums:
        # A composite checksum without its "-N" part count, unlike GetObject's and
        # HeadObject's (ObjectParts gives the count): S3 answers it so.
        answer["Checksum"] = {
            **checksum_elements({name: v.partition("-")[0] for name, v in checksums.items()}),
            "ChecksumType": version.properties.get("checksum_type", "FULL_OBJECT"),
        }
    parts = version.properties.get("parts")
    if "ObjectParts" in wanted and parts is not None:
        answer["ObjectParts"] = _parts_page(call, parts)
    if "StorageClass" in wanted:
        answer["StorageClass"] = "STANDARD"
    if "ObjectSize" in wanted:
        answer["ObjectSize"] = version.content_length
    body = s3xml.document("GetObjectAttributesResponse", answer)
    return http.Response(body=body, content_type=XML, headers=_version_headers(version))


def _wanted_attributes(header: str | None) -> set[str]:
    """x-amz-object-attributes: a comma-separated list of at least one known attribute."""
    named = {name.strip() for name in (header or "").split(",") if name.strip()}
    if not named or not named <= set(ATTRIBUTES):
        raise InvalidArgument("Invalid attribute name specified.")
    return named


def _parts_page(call: Call, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One page of the parts, after x-amz-part-number-marker, at most x-amz-max-parts."""
    after = _header_number(call, "x-amz-part-number-marker", 0)
    limit = min(_header_number(call, "x-amz-max-parts", DEFAULT_MAX_PARTS), DEFAULT_MAX_PARTS)
    following = [p for p in parts if int(p["part_number"]) > after]
    page = following[:limit]
    truncated = len(following) > len(page)
    return {
        "PartsCount": len(parts),
        "PartNumberMarker": after,
        # An empty page (x-amz-max-parts 0) goes on from where it was asked to start.
        "NextPartNumberMarker": (page[-1]["part_number"] if page else after) if truncated else None,
        "MaxParts": limit,
        "IsTruncated": truncated,
        "Part": [
            {
                "PartNumber": p["part_number"],
                "Size": p["size"],
                **checksum_elements(p.get("checksums", {})),
            }
            for p in page
        ],
    }


def _header_number(call: Call, header: str, default: int) -> int:
    raw = call.request.headers.get(header)
    if raw is None:
        return default
    value = whole_number(raw)
    if value is None or not 0 <= value <= MAX_PART_NUMBER:
        raise InvalidArgument(f"{header} must be an integer between 0 and {MAX_PART_NUMBER}")
    return value


def _version_headers(version: ObjectVersion) -> dict[str, str]:
    return {"Last-Modified": h.http_date(version.modified)}
