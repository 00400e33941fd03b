"""The '/' directory (directory.py, schema.py's vnode migration 5): listings from it equal
the model and the row path, and its rows equal what the live names say, after deletes, under
concurrent writes, with a delete and a new name racing on one common prefix, multipart
completions and odd names.

`rows_listing` turns the directory off to compare with the path other delimiters take.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.metadata import MetadataStore, ObjectWrite, PartWrite, directory, queries
from shoal.metadata.base import write_params
from shoal.metadata.errors import ObjectNotFound, PreconditionFailed
from shoal.metadata.shards import render
from tests.fixtures.postgres import MakeStore, unique
from tests.integration.test_listing import fill_bucket, key_text, listed, model_listing


@pytest.fixture(scope="module")
def store(make_store: MakeStore) -> Iterator[MetadataStore]:
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
    """The same listing read from the object rows (the directory off)."""
    directory.ENABLED = False
    try:
        return run(walk(store, owner, bucket, prefix))
    finally:
        directory.ENABLED = True


Row = tuple[str, str, int]  # (parent, segment, vnode)


def directory_rows(store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str) -> set[Row]:
    """The bucket's directory rows over every shard."""
    bucket_id = run(store.buckets.get(owner, bucket)).id

    async def rows() -> set[Row]:
        found: set[Row] = set()
        for shard in store.shards.placed():
            async with shard.pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT parent, segment, vnode FROM shoal.bucket_directory "
                    "WHERE owner = %(owner)s AND bucket_id = %(bucket_id)s",
                    {"owner": owner, "bucket_id": bucket_id},
                )
                found |= set(await cur.fetchall())
        return found

    return run(rows())


def rows_of_names(store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str) -> set[Row]:
    """The rows the bucket's live names call for, each on its name's vnode: one per common
    prefix, one per directory."""
    bucket_id = run(store.buckets.get(owner, bucket)).id
    rows: set[Row] = set()
    for name in run(live_keys(store, owner, bucket)):
        vnode = store.ring.vnode_for_object(owner, bucket_id, name)
        parts = name.split("/")
        for level in range(1, len(parts)):
            rows.add(("".join(p + "/" for p in parts[: level - 1]), parts[level - 1] + "/", vnode))
        rows.add((name[: name.rfind("/") + 1], "", vnode))
    return rows


def assert_exact(store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str) -> None:
    """The directory's rows are exactly those of the live names, but for the root's own rows
    (parent and segment ''), which names without a '/' leave behind until the bucket goes."""
    found = directory_rows(store, run, owner, bucket)
    wanted = rows_of_names(store, run, owner, bucket)
    assert {row for row in found if row[:2] != ("", "")} == {
        row for row in wanted if row[:2] != ("", "")
    }
    assert {row for row in wanted if row[:2] == ("", "")} <= found


async def live_keys(store: MetadataStore, owner: uuid.UUID, bucket: str) -> list[str]:
    keys: list[str] = []
    marker = ""
    while True:
        page = await store.objects.list(owner, bucket, marker=marker)
        keys += [o.name for o in page.objects]
        if not page.is_truncated:
            return keys
        marker = page.next_marker or ""


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
    assert_exact(store, run, owner, bucket)


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
    assert_exact(store, run, owner, bucket)


def names_on_one_vnode(
    store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str, prefix: str
) -> tuple[str, str, int]:
    """Two names under `prefix` that live on the same vnode, and that vnode."""
    bucket_id = run(store.buckets.get(owner, bucket)).id
    seen: dict[int, str] = {}
    for i in range(1000):
        name = f"{prefix}k{i}"
        vnode = store.ring.vnode_for_object(owner, bucket_id, name)
        if vnode in seen:
            return seen[vnode], name, vnode
        seen[vnode] = name
    raise AssertionError("no two names on one vnode")


async def blocked_for_a_while(task: asyncio.Task[Any]) -> bool:
    """Whether `task` is still waiting after a while (for a lock another transaction holds)."""
    await asyncio.sleep(0.5)
    return not task.done()


async def waits_for_open_write(
    store: MetadataStore,
    vnode: int,
    statement: str,
    params: dict[str, Any],
    then: Callable[[], Awaitable[Any]],
) -> bool:
    """Whether `then` waits for a transaction on `vnode` that ran `statement` and is still
    open; it goes on once that transaction commits."""
    async with store.shards.of_vnode(vnode).pool.transaction() as conn:
        await conn.execute(render(statement, vnode), params)
        task = asyncio.create_task(then())
        waited = await blocked_for_a_while(task)
    await task
    return waited


