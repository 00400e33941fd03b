"""What every part of the metadata API shares: running a statement on a vnode's shard,
turning rows into models, and creating a missing deleted-table window on demand."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from typing import Any, TypeVar

import psycopg
from psycopg.types.json import Jsonb

from shoal.metadata import prepared
from shoal.metadata.batched import AfterCommit
from shoal.metadata.errors import BucketNotFound, CommitUnknown, MetadataError, VnodeMoved
from shoal.metadata.metrics import metadata as metrics
from shoal.metadata.models import Bucket, ObjectVersion, ObjectWrite
from shoal.metadata.names import check_bucket_name
from shoal.metadata.outage import vnode_gone
from shoal.metadata.partitions import ensure_window_for_now
from shoal.metadata.queries import BUCKET_TAKES_WRITES, SELECT_BUCKET
from shoal.metadata.shards import Shard, ShardSet, positional, render, render_arms

Row = dict[str, Any]
T = TypeVar("T")
# How long a statement refused by a vnode's old shard waits for the ring to name the new one:
# longer than a move's write pause, shorter than a client's patience.
MOVE_WAIT_SECONDS = 2.0
# How long a DeleteBucket's mark holds writes back: one left by a delete that died stops
# holding them after this. A delete that could not finish well within it gives up
# (Buckets.delete: DELETE_CHECK_SECONDS).
DELETING_MARK_SECONDS = 120


class Component:
    """Base of Buckets, Objects, Uploads and Garbage: all talk to shards through here."""

    def __init__(self, shards: ShardSet, window: timedelta) -> None:
        self.shards = shards
        self.window = window

    async def rows(
        self, vnode: int, template: str, params: Mapping[str, Any], *, upper_bound: bool = False
    ) -> list[Row]:
        """Run one statement of queries.py on a vnode (autocommit) and return its rows.

        Prepared on first use on each connection (prepared.py): each vnode has its own
        statement text. These are the writes that are not one object's row (buckets,
        uploads); those go through write_row, and point reads through read_rows.
        """
        started = time.perf_counter()
        statement, values = _bound(template, vnode, params, upper_bound)

        async def attempt() -> list[Row]:
            shard = self.shards.of_vnode(vnode)
            # A write's wait: bounded while the shard's commits hang.
            async with shard.pool.commit_bound(), shard.statement_connection() as conn:
                try:
                    return await prepared.fetch(conn, statement, values)
                except Exception as exc:
                    # Sent, in autocommit: if the answer was lost, the write may have
                    # committed.
                    failure = shard.pool.failure(exc, may_have_committed=True)
                    if failure is exc:
                        raise
                    raise failure from exc

        try:
            return await self.retrying_window(vnode, attempt)
        finally:
            metrics().statement_took(template, time.perf_counter() - started)

    async def write_row(self, vnode: int, template: str, params: Mapping[str, Any]) -> list[Row]:
        """Run one statement of queries.py that writes the object row of `params` (owner,
        bucket_id, name) in a vnode, and return its rows once committed: in one transaction
        with the other such writes of the vnode's shard that wait at the same time
        (batched.py's group commit)."""
        rows, _ = await self._write_row(vnode, template, params, None)
        return rows

    async def write_object_row(
        self, vnode: int, template: str, params: Mapping[str, Any], bucket: str
    ) -> list[Row]:
        """write_row for a write that makes an object version (a PUT, a copy), then, if it
        wrote, check_bucket_takes_writes for `bucket`, the bucket of `params`. Where the
        bucket's row is on the object row's shard, the check is sent in the write's own
        pipeline, to run after its commit (batched.AfterCommit: one round trip, not two),
        and its answer is looked at only if the write wrote."""
        owner, bucket_id = params["owner"], params["bucket_id"]
        bucket_vnode = self.shards.ring.vnode_for_bucket(owner, bucket)
        statement, values = _bound(
            BUCKET_TAKES_WRITES, bucket_vnode, _takes_writes(owner, bucket, bucket_id)
        )
        check = AfterCommit(statement, tuple(values))
        rows, checked = await self._write_row(vnode, template, params, (bucket_vnode, check))
        if not rows:
            return rows
        if checked is None:  # another shard's, or the read failed: read for itself
            await self.check_bucket_takes_writes(owner, bucket, bucket_id)
        elif not checked:
            raise _being_deleted(bucket)
        return rows

    async def _write_row(
        self,
        vnode: int,
        template: str,
        params: Mapping[str, Any],
        then: tuple[int, AfterCommit] | None,
    ) -> tuple[list[Row], list[Row] | None]:
        """write_row, and the rows of `then` (a read on its vnode) run after the commit if
        that vnode is on the same shard (else None)."""
        started = time.perf_counter()
        statement, values = _bound(template, vnode, params)
        order = (vnode, params["owner"], params["bucket_id"], params["name"])

        def attempt() -> Awaitable[tuple[list[Row], list[Row] | None]]:
            shard = self.shards.of_vnode(vnode)
            after = None
            if then is not None and self.shards.of_vnode(then[0]) is shard:
                after = then[1]
            return shard.writes.write_then_read(statement, values, order, after)

        try:
            return await self.retrying_window(vnode, attempt)
        finally:
            metrics().statement_took(template, time.perf_counter() - started)

    async def read_rows(self, vnode: int, template: str, params: Mapping[str, Any]) -> list[Row]:
        """Run one read-only statement of queries.py on a vnode and return its rows: batched
        with the other reads of the vnode's shard that wait at the same time (batched.py)."""
        started = time.perf_counter()
        statement, values = _bound(template, vnode, params)
        try:
            return await self.following_moves(
                lambda: self.shards.of_vnode(vnode).reads.fetch(statement, values)
            )
        finally:
            metrics().statement_took(template, time.perf_counter() - started)

    async def shard_rows(
        self,
        shard: Shard,
        statement: str,
        params: Mapping[str, Any],
        rows: prepared.RowMaker = prepared.dict_rows,
        *,
        template: str = "",
    ) -> list[Any]:
        """Run a statement over the vnodes of a shard (shards.render_arms). Rows are dicts
        unless `rows` makes them otherwise (a listing makes its entries straight away).
        `template`: the statement of queries.py it was made from, which names it in the
        metrics."""
        started = time.perf_counter()
        text, names = positional(statement)
        try:
            async with shard.statement_connection() as conn:
                values = [params[name] for name in names]
                try:
                    return await prepared.fetch(conn, text, values, rows=rows)
                except Exception as exc:
                    failure = shard.pool.failure(exc, may_have_committed=False)
                    if isinstance(failure, VnodeMoved):
                        # The caller rendered this statement for the vnodes the ring gave the
                        # shard: it cannot be sent elsewhere. Follow the ring for the next call
                        # and refuse this one (a 503 its client tries again).
                        await self.shards.follow_ring(MOVE_WAIT_SECONDS)
                    if failure is exc:
                        raise
                    raise failure from exc
        finally:
            metrics().statement_took(template, time.perf_counter() - started)

    async def every_shard(
        self, merge: str, arm: str, params: Mapping[str, Any], *, upper_bound: bool = False
    ) -> list[list[Row]]:
        """The rows of a statement over every vnode, a list per shard: one statement a shard
        (`merge` around an `arm` per vnode, shards.render_arms), all shards at once, under
        one ring."""
        return await self.under_one_ring(
            lambda: asyncio.gather(
                *(
                    self.shard_rows(
                        shard,
                        render_arms(merge, arm, tuple(shard.vnodes), upper_bound),
                        params,
                        template=merge,
                    )
                    for shard in self.shards.placed()
                )
            )
        )

    async def under_one_ring(self, read: Callable[[], Awaitable[T]]) -> T:
        """Run `read`, a read of every shard (a listing), under one ring version: if a
        shard refused it (VnodeMoved) or the ring changed while it ran (a vnode's rows
        could then have been read on both shards, or on neither), it runs once more."""
        for attempt in range(2):
            ring = self.shards.ring
            try:
                result = await read()
            except VnodeMoved:
                if attempt:
                    raise
                await self.shards.follow_ring(MOVE_WAIT_SECONDS)
                continue
            if self.shards.ring is ring:
                return result
        raise VnodeMoved("the ring changed while the shards were read; try again")

    async def following_moves(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run `attempt`, which finds its shard through the ring when it starts; if the shard
        no longer holds the vnode (VnodeMoved: nothing was written), follow the ring to its
        new owner and run it once more."""
        try:
            return await attempt()
        except VnodeMoved:
            await self.shards.follow_ring(MOVE_WAIT_SECONDS)
        except psycopg.Error as exc:
            if not vnode_gone(exc):  # met in a transaction of the caller's own
                raise
            await self.shards.follow_ring(MOVE_WAIT_SECONDS)
        try:
            return await attempt()
        except psycopg.Error as exc:
            if vnode_gone(exc):
                raise VnodeMoved(f"the vnode moved: {exc}") from exc
            raise

    async def retrying_window(
        self, vnode: int, attempt: Callable[[], Awaitable[T]], *more_vnodes: int
    ) -> T:
        """Run `attempt`, which writes deletion records on `vnode` (and `more_vnodes` of the
        same shard); if one found no window for now, create the windows and rerun. A vnode
        that moved meanwhile is followed to its new shard (`following_moves`)."""
        try:
            return await self.following_moves(attempt)
        except psycopg.errors.CheckViolation as exc:
            if not _no_partition_for_row(exc):
                raise
        async with self.shards.of_vnode(vnode).pool.connection() as conn:
            for written in (vnode, *more_vnodes):
                await ensure_window_for_now(conn, written, self.window)
        return await attempt()

    async def check_bucket_takes_writes(
        self, owner: uuid.UUID, name: str, bucket_id: uuid.UUID
    ) -> None:
        """After an object write committed into incarnation `bucket_id`: CommitUnknown (a
        503) unless it still takes writes, read afresh. A DeleteBucket marks the bucket
        before it checks that it is empty; a write that finds no mark was committed before
        it, so that check sees the write and the delete is refused. One that finds the mark
        (or no bucket) may have landed in an incarnation being deleted, and must not be
        acknowledged: it stays, or goes with the bucket (Buckets.delete)."""
        vnode = self.shards.ring.vnode_for_bucket(owner, name)
        params = _takes_writes(owner, name, bucket_id)
        try:
            takes_writes = await self.read_rows(vnode, BUCKET_TAKES_WRITES, params)
        except MetadataError as exc:
            # The write committed: whatever stops this read must not pass for a write that
            # did not (its caller would drop the blocks the row names).
            raise CommitUnknown(
                f"bucket {name!r} could not be read after a write into it: {exc}"
            ) from exc
        if not takes_writes:
            raise _being_deleted(name)

    async def bucket(self, owner: uuid.UUID, name: str) -> Bucket:
        """The live incarnation of a bucket, or BucketNotFound (see bucket_cache.py)."""
        cached = self.shards.buckets_seen.get(owner, name)
        if cached is not None:
            return cached  # only valid names are ever cached
        check_bucket_name(name)
        vnode = self.shards.ring.vnode_for_bucket(owner, name)
        found = await self.read_rows(vnode, SELECT_BUCKET, {"owner": owner, "name": name})
        if not found:
            raise BucketNotFound(f"no bucket {name!r} for owner {owner}")
        bucket = Bucket(**found[0])
        self.shards.buckets_seen.keep(owner, name, bucket)
        return bucket

    async def locate_object(
        self, owner: uuid.UUID, bucket: str, name: str
    ) -> tuple[uuid.UUID, int, dict[str, Any]]:
        """Where object `name` of a bucket lives: the bucket's id, the object's vnode, and
        the parameters that name its rows (owner, bucket_id, name)."""
        bucket_id = (await self.bucket(owner, bucket)).id
        vnode = self.shards.ring.vnode_for_object(owner, bucket_id, name)
        return bucket_id, vnode, {"owner": owner, "bucket_id": bucket_id, "name": name}

    def forget_bucket(self, owner: uuid.UUID, name: str) -> None:
        self.shards.buckets_seen.forget(owner, name)


def _no_partition_for_row(exc: psycopg.errors.CheckViolation) -> bool:
    """Whether a check_violation (SQLSTATE 23514) is PostgreSQL finding no partition for a
    row: that error names the partitioned table but no constraint, where a CHECK constraint's
    violation names its constraint."""
    return exc.diag.constraint_name is None and exc.diag.table_name is not None


def _takes_writes(owner: uuid.UUID, name: str, bucket_id: uuid.UUID) -> dict[str, Any]:
    """The parameters of BUCKET_TAKES_WRITES."""
    return {
        "owner": owner,
        "name": name,
        "id": bucket_id,
        "mark_lifetime": f"{DELETING_MARK_SECONDS} seconds",
    }


def _being_deleted(name: str) -> CommitUnknown:
    return CommitUnknown(
        f"bucket {name!r} is being deleted: a write into it may go with it; try again"
    )


def _bound(
    template: str, vnode: int, params: Mapping[str, Any], upper_bound: bool = False
) -> tuple[bytes, list[Any]]:
    """A statement of queries.py for a vnode, as prepared.py sends it, and its values."""
    statement, names = positional(render(template, vnode, upper_bound))
    return statement, [params[name] for name in names]


def object_from_row(row: Row) -> ObjectVersion:
    return ObjectVersion(
        id=row["id"],
        owner=row["owner"],
        bucket_id=row["bucket_id"],
        name=row["name"],
        created=row["created"],
        modified=row["modified"],
        creator=row["creator"],
        content_length=row["content_length"],
        content_md5=bytes(row["content_md5"] or b""),
        content_type=row["content_type"],
        headers=row["headers"] or {},
        roles=row["roles"] or [],
        sharks=row["sharks"] or [],
        properties=row["properties"] or {},
        data=row.get("data"),
        deleted_at=row.get("deleted_at"),
    )


def write_params(owner: uuid.UUID, bucket_id: uuid.UUID, name: str, write: ObjectWrite) -> Row:
    """The parameters of PUT_OBJECT and its conditional variants."""
    return {
        "id": write.id,
        "owner": owner,
        "bucket_id": bucket_id,
        "name": name,
        "creator": write.creator,
        "content_length": write.content_length,
        "content_md5": write.content_md5,
        "content_type": write.content_type,
        "headers": dict(write.headers),
        "roles": list(write.roles),
        "sharks": list(write.sharks),
        "properties": Jsonb(write.properties),
        "data": write.data,
    }
