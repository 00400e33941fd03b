"""One-row writes group-committed per shard (shoal/metadata/batched.py, WriteBatcher): writes
that wait together commit together, each gets its own answer, and a failing write fails
alone without taking the others of its batch with it."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

from shoal.metadata import MetadataStore, ObjectWrite, queries
from shoal.metadata.base import _bound, _no_partition_for_row, write_params
from shoal.metadata.batched import AfterCommit, WriteBatcher, WriteOrder
from shoal.metadata.errors import CommitUnknown
from shoal.metadata.models import Bucket
from shoal.metadata.ring import vnode_schema
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


OWNER = uuid.UUID(int=1)
BUCKETS = (uuid.UUID(int=1), uuid.UUID(int=2))


def order(key: str, vnode: int = 0, bucket: uuid.UUID = BUCKETS[0]) -> WriteOrder:
    return (vnode, OWNER, bucket, key)


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
            *(writes.write(WRITE, [key, n], order(key)) for n, key in enumerate(keys))
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
    """Writes arriving in descending order run in ascending order of vnode, then row key
    (owner, bucket id, name) inside their transaction, so two batches never lock the same
    rows in opposite orders: not even one name in two buckets of one vnode."""
    writes = writer_of(store)
    orders = [
        order(f"order-{name}", vnode, bucket)
        for vnode in (1, 0)
        for bucket in reversed(BUCKETS)
        for name in "zya"
    ]

    async def descending() -> None:
        await asyncio.gather(*(writes.write(WRITE, [repr(each), 0], each) for each in orders))

    run(descending())
    written = rows_written(store, run, [repr(each) for each in orders])
    taken_by_transaction: dict[str, list[WriteOrder]] = {}
    for key, _, xid in written:
        taken_by_transaction.setdefault(xid, []).append(next(o for o in orders if repr(o) == key))
    assert max(map(len, taken_by_transaction.values())) > 1  # some did share a transaction
    for taken in taken_by_transaction.values():
        assert taken == sorted(taken)
    run(writes.close())


def test_a_failing_write_fails_alone_and_the_rest_commit(store: MetadataStore, run: Any) -> None:
    """A CHECK violation in the middle of a batch rolls the batch back in the server; every
    write of it goes again alone, and only the failing one sees the error."""
    writes = writer_of(store)
    values = [("fail-a", 1), ("fail-b", 2), ("fail-c", -1), ("fail-d", 3), ("fail-e", -2)]

    async def mixed() -> list[Any]:
        return await asyncio.gather(
            *(writes.write(WRITE, [key, n], order(key)) for key, n in values),
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


def test_writes_one_after_another_commit_alone_on_the_kept_connection(
    store: MetadataStore, run: Any
) -> None:
    """Writes sent alone by their callers on the kept connection: each commits in its own
    transaction before it is answered, a failing one fails alone, and the connection serves
    the next write after it."""
    writes = writer_of(store)
    values = [("lone-a", 1), ("lone-b", -1), ("lone-c", 2)]

    async def one_by_one() -> list[Any]:
        answers: list[Any] = []
        for key, n in values:
            try:
                answers.append(await writes.write(WRITE, [key, n], order(key)))
            except psycopg.errors.CheckViolation as exc:
                answers.append(exc)
            assert writes.kept_connection is not None
        return answers

    a, b, c = run(one_by_one())
    assert isinstance(b, psycopg.errors.CheckViolation)
    assert (a, c) == ([{"key": "lone-a", "n": 1}], [{"key": "lone-c", "n": 2}])
    written = rows_written(store, run, [key for key, _ in values])
    assert [(key, n) for key, n, _ in written] == [("lone-a", 1), ("lone-c", 2)]
    assert written[0][2] != written[1][2]  # two transactions
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


def test_an_error_at_commit_fails_the_batch_not_its_writes(store: MetadataStore, run: Any) -> None:
    """A deferred constraint fails at the commit, after every statement succeeded: nothing of
    the batch is answered as done; each write goes again alone, the first commits, the
    second fails its own commit."""
    writes = writer_of(store)

    async def create_table() -> None:
        async with store.shards.placed()[0].pool.connection() as conn:
            await conn.execute(
                "CREATE TABLE deferred (k text UNIQUE DEFERRABLE INITIALLY DEFERRED, n int)"
            )

    insert = b"INSERT INTO deferred VALUES ($1::text, $2::int) RETURNING n"

    async def same_key_twice() -> list[Any]:
        first = asyncio.create_task(writes.write(insert, ["other", 0], order("other")))
        await asyncio.sleep(0)  # the first's batch is out (with or without the two below)
        return await asyncio.gather(
            first,
            writes.write(insert, ["same", 1], order("same")),
            writes.write(insert, ["same", 2], order("same")),
            return_exceptions=True,
        )

    run(create_table())
    other, one, two = run(same_key_twice())
    assert other == [{"n": 0}]
    assert one == [{"n": 1}]
    assert isinstance(two, psycopg.errors.UniqueViolation)
    # Whichever way the first batch formed: one that failed or held "other" alone, one that
    # failed, and each "same" alone.
    assert writes.batches_sent == 4

    async def kept() -> list[Any]:
        async with store.shards.placed()[0].pool.connection() as conn:
            cursor = await conn.execute("SELECT k, n FROM deferred ORDER BY k")
            return await cursor.fetchall()

    assert run(kept()) == [("other", 0), ("same", 1)]
    run(writes.close())


def test_last_modified_never_goes_back_behind_a_waiting_batch(
    make_store: MakeStore, run: Any
) -> None:
    """A batch whose first write waits for a row lock writes `k` after another write of `k`
    committed meanwhile: its version is stamped when its own statement started, so it is
    newer than the one it replaced, and that one's deletion record is not older than it."""
    store = make_store(shards=1, vnodes=1, pool_max_size=6)
    pool = store.shards.placed()[0].pool

    def version() -> ObjectWrite:
        return ObjectWrite(content_length=1, content_md5=b"0" * 16, sharks=["node-1"])

    async def race() -> tuple[Any, Any, list[Any]]:
        owner = (await store.accounts.create(f"lm-{uuid.uuid4().hex[:8]}")).id
        bucket = await store.buckets.create(owner, f"lm-{uuid.uuid4().hex[:8]}")
        await store.objects.put(owner, bucket.name, "a", version())
        await store.objects.put(owner, bucket.name, "k", version())
        writes = WriteBatcher(pool, batches_at_once=1)
        batched = {name: version() for name in ("a", "k")}
        statements = {
            name: _bound(queries.PUT_OBJECT, 0, write_params(owner, bucket.id, name, write))
            for name, write in batched.items()
        }
        async with await psycopg.AsyncConnection.connect(pool.conninfo) as blocker:
            await blocker.execute(
                f"SELECT 1 FROM {vnode_schema(0)}.manta_bucket_object"
                " WHERE bucket_id = %s AND name = 'a' FOR UPDATE",
                [bucket.id],
            )
            held = asyncio.gather(
                *(
                    writes.write(*statements[name], (0, owner, bucket.id, name))
                    for name in ("a", "k")
                )
            )
            await until_a_statement_waits_for_a_lock(pool)  # the batch of both, on "a"
            meanwhile = version()
            await store.objects.put(owner, bucket.name, "k", meanwhile)
        await held  # the blocker's transaction ended with its connection
        live = await store.objects.get(owner, bucket.name, "k")
        async with pool.connection() as conn:
            cursor = await conn.execute(
                f"SELECT modified, deleted_at FROM {vnode_schema(0)}.manta_bucket_deleted_object"
                " WHERE id = %s",
                [meanwhile.id],
            )
            records = await cursor.fetchall()
        await writes.close()
        return batched["k"], live, records

    batched_k, live, records = run(race())
    assert live.id == batched_k.id  # the batch's write of "k" came last
    [(replaced_modified, deleted_at)] = records
    assert live.modified > replaced_modified
    assert deleted_at >= replaced_modified


