"""Statements of one shard sent to PostgreSQL in batches: the statements that wait while a
batch is out go together in the next one, on one connection, in one pipeline.

Why: a GET or HEAD reads one row, a PUT or DELETE writes one. Sent alone, each statement is a
round trip of its own: a write to the server's socket, a wake-up of its backend, a statement,
a reply, and on the gateway's side a wait on the socket; a write also pays a commit of its
own. Under load those are most of the cost of the statement, for PostgreSQL and for the
gateway alike (docs/decisions.md, "Batched point reads" and "Group commit of object writes";
`bench/cpu_split.py get|put|delete --concurrency 64`). Batched, a busy gateway pays them once
for all the statements that arrived during the previous batch, and a lone statement goes out
at once, as before.

A batcher keeps the connection of its last batch, with its socket watched by the event loop
(socket_watch.py), instead of handing it back to the pool: the next batch skips the pool's
checkout and return and psycopg's registration of the socket for each wait. A statement
that finds no batch out and none waiting, after a batch of one, is sent by its caller on that
connection at once, without a sender task. At one client that is about an eighth of the
gateway's CPU per HEAD (docs/decisions.md, "A batcher keeps its connection"). The kept
connection goes back to the pool when the pool is drained or its shard marked down, when
the server speaks on it unasked (it is ending the backend), every KEEP_SECONDS, and at close;
a pool of fewer than KEEP_FROM_POOL_SIZE connections keeps none, leaving them to
transactions and listings.

ReadBatcher: point reads. Each read sees every write acknowledged before it was sent, as a
read of its own would. An error in one read aborts the reads after it in the same batch;
those are sent again.

WriteBatcher: writes of one object row each (group commit). The batch is one transaction, so
an error in any write rolls back every write of the batch: then each of them goes again in
a transaction of its own, and only a write that fails alone reports its error. No write is
answered before its batch has committed. Each batch takes its rows' locks in one order (by
vnode, then the row's key), so two batches never wait for each other in a cycle. The price:
a write that waits for a row lock holds up the writes behind it in its batch, and keeps the
rows of those before it locked, where alone it would hold up only itself.

A write may bring a read to run once it has committed (`AfterCommit`: a PUT's check that its
bucket still takes writes). It goes in the same pipeline, after the batch's Sync, so the
server runs it after the commit, in a transaction of its own, as a read sent after the
answer would run: one round trip where there were two. Writes of a batch that bring the
same read share one. The writes that bring none are answered once the batch has committed;
those that do, once their read is back too. A read that fails (or cannot be prepared, or
whose answer is lost with the connection) leaves its writes answered without it
(`then_rows` None), and their callers read for themselves. The price: a read that waits in
the server (on a vnode move's fence) holds the batch's connection and its sender meanwhile,
as a transaction does.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors, generators
from psycopg.pq import ExecStatus, TransactionStatus

from shoal.metadata import metrics, prepared
from shoal.metadata.errors import MetadataUnavailable
from shoal.metadata.outage import classified, connection_failed
from shoal.metadata.socket_watch import SocketWatch

if TYPE_CHECKING:
    from shoal.metadata.shards import ShardPool

# Batches of one kind (reads or writes) of one shard out at once, per process: enough to keep
# a few backends busy, few enough that statements wait for a batch rather than each taking a
# connection of its own.
BATCHES_AT_ONCE = 2
# Statements in one batch: a batch's statements wait for its last, so keep it short.
PER_BATCH = 32
# The longest a write waits for its commit before it is given up (a 503): a write waits
# for a batch, its row's lock and its commit, each a few milliseconds when the shard is
# well; this long, the shard is not (docs/durability.md, "PostgreSQL outages").
COMMIT_WAIT_SECONDS = 10.0
# A batcher keeps a connection between batches only from a pool at least this large: a
# shard's two batchers (reads, writes) then hold at most half of it while idle.
KEEP_FROM_POOL_SIZE = 4
# How long a batcher keeps one connection before handing it back to the pool, so that the
# pool's own upkeep (max_lifetime, its statistics) reaches it too.
KEEP_SECONDS = 60.0

# Where a write goes in its batch: its vnode, then its row's key in that vnode (owner, bucket
# id, name: the primary key of manta_bucket_object, so two writes of one row sort together).
WriteOrder = tuple[int, uuid.UUID, uuid.UUID, str]


@dataclass(frozen=True)
class AfterCommit:
    """A read-only statement ($1, $2, ... placeholders) and its values, which a write wants
    run once its batch has committed, in the batch's own pipeline (see the module's
    docstring)."""

    statement: bytes
    values: tuple[Any, ...]


@dataclass
class _Queued:
    """A statement waiting for its batch, and its caller's answer."""

    statement: bytes
    values: Sequence[Any]
    answer: asyncio.Future[list[prepared.Row]] = field(repr=False)
    order: tuple[Any, ...] = ()  # a write's WriteOrder; reads are not sorted
    then: AfterCommit | None = None  # a write's read after its commit
    then_rows: list[prepared.Row] | None = None  # that read's rows, once answered
    # The read it was last sent with; its rows, committed, wait here for that read's answer.
    read: _AfterRead | None = field(default=None, repr=False)
    committed_rows: list[prepared.Row] | None = None
    prepared_again: bool = False  # after InvalidSqlStatementName, once
    alone: bool = False  # a write whose batch failed: it goes again in a batch of its own
    synced: bool = False  # its batch's Sync was sent: a write of it may have committed

    @classmethod
    def of(
        cls,
        statement: bytes,
        values: Sequence[Any],
        order: tuple[Any, ...] = (),
        then: AfterCommit | None = None,
    ) -> _Queued:
        return cls(statement, values, asyncio.get_running_loop().create_future(), order, then)

    def fail(self, exc: BaseException) -> None:
        if not self.answer.done():  # its caller may have given up
            self.answer.set_exception(exc)


