"""Listing arithmetic: successor, common prefixes, key ranges, the shard merge."""

import asyncio
import bisect

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.metadata import listing
from shoal.metadata.listing import (
    common_prefix,
    first_arm_limit,
    first_key_limit,
    first_keys,
    first_row_budget,
    key_range,
    merge_sorted,
    next_arm_limit,
    next_row_budget,
    prefer_skip_scan,
    successor,
)

names = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12
)


def test_successor_increments_the_last_character() -> None:
    assert successor("abc") == "abd"
    assert successor("a/") == "a0"
    assert successor("\ud7ff") == "\ue000"  # UTF-8 has no surrogates to land on


def test_successor_drops_maximal_characters() -> None:
    assert successor("a\U0010ffff") == "b"
    assert successor("\U0010ffff\U0010ffff") is None
    assert successor("") is None


@given(prefix=names.filter(bool), name=names)
def test_successor_bounds_exactly_the_names_under_a_prefix(prefix: str, name: str) -> None:
    upper = successor(prefix)
    inside = prefix <= name and (upper is None or name < upper)
    assert inside == name.startswith(prefix)


@given(name=names, prefix=names, delimiter=names)
def test_common_prefix_is_a_prefix_ending_with_the_delimiter(
    name: str, prefix: str, delimiter: str
) -> None:
    name = prefix + name
    found = common_prefix(name, prefix, delimiter)
    if found is None:
        assert not delimiter or delimiter not in name[len(prefix) :]
    else:
        assert name.startswith(found) and found.endswith(delimiter)
        assert delimiter not in found[len(prefix) : -len(delimiter) or None]


def test_key_range_after_a_marker() -> None:
    assert key_range("", "", "") == ("", None)
    assert key_range("p", "", "") == ("p", "q")
    assert key_range("", "", "m") == ("m\x01", None)
    # A marker that is a common prefix skips every name under it.
    assert key_range("", "/", "a/") == ("a0", None)
    # A marker before the prefix does not widen the range.
    assert key_range("p", "", "a") == ("p", "q")
    # A marker past the prefix's range leaves nothing.
    assert key_range("p", "", "q") is None


def test_merge_sorted_keeps_one_of_equal_keys_and_stops_at_the_limit() -> None:
    merged = merge_sorted([["a", "c/", "d"], ["b", "c/", "e"]], key_of=str, limit=4)
    assert merged == ["a", "b", "c/", "d"]


def test_arm_limits_start_at_twice_the_share_and_never_exceed_the_page() -> None:
    assert first_arm_limit(wanted=1001, arms=64) == 32
    assert first_arm_limit(wanted=3, arms=64) == 3
    assert first_arm_limit(wanted=1001, arms=1) == 1001
    # 32 per arm covered 200 entries; 801 missing at that density, with a margin.
    assert next_arm_limit(32, covered=200, missing=801, wanted=1001) == 193
    assert next_arm_limit(32, covered=1, missing=900, wanted=1001) == 1001
    assert next_arm_limit(32, covered=1000, missing=1, wanted=1001) == 64


def test_one_shard_is_taken_as_it_is() -> None:
    assert merge_sorted([["a", "b/", "c"]], key_of=str, limit=2) == ["a", "b/"]


def test_row_budgets_start_at_four_rows_an_entry_and_grow_with_the_density_found() -> None:
    assert first_row_budget(wanted=1001) == 4004
    assert first_row_budget(wanted=3) == 256  # the least worth a round trip
    # 4,004 rows covered 400 entries: 601 missing at 10 rows each, with a margin.
    assert next_row_budget(4004, covered=400, missing=601) == 9025
    # A round that covered nearly all still doubles, so that pages end in few rounds.
    assert next_row_budget(4004, covered=1000, missing=1) == 8008
    assert next_row_budget(4004, covered=1, missing=1000) == 262_144  # capped


def test_a_delimiter_listing_skip_scans_only_when_prefixes_hold_many_keys() -> None:
    # 2,048 rows covered 150 entries: 14 keys a prefix, rows are cheaper than steps.
    assert not prefer_skip_scan(rows_read=2048, covered=150, arms_per_shard=64)
    # 2,048 rows covered 4 entries: a step per arm (64 x 4 rows) is cheaper.
    assert prefer_skip_scan(rows_read=2048, covered=4, arms_per_shard=64)
    assert prefer_skip_scan(rows_read=2048, covered=0, arms_per_shard=1)


def test_a_shard_is_asked_first_for_its_share_of_a_page_and_four_spreads_more() -> None:
    assert first_key_limit(wanted=1001, share=1.0) == 1001
    # Half the vnodes: 500.5 on average, spread 15.8.
    assert first_key_limit(wanted=1001, share=0.5) == 565
    # A quarter: 250.25, spread 13.7; the four shards read 1,228 rows, not 4,004.
    assert first_key_limit(wanted=1001, share=0.25) == 307
    assert first_key_limit(wanted=2, share=0.5) == 2  # never more than the page


def read_in_memory(shards: list[list[str]], rounds: list[int]) -> listing.ShardReader[str]:
    """A reader of sorted in-memory shards that counts its rounds (calls at one start)."""

    async def read(shard: int, start: str, limit: int) -> list[str]:
        rounds.append(shard)
        keys = shards[shard]
        at = bisect.bisect_left(keys, start)
        return keys[at : at + limit]

    return read


spread_keys = st.lists(st.tuples(names, st.integers(0, 3)), unique_by=lambda kv: kv[0], max_size=60)


@given(
    placed=spread_keys,
    shares=st.lists(st.integers(1, 8), min_size=1, max_size=4),
    lower=names,
    wanted=st.integers(1, 25),
    spreads=st.sampled_from([4, 0, -3]),
)
def test_first_keys_equal_the_first_of_all_keys_in_two_rounds_at_most(
    placed: list[tuple[str, int]], shares: list[int], lower: str, wanted: int, spreads: float
) -> None:
    """However keys fall on shards (evenly or all on one), and however short the first
    round's limits (fewer spreads than the real four make second rounds common)."""
    shards: list[list[str]] = [[] for _ in shares]
    for key, shard in placed:
        shards[shard % len(shares)].append(key)
    for keys in shards:
        keys.sort()
    calls: list[int] = []
    read = read_in_memory(shards, calls)
    fractions = [share / sum(shares) for share in shares]
    original = listing.SHARE_SPREADS
    listing.SHARE_SPREADS = spreads
    try:
        found = asyncio.run(first_keys(fractions, read, lower, str, wanted))
    finally:
        listing.SHARE_SPREADS = original
    expected = sorted(key for key, _ in placed if key >= lower)[:wanted]
    assert found == expected
    assert len(calls) <= 2 * len(shares)
    assert all(calls.count(shard) <= 2 for shard in range(len(shares)))


def test_a_shard_that_fell_short_is_read_on_from_its_last_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Shard 0 holds the page's first keys but was asked, like shard 1, for half the page.
    # With no margin (its mean plus one), that is 3 keys: "d" takes a second read of shard 0.
    shards = [["a", "b", "c", "d"], ["x", "y"]]
    calls: list[int] = []
    monkeypatch.setattr(listing, "SHARE_SPREADS", 0)
    found = asyncio.run(first_keys([0.5, 0.5], read_in_memory(shards, calls), "", str, 4))
    assert found == ["a", "b", "c", "d"]
    assert calls == [0, 1, 0]