async def until_a_statement_waits_for_a_lock(pool: Any) -> None:
    async with pool.connection() as conn:
        for _ in range(1000):
            cursor = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            )
            row = await cursor.fetchone()
            if row and row[0]:
                return
            await asyncio.sleep(0.01)
    raise AssertionError("no statement waited for the lock within 10 s")


def test_object_writes_are_ordered_by_vnode_then_primary_key(
    store: MetadataStore, run: Any
) -> None:
    """What objects.py's writes hand the batcher as their order: the vnode, then the key of
    the one row they lock, the whole primary key (owner, bucket id, name)."""
    writes = store.shards.placed()[0].writes
    seen: list[WriteOrder] = []
    write = writes.write_then_read  # what every write goes through

    async def noting(statement: bytes, values: Any, order: WriteOrder, then: Any) -> Any:
        seen.append(order)
        return await write(statement, values, order, then)

    async def put_and_delete() -> tuple[Any, Any]:
        owner = (await store.accounts.create(f"ord-{uuid.uuid4().hex[:8]}")).id
        bucket = await store.buckets.create(owner, f"ord-{uuid.uuid4().hex[:8]}")
        written = ObjectWrite(content_length=1, content_md5=b"0" * 16, data=b"x")
        await store.objects.put(owner, bucket.name, "name", written)
        await store.objects.delete(owner, bucket.name, "name")
        return owner, bucket.id

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(writes, "write_then_read", noting)
        owner, bucket_id = run(put_and_delete())
    vnode = store.shards.ring.vnode_for_object(owner, bucket_id, "name")
    assert seen == [(vnode, owner, bucket_id, "name")] * 2


