"""The collector: reclaims garbage in small batches, vnode by vnode, every step idempotent.

Used by the daemon inside `shoal serve` and by `shoal gc run`. Several collectors (or workers
of one) never take the same record: batches are claimed with FOR UPDATE SKIP LOCKED and held
until their transaction ends. The blocks of a whole batch are deleted with one request per
storage node (all nodes at once), and each record is removed only if none of the nodes it
names failed. A collector killed at any point loses nothing: blocks already deleted count as
gone on the next run, and records it had claimed are released by the rollback.

A vnode being moved to another shard is left alone (garbage.VnodeBeingMoved): the mover holds
it from before its copy until its switch, waiting first for the GC transactions in flight on
it, so GC neither holds up the move's write fence nor truncates or drops a window (which
would not be replicated to the copy). A vnode that moved since this process read the ring is
left alone too (VnodeMoved); the next pass finds it on its new shard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from shoal.gc.deletion import delete_blocks
from shoal.gc.rules import blocks_of
from shoal.metadata import MetadataStore, ObjectVersion
from shoal.metadata.errors import CommitUnknown, MetadataUnavailable, VnodeMoved
from shoal.metadata.garbage import GcRun, VnodeBeingMoved
from shoal.storage import DataPath, StorageUnavailable

log = logging.getLogger("shoal.gc")

BATCH_SIZE = 100
WORKERS = 4
# Fault injection for tests: exit the process after this many node delete batches.
FAULT_AFTER_ENV = "SHOAL_GC_FAULT_AFTER"


def connections_needed(workers: int) -> int:
    """Connections per shard that a pass of `workers` workers may hold at once.

    A worker keeps its claim's transaction (and connection) open while it makes one more
    statement: the node registry's read, a deleted bucket's contents. One more serves the
    run's own bookkeeping. A smaller pool starves: every connection held by a claim, and
    each claim waiting for a connection.
    """
    return 2 * workers + 1


@dataclass
class Tally:
    found: int = 0
    reclaimed: int = 0
    failed: int = 0
    # Block replicas a node removed (one block on one node); replicas already missing are
    # counted apart. The Spark job counts the same two figures.
    blocks: int = 0
    missing: int = 0
    bytes: int = 0
    windows: int = 0
    vnodes_with_removals: set[int] = field(default_factory=set)
    # Vnodes left for a later pass: being moved, or moved since the ring was read.
    vnodes_skipped: set[int] = field(default_factory=set)


class Collector:
    def __init__(
        self,
        store: MetadataStore,
        data: DataPath,
        leeway: timedelta,
        batch_size: int = BATCH_SIZE,
        workers: int = WORKERS,
        kind: str = "daemon",
    ) -> None:
        self.store = store
        self.data = data
        self.leeway = leeway
        self.batch_size = batch_size
        self.workers = workers
        self.kind = kind
        self._deletions = 0
        # The vnodes the last pass left alone because they were being moved.
        self.vnodes_skipped: list[int] = []
        fault = os.environ.get(FAULT_AFTER_ENV)
        self._fault_after = int(fault) if fault else None

    async def run_once(self) -> GcRun:
        """One pass over every vnode: deletion records, deleted buckets, empty windows."""
        started = datetime.now(UTC)
        tally = Tally()
        gate = asyncio.Semaphore(self.workers)

        async def vnode_pass(vnode: int) -> None:
            async with gate:
                try:
                    await self._records(vnode, tally)
                    await self._buckets(vnode, tally)
                    # Not `tally.windows += await ...`: that reads the tally before the await,
                    # and the vnode passes running meanwhile would have their counts
                    # overwritten.
                    dropped = await self.store.gc_book.drop_empty_windows(vnode)
                    tally.windows += dropped
                except VnodeBeingMoved:
                    tally.vnodes_skipped.add(vnode)
                except VnodeMoved:
                    tally.vnodes_skipped.add(vnode)
                    await self.store.shards.follow_ring()

        vnodes = [v for shard in self.store.shards.placed() for v in shard.vnodes]
        try:
            # A pass that fails stops the others: their errors would only repeat its own.
            async with asyncio.TaskGroup() as passes:
                for vnode in vnodes:
                    passes.create_task(vnode_pass(vnode))
        except ExceptionGroup as failed:
            raise failed.exceptions[0] from None
        # Removed rows are dead tuples until vacuumed; do it now rather than leave it to
        # autovacuum (after every worker's claim has ended, so that they can be reclaimed).
        for vnode in sorted(tally.vnodes_with_removals - tally.vnodes_skipped):
            with contextlib.suppress(VnodeMoved):
                await self.store.gc_book.vacuum_deleted_tables(vnode)
        run = GcRun(
            kind=self.kind,
            leeway=self.leeway,
            started=started,
            finished=datetime.now(UTC),
            records_found=tally.found,
            records_reclaimed=tally.reclaimed,
            records_failed=tally.failed,
            blocks_deleted=tally.blocks,
            bytes_reclaimed=tally.bytes,
            windows_dropped=tally.windows,
        )
        await self.store.gc_book.record_run(run)
        log.info(
            "gc (%s) reclaimed %d of %d records (%d kept), %d block replicas deleted "
            "(%d already gone), %d windows dropped",
            self.kind,
            tally.reclaimed,
            tally.found,
            tally.failed,
            tally.blocks,
            tally.missing,
            tally.windows,
        )
        if tally.vnodes_skipped:
            log.info(
                "gc (%s) left vnode(s) %s for a later pass: being moved to another shard",
                self.kind,
                ", ".join(map(str, sorted(tally.vnodes_skipped))),
            )
        self.vnodes_skipped = sorted(tally.vnodes_skipped)
        return run

    async def run_forever(self, interval: timedelta, stop: asyncio.Event) -> None:
        """The daemon: a pass every `interval` unless paused (`shoal gc pause`)."""
        while not stop.is_set():
            try:
                if not await self.store.gc_book.paused():
                    await self.run_once()
            except (MetadataUnavailable, CommitUnknown, StorageUnavailable) as exc:
                # An outage, expected now and then: one line, not a trace.
                log.warning("gc pass stopped: %s; the next pass retries", exc)
            except Exception:
                log.exception("gc pass failed; the next pass retries")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval.total_seconds())

    async def _records(self, vnode: int, tally: Tally) -> None:
        """Claim batches until one makes no progress (its records' nodes are down) or ends."""
        while True:
            async with self.store.garbage.claim_deleted_objects(
                vnode, self.leeway, self.batch_size
            ) as claim:
                gone = await self._reclaim(claim.records, tally)
                await claim.remove(gone)
            if claim.removed:
                tally.vnodes_with_removals.add(vnode)
            if len(claim.records) < self.batch_size or not gone:
                return

    async def _buckets(self, vnode: int, tally: Tally) -> None:
        async with self.store.garbage.claim_deleted_buckets(vnode, self.leeway) as claim:
            for bucket in claim.buckets:
                if await self._empty_bucket(bucket.owner, bucket.id, tally):
                    await claim.remove(bucket)
                    tally.vnodes_with_removals.add(vnode)

    async def _empty_bucket(self, owner: uuid.UUID, bucket_id: uuid.UUID, tally: Tally) -> bool:
        """Reclaim a deleted incarnation's objects and parts; True once none remain."""
        while True:
            contents = await self.store.garbage.bucket_contents(owner, bucket_id, self.batch_size)
            if not contents:
                await self.store.garbage.remove_bucket_uploads(owner, bucket_id)
                return True
            gone = await self._reclaim(contents, tally)
            await self.store.garbage.remove_bucket_contents(owner, bucket_id, gone)
            if len(gone) < len(contents):
                return False  # some node is down: the bucket record waits for a later pass

    async def _reclaim(self, records: list[ObjectVersion], tally: Tally) -> list[ObjectVersion]:
        """Delete every block of the records, one batch per node with the nodes in parallel;
        return the records that may go."""
        tally.found += len(records)
        runs = [blocks_of(record) for record in records]
        deletion = await delete_blocks(self.data, runs, self._count_deletion)
        tally.blocks += deletion.deleted
        tally.missing += deletion.missing
        gone = []
        for record, may_go in zip(records, deletion.may_go, strict=True):
            if may_go:
                gone.append(record)
                tally.reclaimed += 1
                tally.bytes += record.content_length or 0
            else:
                tally.failed += 1
        return gone

    def _count_deletion(self) -> None:
        self._deletions += 1
        if self._fault_after is not None and self._deletions >= self._fault_after:
            log.error("fault injection: exiting after %d node delete batches", self._deletions)
            os._exit(3)
