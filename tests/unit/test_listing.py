"""Listing arithmetic: successor, common prefixes, key ranges, the shard merge."""

from hypothesis import given
from hypothesis import strategies as st

from shoal.metadata.listing import (
    common_prefix,
    first_arm_limit,
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