class _Held:
    """A connection a batcher holds (for a batch, or kept between batches), its socket
    watched for as long as it does."""

    def __init__(
        self,
        conn: psycopg.AsyncConnection[Any],
        pool: ShardPool,
        unasked: Callable[[_Held], None],
    ) -> None:
        self.conn = conn
        self.since = time.monotonic()
        self.drains = pool.drains  # the pool's drains so far: a later one retires it
        self.watch = SocketWatch(conn, lambda: unasked(self))


class _Batcher:
    """The batches of one shard's pool: what reads and writes share."""

    # Whether a statement of this kind may commit once its batch's Sync was sent.
    writes = False

    def __init__(
        self,
        pool: ShardPool,
        batches_at_once: int = BATCHES_AT_ONCE,
        per_batch: int = PER_BATCH,
    ) -> None:
        self.pool = pool
        self.batches_at_once = batches_at_once
        self.per_batch = per_batch
        self._waiting: deque[_Queued] = deque()
        self._senders: set[asyncio.Task[None]] = set()
        self._sending = 0
        self._closed = False
        self._kept: _Held | None = None
        # Whether the last batch held one statement. Only then does a statement that finds
        # no batch out go at once from its caller: under load, the statements of one turn
        # of the event loop (one for each request that arrived) wait for the sender task's
        # turn and go together, where the first of them alone would make two batches.
        self._last_alone = False
        self._letting_go: set[asyncio.Task[None]] = set()
        self.keeps = pool.max_size >= KEEP_FROM_POOL_SIZE
        self.batches_sent = 0  # pipelines written, for tests and the curious
        self.reads_after_commit = 0  # AfterCommit reads sent (each shared by its writes)
        pool.when_down(self._refuse_waiting)

    async def _enqueue(self, queued: _Queued) -> list[prepared.Row]:
        """Queue a statement ($1, $2, ... placeholders) for the next batch; its rows as dicts."""
        if self._closed:
            raise _store_closed()
        self.pool.check_reachable()  # a shard marked down: refused at once, never queued
        if self._last_alone and self._kept is not None and not self._sending and not self._waiting:
            held = self._take_kept()
            if held is not None:
                return await self._send_alone(held, queued)
        self._waiting.append(queued)
        if self._sending < self.batches_at_once:
            self._start_sender()
        return await queued.answer

    async def close(self) -> None:
        """Stop: statements still waiting, or in a batch, fail; later ones are refused."""
        self._closed = True
        for sender in list(self._senders):
            sender.cancel()
        await asyncio.gather(*self._senders, return_exceptions=True)
        for queued in self._take_all():
            queued.fail(_store_closed())
        held, self._kept = self._kept, None
        if held is not None:
            held.watch.stop()
            await self.pool.putconn(held.conn)
        await asyncio.gather(*self._letting_go, return_exceptions=True)

    @property
    def kept_connection(self) -> psycopg.AsyncConnection[Any] | None:
        """The connection kept between batches, if any: for tests and the curious."""
        return self._kept.conn if self._kept is not None else None

    def _start_sender(self) -> None:
        # A task, not the caller: a caller that gives up (its client went away) must not
        # take the batch of the others down with it.
        self._sending += 1
        sender = asyncio.create_task(self._send_waiting())
        self._senders.add(sender)
        sender.add_done_callback(self._senders.discard)

    async def _send_waiting(self) -> None:
        """Send batches on one connection (the kept one, or one from the pool) until no
        statement waits. `_sending` counts the senders that will still look at the queue: a
        sender leaves that count in the same step in which it saw the queue empty, so none
        is left waiting unseen."""
        try:
            held = await self._hold()
        except BaseException as exc:
            self._sending -= 1
            if not isinstance(exc, Exception):
                raise  # cancelled by close(), which fails what waits
            self._fail(self._next_batch(), exc)
            self._carry_on()
            return
        batch: list[_Queued] = []
        try:
            while self._waiting:
                batch = self._next_batch()
                await self._send(held, batch)
        except BaseException as exc:
            self._sending -= 1
            try:
                await self._close(held)
                if not isinstance(exc, Exception):
                    for queued in batch:
                        queued.fail(self._closed_under(queued))
                    raise
                self._fail_unless_answered(batch, exc)
                self._carry_on()
            finally:
                await self.pool.putconn(held.conn)
        else:
            self._sending -= 1
            await self._release(held)

    def _fail_unless_answered(self, batch: list[_Queued], exc: Exception) -> None:
        """`_fail` a batch whose connection failed, unless it was answered already (a read
        after its commit was lost): then its writes are done, or waiting again, perhaps
        already in another sender's batch, and must not be failed."""
        if isinstance(exc, _AnsweredThenLost):
            cause = exc.__cause__
            if isinstance(cause, Exception):  # for the pool's upkeep: the idle ones go
                self.pool.failure(cause, may_have_committed=True)
            return
        self._fail(batch, exc)

    async def _send_alone(self, held: _Held, queued: _Queued) -> list[prepared.Row]:
        """Send a statement that found no batch out and none waiting, from its caller, on
        the kept connection. A caller cancelled meanwhile leaves the connection in the
        middle of its pipeline: it is closed."""
        self._sending += 1
        try:
            await self._send(held, [queued])
        except BaseException as exc:
            self._sending -= 1
            try:
                await self._close(held)
                if not isinstance(exc, Exception):
                    raise
                self._fail_unless_answered([queued], exc)
            finally:
                await self.pool.putconn(held.conn)
        else:
            self._sending -= 1
            await self._release(held)
        self._carry_on()  # statements that came meanwhile, or this one again (`_answer`)
        return await queued.answer

    async def _hold(self) -> _Held:
        """The kept connection if it may still serve, else one from the pool."""
        held = self._take_kept()
        if held is not None:
            return held
        conn = await self.pool.getconn()
        try:
            return _Held(conn, self.pool, self._unasked)
        except BaseException:
            await self.pool.putconn(conn)
            raise

    def _take_kept(self) -> _Held | None:
        """The kept connection, taken; None if there is none, or if it may serve no more
        (it then goes back to the pool)."""
        held, self._kept = self._kept, None
        if held is None or self._may_serve(held):
            return held
        self._let_go(held)
        return None

    def _may_serve(self, held: _Held) -> bool:
        """Whether a held connection may serve another batch: not once its pool was
        drained or its shard marked down since it was taken, nor after KEEP_SECONDS."""
        return (
            held.watch.watching
            and held.drains == self.pool.drains
            and self.pool.down_since is None
            and time.monotonic() - held.since < KEEP_SECONDS
        )

    async def _release(self, held: _Held) -> None:
        """After a batch: keep the connection for the next, or hand it back to the pool."""
        if (
            self.keeps
            and self._kept is None
            and not self._closed
            and held.conn.pgconn.transaction_status == TransactionStatus.IDLE
            and self._may_serve(held)
        ):
            self._kept = held
            return
        held.watch.stop()
        await self.pool.putconn(held.conn)

    async def _close(self, held: _Held) -> None:
        """Close a held connection whose state is unknown (a pipeline may be half read)."""
        held.watch.stop()
        await held.conn.close()

    def _unasked(self, held: _Held) -> None:
        """The server spoke on a held connection while no batch waited on it: it is ending
        the backend, or the connection broke. The kept one goes at once; a sender holding
        one between two waits finds its watch stopped at the next, and closes it."""
        if self._kept is held:
            self._kept = None
            self._let_go(held, broken=True)

    def _let_go(self, held: _Held, *, broken: bool = False) -> None:
        """Hand a kept connection back to the pool (closed first if `broken`), in a task."""
        held.watch.stop()

        async def give_back() -> None:
            if broken:
                await held.conn.close()
            await self.pool.putconn(held.conn)

        task = asyncio.get_running_loop().create_task(give_back())
        self._letting_go.add(task)
        task.add_done_callback(self._letting_go.discard)

    def _fail(self, batch: list[_Queued], exc: Exception) -> None:
        """Fail each statement of `batch` with `exc`, or with what a failed connection means
        for it (outage.py): a write whose batch's Sync was sent may have committed."""
        for queued in batch:
            queued.fail(self._failure(queued, exc))

    def _failure(self, queued: _Queued, exc: Exception) -> Exception:
        return self.pool.failure(exc, may_have_committed=self.writes and queued.synced)

    def _closed_under(self, queued: _Queued) -> Exception:
        """What a statement whose batch close() interrupted gets."""
        closed = psycopg.OperationalError("the metadata store is closed")
        return classified(closed, self.pool.shard, may_have_committed=self.writes and queued.synced)

    def _refuse_waiting(self) -> None:
        """The shard was marked down (a connect failed, or it did not answer the readiness
        check): the statements waiting for a batch fail at once, as the pool's own waiters
        do, rather than wait behind batches that may be stuck on a server that hangs. None
        of them can have committed: a write waits again only after its batch rolled back.
        The batches out keep waiting for their answers."""
        for queued in self._take_all():
            queued.fail(MetadataUnavailable(f"shard {self.pool.shard} is unreachable"))

    def _carry_on(self) -> None:
        """After a failed batch or a statement sent alone: the statements still waiting
        get a sender of their own, if there is room for one."""
        if self._waiting and self._sending < self.batches_at_once and not self._closed:
            self._start_sender()

    def _next_batch(self) -> list[_Queued]:
        """The statements of the next batch, in the order they came; a write marked `alone`
        goes in a batch of its own."""
        batch: list[_Queued] = []
        while self._waiting and len(batch) < self.per_batch:
            if self._waiting[0].alone and batch:
                break
            queued = self._waiting.popleft()
            if not queued.answer.done():  # its caller may have given up
                batch.append(queued)
                if queued.alone:
                    break
        return batch

    def _take_all(self) -> list[_Queued]:
        waiting, self._waiting = list(self._waiting), deque()
        return waiting

    async def _send(self, held: _Held, batch: list[_Queued]) -> None:
        """One pipeline with the batch's statements, then their answers (`_answer`); after
        the Sync that commits a batch of writes, the reads they want run then."""
        conn = held.conn
        sent = []
        reads: dict[tuple[Any, ...], _AfterRead] = {}
        for queued in batch:
            try:
                parameters = prepared.dumped(conn, queued.values)
                name = await prepared.prepared_name(
                    conn, queued.statement, parameters, held.watch.wait
                )
            except Exception as exc:
                if conn.closed or connection_failed(exc):  # lost, for the whole batch
                    raise
                queued.fail(exc)  # its own fault (a value, its statement): the rest go on
                continue
            if queued.then is not None:
                await self._share_read(held, queued, reads)
            sent.append(_Sent(queued, name, parameters))
        # Given up meanwhile (a caller cancelled, close()): not sent. None of them had been.
        sent = [statement for statement in sent if not statement.queued.answer.done()]
        if not sent:
            return
        metrics.metadata().batch_sent(metrics.WRITE if self.writes else metrics.READ, len(sent))
        pgconn = conn.pgconn
        pgconn.enter_pipeline_mode()
        for statement in sent:
            prepared.send_prepared(conn, statement.name, statement.parameters)
        # From here on the server may commit the batch: until the Sync, it cannot.
        for statement in sent:
            statement.queued.synced = True
        pgconn.pipeline_sync()
        for read in reads.values():  # run once the Sync above has committed the batch
            prepared.send_prepared(conn, read.name, read.parameters)
            pgconn.pipeline_sync()  # each apart: one that waits or fails holds up no other
        self.batches_sent += 1
        self.reads_after_commit += len(reads)
        self._last_alone = len(sent) == 1
        results = await held.watch.wait(_pipeline_results(pgconn, len(sent)))
        self._answer(conn, sent, results)
        await self._answer_reads(held, list(reads.values()))
        pgconn.exit_pipeline_mode()

    async def _answer_reads(self, held: _Held, reads: list[_AfterRead]) -> None:
        """Read the answers of `reads`, each in its part of the pipeline, and answer their
        writes. The batch is answered by then: if the connection is lost meanwhile, the
        reads still out leave their writes answered without them, and the sender is told
        so (`_AnsweredThenLost`) rather than failing a batch it answered."""
        for n, read in enumerate(reads):
            try:
                [result] = await held.watch.wait(_pipeline_results(held.conn.pgconn, 1, False))
            except BaseException as exc:
                for lost in reads[n:]:
                    _answer_read(held.conn, lost, None)
                if isinstance(exc, Exception):
                    raise _AnsweredThenLost() from exc
                raise
            _answer_read(held.conn, read, result)

    async def _share_read(
        self, held: _Held, queued: _Queued, reads: dict[tuple[Any, ...], _AfterRead]
    ) -> None:
        """Add the read `queued` wants after its commit to `reads`, or join the same read
        another write of the batch wants. A read that cannot be prepared (its vnode's schema
        moved away, say) is left out: the write goes on, and its caller reads for itself."""
        assert queued.then is not None
        queued.then_rows = queued.committed_rows = None  # a write sent again is answered again
        queued.read = None
        conn = held.conn
        try:
            parameters = prepared.dumped(conn, queued.then.values)
            key = (queued.then.statement, parameters.types, *map(_bytes_or_none, parameters.dumped))
            read = reads.get(key)
            if read is None:
                name = await prepared.prepared_name(
                    conn, queued.then.statement, parameters, held.watch.wait
                )
                read = reads[key] = _AfterRead(name, parameters)
        except Exception as exc:
            if conn.closed or connection_failed(exc):  # lost, for the whole batch
                raise
            return
        read.writes.append(queued)
        queued.read = read

    def _answer(
        self, conn: psycopg.AsyncConnection[Any], sent: list[_Sent], results: list[Any]
    ) -> None:
        """Each statement gets its rows or its error; those a failed one aborted wait for the
        next batch."""
        again = []
        for statement, result in zip(sent, results, strict=True):
            queued = statement.queued
            if queued.answer.done():
                continue
            if result.status == ExecStatus.PIPELINE_ABORTED:
                again.append(queued)
                continue
            try:
                rows = prepared.loaded_rows(conn, prepared.checked(conn, result), statement.name)
            except errors.InvalidSqlStatementName as exc:
                # DEALLOCATE ALL ran on the connection: prepare again, once (a statement
                # that raises this error itself must not go round for ever).
                if queued.prepared_again:
                    queued.fail(exc)
                    continue
                prepared.forget_prepared(conn)
                queued.prepared_again = True
                again.append(queued)
            except Exception as exc:
                queued.fail(self._failure(queued, exc))
            else:
                self._succeed(queued, rows)
        self._waiting.extendleft(reversed(again))

    def _succeed(self, queued: _Queued, rows: list[prepared.Row]) -> None:
        if queued.read is not None:  # answered with its read's rows (_answer_reads)
            queued.committed_rows = rows
        else:
            queued.answer.set_result(rows)


