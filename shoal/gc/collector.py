"""The collector: reclaims garbage in small batches, vnode by vnode, every step idempotent.

Used by the daemon inside `shoal serve` and by `shoal gc run`. Several collectors (or workers
of one) never take the same record: batches are claimed with FOR UPDATE SKIP LOCKED and held
until their transaction ends. A collector killed at any point loses nothing: blocks already
deleted count as gone on the next run, and records it had claimed are released by the
rollback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from shoal.gc.rules import blocks_of, may_remove
from shoal.metadata import MetadataStore, ObjectVersion
from shoal.metadata.garbage import GcRun
from shoal.storage import DataPath

log = logging.getLogger("shoal.gc")

BATCH_SIZE = 100
WORKERS = 4
DEFAULT_INTERVAL = timedelta(minutes=15)
# Fault injection for tests: exit the process after this many block-delete calls.
FAULT_AFTER_ENV = "SHOAL_GC_FAULT_AFTER"


@dataclass
class Tally:
    found: int = 0
    reclaimed: int = 0
    failed: int = 0
    blocks: int = 0
    bytes: int = 0
    windows: int = 0


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
        fault = os.environ.get(FAULT_AFTER_ENV)
        self._fault_after = int(fault) if fault else None

    async def run_once(self) -> GcRun:
        """One pass over every vnode: deletion records, deleted buckets, empty windows."""
        started = datetime.now(UTC)
        tally = Tally()
        gate = asyncio.Semaphore(self.workers)

        async def vnode_pass(vnode: int) -> None:
            async with gate:
                await self._records(vnode, tally)
                await self._buckets(vnode, tally)
                tally.windows += await self.store.gc_book.drop_empty_windows(vnode)

        vnodes = [v for shard in self.store.shards.placed() for v in shard.vnodes]
        await asyncio.gather(*(vnode_pass(v) for v in vnodes))
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
        return run

    async def run_forever(self, interval: timedelta, stop: asyncio.Event) -> None:
        """The daemon: a pass every `interval` unless paused (`shoal gc pause`)."""
        while not stop.is_set():
            try:
                if not await self.store.gc_book.paused():
                    run = await self.run_once()
                    log.info(
                        "gc reclaimed %d of %d records (%d failed), %d blocks, %d windows",
                        run.records_reclaimed,
                        run.records_found,
                        run.records_failed,
                        run.blocks_deleted,
                        run.windows_dropped,
                    )
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
            if len(claim.records) < self.batch_size or not gone:
                return

    async def _buckets(self, vnode: int, tally: Tally) -> None:
        async with self.store.garbage.claim_deleted_buckets(vnode, self.leeway) as claim:
            for bucket in claim.buckets:
                if await self._empty_bucket(bucket.owner, bucket.id, tally):
                    await claim.remove(bucket)

    async def _empty_bucket(self, owner: uuid.UUID, bucket_id: uuid.UUID, tally: Tally) -> bool:
        """Reclaim a deleted incarnation's objects and parts; True once none remain."""
        while True:
            contents = await self.store.garbage.bucket_contents(owner, bucket_id, self.batch_size)
            if not contents:
                return True
            gone = await self._reclaim(contents, tally)
            await self.store.garbage.remove_bucket_contents(owner, bucket_id, gone)
            if len(gone) < len(contents):
                return False  # some node is down: the bucket record waits for a later pass

    async def _reclaim(self, records: list[ObjectVersion], tally: Tally) -> list[ObjectVersion]:
        """Delete every block of each record; return the records that may go."""
        tally.found += len(records)
        gone = []
        for record in records:
            outcome = await self.data.delete(blocks_of(record))
            self._count_deletion()
            tally.blocks += outcome.deleted
            if may_remove(outcome):
                gone.append(record)
                tally.reclaimed += 1
                tally.bytes += record.content_length or 0
            else:
                tally.failed += 1
        return gone

    def _count_deletion(self) -> None:
        self._deletions += 1
        if self._fault_after is not None and self._deletions >= self._fault_after:
            log.error("fault injection: exiting after %d deletions", self._deletions)
            os._exit(3)
