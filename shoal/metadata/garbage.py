"""The queries garbage collection needs: batches of deletion records and deleted buckets.

Ages are judged by the database clock (`current_timestamp - leeway`), never a worker's.
A claimed batch is held by its transaction (FOR UPDATE SKIP LOCKED): several workers take
disjoint batches, and a worker that dies releases its batch by rolling back, so every step can
be repeated. Records are removed only by the claimer, after the blocks they name are gone.

Removing rows leaves dead tuples until a vacuum. So the Spark job removes a window's records
by truncating the window when they are all it holds (`clear_window`), and both GC paths
vacuum what they removed row by row.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import class_row, dict_row

from shoal.metadata import queries
from shoal.metadata.base import Component, object_from_row
from shoal.metadata.errors import MetadataError
from shoal.metadata.models import DeletedBucket, ObjectVersion
from shoal.metadata.partitions import window_end
from shoal.metadata.ring import vnode_schema
from shoal.metadata.schema import DELETED_TABLES
from shoal.metadata.shards import render, render_arms, scalar


class VnodeBeingMoved(MetadataError):
    """GC left a vnode alone: a mover holds it (queries.VNODE_MOVE_LOCK) until its switch."""

    def __init__(self, vnode: int) -> None:
        super().__init__(f"vnode {vnode} is being moved; GC leaves it for a later pass")
        self.vnode = vnode


async def _gc_may_work_on(conn: psycopg.AsyncConnection[Any], vnode: int) -> None:
    """Take the vnode's move lock shared for the transaction, or raise VnodeBeingMoved."""
    row = await (await conn.execute(queries.GC_VNODE_LOCK, {"vnode": vnode})).fetchone()
    if not row or not row[0]:
        raise VnodeBeingMoved(vnode)


@dataclass
class ClaimedRecords:
    """Deletion records held by one worker until its `claim_*` block ends."""

    records: list[ObjectVersion]
    _conn: psycopg.AsyncConnection
    _vnode: int
    removed: int = field(default=0)

    async def remove(self, records: Sequence[ObjectVersion]) -> None:
        """Drop the records whose blocks are all gone; committed when the claim block ends."""
        ids = [r.id for r in records]
        if ids:
            cur = await self._conn.execute(
                render(queries.REMOVE_DELETED_OBJECTS, self._vnode), {"ids": ids}
            )
            self.removed += cur.rowcount


@dataclass
class ClaimedBuckets:
    buckets: list[DeletedBucket]
    _conn: psycopg.AsyncConnection
    _vnode: int

    async def remove(self, bucket: DeletedBucket) -> None:
        """Drop a deleted-bucket record once none of its contents remain anywhere."""
        params = {"id": bucket.id, "owner": bucket.owner, "name": bucket.name}
        await self._conn.execute(render(queries.REMOVE_DELETED_BUCKET, self._vnode), params)


