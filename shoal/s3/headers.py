"""HTTP headers of S3 objects: what a PUT keeps, what a GET returns, conditionals, ranges."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from datetime import datetime

from shoal import httpdate
from shoal.metadata import ObjectVersion
from shoal.s3.errors import (
    InvalidArgument,
    InvalidDigest,
    InvalidPartNumber,
    InvalidRange,
    MetadataTooLarge,
    PreconditionFailed,
)
from shoal.s3.http import Headers

# Standard headers S3 stores with an object and returns on GET and HEAD.
STORED_HEADERS = (
    "cache-control",
    "content-disposition",
    "content-encoding",
    "content-language",
    "expires",
)
USER_METADATA_PREFIX = "x-amz-meta-"
MAX_USER_METADATA_BYTES = 2048
DEFAULT_CONTENT_TYPE = "binary/octet-stream"
# GET's response-* parameters override these headers of the response.
RESPONSE_OVERRIDES = {
    "response-content-type": "Content-Type",
    "response-content-language": "Content-Language",
    "response-expires": "Expires",
    "response-cache-control": "Cache-Control",
    "response-content-disposition": "Content-Disposition",
    "response-content-encoding": "Content-Encoding",
}
# What no header value may hold: control characters but the tab (RFC 9110, section 5.5).
_NOT_IN_A_HEADER = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_RANGE = re.compile(r"bytes=([0-9]*)-([0-9]*)")
# A range bound of more digits than this is past the end of any object, and is read as this
# (Python will not even parse an int of over 4300 digits): a Range header of 10,000 digits
# is then what S3 makes of it, 416 past the end or the rest of the object.
_RANGE_NUMBER_DIGITS = 20
BEYOND_ANY_OBJECT = 10**_RANGE_NUMBER_DIGITS


class NotModified(Exception):
    """A conditional GET or HEAD whose answer is 304."""


def object_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers of a PUT (or of a REPLACE copy) that are kept with the object."""
    kept = {
        name: value
        for name, value in _lower(headers).items()
        if name in STORED_HEADERS or name.startswith(USER_METADATA_PREFIX)
    }
    user_bytes = sum(
        _utf8_bytes(k) + _utf8_bytes(v)
        for k, v in kept.items()
        if k.startswith(USER_METADATA_PREFIX)
    )
    if user_bytes > MAX_USER_METADATA_BYTES:
        raise MetadataTooLarge(Size=str(user_bytes), MaxSizeAllowed=str(MAX_USER_METADATA_BYTES))
    if "content-encoding" in kept:
        # aws-chunked is a transfer detail of SigV4 streaming, not the object's encoding.
        codings = [c.strip() for c in kept["content-encoding"].split(",")]
        codings = [c for c in codings if c and c != "aws-chunked"]
        if codings:
            kept["content-encoding"] = ", ".join(codings)
        else:
            del kept["content-encoding"]
    return kept


def _utf8_bytes(text: str) -> int:
    """Bytes of `text` in UTF-8, as S3 measures metadata (a header's bytes that were not
    UTF-8 count one each)."""
    return len(text.encode("utf-8", "surrogateescape"))


def response_headers(version: ObjectVersion) -> dict[str, str]:
    """The headers of a GET or HEAD of `version` (without length and range)."""
    headers = {
        "ETag": f'"{version.etag}"',
        "Last-Modified": http_date(version.modified),
        "Content-Type": version.content_type or DEFAULT_CONTENT_TYPE,
        "Accept-Ranges": "bytes",
    }
    for name, value in version.headers.items():
        if value is None:
            continue
        if name.startswith(USER_METADATA_PREFIX) and not value.isascii():
            value = mail_safe(value)
        headers[name] = value
    tags = version.properties.get("tags")
    if tags:
        headers["x-amz-tagging-count"] = str(len(tags))
    return headers


def mail_safe(value: str) -> str:
    """A metadata value that is not US-ASCII as S3 answers it: RFC 2047's encoded word of its
    UTF-8 (`=?UTF-8?B?...?=`), so that the header holds US-ASCII alone, as HTTP wants."""
    raw = value.encode("utf-8", "surrogateescape")
    return f"=?UTF-8?B?{base64.b64encode(raw).decode()}?="


def apply_overrides(headers: dict[str, str], query: Mapping[str, str]) -> None:
    """The `response-*` parameters of a GET or HEAD in place of the headers they name: one
    header each, whatever the case of the name it was stored under. A value no header can
    carry (a line break, a control character) is InvalidArgument."""
    for parameter, header in RESPONSE_OVERRIDES.items():
        value = query.get(parameter)
        if value is None:
            continue
        if _NOT_IN_A_HEADER.search(value):
            raise InvalidArgument(f"{parameter} holds a character no header value can")
        for name in [n for n in headers if n.lower() == header.lower()]:
            del headers[name]
        headers[header] = value


def checksum_headers(version: ObjectVersion) -> dict[str, str]:
    """x-amz-checksum-* of the whole object, and whether it is a multipart object's
    COMPOSITE checksum (checksum of the part checksums) or of all its bytes (FULL_OBJECT)."""
    checksums = version.properties.get("checksums", {})
    if not checksums:
        return {}
    headers = {f"x-amz-checksum-{name}": value for name, value in checksums.items()}
    headers["x-amz-checksum-type"] = version.properties.get("checksum_type", "FULL_OBJECT")
    return headers


