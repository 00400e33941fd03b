"""S3 listing arithmetic, shared by the SQL it parameterizes and by the merge across shards.

Names compare by UTF-8 bytes, which is the same order as Python's comparison of code points,
so plain `str` comparison is S3's order. No name contains NUL (PostgreSQL text cannot).
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeVar

MAX_CODE_POINT = 0x10FFFF
_SURROGATES_START = 0xD800
_SURROGATES_END = 0xDFFF
# A skip-scanning listing steps through each vnode (arm) for this many times its even share
# of the entries it wants at first: names spread evenly over vnodes (see first_arm_limit).
FIRST_ROUND_SHARE = 2.0
MIN_ARM_LIMIT = 8
# A delimiter listing's first round reads at most this many rows per entry it wants: enough
# for most trees in one round (3 keys a prefix: 3,003 rows for a page of 1000), and little
# to waste where prefixes hold so many keys that skip scans will be cheaper (see
# prefer_skip_scan). A round stops as soon as it has its entries, so a budget costs nothing
# that a page does not need.
FIRST_ROUND_ROWS_PER_ENTRY = 4
MIN_ROW_BUDGET = 256
MAX_ROW_BUDGET = 262_144
# What one step of a skip scan (an index descent in a recursive query) costs, in rows read
# in order and merged, as bench/listing_bench.py measures them (its dense bucket is where skip
# scans win; docs/decisions.md, "The listing strategy").
SKIP_STEP_COST_IN_ROWS = 4
# The smallest character; `name > m` is `name >= m + SMALLEST` because no name holds NUL.
SMALLEST = "\x01"
# A shard holding a share p of the vnodes holds about that share of any range of names (names
# hash evenly over vnodes), so of a page's first n keys it holds a binomial number: n*p on
# average, spread by sqrt(n*p*(1-p)). Asked first for its mean plus this many spreads, a
# shard covers its part of the page in all but about one page in 30,000 (a normal tail; a
# page over four shards needs a second round about once in 8,600), which reads on from
# where the shards that fell short stopped (first_keys).
SHARE_SPREADS = 4


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
    if len(streams) == 1:  # one shard: its keys are already distinct (and a page is 1000)
        return list(itertools.islice(streams[0], limit))
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


def first_key_limit(wanted: int, share: float) -> int:
    """How many keys a listing without a delimiter asks first of a shard that holds `share`
    of the vnodes. Asking every shard for the whole page would read `shards` times the rows
    the page needs (4,004 for a page of 1000 over 4 shards, against about 1,250 this way)."""
    if share >= 1.0:
        return wanted
    spread = math.sqrt(wanted * share * (1.0 - share))
    return max(1, min(wanted, math.ceil(wanted * share + SHARE_SPREADS * spread) + 1))


# Reads up to `limit` keys of shard `shard` from name `lower` on, in order.
ShardReader = Callable[[int, str, int], Awaitable[list[T]]]


async def first_keys(
    shares: Sequence[float],
    read: ShardReader[T],
    lower: str,
    key_of: Callable[[T], str],
    wanted: int,
) -> list[T]:
    """The first `wanted` keys from `lower` on, over shards that hold `shares` of the vnodes
    and whose keys are all distinct (a name lives on one vnode).

    Every shard is read at once for its share of the page with a margin (first_key_limit).
    A shard that returned all it was asked may have more, but it has returned all its keys
    up to its last one: so the merged keys are settled up to the smallest last key of such a
    shard. In the rare page where fewer than `wanted` are settled, the shards that stopped
    short of the page's `wanted`-th key are read on from their last key, for as many keys
    as are missing. That round settles the page: a shard not read again ends at or past the
    `wanted`-th key, and one read again that may still have more has returned that many keys
    past all that was settled before.
    """
    limits = {shard: first_key_limit(wanted, share) for shard, share in enumerate(shares)}
    starts = dict.fromkeys(limits, lower)
    keys_of: list[list[T]] = [[] for _ in shares]
    open_shards: set[int] = set()  # returned all they were asked for: may have more
    while True:
        answers = await asyncio.gather(*(read(i, starts[i], limits[i]) for i in limits))
        for shard, keys in zip(limits, answers, strict=True):
            keys_of[shard] += keys
            if len(keys) < limits[shard]:
                open_shards.discard(shard)
            else:
                open_shards.add(shard)
        # Each shard's keys are in order: sorting them all merges the runs (in C).
        merged = keys_of[0] if len(keys_of) == 1 else sorted(itertools.chain(*keys_of), key=key_of)
        if not open_shards:
            return merged[:wanted]
        through = min(key_of(keys_of[shard][-1]) for shard in open_shards)
        settled = bisect.bisect_right(merged, through, key=key_of)
        if settled >= wanted:
            return merged[:wanted]
        cut = key_of(merged[wanted - 1]) if len(merged) >= wanted else None
        behind = [s for s in open_shards if cut is None or key_of(keys_of[s][-1]) < cut]
        limits = dict.fromkeys(behind, wanted - settled)
        starts = {shard: key_of(keys_of[shard][-1]) + SMALLEST for shard in behind}


def first_arm_limit(wanted: int, arms: int) -> int:
    """How many skip-scan steps to ask of each arm in a listing's first skip-scan round.

    Asking every arm for the whole page costs `arms` times the work (64 x 1001 steps for a
    page of 1000 over 64 vnodes); asking for twice its share covers the page in one round
    when entries spread evenly, and later rounds fetch only what is still missing.
    """
    return min(wanted, max(MIN_ARM_LIMIT, math.ceil(FIRST_ROUND_SHARE * wanted / arms)))


def next_arm_limit(arm_limit: int, covered: int, missing: int, wanted: int) -> int:
    """The per-arm limit for the next round, from how many entries this round covered.

    `covered` entries came from arms read up to `arm_limit` each; ask for enough to cover
    the `missing` ones at that density, with a margin, never more than a whole page.
    """
    estimate = math.ceil(1.5 * missing * arm_limit / max(covered, 1))
    return min(wanted, max(2 * arm_limit, estimate))


def first_row_budget(wanted: int) -> int:
    """How many rows a delimiter listing's first round may read (of one shard)."""
    return max(MIN_ROW_BUDGET, math.ceil(FIRST_ROUND_ROWS_PER_ENTRY * wanted))


def next_row_budget(rows: int, covered: int, missing: int) -> int:
    """The row budget of the next round, from how many entries `rows` rows covered: enough
    for the `missing` entries at that density, with a margin."""
    estimate = math.ceil(1.5 * missing * rows / max(covered, 1))
    return min(MAX_ROW_BUDGET, max(2 * rows, estimate))


def prefer_skip_scan(rows_read: int, covered: int, arms_per_shard: int) -> bool:
    """Whether the rest of a delimiter listing should skip-scan instead of reading rows.

    Reading in order costs a row for every key under a common prefix; a skip scan costs a step
    in each arm that holds keys under it, at most `arms_per_shard`, and a step costs
    SKIP_STEP_COST_IN_ROWS rows. So rows are cheaper until prefixes hold more than about that
    many times `arms_per_shard` keys, which `rows_read` per entry `covered` estimates.
    """
    return rows_read > SKIP_STEP_COST_IN_ROWS * arms_per_shard * max(covered, 1)