def test_a_new_name_in_flight_keeps_its_prefix_when_the_last_other_name_goes(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    """A delete of the last name under a common prefix waits for a write of a new name
    under it that is in flight on the same vnode, then sees it and keeps the prefix's row."""
    bucket = unique("race")
    run(store.buckets.create(owner, bucket))
    old, new, vnode = names_on_one_vnode(store, run, owner, bucket, "p/")
    run(store.objects.put(owner, bucket, old, write(old)))
    bucket_id = run(store.buckets.get(owner, bucket)).id

    put = write_params(owner, bucket_id, new, write(new))
    waited = waits_for_open_write(
        store, vnode, queries.PUT_OBJECT, put, lambda: store.objects.delete(owner, bucket, old)
    )
    assert run(waited), "the delete did not wait for the new name's transaction"
    assert run(walk(store, owner, bucket, "")) == [("p/", True)]
    assert run(walk(store, owner, bucket, "p/")) == [(new, False)]
    assert_exact(store, run, owner, bucket)


def test_a_new_name_waits_for_the_delete_that_removes_its_prefix_and_adds_it_again(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    """A write of a new name under a common prefix whose last name is being deleted on the
    same vnode waits for that delete, which removed the prefix's row, and adds the row again."""
    bucket = unique("race")
    run(store.buckets.create(owner, bucket))
    old, new, vnode = names_on_one_vnode(store, run, owner, bucket, "q/r/")
    run(store.objects.put(owner, bucket, old, write(old)))
    bucket_id = run(store.buckets.get(owner, bucket)).id

    gone = {"owner": owner, "bucket_id": bucket_id, "name": old, "if_match": None}
    waited = waits_for_open_write(
        store,
        vnode,
        queries.DELETE_OBJECT_ID,
        gone,
        lambda: store.objects.put(owner, bucket, new, write(new)),
    )
    assert run(waited), "the new name did not wait for the delete's transaction"
    assert run(walk(store, owner, bucket, "")) == [("q/", True)]
    assert run(walk(store, owner, bucket, "q/")) == [("q/r/", True)]
    assert run(walk(store, owner, bucket, "q/r/")) == [(new, False)]
    assert_exact(store, run, owner, bucket)


def names_in_one_directory_on_one_vnode(
    store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str, count: int
) -> tuple[list[str], int]:
    """`count` names of one directory that live on the same vnode, in order, and the vnode."""
    bucket_id = run(store.buckets.get(owner, bucket)).id
    by_vnode: dict[int, list[str]] = {}
    for i in range(5000):
        name = f"hot/dir/k{i:05d}"
        same = by_vnode.setdefault(store.ring.vnode_for_object(owner, bucket_id, name), [])
        same.append(name)
        if len(same) == count:
            return same, store.ring.vnode_for_object(owner, bucket_id, name)
    raise AssertionError(f"no {count} names on one vnode")


def test_deletes_in_a_directory_that_keeps_a_name_do_not_wait_for_each_other(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    """A delete whose directory keeps another name on the vnode locks that name (FOR KEY
    SHARE) and no common prefix: another delete in the directory goes through while it is in
    flight; only a delete of the name it holds waits. The last name's delete then removes
    the rows."""
    bucket = unique("hotdir")
    run(store.buckets.create(owner, bucket))
    (first, held, last), vnode = names_in_one_directory_on_one_vnode(store, run, owner, bucket, 3)
    for name in (first, held, last):
        run(store.objects.put(owner, bucket, name, write(name)))
    bucket_id = run(store.buckets.get(owner, bucket)).id

    async def scenario() -> bool:
        async with store.shards.of_vnode(vnode).pool.transaction() as conn:
            params = {"owner": owner, "bucket_id": bucket_id, "name": first, "if_match": None}
            await conn.execute(render(queries.DELETE_OBJECT_ID, vnode), params)
            # Goes through with the transaction still open (a wait would time out here).
            await asyncio.wait_for(store.objects.delete(owner, bucket, last), 10)
            deleting_held = asyncio.create_task(store.objects.delete(owner, bucket, held))
            held_waited = await blocked_for_a_while(deleting_held)
        await deleting_held
        return held_waited

    assert run(scenario()), "the delete of the name held did not wait"
    assert run(walk(store, owner, bucket, "")) == []
    assert directory_rows(store, run, owner, bucket) == set()


def test_a_rolled_back_write_leaves_no_row_and_a_rolled_back_delete_keeps_it(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    """The rows change in the write's own transaction: a crash before its commit (here a
    rollback) leaves the directory as it was, so no key is ever hidden."""
    bucket = fill_bucket(store, run, owner, ["keep/k"])
    bucket_id = run(store.buckets.get(owner, bucket)).id
    before = directory_rows(store, run, owner, bucket)

    async def rolled_back(name: str, statement: str, params: dict[str, Any]) -> None:
        vnode = store.ring.vnode_for_object(owner, bucket_id, name)
        pool = store.shards.of_vnode(vnode).pool
        async with pool.connection() as conn, conn.transaction(force_rollback=True):
            await conn.execute(render(statement, vnode), params)

    run(
        rolled_back(
            "gone/x", queries.PUT_OBJECT, write_params(owner, bucket_id, "gone/x", write("x"))
        )
    )
    keep = {"owner": owner, "bucket_id": bucket_id, "name": "keep/k", "if_match": None}
    run(rolled_back("keep/k", queries.DELETE_OBJECT_ID, keep))
    assert directory_rows(store, run, owner, bucket) == before
    assert run(walk(store, owner, bucket, "")) == [("keep/", True)]


def test_a_write_that_does_not_happen_adds_no_row(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    bucket = fill_bucket(store, run, owner, ["d/e/f"])
    before = directory_rows(store, run, owner, bucket)
    with pytest.raises(ObjectNotFound):
        run(store.objects.put(owner, bucket, "x/y/z", write("x"), if_match=b"\0" * 16))
    with pytest.raises(PreconditionFailed):
        run(store.objects.put(owner, bucket, "d/e/f", write("again"), if_none_match=True))
    assert directory_rows(store, run, owner, bucket) == before
    assert {(parent, segment) for parent, segment, _ in before} == {
        ("", "d/"),
        ("d/", "e/"),
        ("d/e/", ""),
    }
    run(store.objects.put(owner, bucket, "x/y/z", write("x"), if_none_match=True))
    assert len(directory_rows(store, run, owner, bucket)) == 6
    assert_exact(store, run, owner, bucket)


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
    assert_exact(store, run, owner, bucket)


def test_rows_written_around_the_directory_are_filled_from_the_objects(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    """What vnode migration 5 does for rows written before it (and bulk loads after)."""
    keys = ["m/n/o", "m/p", "q/r/s/t", "u"]
    bucket = fill_bucket(store, run, owner, keys)
    bucket_id = run(store.buckets.get(owner, bucket)).id
    before = directory_rows(store, run, owner, bucket)

    async def refill() -> None:
        for shard in store.shards.placed():
            async with shard.pool.connection() as conn:
                await conn.execute(
                    "DELETE FROM shoal.bucket_directory WHERE bucket_id = %(id)s", {"id": bucket_id}
                )
                for vnode in shard.vnodes:
                    await conn.execute(render(queries.FILL_DIRECTORY, vnode))

    run(refill())
    assert directory_rows(store, run, owner, bucket) == before
    for prefix in ("", "m/", "q/", "q/r/"):
        assert run(walk(store, owner, bucket, prefix)) == model_listing(keys, prefix, "/", "")


def test_other_delimiters_and_prefixes_not_ending_in_slash_read_the_rows(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    keys = ["ab/c", "ab/d/e", "abc/f", "a|b|c", "a|d"]
    bucket = fill_bucket(store, run, owner, keys)
    for prefix, delimiter in (("a", "/"), ("ab", "/"), ("", "|"), ("a|", "|"), ("", "b/")):
        assert not directory.serves(prefix, delimiter)
        page = run(store.objects.list(owner, bucket, prefix=prefix, delimiter=delimiter))
        assert listed(page) == model_listing(keys, prefix, delimiter, ""), (prefix, delimiter)


def test_listings_under_concurrent_writes_never_miss_a_settled_key(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    """Writers put and delete keys under a few hot prefixes while listers walk them. Keys
    written before the walk began and never deleted must be listed (as themselves or by
    their common prefix) by every walk; afterwards, the directory equals the model and rows,
    and its rows are exactly those of the live names."""
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

    keys = run(live_keys(store, owner, bucket))
    for prefix in ("", "hot0/", "hot1/", "hot3/", "hot3/c2/"):
        expected = model_listing(keys, prefix, "/", "")
        assert run(walk(store, owner, bucket, prefix, limit=3)) == expected, prefix
        assert rows_listing(store, run, owner, bucket, prefix) == expected, prefix
    assert_exact(store, run, owner, bucket)


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
    a key after it (the directory cannot say so; such a page reads rows)."""
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


def test_delete_objects_of_many_deep_names_at_once_removes_their_rows(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    """Two DeleteObjects of 500 names each, five levels deep under shared prefixes, at once:
    each takes a lock per common prefix and vnode in one transaction a shard, and neither
    fails nor leaves a row behind."""
    names = [f"deep/{i % 7}/{i}/a/b" for i in range(1000)] + ["deep/kept"]
    bucket = unique("deep")
    run(store.buckets.create(owner, bucket))

    async def put_all() -> None:
        for start in range(0, len(names), 50):
            await asyncio.gather(
                *(store.objects.put(owner, bucket, n, write(n)) for n in names[start : start + 50])
            )

    run(put_all())

    async def delete_halves() -> list[dict[str, Any]]:
        return await asyncio.gather(
            store.objects.delete_many(owner, bucket, names[0:1000:2]),
            store.objects.delete_many(owner, bucket, names[1:1000:2]),
        )

    for outcome in run(delete_halves()):
        assert set(outcome.values()) == {None}
    assert run(walk(store, owner, bucket, "")) == [("deep/", True)]
    assert run(walk(store, owner, bucket, "deep/")) == [("deep/kept", False)]
    assert_exact(store, run, owner, bucket)


def test_replication_apply_keeps_the_rows_without_taking_locks(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    """As logical replication's apply writes a moving vnode's rows on its new shard
    (session_replication_role = replica), the directory follows them and no advisory lock is
    taken: the vnode's one writer, whose initial copy of millions of rows would otherwise hold
    a lock per common prefix until it ends."""
    bucket = unique("apply")
    run(store.buckets.create(owner, bucket))
    bucket_id = run(store.buckets.get(owner, bucket)).id
    name = "r/s/t"
    vnode = store.ring.vnode_for_object(owner, bucket_id, name)

    async def applied(statement: str, params: dict[str, Any]) -> int:
        async with store.shards.of_vnode(vnode).pool.connection() as conn, conn.transaction():
            await conn.execute("SET LOCAL session_replication_role = replica")
            await conn.execute(render(statement, vnode), params)
            cur = await conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                " AND pid = pg_backend_pid()"
            )
            return int((await cur.fetchone())[0])  # type: ignore[index]

    assert run(applied(queries.PUT_OBJECT, write_params(owner, bucket_id, name, write(name)))) == 0
    assert directory_rows(store, run, owner, bucket) == {
        ("", "r/", vnode),
        ("r/", "s/", vnode),
        ("r/s/", "", vnode),
    }
    gone = {"owner": owner, "bucket_id": bucket_id, "name": name, "if_match": None}
    assert run(applied(queries.DELETE_OBJECT_ID, gone)) == 0
    assert directory_rows(store, run, owner, bucket) == set()


def test_a_delete_that_empties_a_directory_refuses_repeatable_read(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    """Its check must see names committed before its locks were had, which a snapshot taken
    at the transaction's start would not: it refuses rather than remove a row too many."""
    bucket = fill_bucket(store, run, owner, ["only/one"])
    bucket_id = run(store.buckets.get(owner, bucket)).id
    vnode = store.ring.vnode_for_object(owner, bucket_id, "only/one")
    params = {"owner": owner, "bucket_id": bucket_id, "name": "only/one", "if_match": None}

    async def delete_in_repeatable_read() -> None:
        async with store.shards.of_vnode(vnode).pool.connection() as conn, conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            await conn.execute(render(queries.DELETE_OBJECT_ID, vnode), params)

    with pytest.raises(psycopg.errors.RaiseException, match="READ COMMITTED"):
        run(delete_in_repeatable_read())
    assert run(walk(store, owner, bucket, "")) == [("only/", True)]