class Garbage(Component):
    @contextlib.asynccontextmanager
    async def claim_deleted_objects(
        self, vnode: int, leeway: timedelta, limit: int = 100
    ) -> AsyncIterator[ClaimedRecords]:
        """The oldest deletion records of a vnode older than `leeway`, locked for this worker
        (VnodeBeingMoved while a mover holds the vnode)."""
        async with self.shards.of_vnode(vnode).pool.connection() as conn, conn.transaction():
            await _gc_may_work_on(conn, vnode)
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                render(queries.CLAIM_DELETED_OBJECTS, vnode), {"leeway": leeway, "limit": limit}
            )
            records = [object_from_row(row) for row in await cur.fetchall()]
            yield ClaimedRecords(records=records, _conn=conn, _vnode=vnode)

    @contextlib.asynccontextmanager
    async def claim_deleted_buckets(
        self, vnode: int, leeway: timedelta, limit: int = 25
    ) -> AsyncIterator[ClaimedBuckets]:
        async with self.shards.of_vnode(vnode).pool.connection() as conn, conn.transaction():
            await _gc_may_work_on(conn, vnode)
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                render(queries.CLAIM_DELETED_BUCKETS, vnode), {"leeway": leeway, "limit": limit}
            )
            buckets = [DeletedBucket(**row) for row in await cur.fetchall()]
            yield ClaimedBuckets(buckets=buckets, _conn=conn, _vnode=vnode)

    async def bucket_contents(
        self, owner: uuid.UUID, bucket_id: uuid.UUID, limit: int = 100
    ) -> list[ObjectVersion]:
        """Up to `limit` objects and parts of a bucket incarnation from each shard, as records.

        For a deleted bucket: its live rows are garbage once the bucket record passes the
        leeway. Parts carry `upload_id` and `part_number` in their properties.
        """
        params = {"owner": owner, "bucket_id": bucket_id, "limit": limit}
        results = await asyncio.gather(
            *(
                self.shard_rows(
                    shard, render_arms("{arms}", arm, tuple(shard.vnodes)), params, template=arm
                )
                for shard in self.shards.placed()
                for arm in (queries.BUCKET_OBJECTS_ARM, queries.BUCKET_PARTS_ARM)
            )
        )
        return [object_from_row(row) for rows in results for row in rows]

    async def remove_bucket_contents(
        self, owner: uuid.UUID, bucket_id: uuid.UUID, records: Sequence[ObjectVersion]
    ) -> None:
        """Drop rows of a deleted incarnation whose blocks are gone, then its empty uploads."""
        by_vnode: dict[int, list[uuid.UUID]] = {}
        for record in records:
            vnode = self.shards.ring.vnode_for_object(owner, bucket_id, record.name)
            by_vnode.setdefault(vnode, []).append(record.id)
        for vnode, ids in by_vnode.items():
            params = {"owner": owner, "bucket_id": bucket_id, "ids": ids}
            async with self.shards.of_vnode(vnode).pool.connection() as conn, conn.transaction():
                for statement in (
                    queries.REMOVE_BUCKET_OBJECTS,
                    queries.REMOVE_BUCKET_PARTS,
                    queries.REMOVE_BUCKET_UPLOADS,
                ):
                    await conn.execute(render(statement, vnode), params)

    async def remove_bucket_uploads(self, owner: uuid.UUID, bucket_id: uuid.UUID) -> None:
        """Drop the upload rows of a deleted incarnation that have no part left, on every
        vnode: an upload opened with no part uploaded names no block, so no record of
        `bucket_contents` leads to its row."""
        params = {"owner": owner, "bucket_id": bucket_id}
        for vnode in range(self.shards.ring.vnodes):
            await self.rows(vnode, queries.REMOVE_BUCKET_UPLOADS, params)


@dataclass(frozen=True)
class Backlog:
    """What waits for GC on one shard: deletion records (of objects and of buckets), the
    bytes the object records name, the oldest deletion, and the deleted tables' windows.

    `oldest` and `windows` are always exact. `records` and `bytes` are exact when
    `estimated` is false; past EXACT_BACKLOG_LIMIT records (by the statistics) they are
    estimates: records from PostgreSQL's statistics, bytes from a sample of the records."""

    shard: str
    records: int
    bytes: int
    oldest: datetime | None
    windows: int = 0
    estimated: bool = False


# Up to this many records on a shard (by the statistics), the backlog is counted exactly: a
# count and a sum over that many rows take milliseconds. Past it, counting would scan every
# window, so the records come from the statistics and the bytes from a sample.
EXACT_BACKLOG_LIMIT = 100_000
# The sample reads about this many records' pages.
SAMPLED_RECORDS = 10_000
# Bounds every statement of a backlog reading (a count the statistics misjudged, a shard that
# is slow): past it the reading falls back to the estimate.
BACKLOG_STATEMENT_TIMEOUT = "10s"


