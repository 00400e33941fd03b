"""The '/' prefix index (prefix_index.py): listings from it equal the model and the row path,
after deletes, under concurrent writes, with stale rows, multipart completions and odd names.

The store reads '/' listings from the index from their first round (EveryListingDense), so
every listing here that the index serves is answered by it; `rows_listing` turns the index
off to compare with the path other delimiters take.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.metadata import MetadataStore, ObjectWrite, PartWrite, prefix_index, queries
from shoal.metadata.errors import ObjectNotFound, PreconditionFailed
from shoal.metadata.shards import render
from tests.fixtures.postgres import MakeStore, unique
from tests.integration.test_listing import (
    EveryListingDense,
    fill_bucket,
    key_text,
    listed,
    model_listing,
)


@pytest.fixture(scope="module")
def store(make_store: MakeStore) -> Iterator[MetadataStore]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prefix_index, "dense", EveryListingDense())
        yield make_store(shards=2, vnodes=6, pool_max_size=20)


@pytest.fixture(scope="module")
def owner(store: MetadataStore, run: Any) -> uuid.UUID:
    return run(store.accounts.create(unique("prefixes"))).id


def write(name: str) -> ObjectWrite:
    return ObjectWrite(content_length=len(name), content_md5=hashlib.md5(name.encode()).digest())


async def walk(
    store: MetadataStore, owner: uuid.UUID, bucket: str, prefix: str, limit: int = 1000
) -> list[tuple[str, bool]]:
    """Every entry of a '/' listing of `prefix`, page by page."""
    entries: list[tuple[str, bool]] = []
    marker = ""
    while True:
        page = await store.objects.list(
            owner, bucket, prefix=prefix, delimiter="/", marker=marker, limit=limit
        )
        entries += listed(page)
        if not page.is_truncated:
            return entries
        marker = page.next_marker or ""


def rows_listing(
    store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str, prefix: str
) -> list[tuple[str, bool]]:
    """The same listing read from the object rows (the index off)."""
    prefix_index.ENABLED = False
    try:
        return run(walk(store, owner, bucket, prefix))
    finally:
        prefix_index.ENABLED = True


def index_entries(
    store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str
) -> list[tuple[str, str]]:
    """The bucket's index rows, (parent, segment), over every vnode."""
    bucket_id = run(store.buckets.get(owner, bucket)).id

    async def rows() -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        for vnode in range(store.ring.vnodes):
            async with store.shards.of_vnode(vnode).pool.connection() as conn:
                statement = render(
                    "SELECT parent, segment FROM {schema}.manta_bucket_prefix "
                    "WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s",
                    vnode,
                )
                cur = await conn.execute(statement, {"owner": owner, "bucket_id": bucket_id})
                found += await cur.fetchall()
        return found

    return run(rows())


def index_rows(store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str) -> int:
    """How many index rows the bucket has, over every vnode."""
    return len(index_entries(store, run, owner, bucket))


# Names under '/' with odd bytes: multibyte, the delimiter doubled, leading and trailing,
# LIKE wildcards, the smallest character and the largest code point.
slash_keys = st.text(alphabet="a/é☃😀%_\x01\U0010ffff", min_size=1, max_size=7)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), keys=st.lists(slash_keys, max_size=25, unique=True))
def test_listings_after_deletes_equal_the_model_and_the_row_path(
    store: MetadataStore, run: Any, owner: uuid.UUID, data: st.DataObject, keys: list[str]
) -> None:
    bucket = fill_bucket(store, run, owner, keys)
    deleted = data.draw(st.lists(st.sampled_from(keys), unique=True) if keys else st.just([]))
    for key in deleted:
        run(store.objects.delete(owner, bucket, key))
    kept = [k for k in keys if k not in deleted]
    prefixes = {""} | {k[: i + 1] for k in keys for i, c in enumerate(k) if c == "/"}
    for prefix in sorted(prefixes):
        limit = data.draw(st.integers(1, 5), label="limit")
        expected = model_listing(kept, prefix, "/", "")
        assert run(walk(store, owner, bucket, prefix, limit)) == expected, prefix
        assert rows_listing(store, run, owner, bucket, prefix) == expected, prefix


