"""S3 listing arithmetic, shared by the SQL it parameterizes and by the merge across shards.

Names compare by UTF-8 bytes, which is the same order as Python's comparison of code points,
so plain `str` comparison is S3's order. No name contains NUL (PostgreSQL text cannot).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

MAX_CODE_POINT = 0x10FFFF
_SURROGATES_START = 0xD800
_SURROGATES_END = 0xDFFF
# The smallest character; `name > m` is `name >= m + SMALLEST` because no name holds NUL.
SMALLEST = "\x01"


def successor(prefix: str) -> str | None:
    """The least string greater than every string that starts with `prefix`.

    So `prefix <= name < successor(prefix)` selects exactly the names under `prefix`, as an
    index range. None means no upper bound (the prefix is all U+10FFFF characters).
    """
    chars = list(prefix)
    while chars:
        code = ord(chars[-1])
        if code < MAX_CODE_POINT:
            code += 1
            if _SURROGATES_START <= code <= _SURROGATES_END:
                code = _SURROGATES_END + 1  # UTF-8 has no surrogates; skip them
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None


def common_prefix(name: str, prefix: str, delimiter: str) -> str | None:
    """The common prefix `name` rolls up into, or None when it is listed as itself."""
    if not delimiter:
        return None
    found = name.find(delimiter, len(prefix))
    if found < 0:
        return None
    return name[: found + len(delimiter)]


def key_range(prefix: str, delimiter: str, marker: str) -> tuple[str, str | None] | None:
    """The index range [lower, upper) of names a listing reads, or None if it is empty.

    Names after `marker` are listed; when the marker is itself a common prefix (a previous page
    ended with it), every name under it is skipped, so no page repeats a common prefix.
    """
    lower = prefix
    if marker:
        if common_prefix(marker, prefix, delimiter) == marker and marker.startswith(prefix):
            start = successor(marker)
            if start is None:
                return None
        else:
            start = marker + SMALLEST
        lower = max(lower, start)
    upper = successor(prefix) if prefix else None
    if upper is not None and lower >= upper:
        return None
    return lower, upper


T = TypeVar("T")


def merge_sorted(streams: Sequence[Iterable[T]], key_of: Callable[[T], str], limit: int) -> list[T]:
    """Merge sorted streams from several shards, keeping the first of equal keys, up to `limit`.

    Equal keys happen only for common prefixes, which every shard may report.
    """
    merged: list[T] = []
    last_key: str | None = None
    for item in heapq.merge(*streams, key=key_of):
        key = key_of(item)
        if key == last_key:
            continue
        merged.append(item)
        last_key = key
        if len(merged) >= limit:
            break
    return merged