async def read_backlog(
    conn: psycopg.AsyncConnection[Any],
    shard: str,
    vnodes: Sequence[int],
    exact_limit: int = EXACT_BACKLOG_LIMIT,
) -> Backlog:
    """The backlog of the vnodes a shard holds, on a connection to it (autocommit)."""
    if not vnodes:
        return Backlog(shard, 0, 0, None)
    arms = tuple(vnodes)
    schemas = [vnode_schema(v) for v in vnodes]
    async with conn.transaction():
        await conn.execute(f"SET LOCAL statement_timeout = '{BACKLOG_STATEMENT_TIMEOUT}'")
        cur = await conn.execute(queries.GC_WINDOW_STATISTICS, {"schemas": schemas})
        statistics = {parent: (windows, rows) for parent, windows, rows in await cur.fetchall()}
        windows = sum(w for w, _ in statistics.values())
        object_rows = statistics.get("manta_bucket_deleted_object", (0, 0))[1]
        bucket_rows = statistics.get("manta_bucket_deleted_bucket", (0, 0))[1]
        cur = await conn.execute(render_arms(queries.GC_OLDEST, queries.GC_OLDEST_ARM, arms))
        row = await cur.fetchone()
        oldest: datetime | None = row[0] if row else None  # None: no deletion records
        if object_rows + bucket_rows <= exact_limit:
            try:
                async with conn.transaction():  # a savepoint: a timeout leaves the rest usable
                    statement = render_arms(queries.GC_BACKLOG, queries.GC_BACKLOG_ARM, arms)
                    row = await (await conn.execute(statement)).fetchone()
                assert row is not None
                return Backlog(shard, row[0] or 0, row[1] or 0, oldest, windows)
            except psycopg.errors.QueryCanceled:
                pass  # more than the statistics said: estimate
        sampled_bytes = await _sampled_bytes(conn, arms, object_rows)
        return Backlog(
            shard, object_rows + bucket_rows, sampled_bytes, oldest, windows, estimated=True
        )


async def _sampled_bytes(
    conn: psycopg.AsyncConnection[Any], vnodes: tuple[int, ...], object_rows: int
) -> int:
    """The bytes of `object_rows` deletion records, from the sizes of a sample of them."""
    if object_rows <= 0:
        return 0
    percent = min(100.0, 100.0 * SAMPLED_RECORDS / object_rows)
    statement = render_arms(queries.GC_SIZE_SAMPLE, queries.GC_SIZE_SAMPLE_ARM, vnodes)
    row = await (await conn.execute(statement, {"percent": percent})).fetchone()
    assert row is not None  # an aggregate's one row
    records, size = int(row[0]), int(row[1])
    if not records:
        return 0
    return round(object_rows * size / records)


@dataclass(frozen=True)
class GcRun:
    kind: str
    leeway: timedelta
    started: datetime
    finished: datetime
    records_found: int
    records_reclaimed: int
    records_failed: int
    blocks_deleted: int
    bytes_reclaimed: int
    windows_dropped: int


PAUSED_SETTING = "gc_paused"
# A window is dropped only this long after its end: a transaction that began before the end
# still writes deleted_at inside it (current_timestamp is the transaction's start; the
# one-row object writes stamp their statement's start, no earlier).
WINDOW_DROP_GRACE = timedelta(minutes=10)


