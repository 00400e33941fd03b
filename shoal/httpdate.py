"""HTTP dates: the `Date` header as the gateway and the storage nodes send it, and the dates
clients send (Date, If-Modified-Since, ...) read back."""

from __future__ import annotations

import email.utils
import time
from datetime import UTC, datetime

# Longer than any HTTP date: refused unread.
MAX_DATE_CHARS = 64

_cache: tuple[int, str] = (0, "")


def now() -> str:
    """The current time as an HTTP date, formatted once a second (a header per response)."""
    global _cache
    second = int(time.time())
    if _cache[0] != second:
        _cache = (second, email.utils.formatdate(second, usegmt=True))
    return _cache[1]


def parse(value: str | None) -> datetime | None:
    """An HTTP date ("Tue, 27 Mar 2007 19:36:42 GMT", or an obsolete form of it) in UTC, or
    None if it is absent or unreadable."""
    if not value or len(value) > MAX_DATE_CHARS:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    # "-0000" means UTC with no claim about the local zone: parsedate leaves it naive.
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