def test_the_last_key_under_a_prefix_deleted_takes_the_prefix_away(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    bucket = fill_bucket(store, run, owner, ["a/b/c", "a/b/d", "a/e", "f"])
    run(store.objects.delete(owner, bucket, "a/b/c"))
    assert run(walk(store, owner, bucket, "a/")) == [("a/b/", True), ("a/e", False)]
    run(store.objects.delete(owner, bucket, "a/b/d"))
    assert run(walk(store, owner, bucket, "a/")) == [("a/e", False)]
    assert run(walk(store, owner, bucket, "")) == [("a/", True), ("f", False)]
    run(store.objects.delete(owner, bucket, "a/e"))
    assert run(walk(store, owner, bucket, "")) == [("f", False)]
    # A key written again under the emptied prefix brings it back.
    run(store.objects.put(owner, bucket, "a/b/z", write("a/b/z")))
    assert run(walk(store, owner, bucket, "")) == [("a/", True), ("f", False)]
    assert run(walk(store, owner, bucket, "a/")) == [("a/b/", True)]


def test_index_rows_without_keys_never_show_and_keys_never_hide(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    """Rows left with no key under them (by deletes, or by anything else that could leave a
    row without its key) are checked away, and removed; the index is written in the
    statement that writes the key, so no committed key is ever without its rows."""
    keys = ["k/1", "k/2/x"]
    bucket = fill_bucket(store, run, owner, keys)
    bucket_id = run(store.buckets.get(owner, bucket)).id

    async def stale_rows() -> None:
        for vnode in range(store.ring.vnodes):
            async with store.shards.of_vnode(vnode).pool.connection() as conn:
                await conn.execute(
                    render(
                        "INSERT INTO {schema}.manta_bucket_prefix VALUES "
                        "(%(owner)s, %(bucket_id)s, '', 'ghost/'), "
                        "(%(owner)s, %(bucket_id)s, 'k/', 'ghost/'), "
                        "(%(owner)s, %(bucket_id)s, '', 'k/') ON CONFLICT DO NOTHING",
                        vnode,
                    ),
                    {"owner": owner, "bucket_id": bucket_id},
                )

    # 'k/' gets a row on every vnode, most without a key under it: the check must find the
    # vnodes that hold one, whichever reported the prefix first.
    run(stale_rows())
    assert run(walk(store, owner, bucket, "")) == [("k/", True)]
    assert run(walk(store, owner, bucket, "k/")) == [("k/1", False), ("k/2/", True)]
    assert run(walk(store, owner, bucket, "ghost/")) == []
    # Each listing removes, in the background, the stale rows it met first for each prefix
    # (the first vnode of the merge that has a row of it, when that vnode holds no key under
    # it): listings go on until no row of 'ghost/', which has no key at all, remains. Rows of
    # 'k/' on vnodes without its keys may stay behind a vnode that holds some: they never show.
    # Generous: a removal that misses its short lock wait on a loaded machine backs off for
    # PREFIX_REPAIR_BACKOFF_SECONDS before a later listing tries that vnode again.
    deadline = time.monotonic() + 120
    while remaining := [row for row in index_entries(store, run, owner, bucket) if "ghost/" in row]:
        assert time.monotonic() < deadline, f"stale prefix rows were not removed: {remaining}"
        assert run(walk(store, owner, bucket, "")) == [("k/", True)]
        assert run(walk(store, owner, bucket, "k/")) == [("k/1", False), ("k/2/", True)]
        run(asyncio.sleep(0.05))
    live = {("", "k/"), ("k/", "2/")}
    assert live <= set(index_entries(store, run, owner, bucket))
    assert run(walk(store, owner, bucket, "")) == [("k/", True)]


def test_a_write_that_does_not_happen_adds_no_index_row(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    bucket = fill_bucket(store, run, owner, ["d/e/f"])
    before = index_rows(store, run, owner, bucket)
    with pytest.raises(ObjectNotFound):
        run(store.objects.put(owner, bucket, "x/y/z", write("x"), if_match=b"\0" * 16))
    with pytest.raises(PreconditionFailed):
        run(store.objects.put(owner, bucket, "d/e/f", write("again"), if_none_match=True))
    assert index_rows(store, run, owner, bucket) == before == 2
    run(store.objects.put(owner, bucket, "x/y/z", write("x"), if_none_match=True))
    assert index_rows(store, run, owner, bucket) == 4


def test_multipart_completion_adds_the_keys_prefixes(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    bucket = unique("mpu")
    run(store.buckets.create(owner, bucket))
    upload = run(store.uploads.create(owner, bucket, "videos/2026/big.mp4"))
    part = PartWrite(part_number=1, content_length=10, content_md5=b"\1" * 16)
    run(store.uploads.put_part(owner, bucket, "videos/2026/big.mp4", upload.id, part))
    assert run(walk(store, owner, bucket, "")) == []  # an open upload is no key
    run(
        store.uploads.complete(
            owner, bucket, "videos/2026/big.mp4", upload.id, [(1, part.content_md5)]
        )
    )
    assert run(walk(store, owner, bucket, "")) == [("videos/", True)]
    assert run(walk(store, owner, bucket, "videos/")) == [("videos/2026/", True)]
    assert run(walk(store, owner, bucket, "videos/2026/")) == [("videos/2026/big.mp4", False)]


def test_rows_written_around_the_index_are_filled_from_the_objects(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    """What vnode migration 4 does for rows written before it (and bulk loads after)."""
    keys = ["m/n/o", "m/p", "q/r/s/t", "u"]
    bucket = fill_bucket(store, run, owner, keys)
    bucket_id = run(store.buckets.get(owner, bucket)).id

    async def refill() -> None:
        for vnode in range(store.ring.vnodes):
            async with store.shards.of_vnode(vnode).pool.connection() as conn:
                await conn.execute(
                    render(
                        "DELETE FROM {schema}.manta_bucket_prefix WHERE bucket_id = %(id)s",
                        vnode,
                    ),
                    {"id": bucket_id},
                )
                await conn.execute(render(queries.FILL_PREFIX_INDEX, vnode))

    run(refill())
    for prefix in ("", "m/", "q/", "q/r/"):
        assert run(walk(store, owner, bucket, prefix)) == model_listing(keys, prefix, "/", "")


def test_other_delimiters_and_prefixes_not_ending_in_slash_read_the_rows(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    keys = ["ab/c", "ab/d/e", "abc/f", "a|b|c", "a|d"]
    bucket = fill_bucket(store, run, owner, keys)
    for prefix, delimiter in (("a", "/"), ("ab", "/"), ("", "|"), ("a|", "|"), ("", "b/")):
        assert not prefix_index.serves(prefix, delimiter)
        page = run(store.objects.list(owner, bucket, prefix=prefix, delimiter=delimiter))
        assert listed(page) == model_listing(keys, prefix, delimiter, ""), (prefix, delimiter)


def test_listings_under_concurrent_writes_never_miss_a_settled_key(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    """Writers put and delete keys under a few hot prefixes while listers walk them. Keys
    written before the walk began and never deleted must be listed (as themselves or by
    their common prefix) by every walk; afterwards, the index equals the model and rows."""
    settled = [f"hot{d}/s{i}" for d in range(3) for i in range(4)] + ["top"]
    bucket = fill_bucket(store, run, owner, settled)
    churn = [f"hot{d}/c{i}/x" for d in range(4) for i in range(6)] + [
        f"hot{d}/c{i}" for d in range(4) for i in range(3)
    ]

    async def writer(seed: int, stop: asyncio.Event) -> None:
        rnd = random.Random(seed)
        while not stop.is_set():
            name = rnd.choice(churn)
            if rnd.random() < 0.5:
                await store.objects.put(owner, bucket, name, write(name))
            else:
                await store.objects.delete(owner, bucket, name)

    async def lister(prefix: str, walks: int) -> list[list[tuple[str, bool]]]:
        return [await walk(store, owner, bucket, prefix, limit=2) for _ in range(walks)]

    async def scenario() -> tuple[list[list[tuple[str, bool]]], list[list[tuple[str, bool]]]]:
        stop = asyncio.Event()
        writers = [asyncio.create_task(writer(seed, stop)) for seed in range(6)]
        try:
            return await asyncio.gather(lister("", 15), lister("hot1/", 15))
        finally:
            stop.set()
            await asyncio.gather(*writers)

    roots, hot1 = run(scenario())
    for entries in roots:
        assert {("hot0/", True), ("hot1/", True), ("hot2/", True), ("top", False)} <= set(entries)
        assert entries == sorted(set(entries), key=lambda e: e[0].encode())
    for entries in hot1:
        assert {(f"hot1/s{i}", False) for i in range(4)} <= set(entries)
        assert entries == sorted(set(entries), key=lambda e: e[0].encode())

    async def live_keys() -> list[str]:
        page_keys: list[str] = []
        marker = ""
        while True:
            page = await store.objects.list(owner, bucket, marker=marker)
            page_keys += [o.name for o in page.objects]
            if not page.is_truncated:
                return page_keys
            marker = page.next_marker or ""

    keys = run(live_keys())
    for prefix in ("", "hot0/", "hot1/", "hot3/", "hot3/c2/"):
        expected = model_listing(keys, prefix, "/", "")
        assert run(walk(store, owner, bucket, prefix, limit=3)) == expected, prefix
        assert rows_listing(store, run, owner, bucket, prefix) == expected, prefix


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), keys=st.lists(key_text, max_size=20, unique=True))
def test_one_page_from_any_marker_equals_the_model(
    store: MetadataStore, run: Any, owner: uuid.UUID, data: st.DataObject, keys: list[str]
) -> None:
    bucket = fill_bucket(store, run, owner, keys)
    prefixes = ["", *sorted({k[: i + 1] for k in keys for i, c in enumerate(k) if c == "/"})]
    prefix = data.draw(st.sampled_from(prefixes), label="prefix")
    every_entry = [entry for entry, _ in model_listing(keys, prefix, "/", "")]
    marker = data.draw(
        st.one_of(st.just(""), key_text, st.sampled_from(every_entry or [""])), label="marker"
    )
    limit = data.draw(st.integers(1, 6), label="limit")
    expected = model_listing(keys, prefix, "/", marker)
    page = run(
        store.objects.list(owner, bucket, prefix=prefix, delimiter="/", marker=marker, limit=limit)
    )
    assert listed(page) == expected[:limit]
    assert page.is_truncated == (len(expected) > limit)


def test_a_marker_inside_a_common_prefix_lists_it_when_a_key_follows(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    """S3's start-after may name any key: the common prefix it falls in is listed when it holds
    a key after it (the index cannot say so; such a page reads rows)."""
    keys = ["/_", "a/b", "a/d", "a/d/e", "c"]
    bucket = fill_bucket(store, run, owner, keys)
    for prefix in ("", "a/"):
        for marker in ("/\\", "/_", "/a", "a/c", "a/d", "a/d/", "a/", "a", "b"):
            expected = model_listing(keys, prefix, "/", marker)
            for limit in (1, 3):
                page = run(
                    store.objects.list(
                        owner, bucket, prefix=prefix, delimiter="/", marker=marker, limit=limit
                    )
                )
                assert listed(page) == expected[:limit], (prefix, marker, limit)


def test_stale_rows_of_a_busy_vnode_stay_and_its_writes_wait_briefly(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    """A removal that cannot have its vnode's lock soon (a write in flight there) gives up,
    leaving the rows, which listings still check away."""
    bucket = fill_bucket(store, run, owner, ["busy/1"])
    bucket_id = run(store.buckets.get(owner, bucket)).id
    vnode = store.ring.vnode_for_object(owner, bucket_id, "busy/1")
    run(store.objects.delete(owner, bucket, "busy/1"))  # its rows are stale now
    params = {"owner": owner, "bucket_id": bucket_id}

    async def list_while_a_write_is_open() -> int:
        async with store.shards.of_vnode(vnode).pool.transaction() as conn:
            # A write in flight on the vnode: it holds the object table in ROW EXCLUSIVE mode.
            writing = "DELETE FROM {schema}.manta_bucket_object WHERE bucket_id = %(bucket_id)s"
            await conn.execute(render(writing, vnode), params)
            assert await walk(store, owner, bucket, "") == []
            deadline = time.monotonic() + 10
            while store.objects._repairs:
                assert time.monotonic() < deadline, "the removal did not give up"
                await asyncio.sleep(0.01)
            cur = await conn.execute(
                render(
                    "SELECT count(*) FROM {schema}.manta_bucket_prefix "
                    "WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s",
                    vnode,
                ),
                params,
            )
            return int((await cur.fetchone())[0])  # type: ignore[index]

    assert run(list_while_a_write_is_open()) == 1
    assert run(walk(store, owner, bucket, "")) == []
