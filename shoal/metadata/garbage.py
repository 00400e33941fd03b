"""The queries garbage collection needs: batches of deletion records and deleted buckets.

Ages are judged by the database clock (`current_timestamp - leeway`), never a worker's.
A claimed batch is held by its transaction (FOR UPDATE SKIP LOCKED): several workers take
disjoint batches, and a worker that dies releases its batch by rolling back, so every step can
be repeated. Records are removed only by the claimer, after the blocks they name are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import psycopg
from psycopg import sql
from psycopg.rows import class_row, dict_row

from shoal.metadata import queries
from shoal.metadata.base import Component, object_from_row
from shoal.metadata.models import DeletedBucket, ObjectVersion
from shoal.metadata.partitions import window_end
from shoal.metadata.ring import vnode_schema
from shoal.metadata.shards import render, render_arms


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
        """The oldest deletion records of a vnode older than `leeway`, locked for this worker."""
        async with self.shards.of_vnode(vnode).pool.connection() as conn, conn.transaction():
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
                self.shard_rows(shard, render_arms("{arms}", arm, tuple(shard.vnodes)), params)
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


@dataclass(frozen=True)
class Backlog:
    shard: str
    records: int
    bytes: int
    oldest: datetime | None


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
# still writes deleted_at inside it (current_timestamp is the transaction's start).
WINDOW_DROP_GRACE = timedelta(minutes=10)


class GarbageBook(Component):
    """GC's bookkeeping: backlog, runs, pause switch, and dropping reclaimed windows."""

    async def backlog(self) -> list[Backlog]:
        results = []
        for shard in self.shards.placed():
            statement = render_arms(queries.GC_BACKLOG, queries.GC_BACKLOG_ARM, tuple(shard.vnodes))
            row = (await self.shard_rows(shard, statement, {}))[0]
            results.append(
                Backlog(shard.name, row["records"] or 0, row["bytes"] or 0, row["oldest"])
            )
        return results

    async def record_run(self, run: GcRun) -> None:
        async with self.shards.catalog.pool.connection() as conn:
            await conn.execute(
                queries.RECORD_GC_RUN, {k: v for k, v in run.__dict__.items() if k != "finished"}
            )

    async def last_runs(self, limit: int = 10) -> list[GcRun]:
        async with self.shards.catalog.pool.connection() as conn:
            cur = conn.cursor(row_factory=class_row(GcRun))
            await cur.execute(queries.LAST_GC_RUNS, {"limit": limit})
            return await cur.fetchall()

    async def set_paused(self, paused: bool) -> None:
        async with self.shards.catalog.pool.connection() as conn:
            await conn.execute(queries.SET_SETTING, {"key": PAUSED_SETTING, "value": str(paused)})

    async def paused(self) -> bool:
        async with self.shards.catalog.pool.connection() as conn:
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
            now = (await (await conn.execute(queries.DATABASE_NOW)).fetchone())[0]  # type: ignore[index]
            windows = await (await conn.execute(queries.OLD_WINDOWS, {"schema": schema})).fetchall()
            for name, parent in windows:
                end = window_end(name, self.window)
                if end is None or end > now - WINDOW_DROP_GRACE:
                    continue
                async with conn.transaction():
                    table = sql.Identifier(schema, name)
                    await conn.execute(
                        sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(table)
                    )
                    cur = await conn.execute(
                        sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(table)
                    )
                    if (await cur.fetchone())[0]:  # type: ignore[index]
                        continue
                    await conn.execute(
                        sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(
                            sql.Identifier(schema, parent), table
                        )
                    )
                    await conn.execute(sql.SQL("DROP TABLE {}").format(table))
                    dropped += 1
        return dropped