class ReadBatcher(_Batcher):
    """The batches of point reads of one shard's pool."""

    async def fetch(self, statement: bytes, values: Sequence[Any]) -> list[prepared.Row]:
        """The rows of a read-only `statement`."""
        return await self._enqueue(_Queued.of(statement, values))


class WriteBatcher(_Batcher):
    """The batches of one-row writes of one shard's pool: each batch one transaction."""

    writes = True

    async def write(
        self, statement: bytes, values: Sequence[Any], order: WriteOrder
    ) -> list[prepared.Row]:
        """The rows of `statement`, a write of the one row that `order` locates, once
        committed with the rest of its batch (write_then_read, with no read)."""
        rows, _ = await self.write_then_read(statement, values, order, None)
        return rows

    async def write_then_read(
        self,
        statement: bytes,
        values: Sequence[Any],
        order: WriteOrder,
        then: AfterCommit | None,
    ) -> tuple[list[prepared.Row], list[prepared.Row] | None]:
        """The rows of `statement`, a write of the one row that `order` locates, once
        committed with the rest of its batch; and the rows of `then`, run after that commit
        (None: not asked, or it failed).

        Its wait is bounded (ShardPool.commit_bound): by COMMIT_WAIT_SECONDS, and by the
        shard's commits hanging, as the readiness check's commit probe finds. A shard whose
        commits do not come back (a synchronous standby that does not answer holds every
        commit) must not hold the requests behind it without end. Then the write is given up
        as not written while it still waits for a batch, else as CommitUnknown: a batch of
        others still out goes on, and commits or not, as any write whose answer was lost (a
        lone write sent by its caller closes its connection, as a caller cancelled does)."""
        queued = _Queued.of(statement, values, order, then)
        async with self.pool.commit_bound(COMMIT_WAIT_SECONDS) as bound:
            try:
                return await self._enqueue(queued), queued.then_rows
            except asyncio.CancelledError:
                if queued in self._waiting:  # given up before its batch: never sent
                    self._waiting.remove(queued)
                    bound.sent = False
                raise

    def _next_batch(self) -> list[_Queued]:
        # Every batch takes its rows' locks in this order: two batches that wrote the same
        # two rows in opposite orders could each wait for the other until PostgreSQL's
        # deadlock check (a second) cancelled one.
        return sorted(super()._next_batch(), key=attrgetter("order"))

    def _answer(
        self, conn: psycopg.AsyncConnection[Any], sent: list[_Sent], results: list[Any]
    ) -> None:
        failed = any(result.status not in _SUCCEEDED for result in results)
        if not failed or len(sent) == 1:
            super()._answer(conn, sent, results)
            return
        # The server rolled the whole batch back: nothing of it happened. Each write goes
        # again alone, so that only one that fails by itself sees an error.
        again = [statement.queued for statement in sent if not statement.queued.answer.done()]
        for queued in again:
            queued.alone = True
            queued.synced = False
        self._waiting.extendleft(reversed(again))


