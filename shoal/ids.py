"""Time-ordered identifiers: UUIDv7 (RFC 9562) for every object version and multipart part.

A UUIDv7 starts with its creation time in milliseconds, so an id tells its age (GC and the
orphan check rely on that) and new rows land at the right edge of an id index.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from datetime import UTC, datetime

_lock = threading.Lock()
_last_ms = 0
_last_seq = 0
_SEQ_MAX = 0xFFF


def uuid7(now_ms: int | None = None) -> uuid.UUID:
    """A new UUIDv7; ids made by one process are strictly increasing.

    The 12 bits after the timestamp count ids made in the same millisecond (RFC 9562,
    method 1), so that ordering by id is ordering by creation within a process.
    """
    global _last_ms, _last_seq
    with _lock:
        ms = int(time.time() * 1000) if now_ms is None else now_ms
        if ms <= _last_ms:
            ms = _last_ms
            _last_seq += 1
            if _last_seq > _SEQ_MAX:
                ms += 1
                _last_seq = 0
        else:
            _last_seq = 0
        _last_ms = ms
        seq = _last_seq
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= seq << 64
    value |= 0b10 << 62
    value |= rand
    return uuid.UUID(int=value)


def uuid7_time(value: uuid.UUID) -> datetime:
    """When a UUIDv7 was made (millisecond precision, UTC)."""
    if value.version != 7:
        raise ValueError(f"{value} is not a UUIDv7")
    ms = value.int >> 80
    return datetime.fromtimestamp(ms / 1000, tz=UTC)
