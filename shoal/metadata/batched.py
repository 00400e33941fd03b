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

A batch runs in libpq's pipeline mode: the statements (each prepared on the connection, as
prepared.py does) are written together, then one Sync. Between Syncs PostgreSQL runs them as
one implicit transaction, each with its own snapshot (READ COMMITTED), and commits them
together at the Sync.

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
"""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors, generators
from psycopg.pq import ExecStatus

from shoal.metadata import metrics, prepared
from shoal.metadata.errors import MetadataUnavailable
from shoal.metadata.outage import classified, connection_failed

if TYPE_CHECKING:
    from shoal.metadata.shards import ShardPool

# Batches of one kind (reads or writes) of one shard out at once, per process: enough to keep
# a few backends busy, few enough that statements wait for a batch rather than each taking a
# connection of its own.
BATCHES_AT_ONCE = 2
# Statements in one batch: a batch's statements wait for its last, so keep it short.
PER_BATCH = 32

# Where a write goes in its batch: its vnode, then its row's key in that vnode (owner, bucket
# id, name: the primary key of manta_bucket_object, so two writes of one row sort together).
WriteOrder = tuple[int, uuid.UUID, uuid.UUID, str]


@dataclass
class _Queued:
    """A statement waiting for its batch, and its caller's answer."""

    statement: bytes
    values: Sequence[Any]
    answer: asyncio.Future[list[prepared.Row]] = field(repr=False)
    order: tuple[Any, ...] = ()  # a write's WriteOrder; reads are not sorted
    prepared_again: bool = False  # after InvalidSqlStatementName, once
    alone: bool = False  # a write whose batch failed: it goes again in a batch of its own
    synced: bool = False  # its batch's Sync was sent: a write of it may have committed

    def fail(self, exc: BaseException) -> None:
        if not self.answer.done():  # its caller may have given up
            self.answer.set_exception(exc)


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
        self.batches_sent = 0  # pipelines written, for tests and the curious

    async def _enqueue(
        self, statement: bytes, values: Sequence[Any], order: tuple[Any, ...] = ()
    ) -> list[prepared.Row]:
        """Queue a statement ($1, $2, ... placeholders) for the next batch; its rows as dicts."""
        if self._closed:
            raise _store_closed()
        queued = _Queued(statement, values, asyncio.get_running_loop().create_future(), order)
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

    def _start_sender(self) -> None:
        # A task, not the caller: a caller that gives up (its client went away) must not
        # take the batch of the others down with it.
        self._sending += 1
        sender = asyncio.create_task(self._send_waiting())
        self._senders.add(sender)
        sender.add_done_callback(self._senders.discard)

    async def _send_waiting(self) -> None:
        """Send batches on one borrowed connection until no statement waits. `_sending`
        counts the senders that will still look at the queue: a sender leaves that count in
        the same step in which it saw the queue empty, so none is left waiting unseen."""
        try:
            conn = await self.pool.getconn()
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
                await self._send(conn, batch)
            self._sending -= 1
        except BaseException as exc:
            self._sending -= 1
            # The connection's state is unknown (a pipeline may be half read): it goes.
            await conn.close()
            if not isinstance(exc, Exception):
                for queued in batch:
                    queued.fail(self._closed_under(queued))
                raise
            self._fail(batch, exc)
            self._carry_on()
        finally:
            await self.pool.putconn(conn)

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

    def _carry_on(self) -> None:
        """After a failed batch: the statements still waiting get a sender of their own."""
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

    async def _send(self, conn: psycopg.AsyncConnection[Any], batch: list[_Queued]) -> None:
        """One pipeline with the batch's statements, then their answers (`_answer`)."""
        sent = []
        for queued in batch:
            try:
                parameters = prepared.dumped(conn, queued.values)
                name = await prepared.prepared_name(conn, queued.statement, parameters)
            except Exception as exc:
                if conn.closed or connection_failed(exc):  # lost, for the whole batch
                    raise
                queued.fail(exc)  # its own fault (a value, its statement): the rest go on
                continue
            sent.append(_Sent(queued, name, parameters))
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
        self.batches_sent += 1
        results = await conn.wait(_pipeline_results(pgconn, len(sent)))
        pgconn.exit_pipeline_mode()
        self._answer(conn, sent, results)

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
                queued.answer.set_result(rows)
        self._waiting.extendleft(reversed(again))


class ReadBatcher(_Batcher):
    """The batches of point reads of one shard's pool."""

    async def fetch(self, statement: bytes, values: Sequence[Any]) -> list[prepared.Row]:
        """The rows of a read-only `statement`."""
        return await self._enqueue(statement, values)


class WriteBatcher(_Batcher):
    """The batches of one-row writes of one shard's pool: each batch one transaction."""

    writes = True

    async def write(
        self, statement: bytes, values: Sequence[Any], order: WriteOrder
    ) -> list[prepared.Row]:
        """The rows of `statement`, a write of the one row that `order` locates, once
        committed with the rest of its batch."""
        return await self._enqueue(statement, values, order)

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


_SUCCEEDED = (ExecStatus.TUPLES_OK, ExecStatus.COMMAND_OK)


def _store_closed() -> MetadataUnavailable:
    return MetadataUnavailable("the metadata store is closed")


def _pipeline_results(pgconn: Any, count: int) -> Generator[Any, Any, list[Any]]:
    """Flush the pipeline, then read the last result of each of `count` statements and the
    Sync that ends them. An error between the last statement and the Sync is the commit's
    (a deferred constraint, say): it stands for the last statement's result, so that the
    batch counts as failed and nothing of it as done."""
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
