"""Listing operations: ListObjects, ListObjectsV2, ListObjectVersions."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from shoal.metadata import ListingPage
from shoal.s3 import http
from shoal.s3 import xml as s3xml
from shoal.s3.app import Call, handles
from shoal.s3.bucket import decode_token, encode_token, owner_tree
from shoal.s3.errors import InvalidArgument
from shoal.s3.router import Endpoint

XML = "application/xml"
MAX_KEYS = 1000


def whole_number(raw: str) -> int | None:
    """The integer a query parameter or header gives (ASCII digits, perhaps a minus), or
    None: int() would also take "1_0", " 5" and other scripts' digits."""
    return int(raw) if re.fullmatch(r"-?[0-9]+", raw) else None


def max_keys(call: Call, parameter: str = "max-keys") -> int:
    value = whole_number(call.query.get(parameter, str(MAX_KEYS)))
    if value is None:
        raise InvalidArgument(f"Provided {parameter} not an integer or within integer range")
    if value < 0:
        raise InvalidArgument(f"{parameter} must not be negative")
    return min(value, MAX_KEYS)


def url_encoded(call: Call) -> bool:
    """encoding-type=url: keys and prefixes percent-encoded in the response."""
    kind = call.query.get("encoding-type")
    if kind is None:
        return False
    if kind != "url":
        raise InvalidArgument("Invalid Encoding Method specified in Request")
    return True


def encoder(call: Call) -> Any:
    """How the response writes a prefix, marker or key: as it is, or percent-encoded."""
    if not url_encoded(call):
        return lambda text: text
    return lambda text: None if text is None else quote(text, safe="/")


async def page_of(call: Call, marker: str, limit: int) -> ListingPage:
    return await call.store.objects.list(
        call.account,
        call.bucket,
        prefix=call.query.get("prefix", ""),
        delimiter=call.query.get("delimiter", ""),
        marker=marker,
        limit=limit,
    )


def contents(call: Call, page: ListingPage, with_owner: bool) -> s3xml.Fragment:
    """The page's <Contents> elements, one f-string per key (a page has up to 1000)."""
    owner = s3xml.element("Owner", owner_tree(call)) if with_owner else ""
    objects = page.objects
    keys = listed_keys([o.name for o in objects], url_encoded(call))
    return s3xml.Fragment(
        "".join(
            [
                f"<Contents><Key>{key}</Key><LastModified>{o.last_modified}</LastModified>"
                f'<ETag>"{o.etag}"</ETag><Size>{o.content_length}</Size>'
                f"<StorageClass>STANDARD</StorageClass>{owner}</Contents>"
                for o, key in zip(objects, keys, strict=True)
            ]
        )
    )


def listed_keys(names: list[str], percent_encoded: bool) -> list[str]:
    """A page's keys as its XML shows them: percent-encoded (encoding-type=url, which boto3
    and the aws cli ask for), else escaped. Nearly every page needs neither, which one look
    at all its keys together tells, where quoting key by key cost every page."""
    together = "".join(names)
    if percent_encoded:
        if _URL_SAFE.fullmatch(together):
            return names
        return [quote(name, safe="/") for name in names]
    if "&" in together or "<" in together or ">" in together or "\r" in together:
        return [s3xml.text(name) for name in names]
    return names


# What quote(name, safe="/") leaves as it is.
_URL_SAFE = re.compile(r"[A-Za-z0-9_.~/-]*")


def common_prefixes(call: Call, page: ListingPage) -> s3xml.Fragment:
    prefixes = listed_keys(page.common_prefixes, url_encoded(call))
    return s3xml.Fragment(
        "".join([f"<CommonPrefixes><Prefix>{p}</Prefix></CommonPrefixes>" for p in prefixes])
    )