def object_part(version: ObjectVersion, number: int) -> tuple[int, int, dict[str, str]]:
    """[start, end) of part `number` of a version and the part's checksums (GET and HEAD
    ?partNumber=). An object not uploaded in parts is one part, with the object's checksums.

    `number` is the part's number as uploaded, which need not be its position: an upload
    completed with parts 1 and 3 has a part 3 and no part 2."""
    parts = version.properties.get("parts")
    if parts is None:
        if number != 1:
            raise InvalidPartNumber()
        return 0, version.content_length, checksum_headers(version)
    start = 0
    for part in parts:
        if int(part["part_number"]) == number:
            checksums = {f"x-amz-checksum-{k}": v for k, v in part.get("checksums", {}).items()}
            return start, start + int(part["size"]), checksums
        start += int(part["size"])
    raise InvalidPartNumber()


def http_date(moment: datetime) -> str:
    return httpdate.format_date(moment)


def check_conditions(version: ObjectVersion, headers: Mapping[str, str], prefix: str = "") -> None:
    """If-Match, If-None-Match, If-Modified-Since, If-Unmodified-Since, with S3's precedence.

    `prefix` is "x-amz-copy-source-" for a copy's conditions on its source (where a failed
    If-None-Match or If-Modified-Since is 412, not 304).
    """
    lowered = _lower(headers)
    if_match = lowered.get(prefix + "if-match")
    if_none_match = lowered.get(prefix + "if-none-match")
    modified_since_text = lowered.get(prefix + "if-modified-since")
    unmodified_since_text = lowered.get(prefix + "if-unmodified-since")
    conditions = (if_match, if_none_match, modified_since_text, unmodified_since_text)
    if conditions == (None, None, None, None):
        return  # most reads: no condition (and none of the work below)
    # A date that cannot be read is ignored, as S3 does.
    modified_since = httpdate.parse(modified_since_text)
    unmodified_since = httpdate.parse(unmodified_since_text)
    modified = version.modified.replace(microsecond=0)
    if if_match is not None:
        if not etag_matches(version.etag, if_match):
            raise PreconditionFailed(Condition=prefix + "If-Match")
    elif unmodified_since is not None and modified > unmodified_since:
        raise PreconditionFailed(Condition=prefix + "If-Unmodified-Since")
    if if_none_match is not None:
        if etag_matches(version.etag, if_none_match):
            raise _not_modified(prefix, "If-None-Match")
    elif modified_since is not None and modified <= modified_since:
        raise _not_modified(prefix, "If-Modified-Since")


def _not_modified(prefix: str, condition: str) -> Exception:
    """A failed If-None-Match or If-Modified-Since: 304 on a read, 412 on a copy's source."""
    return PreconditionFailed(Condition=prefix + condition) if prefix else NotModified()


def if_range_holds(version: ObjectVersion, header: str | None) -> bool:
    """Whether a GET's Range applies (RFC 9110 If-Range): with no If-Range, yes; with an ETag,
    if it is the version's, compared strongly (a weak one never is); with a date, if it is
    the version's Last-Modified exactly. Otherwise the whole object is sent: a client
    resuming a download of another version gets all of this one, never a piece of it."""
    if header is None:
        return True
    value = header.strip()
    if value.startswith('"'):
        return value == f'"{version.etag}"'
    if value.startswith("W/"):
        return False
    return httpdate.parse(value) == version.modified.replace(microsecond=0)


def etag_matches(etag: str, header: str) -> bool:
    candidates = [c.strip().removeprefix("W/").strip('"') for c in header.split(",")]
    return "*" in candidates or etag in candidates


def etag_bytes(header: str) -> bytes:
    """The MD5 bytes of an ETag in a header (`"hex"` or `"hex-N"`), for conditional writes."""
    value = header.strip().strip('"').split("-")[0]
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raw = b""
    if len(raw) != 16:
        raise PreconditionFailed()
    return raw


def content_md5(headers: Mapping[str, str]) -> bytes | None:
    value = _lower(headers).get("content-md5")
    if value is None:
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except binascii.Error:
        raw = b""
    if len(raw) != 16:
        raise InvalidDigest()
    return raw


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """[start, end) of a Range header; None for the whole object (absent or multi-range)."""
    if header is None:
        return None
    match = _RANGE.fullmatch(header.strip())
    if not match:
        return None  # S3 ignores ranges it does not understand, such as several ranges
    first, last = match.groups()
    if first == "" and last == "":
        return None
    if first == "":
        length = range_number(last)
        if length == 0:
            raise InvalidRange(ActualObjectSize=str(size))
        if size == 0:
            return None  # an empty object's last bytes are all of it: no Content-Range fits
        return max(0, size - length), size
    start = range_number(first)
    end = size if last == "" else min(size, range_number(last) + 1)
    if last != "" and range_number(last) < start:
        return None  # not a valid range: S3 ignores it and sends the whole object
    if start >= size:
        raise InvalidRange(ActualObjectSize=str(size))
    return start, end


def range_number(digits: str) -> int:
    """A byte position of a range header (ASCII digits), huge ones capped past any object."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= _RANGE_NUMBER_DIGITS else BEYOND_ANY_OBJECT


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    if isinstance(headers, Headers):
        return dict(headers)  # a request's: lowercase already; a plain dict's lookups are C
    return {name.lower(): value for name, value in headers.items()}
