"""The rules for bucket and object names, checked before any SQL runs."""

from __future__ import annotations

import ipaddress
import re

from shoal.metadata.errors import InvalidName

MAX_OBJECT_NAME_BYTES = 1024
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_RESERVED_BUCKET_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_RESERVED_BUCKET_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def check_bucket_name(name: str) -> None:
    """S3's general-purpose bucket naming rules."""
    if not isinstance(name, str) or not _BUCKET_NAME.fullmatch(name):
        raise InvalidName(
            f"invalid bucket name {name!r}: use 3 to 63 lowercase letters, digits, dots and "
            "hyphens, starting and ending with a letter or digit"
        )
    if ".." in name or ".-" in name or "-." in name:
        raise InvalidName(
            f"invalid bucket name {name!r}: dots must not be adjacent to dots or hyphens"
        )
    if name.startswith(_RESERVED_BUCKET_PREFIXES) or name.endswith(_RESERVED_BUCKET_SUFFIXES):
        raise InvalidName(f"invalid bucket name {name!r}: reserved prefix or suffix")
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        return
    raise InvalidName(f"invalid bucket name {name!r}: must not look like an IP address")


def check_object_name(name: str) -> None:
    """An object name: 1 to 1024 bytes of valid UTF-8 without NUL."""
    if not isinstance(name, str) or name == "":
        raise InvalidName("object name must not be empty")
    _check_text(name, "object name")


def check_listing_text(value: str, what: str) -> None:
    """A prefix, delimiter or marker: may be empty, otherwise the same rules as a name."""
    if not isinstance(value, str):
        raise InvalidName(f"{what} must be text")
    if value:
        _check_text(value, what)


def _check_text(value: str, what: str) -> None:
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidName(f"{what} is not valid UTF-8") from None
    if len(encoded) > MAX_OBJECT_NAME_BYTES:
        raise InvalidName(
            f"{what} is {len(encoded)} bytes long; the limit is {MAX_OBJECT_NAME_BYTES}"
        )
    if "\x00" in value:
        raise InvalidName(f"{what} must not contain NUL")
