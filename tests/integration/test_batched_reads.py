"""Point reads batched per shard (shoal/metadata/batched.py): each read gets its own rows or
its own error, whatever else shares its pipeline."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import psycopg
import pytest

from shoal.metadata import MetadataUnavailable, batched, prepared
from shoal.metadata.batched import ReadBatcher
from tests.fixtures.backends import until_a_backend_waits
from tests.fixtures.postgres import MakeStore

ADD = b"SELECT $1::int + 1 AS answer"
DIVIDE = b"SELECT 100 / $1::int AS answer"
SLEEP = b"SELECT pg_sleep($1::float8) IS NULL AS slept"


def batcher_of(make_store: MakeStore, **kwargs: Any) -> ReadBatcher:
    pool = make_store(shards=1, vnodes=2, pool_max_size=4).shards.placed()[0].pool
    return ReadBatcher(pool, **kwargs)


async def watcher_of(reads: ReadBatcher) -> psycopg.AsyncConnection[Any]:
    """A connection to look at the batches' backends with (until_a_backend_waits)."""
    return await psycopg.AsyncConnection.connect(reads.pool.conninfo, autocommit=True)


def test_reads_waiting_together_share_a_pipeline(make_store: MakeStore, run: Any) -> None:
    reads = batcher_of(make_store, batches_at_once=1)

    async def many() -> list[list[dict[str, Any]]]:
        return await asyncio.gather(*(reads.fetch(ADD, [n]) for n in range(100)))

    answers = run(many())
    assert answers == [[{"answer": n + 1}] for n in range(100)]
    # The first read goes alone; the rest waited for it and go in batches of at most 32.
    assert 2 <= reads.batches_sent <= 1 + 4
    run(reads.close())


def test_a_failing_read_fails_alone(make_store: MakeStore, run: Any) -> None:
    """A division by zero in the middle of a batch: the reads after it were aborted by the
    server and are sent again; only the failing read sees the error."""
    reads = batcher_of(make_store, batches_at_once=1)

    async def mixed() -> list[Any]:
        divisors = [5, 0, 4, 0, 2, 1]
        return await asyncio.gather(
            *(reads.fetch(DIVIDE, [d]) for d in divisors), return_exceptions=True
        )

    first, zero, second, zero_again, third, fourth = run(mixed())
    assert isinstance(zero, psycopg.errors.DivisionByZero)
    assert isinstance(zero_again, psycopg.errors.DivisionByZero)
    assert [first, second, third, fourth] == [
        [{"answer": 20}],
        [{"answer": 25}],
        [{"answer": 50}],
        [{"answer": 100}],
    ]
    run(reads.close())


def test_a_statement_that_cannot_be_prepared_fails_alone(make_store: MakeStore, run: Any) -> None:
    reads = batcher_of(make_store, batches_at_once=1)

    async def mixed() -> list[Any]:
        statements = [ADD, b"SELECT answer FROM no_such_table WHERE n = $1::int", ADD]
        return await asyncio.gather(
            *(reads.fetch(s, [n]) for n, s in enumerate(statements)), return_exceptions=True
        )

    first, missing, last = run(mixed())
    assert isinstance(missing, psycopg.errors.UndefinedTable)
    assert (first, last) == ([{"answer": 1}], [{"answer": 3}])
    run(reads.close())


def test_a_caller_that_gives_up_leaves_the_others_their_answers(
    make_store: MakeStore, run: Any
) -> None:
    reads = batcher_of(make_store, batches_at_once=1)

    async def one_gives_up() -> list[Any]:
        watcher = await watcher_of(reads)
        first = asyncio.create_task(reads.fetch(SLEEP, [0.2]))  # holds the only sender
        await until_a_backend_waits(watcher, "PgSleep")
        await watcher.close()
        quitter = asyncio.create_task(reads.fetch(ADD, [1]))
        stayers = [asyncio.create_task(reads.fetch(ADD, [n])) for n in (2, 3)]
        await asyncio.sleep(0.01)
        quitter.cancel()
        return [await first, *[await s for s in stayers]]

    assert run(one_gives_up()) == [[{"slept": False}], [{"answer": 3}], [{"answer": 4}]]
    run(reads.close())


