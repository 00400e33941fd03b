"""Listing equals a plain-Python model of S3 listing, on random keys, with 1 shard and with 3,
and with '/' listings read from the shard's directory, on 2.

Both read as few rows (or skip-scan steps) a round as they can, so that delimiter pages take
several rounds of reads (objects.list): on one shard they skip-scan after the first round, on
three they read rows in every round. Pages without a delimiter over three shards often take
two rounds (listing.first_keys).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import UTC
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.metadata import MetadataStore, ObjectWrite, directory, listing
from tests.fixtures.postgres import MakeStore, unique

# Characters that stress byte order and SQL: multibyte, LIKE wildcards, the delimiter, the
# smallest and largest code points, the edges of the surrogate gap.
ALPHABET = "ab/%_\\é☃😀\x01\ud7ff\ue000\uffff\U0010ffff"
key_text = st.text(alphabet=ALPHABET, min_size=1, max_size=6)
long_keys = st.text(alphabet="ab/é", min_size=1, max_size=4).map(lambda s: "x" * 1000 + s)
key_sets = st.lists(st.one_of(key_text, long_keys), min_size=0, max_size=25, unique=True)
delimiters = st.sampled_from(["", "/", "%", "_", "ab", "é/", "\U0010ffff"])


def model_listing(
    keys: list[str], prefix: str, delimiter: str, marker: str
) -> list[tuple[str, bool]]:
    """Every entry S3 would list after `marker`: (key or common prefix, is_prefix), in order."""
    entries: list[tuple[str, bool]] = []
    for key in sorted(keys, key=lambda k: k.encode("utf-8")):
        if not key.startswith(prefix) or key.encode() <= marker.encode():
            continue
        rest = key[len(prefix) :]
        if delimiter and delimiter in rest:
            common = prefix + rest[: rest.index(delimiter) + len(delimiter)]
            if common == marker or (entries and entries[-1] == (common, True)):
                continue
            entries.append((common, True))
        else:
            entries.append((key, False))
    return entries


def listed(page: Any) -> list[tuple[str, bool]]:
    return [(e.prefix, True) if hasattr(e, "prefix") else (e.name, False) for e in page.entries]


@pytest.fixture(
    scope="module",
    params=[1, 3, "directory"],
    ids=[
        "1-shard-one-entry-arms-skip-scans-or-directory",
        "3-shards-one-entry-arms-rows",
        "2-shards-directory",
    ],
)
def store(request: pytest.FixtureRequest, make_store: MakeStore) -> Iterator[MetadataStore]:
    # Tiny row budgets and one-step arms, so that most delimiter pages take many rounds. On
    # one shard they switch from reading rows to skip scans (or, for a '/' listing that
    # started inside a common prefix, to the directory) after their first round; on three,
    # with the directory off, they read rows in every round. With "directory", '/' listings it
    # serves read it (over two shards, which merge their common prefixes), others read rows.
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "directory":
            yield make_store(shards=2, vnodes=6)
            return
        if request.param == 3:
            patch.setattr(directory, "ENABLED", False)
        patch.setattr(listing, "MIN_ROW_BUDGET", 1)
        patch.setattr(listing, "FIRST_ROUND_ROWS_PER_ENTRY", 0.1)
        patch.setattr(listing, "MIN_ARM_LIMIT", 1)
        patch.setattr(listing, "FIRST_ROUND_SHARE", 0.1)
        skip_step_cost = 0.1 if request.param == 1 else 1_000_000
        patch.setattr(listing, "SKIP_STEP_COST_IN_ROWS", skip_step_cost)
        # Without a delimiter, each of three shards is asked first for its mean share of the
        # page plus one key, so that many pages need a second read of some shard.
        patch.setattr(listing, "SHARE_SPREADS", 0)
        yield make_store(shards=request.param, vnodes=6)


@pytest.fixture(scope="module")
def owner(store: MetadataStore, run: Any) -> Any:
    return run(store.accounts.create(unique("lister"))).id


def fill_bucket(store: MetadataStore, run: Any, owner: Any, keys: list[str]) -> str:
    bucket = unique("list")
    run(store.buckets.create(owner, bucket))
    for key in keys:
        write = ObjectWrite(content_length=len(key), content_md5=hashlib.md5(key.encode()).digest())
        run(store.objects.put(owner, bucket, key, write))
    return bucket


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), keys=key_sets, delimiter=delimiters)
def test_pages_walk_every_entry_exactly_once_in_byte_order(
    store: MetadataStore,
    run: Any,
    owner: Any,
    data: st.DataObject,
    keys: list[str],
    delimiter: str,
) -> None:
    bucket = fill_bucket(store, run, owner, keys)
    prefix = data.draw(
        st.one_of(
            st.just(""),
            st.sampled_from(keys or [""]).map(lambda k: k[:2]),
            key_text.filter(lambda k: len(k) < 3),
        ),
        label="prefix",
    )
    limit = data.draw(st.integers(1, 7), label="limit")
    expected = model_listing(keys, prefix, delimiter, "")

    walked: list[tuple[str, bool]] = []
    marker = ""
    while True:
        page = run(
            store.objects.list(
                owner, bucket, prefix=prefix, delimiter=delimiter, marker=marker, limit=limit
            )
        )
        walked += listed(page)
        assert len(page.entries) <= limit
        if not page.is_truncated:
            break
        assert len(page.entries) == limit
        marker = page.next_marker
    assert walked == expected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), keys=key_sets, delimiter=delimiters)
def test_one_page_from_any_marker_equals_the_model(
    store: MetadataStore,
    run: Any,
    owner: Any,
    data: st.DataObject,
    keys: list[str],
    delimiter: str,
) -> None:
    bucket = fill_bucket(store, run, owner, keys)
    choices = st.one_of(st.just(""), key_text, st.sampled_from(keys or [""]).map(lambda k: k[:3]))
    prefix = data.draw(choices, label="prefix")
    every_entry = [entry for entry, _ in model_listing(keys, prefix, delimiter, "")]
    marker = data.draw(st.one_of(choices, st.sampled_from(every_entry or [""])), label="marker")
    limit = data.draw(st.integers(1, 10), label="limit")
    expected = model_listing(keys, prefix, delimiter, marker)

    page = run(
        store.objects.list(
            owner, bucket, prefix=prefix, delimiter=delimiter, marker=marker, limit=limit
        )
    )
    assert listed(page) == expected[:limit]
    assert page.is_truncated == (len(expected) > limit)


def test_listing_returns_object_fields_and_literal_wildcards(
    store: MetadataStore, run: Any, owner: Any
) -> None:
    bucket = fill_bucket(store, run, owner, ["100%", "100_", "1000", "a_b", "axb"])
    page = run(store.objects.list(owner, bucket, prefix="100%"))
    assert [o.name for o in page.objects] == ["100%"]
    assert page.objects[0].etag == hashlib.md5(b"100%").hexdigest()
    assert page.objects[0].content_length == 4
    page = run(store.objects.list(owner, bucket, prefix="a_"))
    assert [o.name for o in page.objects] == ["a_b"]


def test_listed_modification_times_are_s3_timestamps_cut_to_milliseconds(
    store: MetadataStore, run: Any, owner: Any
) -> None:
    names = [f"t{i}" for i in range(5)]
    bucket = fill_bucket(store, run, owner, names)
    for listed_object in run(store.objects.list(owner, bucket)).objects:
        modified = run(store.objects.get(owner, bucket, listed_object.name)).modified
        # S3's form, in UTC; milliseconds cut, not rounded (so never a second too late).
        milliseconds = modified.microsecond // 1000
        expected = f"{modified.astimezone(UTC):%Y-%m-%dT%H:%M:%S}.{milliseconds:03d}Z"
        assert listed_object.last_modified == expected


def test_max_keys_is_bounded(store: MetadataStore, run: Any, owner: Any) -> None:
    bucket = fill_bucket(store, run, owner, ["k"])
    assert run(store.objects.list(owner, bucket, limit=0)).entries == []
    with pytest.raises(ValueError, match="limit"):
        run(store.objects.list(owner, bucket, limit=1001))
