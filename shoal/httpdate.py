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


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def format_date(moment: datetime) -> str:
    """A moment as an HTTP date (RFC 9110's IMF-fixdate, "Sun, 06 Nov 1994 08:49:37 GMT"); a
    naive one is taken as UTC. Written out rather than by email.utils.format_datetime, which
    cost several times as much, once per GET or HEAD (Last-Modified)."""
    utc = moment if moment.tzinfo is None else moment.astimezone(UTC)
    return (
        f"{_DAYS[utc.weekday()]}, {utc.day:02d} {_MONTHS[utc.month - 1]} {utc.year:04d} "
        f"{utc.hour:02d}:{utc.minute:02d}:{utc.second:02d} GMT"
    )


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