def test_reads_go_on_after_deallocate_all(make_store: MakeStore, run: Any) -> None:
    reads = batcher_of(make_store, batches_at_once=1)
    # A kept connection serves its batcher alone: the DEALLOCATE must reach a pooled one.
    reads.keeps = False

    async def around_deallocate() -> list[Any]:
        before = await reads.fetch(ADD, [1])
        async with reads.pool.connection() as conn:  # LIFO pool: the batches' connection
            await conn.execute("DEALLOCATE ALL")
        after = await asyncio.gather(*(reads.fetch(ADD, [n]) for n in (2, 3)))
        return [before, *after]

    assert run(around_deallocate()) == [[{"answer": 2}], [{"answer": 3}], [{"answer": 4}]]
    run(reads.close())


def test_a_lost_connection_fails_its_batch_and_the_next_reads_reconnect(
    make_store: MakeStore, run: Any
) -> None:
    reads = batcher_of(make_store, batches_at_once=1)
    backend = b"SELECT pg_backend_pid() AS pid, pg_sleep($1::float8) IS NULL AS slept"

    async def killed() -> list[Any]:
        pid = (await reads.fetch(backend, [0]))[0]["pid"]
        async with await watcher_of(reads) as admin:
            doomed = asyncio.create_task(reads.fetch(backend, [5]))
            await until_a_backend_waits(admin, "PgSleep", pid=pid)
            await admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        with pytest.raises(MetadataUnavailable):  # a read: nothing of it can have committed
            await asyncio.wait_for(doomed, 10)
        return await reads.fetch(backend, [0])

    [row] = run(killed())
    assert row["slept"] is False
    run(reads.close())


def test_the_same_text_with_other_parameter_types_loads_its_own_columns(
    make_store: MakeStore, run: Any
) -> None:
    """`SELECT $1` is prepared once per parameter type, and its column's type follows: rows
    are loaded with the loaders of the statement they came from."""
    reads = batcher_of(make_store)
    echo = b"SELECT $1 AS v"

    async def echoes() -> list[Any]:
        return [await reads.fetch(echo, [value]) for value in (1, 100000, "abc")]

    assert run(echoes()) == [[{"v": 1}], [{"v": 100000}], [{"v": "abc"}]]
    run(reads.close())


def test_closing_fails_the_waiting_reads_and_refuses_new_ones(
    make_store: MakeStore, run: Any
) -> None:
    reads = batcher_of(make_store, batches_at_once=1)

    async def close_under_reads() -> list[Any]:
        async with await watcher_of(reads) as watcher:
            # Long enough to be still running when close() comes, on any machine's load.
            out = asyncio.create_task(reads.fetch(SLEEP, [5]))
            await until_a_backend_waits(watcher, "PgSleep")  # the only sender is in its pipeline
        queued = [asyncio.create_task(reads.fetch(ADD, [n])) for n in range(3)]
        await asyncio.sleep(0.01)
        await reads.close()
        _, pending = await asyncio.wait([out, *queued], timeout=3)
        assert not pending
        with pytest.raises(MetadataUnavailable):
            await reads.fetch(ADD, [1])
        return [type(t.exception()) for t in [out, *queued]]

    assert run(close_under_reads()) == [MetadataUnavailable] * 4


def test_a_value_that_cannot_be_sent_fails_alone(make_store: MakeStore, run: Any) -> None:
    reads = batcher_of(make_store, batches_at_once=1)

    async def batch_with_a_nul() -> list[Any]:
        async with await watcher_of(reads) as watcher:
            out = asyncio.create_task(reads.fetch(SLEEP, [0.2]))
            await until_a_backend_waits(watcher, "PgSleep")  # the only sender is in its pipeline
        statements = [(ADD, [1]), (b"SELECT length($1::text) AS n", ["a\x00b"]), (ADD, [2])]
        together = [reads.fetch(s, v) for s, v in statements]
        return (await asyncio.gather(out, *together, return_exceptions=True))[1:]

    first, nul, last = run(batch_with_a_nul())
    assert isinstance(nul, psycopg.DataError)
    assert (first, last) == ([{"answer": 2}], [{"answer": 3}])
    run(reads.close())


def test_a_statement_raising_invalid_statement_name_itself_is_retried_once(
    make_store: MakeStore, run: Any
) -> None:
    """Only a DEALLOCATE ALL should make a read prepare again; a statement that raises that
    SQLSTATE on its own gets its error after one retry."""
    reads = batcher_of(make_store, batches_at_once=1)

    async def raising() -> Any:
        async with reads.pool.connection() as conn:
            await conn.execute(
                "CREATE FUNCTION raises_26000(int) RETURNS int LANGUAGE plpgsql "
                "AS $$ BEGIN RAISE EXCEPTION 'no' USING ERRCODE = '26000'; END $$"
            )
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            await asyncio.wait_for(reads.fetch(b"SELECT raises_26000($1::int) AS v", [1]), 5)
        return reads.batches_sent

    assert run(raising()) == 2
    run(reads.close())