class GarbageBook(Component):
    """GC's bookkeeping: backlog, runs, pause switch, and dropping reclaimed windows."""

    async def backlog(self) -> list[Backlog]:
        """Each shard's backlog (read_backlog: exact while small, estimated past that)."""
        results = []
        for shard in self.shards.placed():
            async with shard.pool.reading() as conn:
                results.append(await read_backlog(conn, shard.name, shard.vnodes))
        return results

    async def record_run(self, run: GcRun) -> None:
        async with self.shards.catalog.pool.connection() as conn:
            await conn.execute(
                queries.RECORD_GC_RUN, {k: v for k, v in run.__dict__.items() if k != "finished"}
            )

    async def last_runs(self, limit: int = 10) -> list[GcRun]:
        async with self.shards.catalog.pool.reading() as conn:
            cur = conn.cursor(row_factory=class_row(GcRun))
            await cur.execute(queries.LAST_GC_RUNS, {"limit": limit})
            return await cur.fetchall()

    async def set_paused(self, paused: bool) -> None:
        async with self.shards.catalog.pool.connection() as conn:
            await conn.execute(queries.SET_SETTING, {"key": PAUSED_SETTING, "value": str(paused)})

    async def paused(self) -> bool:
        async with self.shards.catalog.pool.reading() as conn:
            cur = await conn.execute(queries.SELECT_SETTING, {"key": PAUSED_SETTING})
            row = await cur.fetchone()
        return row is not None and row[0] == "True"

    async def drop_empty_windows(self, vnode: int) -> int:
        """Detach and drop each past window of the vnode's deleted tables that is empty.

        Dropping a window whole leaves no dead tuples, where deleting rows leaves vacuum work.
        """
        schema = vnode_schema(vnode)
        dropped = 0
        async with self.shards.of_vnode(vnode).pool.connection() as conn:
            now = scalar(await (await conn.execute(queries.DATABASE_NOW)).fetchone(), datetime)
            windows = await (await conn.execute(queries.OLD_WINDOWS, {"schema": schema})).fetchall()
            for name, parent in windows:
                end = window_end(name, self.window)
                if end is None or end > now - WINDOW_DROP_GRACE:
                    continue
                async with conn.transaction():
                    # Dropping a window is not replicated: never while the vnode is copied.
                    await _gc_may_work_on(conn, vnode)
                    names = _names(schema, name, parent)
                    await conn.execute(sql.SQL(queries.LOCK_WINDOW).format(**names))
                    cur = await conn.execute(sql.SQL(queries.WINDOW_HOLDS_ANY).format(**names))
                    if scalar(await cur.fetchone(), bool):
                        continue
                    await conn.execute(sql.SQL(queries.DETACH_WINDOW).format(**names))
                    await conn.execute(sql.SQL(queries.DROP_WINDOW).format(**names))
                    dropped += 1
        return dropped

    async def vacuum_deleted_tables(self, vnode: int) -> None:
        """Vacuum every window of the vnode's deleted tables (after removing rows from them),
        unless a mover holds the vnode (a vacuum would hold up its write fence)."""
        async with self.shards.of_vnode(vnode).pool.connection() as conn:  # autocommit
            row = await (
                await conn.execute(queries.GC_VNODE_SESSION_LOCK, {"vnode": vnode})
            ).fetchone()
            if not row or not row[0]:
                return
            try:
                for table in DELETED_TABLES:
                    statement = sql.SQL(queries.VACUUM_TABLE).format(
                        table=sql.Identifier(vnode_schema(vnode), table)
                    )
                    await conn.execute(statement)
            finally:
                await conn.execute(queries.GC_VNODE_SESSION_UNLOCK, {"vnode": vnode})


def _names(schema: str, window: str, parent: str = "") -> dict[str, sql.Composable]:
    return {"window": sql.Identifier(schema, window), "parent": sql.Identifier(schema, parent)}


# -- for the Spark job's executors, which use plain (synchronous) connections ------------------


class _RowByRow(Exception):
    """The window may not be truncated now (its vnode is being moved)."""


@dataclass(frozen=True)
class WindowClearing:
    removed: int
    whole: bool  # truncated whole (no dead tuples) rather than deleted row by row