def test_a_missing_partition_is_told_from_a_check_constraint_by_sqlstate_and_diagnostics(
    admin_dsn: str,
) -> None:
    """Both are check_violation (23514); only the missing partition names no constraint, so
    `retrying_window` creates windows for that one alone, whatever the server's language."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE windows (at int) PARTITION BY RANGE (at)")
        conn.execute("CREATE TEMP TABLE checked (at int CHECK (at > 0))")
        with pytest.raises(psycopg.errors.CheckViolation) as no_partition:
            conn.execute("INSERT INTO windows VALUES (1)")
        with pytest.raises(psycopg.errors.CheckViolation) as constraint:
            conn.execute("INSERT INTO checked VALUES (0)")
    assert _no_partition_for_row(no_partition.value)
    assert not _no_partition_for_row(constraint.value)


def test_writes_recording_versions_create_a_missing_window(make_store: MakeStore, run: Any) -> None:
    """With no deleted-table window for now (all dropped), concurrent overwrites and deletes
    that share batches all succeed: the batch fails on the missing partition, each write goes
    again alone, and `retrying_window` creates the window before its second try."""
    # Each retry takes a connection of its own beside the batchers' (its window's DDL waits
    # its turn on the parent table's lock): room for all of them, opened before the race.
    store = make_store(shards=1, vnodes=1, pool_max_size=12, full_pools=True)
    pool = store.shards.placed()[0].pool

    def version() -> ObjectWrite:
        return ObjectWrite(content_length=1, content_md5=b"0" * 16, sharks=["node-1"])

    async def without_windows() -> tuple[list[Any], int]:
        owner = (await store.accounts.create(f"win-{uuid.uuid4().hex[:8]}")).id
        bucket = await store.buckets.create(owner, f"win-{uuid.uuid4().hex[:8]}")
        names = [f"object-{n}" for n in range(6)]
        for name in names:
            await store.objects.put(owner, bucket.name, name, version())
        async with pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = %s::regclass",
                [f"{vnode_schema(0)}.manta_bucket_deleted_object"],
            )
            for (window,) in await cursor.fetchall():
                await conn.execute(f"DROP TABLE {window}")
        answers = await asyncio.gather(
            *(store.objects.put(owner, bucket.name, name, version()) for name in names[:4]),
            *(store.objects.delete(owner, bucket.name, name) for name in names[4:]),
            return_exceptions=True,
        )
        async with pool.connection() as conn:
            cursor = await conn.execute(
                f"SELECT count(*) FROM {vnode_schema(0)}.manta_bucket_deleted_object"
            )
            row = await cursor.fetchone()
        return answers, row[0] if row else 0

    answers, records = run(without_windows())
    assert not [answer for answer in answers if isinstance(answer, BaseException)]
    assert records == 6  # four replaced versions, two deleted ones


def test_a_put_checks_its_bucket_in_its_own_pipeline_after_its_commit(
    store: MetadataStore, run: Any
) -> None:
    """A PUT reads its bucket afresh after its commit (Component.write_object_row: a
    DeleteBucket's mark means a 503). With the bucket's row on the object row's shard, that
    read goes in the write's own pipeline, after its Sync, not in a batch of reads of its
    own; PUTs of one batch into one bucket share it; and it still refuses a write into a
    bucket marked as being deleted."""
    shard = store.shards.placed()[0]
    owner = run(store.accounts.create(f"then-{uuid.uuid4().hex[:8]}")).id
    bucket = run(store.buckets.create(owner, f"then-{uuid.uuid4().hex[:8]}"))
    run(store.objects.put(owner, bucket.name, "first", empty()))
    reads, writes, checks = (
        shard.reads.batches_sent,
        shard.writes.batches_sent,
        shard.writes.reads_after_commit,
    )
    run(store.objects.put(owner, bucket.name, "second", empty()))
    assert shard.reads.batches_sent == reads
    assert (shard.writes.batches_sent, shard.writes.reads_after_commit) == (writes + 1, checks + 1)

    async def many() -> None:
        await asyncio.gather(
            *(store.objects.put(owner, bucket.name, f"many-{n}", empty()) for n in range(12))
        )

    writes, checks = shard.writes.batches_sent, shard.writes.reads_after_commit
    run(many())
    assert shard.writes.reads_after_commit - checks == shard.writes.batches_sent - writes < 12

    run(mark_deleting(store, owner, bucket))
    with pytest.raises(CommitUnknown, match="being deleted"):
        run(store.objects.put(owner, bucket.name, "third", empty()))
    assert shard.reads.batches_sent == reads  # judged by the read in its pipeline


def test_a_bucket_on_another_shard_is_read_after_the_commit(
    make_store: MakeStore, run: Any
) -> None:
    """Where the bucket's row is on another shard than the object row's, the read after the
    commit goes to that shard, in a batch of reads, and still refuses a write into a bucket
    marked as being deleted."""
    store = make_store(shards=2, vnodes=8)
    owner = run(store.accounts.create(f"apart-{uuid.uuid4().hex[:8]}")).id
    bucket = run(store.buckets.create(owner, f"apart-{uuid.uuid4().hex[:8]}"))
    ring = store.shards.ring
    bucket_shard = store.shards.of_vnode(ring.vnode_for_bucket(owner, bucket.name))

    def shard_of(name: str) -> Any:
        return store.shards.of_vnode(ring.vnode_for_object(owner, bucket.id, name))

    names = [f"k{n}" for n in range(64)]
    apart = next(n for n in names if shard_of(n) is not bucket_shard)
    together = next(n for n in names if shard_of(n) is bucket_shard)
    for name in (apart, together):  # warm: the bucket cached, statements prepared
        run(store.objects.put(owner, bucket.name, name, empty()))
    reads = bucket_shard.reads.batches_sent
    run(store.objects.put(owner, bucket.name, together, empty()))
    assert bucket_shard.reads.batches_sent == reads
    run(store.objects.put(owner, bucket.name, apart, empty()))
    assert bucket_shard.reads.batches_sent == reads + 1
    assert shard_of(apart).writes.reads_after_commit == 0

    run(mark_deleting(store, owner, bucket))
    for name in (apart, together):
        with pytest.raises(CommitUnknown, match="being deleted"):
            run(store.objects.put(owner, bucket.name, name, empty()))


def empty() -> ObjectWrite:
    """An empty object's write, each a version of its own."""
    return ObjectWrite(content_length=0, content_md5=b"0" * 16, data=b"")


async def mark_deleting(store: MetadataStore, owner: uuid.UUID, bucket: Bucket) -> None:
    """Mark `bucket` as being deleted, as a DeleteBucket's first step does."""
    vnode = store.shards.ring.vnode_for_bucket(owner, bucket.name)
    async with store.shards.of_vnode(vnode).pool.connection() as conn:
        await conn.execute(
            f"INSERT INTO {vnode_schema(vnode)}.manta_bucket_deleting (owner, name, id, token) "
            "VALUES (%s, %s, %s, gen_random_uuid())",
            [owner, bucket.name, bucket.id],
        )


def test_a_read_after_the_commit_runs_outside_the_batch_and_fails_alone(
    store: MetadataStore, run: Any
) -> None:
    """A write's AfterCommit read runs after its batch's Sync, in a transaction of its own
    (no transaction id of the batch's), and sees the batch committed; writes of one batch
    that want the same read share one; a read that fails leaves its writes committed
    and answered, with no rows of it, and so does one that cannot even be prepared; a write
    that fails gets its error, not a read's rows."""
    writes = writer_of(store)
    outside = AfterCommit(
        b"SELECT pg_current_xact_id_if_assigned() AS xid,"
        b" (SELECT count(*) FROM written WHERE key = ANY($1::text[]))::int AS seen",
        (["after-2", "after-3"],),
    )
    failing = AfterCommit(b"SELECT 1 / $1::int AS quotient", (0,))
    unprepared = AfterCommit(b"SELECT 1 FROM no_such_table", ())

    async def batch() -> list[Any]:
        return await asyncio.gather(
            *(
                writes.write_then_read(WRITE, [key, n], order(key), then)
                for key, n, then in (
                    ("after-0", 0, None),  # goes alone: the rest wait for it, together
                    ("after-1", 1, failing),  # sent first: the reads after it still run
                    ("after-2", 2, outside),
                    ("after-3", 3, outside),
                    ("after-4", 4, unprepared),
                )
            )
        )

    checks = writes.reads_after_commit
    assert run(batch()) == [
        ([{"key": "after-0", "n": 0}], None),
        ([{"key": "after-1", "n": 1}], None),
        ([{"key": "after-2", "n": 2}], [{"xid": None, "seen": 2}]),
        ([{"key": "after-3", "n": 3}], [{"xid": None, "seen": 2}]),
        ([{"key": "after-4", "n": 4}], None),
    ]
    assert writes.reads_after_commit - checks == 2  # one shared, one failed, none unprepared
    with pytest.raises(psycopg.errors.CheckViolation):
        run(writes.write_then_read(WRITE, ["after-5", -1], order("after-5"), outside))
    written = rows_written(store, run, [f"after-{n}" for n in range(6)])
    assert [key for key, _, _ in written] == [f"after-{n}" for n in range(5)]
    run(writes.close())


def test_writes_are_answered_apart_from_a_read_that_waits_or_is_lost(
    store: MetadataStore, run: Any
) -> None:
    """The writes of a batch that want no read are answered once it has committed, even
    while another write's read waits in the server (for a lock); a write whose read's
    answer is lost with the connection is answered as committed, without the read's rows
    (its caller reads for itself), and the batcher goes on on a new connection."""
    writes = writer_of(store)
    pool = store.shards.placed()[0].pool
    blocked = AfterCommit(b"SELECT count(*) AS n FROM locked_away", ())
    killed = AfterCommit(b"SELECT pg_terminate_backend(pg_backend_pid())", ())

    async def batch_of(then: AfterCommit, keys: tuple[str, str, str]) -> list[Any]:
        first, plain, reading = (
            asyncio.ensure_future(writes.write_then_read(WRITE, [key, 0], order(key), each))
            for key, each in zip(keys, (None, None, then), strict=True)
        )
        # The first goes alone, after the batch of one before it; the other two wait for
        # it, and go together.
        await first
        return [plain, reading]

    async def waiting_read() -> None:
        async with pool.connection() as conn:
            await conn.execute("CREATE TABLE IF NOT EXISTS locked_away (n int)")
        await writes.write_then_read(WRITE, ["warm", 0], order("warm"), blocked)  # prepared
        batches = writes.batches_sent
        async with await psycopg.AsyncConnection.connect(pool.conninfo) as locker:
            await locker.execute("BEGIN; LOCK TABLE locked_away IN ACCESS EXCLUSIVE MODE")
            plain, reading = await batch_of(blocked, ("lock-0", "lock-1", "lock-2"))
            assert await asyncio.wait_for(plain, 10) == ([{"key": "lock-1", "n": 0}], None)
            await until_a_statement_waits_for_a_lock(pool)
            assert not reading.done() and writes.batches_sent == batches + 2
        assert await asyncio.wait_for(reading, 10) == ([{"key": "lock-2", "n": 0}], [{"n": 0}])

    async def lost_read() -> None:
        plain, reading = await batch_of(killed, ("lost-0", "lost-1", "lost-2"))
        assert await plain == ([{"key": "lost-1", "n": 0}], None)
        assert await reading == ([{"key": "lost-2", "n": 0}], None)
        assert await writes.write(WRITE, ["lost-3", 0], order("lost-3")) == [
            {"key": "lost-3", "n": 0}
        ]

    async def lost_after_a_rollback() -> None:
        # Queued in one turn of the event loop: "again-2" fails the batch that holds it and
        # "again-1", whose writes go again alone; the read sent after that batch's Sync is
        # then lost with the connection: the writes waiting again must not be failed.
        first, reading, bad = (
            asyncio.ensure_future(writes.write_then_read(WRITE, [key, n], order(key), then))
            for key, n, then in (
                ("again-0", 0, None),
                ("again-1", 0, killed),
                ("again-2", -1, None),
            )
        )
        assert await first == ([{"key": "again-0", "n": 0}], None)
        assert await reading == ([{"key": "again-1", "n": 0}], None)
        with pytest.raises(psycopg.errors.CheckViolation):
            await bad

    run(waiting_read())
    run(lost_read())
    run(lost_after_a_rollback())
    keys = ["lock-1", "lock-2", "lost-1", "lost-2", "lost-3", "again-0", "again-1"]
    assert sorted(key for key, _, _ in rows_written(store, run, keys)) == sorted(keys)
    run(writes.close())