def test_a_cancelled_prepare_fails_alone(make_store: MakeStore, run: Any) -> None:
    """A PREPARE cancelled in the server (pg_cancel_backend, as statement_timeout would)
    fails its own read; the others of the batch are answered on the same connection."""
    reads = batcher_of(make_store, batches_at_once=1)
    pid_of = b"SELECT pg_backend_pid() AS pid"

    async def cancelled_while_locked() -> list[Any]:
        async with reads.pool.connection() as conn:
            await conn.execute("CREATE TABLE locked (n int)")
        pid = (await reads.fetch(pid_of, []))[0]["pid"]
        await reads.fetch(ADD, [0])
        watcher = await watcher_of(reads)
        async with await psycopg.AsyncConnection.connect(reads.pool.conninfo) as locker:
            await locker.execute("LOCK TABLE locked IN ACCESS EXCLUSIVE MODE")
            together = [
                asyncio.create_task(reads.fetch(ADD, [1])),
                asyncio.create_task(reads.fetch(b"SELECT n FROM locked WHERE n = $1::int", [1])),
                asyncio.create_task(reads.fetch(ADD, [2])),
            ]
            await until_a_backend_waits(watcher, "Lock", pid=pid)  # the sender's PREPARE
            await watcher.close()
            await locker.execute("SELECT pg_cancel_backend(%s)", [pid])
            answers = await asyncio.gather(*together, return_exceptions=True)
        same_backend = (await reads.fetch(pid_of, []))[0]["pid"] == pid
        return [*answers, same_backend]

    first, cancelled, last, same_backend = run(cancelled_while_locked())
    assert isinstance(cancelled, psycopg.errors.QueryCanceled)
    assert (first, last, same_backend) == ([{"answer": 2}], [{"answer": 3}], True)
    run(reads.close())


def test_a_closed_connection_is_freed_with_what_it_prepared(admin_dsn: str, run: Any) -> None:
    """What a connection prepared goes with it: the pool retires connections (max_lifetime,
    idle shrinking), and a registry that kept them alive would leak each one."""

    async def used_then_closed() -> weakref.ref[psycopg.AsyncConnection[Any]]:
        conn = await psycopg.AsyncConnection.connect(admin_dsn, autocommit=True)
        assert await prepared.fetch(conn, ADD, [1]) == [{"answer": 2}]
        await conn.close()
        return weakref.ref(conn)

    gone = run(used_then_closed())
    gc.collect()
    assert gone() is None


PID = b"SELECT pg_backend_pid() AS pid"


async def backend_of(reads: ReadBatcher) -> int:
    pid: int = (await reads.fetch(PID, []))[0]["pid"]
    return pid


def test_reads_one_after_another_go_on_the_kept_connection(make_store: MakeStore, run: Any) -> None:
    """After the first batch, the batcher keeps its connection: a read alone is sent at once
    on it, without a trip through the pool."""
    reads = batcher_of(make_store)

    async def one_by_one() -> tuple[set[int], int, int]:
        first = await backend_of(reads)
        checkouts = reads.pool.get_stats().get("requests_num", 0)
        sent = reads.batches_sent
        backends = {first} | {await backend_of(reads) for _ in range(50)}
        answers = [await reads.fetch(ADD, [n]) for n in range(50)]
        assert answers == [[{"answer": n + 1}] for n in range(50)]
        more = reads.pool.get_stats().get("requests_num", 0) - checkouts
        return backends, more, reads.batches_sent - sent

    backends, checkouts, batches = run(one_by_one())
    assert len(backends) == 1 and reads.kept_connection is not None
    assert checkouts == 0  # no read took a connection from the pool
    assert batches == 100  # and each still went in a pipeline of its own
    run(reads.close())


def test_a_small_pool_keeps_no_connection(make_store: MakeStore, run: Any) -> None:
    pool = make_store(shards=1, vnodes=2, pool_max_size=2).shards.placed()[0].pool
    reads = ReadBatcher(pool)
    assert run(reads.fetch(ADD, [1])) == [{"answer": 2}]
    assert not reads.keeps and reads.kept_connection is None
    assert pool.get_stats()["pool_available"] == pool.get_stats()["pool_size"]
    run(reads.close())