def clear_window(
    conn: psycopg.Connection[Any], vnode: int, window: str, ids: Sequence[str | uuid.UUID]
) -> WindowClearing:
    """Remove the deletion records `ids`, whose blocks are all gone, from one window of the
    vnode's deleted-object table (`stage_reclaimed`, then `clear_staged_window`)."""
    stage_reclaimed(conn, [(vnode, window, id_) for id_ in ids])
    try:
        return clear_staged_window(conn, vnode, window)
    finally:
        conn.execute(queries.FORGET_RECLAIMED)


def stage_reclaimed(
    conn: psycopg.Connection[Any], rows: Iterable[tuple[int, str, str | uuid.UUID]]
) -> None:
    """Note (vnode, window, id) of deletion records whose blocks are all gone, on `conn`, for
    `clear_staged_window`; they stay staged until FORGET_RECLAIMED or the connection ends."""
    conn.execute(queries.CREATE_RECLAIMED)
    with conn.cursor().copy(queries.COPY_RECLAIMED) as copy:
        for row in rows:
            copy.write_row(row)


def clear_staged_window(conn: psycopg.Connection[Any], vnode: int, window: str) -> WindowClearing:
    """Remove the deletion records staged for one window of a vnode. `conn` must be in
    autocommit mode, and the one they were staged on.

    If the window holds no other record it is truncated whole, leaving no dead tuples. The
    check and the TRUNCATE run under an ACCESS EXCLUSIVE lock on the window, so a record
    written into it concurrently either committed before the lock (the check sees it and the
    window is not truncated) or waits for the lock and lands after the TRUNCATE. Otherwise
    (other records in the window, or the lock not granted in time) the rows are deleted by id,
    and the caller vacuums the window once every removal is done.

    TRUNCATE is not replicated: while a mover holds the vnode (queries.VNODE_MOVE_LOCK) the
    rows are deleted by id instead, so that the vnode's copy on its new shard loses them too.

    TRUNCATE is not MVCC-safe: a reader whose snapshot is older sees the window empty. That
    only hides records whose blocks are already gone, so the orphan job may list those blocks
    again (they are gone) and the meter counts less waiting for GC; nothing live is at stake.
    """
    schema = vnode_schema(vnode)
    names = _names(schema, window)
    staged = {"vnode": vnode, "window": window}
    table: sql.Composable = names["window"]
    try:
        with conn.transaction():
            conn.execute(queries.WINDOW_LOCK_TIMEOUT)
            granted = conn.execute(queries.GC_VNODE_LOCK, {"vnode": vnode}).fetchone()
            if not scalar(granted, bool):
                raise _RowByRow()
            conn.execute(sql.SQL(queries.LOCK_WINDOW).format(**names))
            others = conn.execute(
                sql.SQL(queries.WINDOW_HOLDS_OTHERS).format(**names), staged
            ).fetchone()
            if not scalar(others, bool):
                counted = conn.execute(sql.SQL(queries.COUNT_WINDOW).format(**names)).fetchone()
                count = scalar(counted, int)
                conn.execute(sql.SQL(queries.TRUNCATE_WINDOW).format(**names))
                return WindowClearing(removed=count, whole=True)
    except (psycopg.errors.LockNotAvailable, _RowByRow):
        pass  # busy, or its vnode being moved: remove row by row below
    except psycopg.errors.UndefinedTable:  # not a window of ours: look in every window
        table = sql.Identifier(schema, "manta_bucket_deleted_object")
    removed = conn.execute(sql.SQL(queries.REMOVE_RECLAIMED).format(table=table), staged).rowcount
    return WindowClearing(removed=removed, whole=False)


def vacuum_windows(conn: psycopg.Connection[Any], windows: Iterable[tuple[int, str]]) -> None:
    """Vacuum windows (vnode, name) that had rows deleted; `conn` in autocommit mode."""
    for vnode, window in windows:
        with contextlib.suppress(psycopg.errors.UndefinedTable):  # dropped meanwhile
            conn.execute(
                sql.SQL(queries.VACUUM_TABLE).format(
                    table=_names(vnode_schema(vnode), window)["window"]
                )
            )