@handles(Endpoint.ListObjects)
async def list_objects(call: Call) -> http.Response:
    encode = encoder(call)
    marker = call.query.get("marker", "")
    page = await page_of(call, marker, max_keys(call))
    body = s3xml.document(
        "ListBucketResult",
        {
            "Name": call.bucket,
            "Prefix": encode(call.query.get("prefix", "")),
            "Marker": encode(marker),
            "MaxKeys": max_keys(call),
            "Delimiter": encode(call.query.get("delimiter") or None),  # S3 omits an empty one
            "IsTruncated": page.is_truncated,
            # Only with a delimiter, as S3: without one the last key is the next marker.
            "NextMarker": (
                encode(page.next_marker)
                if page.is_truncated and call.query.get("delimiter")
                else None
            ),
            "EncodingType": call.query.get("encoding-type"),
            "Contents": contents(call, page, with_owner=True),
            "CommonPrefixes": common_prefixes(call, page),
        },
    )
    return http.Response(body=body, content_type=XML)


@handles(Endpoint.ListObjectsV2)
async def list_objects_v2(call: Call) -> http.Response:
    encode = encoder(call)
    token = call.query.get("continuation-token")
    start_after = call.query.get("start-after", "")
    marker = decode_token(token) if token is not None else start_after
    page = await page_of(call, marker, max_keys(call))
    body = s3xml.document(
        "ListBucketResult",
        {
            "Name": call.bucket,
            "Prefix": encode(call.query.get("prefix", "")),
            "KeyCount": len(page.entries),
            "MaxKeys": max_keys(call),
            "Delimiter": encode(call.query.get("delimiter") or None),  # S3 omits an empty one
            "IsTruncated": page.is_truncated,
            "ContinuationToken": token,
            "NextContinuationToken": encode_token(page.next_marker) if page.is_truncated else None,
            "StartAfter": encode(start_after) or None,
            "EncodingType": call.query.get("encoding-type"),
            "Contents": contents(call, page, with_owner=call.query.get("fetch-owner") == "true"),
            "CommonPrefixes": common_prefixes(call, page),
        },
    )
    return http.Response(body=body, content_type=XML)


def check_version_id_marker(query: dict[str, str]) -> None:
    """S3's refusals of a `version-id-marker`: without a `key-marker` parameter (an empty one
    counts as given, as S3 takes it), and one that names no version. Every object is its
    "null" version, so that is the only id there is."""
    marker = query.get("version-id-marker")
    if not marker:
        return
    if "key-marker" not in query:
        raise InvalidArgument(
            "A version-id marker cannot be specified without a key marker.",
            ArgumentName="version-id-marker",
            ArgumentValue=marker,
        )
    if marker != "null":
        raise InvalidArgument(
            "Invalid version id specified", ArgumentName="version-id-marker", ArgumentValue=marker
        )


@handles(Endpoint.ListObjectVersions)
async def list_object_versions(call: Call) -> http.Response:
    """An unversioned bucket as S3 shows it: each object is its only, "null", version."""
    encode = encoder(call)
    key_marker = call.query.get("key-marker", "")
    check_version_id_marker(call.query)
    page = await page_of(call, key_marker, max_keys(call))
    versions = [
        {
            "Key": encode(o.name),
            "VersionId": "null",
            "IsLatest": True,
            "LastModified": o.last_modified,
            "ETag": f'"{o.etag}"',
            "Size": o.content_length,
            "StorageClass": "STANDARD",
            "Owner": owner_tree(call),
        }
        for o in page.objects
    ]
    body = s3xml.document(
        "ListVersionsResult",
        {
            "Name": call.bucket,
            "Prefix": encode(call.query.get("prefix", "")),
            "KeyMarker": encode(key_marker),
            "VersionIdMarker": call.query.get("version-id-marker", ""),
            "NextKeyMarker": encode(page.next_marker) if page.is_truncated else None,
            "NextVersionIdMarker": "null" if page.is_truncated else None,
            "MaxKeys": max_keys(call),
            "Delimiter": encode(call.query.get("delimiter") or None),  # S3 omits an empty one
            "IsTruncated": page.is_truncated,
            "EncodingType": call.query.get("encoding-type"),
            "Version": versions,
            "CommonPrefixes": common_prefixes(call, page),
        },
    )
    return http.Response(body=body, content_type=XML)
