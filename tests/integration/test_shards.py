"""What the shard set keeps per process: its connection pools and its bucket cache."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from shoal.config import MetadataConfig, ShardConfig
from shoal.metadata import MetadataStore, ObjectWrite, bucket_cache, prepared
from shoal.metadata.errors import SchemaError
from shoal.metadata.migrate import migrate
from shoal.metadata.schema import VNODE_MIGRATIONS
from shoal.metadata.shards import LastInFirstOutPool
from tests.fixtures.backends import until_a_backend_waits
from tests.fixtures.postgres import MIGRATING, MakeStore, create_databases, unique


def test_pool_hands_out_the_connection_returned_last(make_store: MakeStore, run: Any) -> None:
    store = make_store(shards=1, vnodes=2, pool_max_size=4)
    pool = store.shards.placed()[0].pool
    assert isinstance(pool, LastInFirstOutPool)

    async def backend_pids() -> list[int]:
        acquired = asyncio.Semaphore(0)

        async def hold(release: asyncio.Event) -> int:
            # The pool opens the second to fourth connections one after another, as callers
            # wait: on a loaded machine that takes longer than the pool's one second.
            async with pool.connection(timeout=30) as conn:
                acquired.release()
                await release.wait()
                return conn.info.backend_pid

        # Grow the pool to four connections, then return them in a known order.
        releases = [asyncio.Event() for _ in range(4)]
        holders = [asyncio.create_task(hold(r)) for r in releases]
        for _ in holders:
            await acquired.acquire()
        pids = []
        for release, holder in zip(releases, holders, strict=True):
            release.set()
            pids.append(await holder)
        assert len(set(pids)) == 4

        served = []
        for _ in range(3):
            async with pool.connection() as conn:
                served.append(conn.info.backend_pid)
        return [pids[-1], *served]

    last_returned, *served = run(backend_pids())
    assert served == [last_returned] * 3


def test_a_bucket_deleted_by_another_process_is_forgotten_at_once(
    make_store: MakeStore, run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only the deletion notice can make this store see the new incarnation in time.
    monkeypatch.setattr(bucket_cache, "KEEP_SECONDS", 600.0)
    here = make_store(shards=2, vnodes=4)
    configs = [ShardConfig(name, shard.pool.conninfo) for name, shard in here.shards.shards.items()]
    owner = run(here.accounts.create(unique("owner"))).id
    name = unique("again")

    async def recreate_elsewhere() -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
        first = await here.buckets.create(owner, name)
        assert (await here.objects.put(owner, name, "k", ObjectWrite(1, b"1" * 16))).id
        async with await MetadataStore.open(configs) as elsewhere:
            await elsewhere.buckets.delete(owner, name, force=True)
            second = await elsewhere.buckets.create(owner, name)
        for _ in range(100):
            seen = await here.buckets.get(owner, name)
            if seen.id != first.id:
                break
            await asyncio.sleep(0.05)
        await here.objects.put(owner, name, "k", ObjectWrite(2, b"2" * 16))
        written = await here.objects.get(owner, name, "k")
        return second.id, seen.id, written.bucket_id

    second, seen, written_into = run(recreate_elsewhere())
    assert seen == second
    assert written_into == second


def test_prepared_statements_survive_deallocate_all_and_errors(
    make_store: MakeStore, run: Any
) -> None:
    """prepared.fetch prepares once per connection; when DEALLOCATE ALL (which psycopg sends
    after a ROLLBACK on a connection with statements of its own) or DISCARD ALL dropped them,
    the next call prepares again; an error result is psycopg's exception, and the
    connection stays usable."""
    store = make_store(shards=1, vnodes=2, pool_max_size=1)
    pool = store.shards.placed()[0].pool
    statement = b"SELECT $1::int + 1 AS answer, $2::text AS name"

    async def calls() -> list[Any]:
        async with pool.connection() as conn:
            first = await prepared.fetch(conn, statement, [41, "a"])
            await conn.execute("DEALLOCATE ALL")
            again = await prepared.fetch(conn, statement, [1, None])  # a NULL: other types
            await conn.execute("DISCARD ALL")
            after_discard = await prepared.fetch(conn, statement, [2, "c"])
            with pytest.raises(psycopg.errors.DivisionByZero):
                await prepared.fetch(conn, b"SELECT 1 / $1::int AS x", [0])
            binary = await prepared.fetch(conn, statement, [3, "d"])
            nothing = await prepared.fetch(conn, b"SET application_name = 'x'", [])
            return [first, again, after_discard, binary, nothing]

    first, again, after_discard, binary, nothing = run(calls())
    assert first == [{"answer": 42, "name": "a"}]
    assert again == [{"answer": 2, "name": None}]
    assert after_discard == [{"answer": 3, "name": "c"}]
    assert binary == [{"answer": 4, "name": "d"}]
    assert nothing == []


def test_a_prepared_statement_waits_on_its_socket_without_spinning(
    make_store: MakeStore, run: Any
) -> None:
    """While PostgreSQL works on a statement, the caller's process sleeps: a statement of
    0.3 s costs it a small fraction of that in CPU (a busy wait would cost all of it)."""
    store = make_store(shards=1, vnodes=2, pool_max_size=1)
    pool = store.shards.placed()[0].pool

    async def slow_statement() -> float:
        async with pool.connection() as conn:
            started = time.process_time()
            await prepared.fetch(conn, b"SELECT pg_sleep($1::float8) AS slept", [0.3])
            return time.process_time() - started

    assert run(slow_statement()) < 0.1


def test_prepared_wait_reads_and_writes_in_many_pieces(admin_dsn: str, run: Any) -> None:
    """An answer of 2 MB arrives in many reads, and a 16 MB parameter leaves in many writes
    (libpq asks to wait for the socket to be writable)."""
    big = "x" * (16 * 1024 * 1024)

    async def calls() -> tuple[list[Any], list[Any]]:
        async with await psycopg.AsyncConnection.connect(admin_dsn, autocommit=True) as conn:
            rows = await prepared.fetch(
                conn, b"SELECT n, repeat('y', 1000) AS filler FROM generate_series(1, $1) n", [2000]
            )
            length = await prepared.fetch(conn, b"SELECT length($1::text) AS length", [big])
            return rows, length

    rows, length = run(calls())
    assert [row["n"] for row in rows] == list(range(1, 2001))
    assert all(row["filler"] == "y" * 1000 for row in rows)
    assert length == [{"length": len(big)}]


def test_a_cancelled_caller_cancels_its_statement_and_leaves_the_connection_usable(
    admin_dsn: str, run: Any
) -> None:
    """The statement is cancelled in the server and its answer read to the end (psycopg's
    wait does both), so the next statement on the connection runs at once."""

    async def cancelled_then_reused() -> tuple[bool, list[Any], float, Any]:
        async with (
            await psycopg.AsyncConnection.connect(admin_dsn, autocommit=True) as conn,
            await psycopg.AsyncConnection.connect(admin_dsn, autocommit=True) as watcher,
        ):
            sleeper = asyncio.ensure_future(
                prepared.fetch(conn, b"SELECT pg_sleep($1::float8) AS slept", [30])
            )
            await until_a_backend_waits(watcher, "PgSleep", pid=conn.info.backend_pid)
            sleeper.cancel()
            try:
                await sleeper
            except asyncio.CancelledError:
                cancelled = True
            started = time.monotonic()
            after = await prepared.fetch(conn, b"SELECT $1::int + 1 AS answer", [1])
            return cancelled, after, time.monotonic() - started, conn.info.transaction_status

    cancelled, after, seconds, status = run(cancelled_then_reused())
    assert cancelled and after == [{"answer": 2}]
    assert seconds < 5  # not after the 30 s sleep
    assert status == psycopg.pq.TransactionStatus.IDLE


def test_prepared_statement_names_are_never_reused_on_a_connection(
    make_store: MakeStore, run: Any
) -> None:
    """After DEALLOCATE ALL, a statement prepared anew and a stale one prepared again must
    not take a name that a statement prepared since still holds in the server."""
    store = make_store(shards=1, vnodes=2, pool_max_size=1)
    pool = store.shards.placed()[0].pool

    def statement(n: int) -> bytes:
        return b"SELECT $1::int + %d AS answer" % n

    async def calls() -> list[int]:
        answers = []
        async with pool.connection() as conn:
            for n in (1, 2):
                answers.append((await prepared.fetch(conn, statement(n), [0]))[0]["answer"])
            await conn.execute("DEALLOCATE ALL")
            for n in (3, 1, 4, 5, 6, 3):  # 3 is new, 1 stale, 4-6 new, 3 again
                answers.append((await prepared.fetch(conn, statement(n), [0]))[0]["answer"])
        return answers

    assert run(calls()) == [1, 2, 3, 1, 4, 5, 6, 3]


def test_a_shard_whose_pooled_connections_are_all_busy_is_not_silent(
    make_store: MakeStore, admin_dsn: str, run: Any
) -> None:
    """The health check (silent_shards, the gateway's readiness each second) asks on a
    connection of its own: a pool busy past the check's wait is a busy shard, not a silent
    one (which the gateway would mark down, failing the statements queued for it)."""
    store = make_store(shards=1, vnodes=2, pool_max_size=2, full_pools=True)
    pool = store.shards.catalog.pool
    assert run(store.silent_shards(5.0)) == []  # its connection made, however slow the machine

    async def check_while_the_pool_is_held() -> list[str]:
        held = [await pool.getconn() for _ in range(2)]
        try:
            # Under the pool's own wait (1 s): a ping through the pool would be cut off.
            return await store.silent_shards(0.9)
        finally:
            for conn in held:
                await pool.putconn(conn)

    assert run(check_while_the_pool_is_held()) == []
    # The check's own connection, broken as a server restart breaks it, is replaced at once.
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            [conninfo_to_dict(pool.conninfo)["dbname"]],
        )
    assert run(store.silent_shards(2.0)) == []


def test_a_process_refuses_to_open_shards_behind_its_schema_until_they_are_migrated(
    admin_dsn: str, run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway of newer code on vnodes that older code migrated would fail its writes
    after their commit: it refuses to start, naming what is behind, until `db migrate`."""
    configs = create_databases(admin_dsn, 2)
    config = MetadataConfig(vnodes=4, partitions_ahead=1)
    with monkeypatch.context() as older:  # the migrations of the code before the last one
        older.setattr(MIGRATING, "VNODE_MIGRATIONS", VNODE_MIGRATIONS[:-1])
        run(migrate(configs, config))
    latest = VNODE_MIGRATIONS[-1].version
    with pytest.raises(SchemaError) as refused:
        run(MetadataStore.open(configs, 2, poll_ring=False))
    message = str(refused.value)
    assert message.startswith("shard s0 is not migrated to this Shoal's schema (manta_bucket_")
    assert f" without {latest}; " in message
    assert message.endswith("run `shoal db migrate`")

    async def write_and_read() -> bytes:
        async with await MetadataStore.open(configs, 2, poll_ring=False) as store:
            owner = (await store.accounts.create(unique("owner"))).id
            bucket = unique("migrated")
            await store.buckets.create(owner, bucket)
            await store.objects.put(owner, bucket, "k", ObjectWrite(1, b"1" * 16))
            return bytes((await store.objects.get(owner, bucket, "k")).content_md5)

    run(migrate(configs, config))
    assert run(write_and_read()) == b"1" * 16