def test_a_kept_connection_whose_backend_ends_is_let_go_before_the_next_read(
    make_store: MakeStore, run: Any
) -> None:
    """The server ending an idle kept connection's backend (a restart, an administrator) makes
    its socket readable while nobody waits: the batcher lets it go then, so the next read goes
    on a new connection and succeeds instead of failing on the dead one."""
    reads = batcher_of(make_store)

    async def terminated() -> tuple[int, int]:
        pid = await backend_of(reads)
        async with await watcher_of(reads) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        deadline = asyncio.get_running_loop().time() + 5
        while reads.kept_connection is not None:  # the loop turns: the watch sees the end
            assert asyncio.get_running_loop().time() < deadline, "the dead connection is kept"
            await asyncio.sleep(0.01)
        return pid, await backend_of(reads)

    before, after = run(terminated())
    assert before != after
    run(reads.close())


def test_a_drained_pool_retires_the_kept_connection(make_store: MakeStore, run: Any) -> None:
    """A drain (the pool's answer to a connection that broke in use) replaces every
    connection, the kept one too."""
    reads = batcher_of(make_store)

    async def around_a_drain() -> tuple[int, int]:
        before = await backend_of(reads)
        await reads.pool.drain()
        return before, await backend_of(reads)

    before, after = run(around_a_drain())
    assert before != after
    run(reads.close())


def test_a_caller_that_gives_up_a_lone_read_leaves_the_batcher_working(
    make_store: MakeStore, run: Any
) -> None:
    """A read sent alone by its caller, cancelled in the middle of its pipeline: its
    connection is closed (nothing is left half read on it), and reads go on."""
    reads = batcher_of(make_store)

    async def given_up() -> tuple[int, list[Any]]:
        pid = await backend_of(reads)
        async with await watcher_of(reads) as admin:
            lone = asyncio.create_task(reads.fetch(SLEEP, [5]))
            await until_a_backend_waits(admin, "PgSleep", pid=pid)
            lone.cancel()
            with pytest.raises(asyncio.CancelledError):
                await lone
        return pid, await asyncio.gather(backend_of(reads), reads.fetch(ADD, [1]))

    pid, (new_pid, answer) = run(given_up())
    assert new_pid != pid and answer == [{"answer": 2}]
    run(reads.close())


def test_closing_hands_the_kept_connection_back(make_store: MakeStore, run: Any) -> None:
    reads = batcher_of(make_store)
    run(reads.fetch(ADD, [1]))
    assert reads.kept_connection is not None
    run(reads.close())
    assert reads.kept_connection is None
    stats = reads.pool.get_stats()
    assert stats["pool_available"] == stats["pool_size"]


def test_a_kept_connection_goes_back_to_the_pool_after_keep_seconds(
    make_store: MakeStore, run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """So that the pool's own upkeep (max_lifetime) reaches it: after KEEP_SECONDS the next
    batch takes a connection from the pool again (its last in, first out: often the same)."""
    reads = batcher_of(make_store)
    run(reads.fetch(ADD, [1]))
    checkouts = reads.pool.get_stats().get("requests_num", 0)
    monkeypatch.setattr(batched, "KEEP_SECONDS", 0.0)
    assert run(reads.fetch(ADD, [2])) == [{"answer": 3}]
    assert reads.pool.get_stats().get("requests_num", 0) == checkouts + 1
    run(reads.close())


def test_a_read_whose_socket_registration_the_loop_dropped_still_ends(
    make_store: MakeStore, run: Any
) -> None:
    """uvloop reports a socket in error once and then drops its registration (a server that
    ended the backend with a batch unread in its buffer). The watch does not wait on the loop
    alone: a wait nothing woke looks at the socket after CHECK_SECONDS and registers it again.
    Here the registration goes behind the watch's back while a read sleeps in the server."""
    reads = batcher_of(make_store)

    async def dropped() -> tuple[list[Any], float]:
        pid = await backend_of(reads)
        kept = reads.kept_connection
        assert kept is not None
        loop = asyncio.get_running_loop()
        async with await watcher_of(reads) as admin:
            lone = asyncio.create_task(reads.fetch(SLEEP, [0.3]))
            await until_a_backend_waits(admin, "PgSleep", pid=pid)
            loop.remove_reader(kept.pgconn.socket)  # what uvloop does after the one report
            started = loop.time()
            rows = await asyncio.wait_for(lone, 5)
        return rows, loop.time() - started

    rows, seconds = run(dropped())
    assert rows == [{"slept": False}]  # pg_sleep's void is not NULL: the read's own answer
    # The sleep, and a few checks after it (a lost watch would wait out the 5 s above).
    assert seconds < 0.3 + 2.5
    assert run(reads.fetch(ADD, [1])) == [{"answer": 2}]  # registered again, it goes on
    run(reads.close())
