"""Point reads of one shard, sent to PostgreSQL in batches: the reads that wait while a
batch is out go together in the next one, on one connection, in one pipeline.

Why: a GET or HEAD reads one row. Sent alone, each read is a round trip of its own: a
write to the server's socket, a wake-up of its backend, a statement, a reply, and on the
gateway's side a wait on the socket. Under load those are most of the cost of the read,
for PostgreSQL and for the gateway alike (bench/RESULTS.md, session 10). Batched, a busy
gateway pays them once for all the reads that arrived during the previous batch, and a
lone read goes out at once, as before.

A batch runs in libpq's pipeline mode: the statements (each prepared on the connection,
as prepared.py does) are written together, then one Sync. Between Syncs PostgreSQL runs
them as one implicit transaction, each with its own snapshot (READ COMMITTED): each read
sees every write acknowledged before it was sent, as a read of its own would. An error
in one read aborts the reads after it in the same batch; those are sent again.

Only reads go through here: writes keep their own transaction each (an aborted batch must
not undo someone else's acknowledged write).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import errors, generators
from psycopg.pq import ExecStatus
from psycopg_pool import AsyncConnectionPool

from shoal.metadata import prepared

# Batches of one shard out at once, per process: enough to keep a few backends busy, few
# enough that reads wait for a batch rather than each taking a connection of its own.
BATCHES_AT_ONCE = 2
# Reads in one batch: a batch's reads wait for its last, so keep it short.
READS_PER_BATCH = 32


@dataclass
class _Read:
    statement: bytes
    values: Sequence[Any]
    answer: asyncio.Future[list[prepared.Row]] = field(repr=False)
    prepared_again: bool = False  # after InvalidSqlStatementName, once

    def fail(self, exc: BaseException) -> None:
        if not self.answer.done():  # its caller may have given up
            self.answer.set_exception(exc)


class ReadBatcher:
    """The batches of one shard's pool."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        batches_at_once: int = BATCHES_AT_ONCE,
        reads_per_batch: int = READS_PER_BATCH,
    ) -> None:
        self.pool = pool
        self.batches_at_once = batches_at_once
        self.reads_per_batch = reads_per_batch
        self._waiting: deque[_Read] = deque()
        self._senders: set[asyncio.Task[None]] = set()
        self._sending = 0
        self._closed = False
        self.batches_sent = 0  # pipelines written, for tests and the curious

    async def fetch(self, statement: bytes, values: Sequence[Any]) -> list[prepared.Row]:
        """The rows of a read-only `statement` ($1, $2, ... placeholders) as dicts."""
        if self._closed:
            raise _store_closed()
        read = _Read(statement, values, asyncio.get_running_loop().create_future())
        self._waiting.append(read)
        if self._sending < self.batches_at_once:
            self._start_sender()
        return await read.answer

    async def close(self) -> None:
        """Stop: reads still waiting, or in a batch, fail; later reads are refused."""
        self._closed = True
        for sender in list(self._senders):
            sender.cancel()
        await asyncio.gather(*self._senders, return_exceptions=True)
        _fail(self._take_all(), _store_closed())

    def _start_sender(self) -> None:
        # A task, not the caller: a caller that gives up (its client went away) must not
        # take the batch of the others down with it.
        self._sending += 1
        sender = asyncio.create_task(self._send_waiting())
        self._senders.add(sender)
        sender.add_done_callback(self._senders.discard)

    async def _send_waiting(self) -> None:
        """Send batches on one borrowed connection until no read waits. `_sending` counts
        the senders that will still look at the queue: a sender leaves that count in the
        same step in which it saw the queue empty, so no read is left waiting unseen."""
        try:
            conn = await self.pool.getconn()
        except BaseException as exc:
            self._sending -= 1
            if not isinstance(exc, Exception):
                raise  # cancelled by close(), which fails what waits
            _fail(self._next_batch(), exc)
            self._carry_on()
            return
        batch: list[_Read] = []
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
                _fail(batch, _store_closed())
                raise
            _fail(batch, exc)
            self._carry_on()
        finally:
            await self.pool.putconn(conn)

    def _carry_on(self) -> None:
        """After a failed batch: the reads still waiting get a sender of their own."""
        if self._waiting and self._sending < self.batches_at_once and not self._closed:
            self._start_sender()

    def _next_batch(self) -> list[_Read]:
        batch: list[_Read] = []
        while self._waiting and len(batch) < self.reads_per_batch:
            read = self._waiting.popleft()
            if not read.answer.done():  # its caller may have given up
                batch.append(read)
        return batch

    def _take_all(self) -> list[_Read]:
        reads, self._waiting = list(self._waiting), deque()
        return reads

    async def _send(self, conn: psycopg.AsyncConnection[Any], batch: list[_Read]) -> None:
        """One pipeline with the batch's reads; each read gets its rows or its error, and
        those a failed read aborted wait for the next batch."""
        sent = []
        for read in batch:
            try:
                parameters = prepared.dumped(conn, read.values)
                name = await prepared.prepared_name(conn, read.statement, parameters)
            except Exception as exc:
                if conn.closed:  # the connection is lost, for every read of the batch
                    raise
                read.fail(exc)  # this read's own fault (a value, its statement): the rest go on
                continue
            sent.append((read, name, parameters))
        if not sent:
            return
        pgconn = conn.pgconn
        pgconn.enter_pipeline_mode()
        for _, name, parameters in sent:
            prepared.send_prepared(conn, name, parameters)
        pgconn.pipeline_sync()
        self.batches_sent += 1
        answers = await conn.wait(_pipeline_results(pgconn, len(sent)))
        pgconn.exit_pipeline_mode()
        again = []
        for (read, name, _), result in zip(sent, answers, strict=True):
            if read.answer.done():
                continue
            if result.status == ExecStatus.PIPELINE_ABORTED:
                again.append(read)
                continue
            try:
                rows = prepared.loaded_rows(conn, prepared.checked(conn, result), name)
            except errors.InvalidSqlStatementName as exc:
                # DEALLOCATE ALL ran on the connection: prepare again, once (a statement
                # that raises this error itself must not go round for ever).
                if read.prepared_again:
                    read.fail(exc)
                    continue
                prepared.forget_prepared(conn)
                read.prepared_again = True
                again.append(read)
            except Exception as exc:
                read.fail(exc)
            else:
                read.answer.set_result(rows)
        self._waiting.extendleft(reversed(again))


def _store_closed() -> psycopg.OperationalError:
    return psycopg.OperationalError("the metadata store is closed")


def _fail(reads: list[_Read], exc: BaseException) -> None:
    for read in reads:
        read.fail(exc)


def _pipeline_results(pgconn: Any, count: int) -> Generator[Any, Any, list[Any]]:
    """Flush the pipeline, then read the last result of each of `count` statements and the
    Sync that ends them."""
    yield from generators.send(pgconn)
    answers = []
    for _ in range(count):
        results = yield from generators.fetch_many(pgconn)
        answers.append(results[-1])
    synced = yield from generators.fetch_many(pgconn)
    if not synced or synced[-1].status != ExecStatus.PIPELINE_SYNC:
        raise psycopg.OperationalError("a pipeline of reads ended without its Sync")
    return answers
