"""Tags of objects and buckets: what S3 accepts, read from a `Tagging` document or the
`x-amz-tagging` header (and CopyObject's `x-amz-tagging-directive`), and rendered.

Tags are validated as S3 does: at most 10 per object (50 per bucket), keys of 1 to 128 and
values of 0 to 256 Unicode characters, of letters, digits, spaces and `_ . : / = + - @`,
unique keys, none starting with `aws:` (InvalidTag, with S3's messages).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from urllib.parse import parse_qsl

from shoal.s3 import xml as s3xml
from shoal.s3.errors import BadRequest, InvalidArgument, InvalidTag, MalformedXML

MAX_OBJECT_TAGS = 10
MAX_BUCKET_TAGS = 50
MAX_KEY_CHARS = 128
MAX_VALUE_CHARS = 256
# Besides letters, digits and spaces (Unicode categories L, N and Z), what S3 allows in tags.
_PUNCTUATION = frozenset("_.:/=+-@")
_BAD_HEADER = (
    "The header 'x-amz-tagging' shall be encoded as UTF-8 then URLEncoded URL query "
    "parameters without tag name duplicates."
)

Tags = dict[str, str]


def checked(pairs: list[tuple[str, str]], limit: int) -> Tags:
    """Tags as S3 accepts them, or InvalidTag with S3's message."""
    if len(pairs) > limit:
        if limit == MAX_BUCKET_TAGS:
            raise InvalidTag(f"Bucket tag count cannot be greater than {limit}")
        raise BadRequest(f"Object tags cannot be greater than {limit}")  # S3's code for it
    tags: Tags = {}
    for key, value in pairs:
        if len(key) > MAX_KEY_CHARS:
            raise InvalidTag(f"The TagKey you have provided is too long, max {MAX_KEY_CHARS}")
        if not key or not _allowed(key):
            raise InvalidTag("The TagKey you have provided is invalid")
        if len(value) > MAX_VALUE_CHARS:
            raise InvalidTag(f"The TagValue you have provided is too long, max {MAX_VALUE_CHARS}")
        if not _allowed(value):
            raise InvalidTag("The TagValue you have provided is invalid")
        if key.lower().startswith("aws:"):
            raise InvalidTag("Your TagKey cannot be prefixed with aws:")
        if key in tags:
            raise InvalidTag("Cannot provide multiple Tags with the same key")
        tags[key] = value
    return tags


def _allowed(text: str) -> bool:
    return all(c in _PUNCTUATION or unicodedata.category(c)[0] in "LNZ" for c in text)


def from_header(headers: Mapping[str, str]) -> Tags:
    """The tags of `x-amz-tagging` (`k1=v1&k2=v2`, URL-encoded UTF-8); none if absent."""
    header = headers.get("x-amz-tagging", "")
    if not header.strip():
        return {}
    try:
        pairs = parse_qsl(header, keep_blank_values=True, errors="strict")
    except (UnicodeDecodeError, ValueError):
        raise InvalidArgument(_BAD_HEADER) from None
    if len({key for key, _ in pairs}) != len(pairs):
        raise InvalidArgument(_BAD_HEADER)
    return checked(pairs, MAX_OBJECT_TAGS)


def of_copy(headers: Mapping[str, str], source_tags: Tags) -> Tags:
    """The tags of a CopyObject's new object: the source's (`x-amz-tagging-directive: COPY`,
    the default) or `x-amz-tagging`'s (REPLACE)."""
    directive = headers.get("x-amz-tagging-directive", "COPY").strip().upper()
    if directive == "COPY":
        return dict(source_tags)
    if directive == "REPLACE":
        return from_header(headers)
    raise InvalidArgument("Unknown tagging directive.")


def from_body(body: bytes, limit: int) -> Tags:
    """The tags of a `Tagging` document (`TagSet/Tag/Key,Value`), keys and values exact."""
    document = s3xml.parse(body, "Tagging")
    tag_set = document.find("TagSet")
    if tag_set is None:
        raise MalformedXML()
    pairs = []
    for tag in tag_set.findall("Tag"):
        if tag.find("Key") is None or tag.find("Value") is None:
            raise MalformedXML()
        key = s3xml.text_of(tag, "Key", required=False) or ""
        value = s3xml.text_of(tag, "Value", required=False) or ""
        pairs.append((key, value))
    return checked(pairs, limit)


def document(tags: Tags) -> bytes:
    tag_list = [{"Key": key, "Value": value} for key, value in tags.items()]
    return s3xml.document("Tagging", {"TagSet": {"Tag": tag_list}})


def of_version(properties: Mapping[str, object]) -> Tags:
    tags = properties.get("tags")
    return dict(tags) if isinstance(tags, dict) else {}
