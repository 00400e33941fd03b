"""The value of the HTTP `Date` header, as the gateway and the storage nodes send it."""

from __future__ import annotations

import email.utils
import time

_cache: tuple[int, str] = (0, "")


def now() -> str:
    """The current time as an HTTP date, formatted once a second (a header per response)."""
    global _cache
    second = int(time.time())
    if _cache[0] != second:
        _cache = (second, email.utils.formatdate(second, usegmt=True))
    return _cache[1]
