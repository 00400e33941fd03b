"""One-row writes group-committed per shard (shoal/metadata/batched.py, WriteBatcher): writes
that wait together commit together, each gets its own answer, and a failing write fails
alone without taking the others of its batch with it."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from shoal.metadata import MetadataStore, ObjectWrite
from shoal.metadata.batched import WriteBatcher
from tests.fixtures.postgres import MakeStore

# Each write records the transaction it ran in and when, in that transaction, it ran.
WRITE = b"""
INSERT INTO written (key, n, xid, step)
VALUES ($1::text, $2::int, pg_current_xact_id()::text, nextval('steps'))
RETURNING key, n
"""


@pytest.fixture(scope="module")
def store(make_store: MakeStore, run: Any) -> MetadataStore:
    store = make_store(shards=1, vnodes=2, pool_max_size=4)

    async def create_table() -> None:
        async with store.shards.placed()[0].pool.connection() as conn:
            await conn.execute(
                "CREATE TABLE written (key text, n int CHECK (n >= 0), xid text, step bigint);"
                "CREATE SEQUENCE steps"
            )

    run(create_table())
    return store


def writer_of(store: MetadataStore) -> WriteBatcher:
    return WriteBatcher(store.shards.placed()[0].pool, batches_at_once=1)


def rows_written(store: MetadataStore, run: Any, keys: list[str]) -> list[tuple[Any, ...]]:
    async def select() -> list[tuple[Any, ...]]:
        async with store.shards.placed()[0].pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT key, n, xid FROM written WHERE key = ANY(%s) ORDER BY step", [keys]
            )
            return await cursor.fetchall()

    return run(select())


def test_writes_waiting_together_commit_together(store: MetadataStore, run: Any) -> None:
    writes = writer_of(store)
    keys = [f"together-{n:03d}" for n in range(100)]

    async def many() -> list[Any]:
        return await asyncio.gather(
            *(writes.write(WRITE, [key, n], (0, key)) for n, key in enumerate(keys))
        )

    answers = run(many())
    assert answers == [[{"key": key, "n": n}] for n, key in enumerate(keys)]
    written = rows_written(store, run, keys)
    assert sorted(key for key, _, _ in written) == keys
    # The first write goes alone; the rest waited for it and commit in batches of at most 32.
    transactions = {xid for _, _, xid in written}
    assert 2 <= len(transactions) == writes.batches_sent <= 1 + 4
    run(writes.close())


def test_a_batch_takes_its_rows_in_order(store: MetadataStore, run: Any) -> None:
    """Writes arriving in descending order run in ascending (vnode, name) order inside their
    transaction, so two batches never lock the same rows in opposite orders."""
    writes = writer_of(store)
    orders = [(vnode, f"order-{name}") for vnode in (1, 0) for name in "zyxa"]

    async def descending() -> None:
        await asyncio.gather(
            *(writes.write(WRITE, [name, vnode], (vnode, name)) for vnode, name in orders)
        )

    run(descending())
    written = rows_written(store, run, [name for _, name in orders])
    by_transaction: dict[str, list[tuple[int, str]]] = {}
    for name, vnode, xid in written:
        by_transaction.setdefault(xid, []).append((vnode, name))
    assert max(map(len, by_transaction.values())) > 1  # some did share a transaction
    for taken in by_transaction.values():
        assert taken == sorted(taken)
    run(writes.close())


def test_a_failing_write_fails_alone_and_the_rest_commit(store: MetadataStore, run: Any) -> None:
    """A CHECK violation in the middle of a batch rolls the batch back in the server; every
    write of it goes again alone, and only the failing one sees the error."""
    writes = writer_of(store)
    values = [("fail-a", 1), ("fail-b", 2), ("fail-c", -1), ("fail-d", 3), ("fail-e", -2)]

    async def mixed() -> list[Any]:
        return await asyncio.gather(
            *(writes.write(WRITE, [key, n], (0, key)) for key, n in values),
            return_exceptions=True,
        )

    a, b, c, d, e = run(mixed())
    assert isinstance(c, psycopg.errors.CheckViolation)
    assert isinstance(e, psycopg.errors.CheckViolation)
    assert [a, b, d] == [
        [{"key": "fail-a", "n": 1}],
        [{"key": "fail-b", "n": 2}],
        [{"key": "fail-d", "n": 3}],
    ]
    written = rows_written(store, run, [key for key, _ in values])
    # Each committed once: the rolled-back batch left nothing behind.
    assert [(key, n) for key, n, _ in written] == [("fail-a", 1), ("fail-b", 2), ("fail-d", 3)]
    run(writes.close())


def test_concurrent_puts_of_one_key_replace_each_other_once(
    make_store: MakeStore, run: Any
) -> None:
    """Puts of one name that share a batch run one after the other in its transaction: each
    replaced version is some put's, and each is replaced exactly once."""
    store = make_store(shards=1, vnodes=4)

    def version() -> ObjectWrite:
        return ObjectWrite(content_length=1, content_md5=b"0" * 16, data=b"x")

    async def race() -> tuple[list[Any], Any]:
        owner = (await store.accounts.create(f"race-{uuid.uuid4().hex[:8]}")).id
        bucket = f"race-{uuid.uuid4().hex[:8]}"
        await store.buckets.create(owner, bucket)
        writes = [version() for _ in range(60)]
        results = await asyncio.gather(
            *(store.objects.put(owner, bucket, "one-key", write) for write in writes)
        )
        live = await store.objects.get(owner, bucket, "one-key")
        return [(write.id, result) for write, result in zip(writes, results, strict=True)], live

    puts, live = run(race())
    ids = {written for written, _ in puts}
    replaced = [result.replaced for _, result in puts if result.replaced is not None]
    assert all(result.id == written for written, result in puts)
    assert len(replaced) == len(puts) - 1 == len(set(replaced))
    assert set(replaced) | {live.id} == ids
    assert store.shards.placed()[0].writes.batches_sent < len(puts)