@dataclass
class _Sent:
    queued: _Queued
    name: bytes  # its prepared statement's name on the batch's connection
    parameters: prepared.Parameters


@dataclass
class _AfterRead:
    """A read sent after a batch's commit, and the writes of the batch that want it."""

    name: bytes  # its prepared statement's name on the batch's connection
    parameters: prepared.Parameters
    writes: list[_Queued] = field(default_factory=list)


def _bytes_or_none(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


class _AnsweredThenLost(Exception):
    """A batch's connection was lost after the batch was answered, while reads after its
    commit were out (the cause is the connection's error)."""


def _answer_read(conn: psycopg.AsyncConnection[Any], read: _AfterRead, result: Any) -> None:
    """Answer the committed writes that waited for `read`, with its rows; a read that
    failed, or whose answer was lost (`result` None), gives none (the writes' callers read
    for themselves). A read whose prepared statement is gone (DEALLOCATE ALL) has the
    connection's statements prepared again next time."""
    rows = None
    try:
        if result is not None:
            rows = prepared.loaded_rows(conn, prepared.checked(conn, result), read.name)
    except errors.InvalidSqlStatementName:
        prepared.forget_prepared(conn)
    except Exception:  # its writes' callers read for themselves
        pass
    writes, read.writes = read.writes, []  # no cycle left between a write and its read
    for queued in writes:
        if queued.read is not read:  # its batch failed: it went again, with another read
            continue
        committed, queued.committed_rows = queued.committed_rows, None
        if committed is not None and not queued.answer.done():
            queued.then_rows = rows
            queued.answer.set_result(committed)


_SUCCEEDED = (ExecStatus.TUPLES_OK, ExecStatus.COMMAND_OK)


def _store_closed() -> MetadataUnavailable:
    return MetadataUnavailable("the metadata store is closed")


def _pipeline_results(
    pgconn: Any, count: int, flush: bool = True
) -> Generator[Any, Any, list[Any]]:
    """Flush the pipeline (unless `flush` is False: a part after the first), then read the
    last result of each of its next `count` statements and the Sync that ends them. An error
    between the last statement and the Sync is the commit's (a deferred constraint, say): it
    stands for the last statement's result, so that the batch counts as failed and nothing
    of it as done."""
    assert count > 0
    if flush:
        yield from generators.send(pgconn)
    answers = []
    for _ in range(count):
        results = yield from generators.fetch_many(pgconn)
        if not results:
            raise psycopg.OperationalError("a pipeline ended before its statements' results")
        answers.append(results[-1])
    while True:
        results = yield from generators.fetch_many(pgconn)
        if not results:
            raise psycopg.OperationalError("a pipeline ended without its Sync")
        for result in results:
            if result.status == ExecStatus.FATAL_ERROR:
                answers[-1] = result
        if results[-1].status == ExecStatus.PIPELINE_SYNC:
            return answers
