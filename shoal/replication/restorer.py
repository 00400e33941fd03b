"""The re-replicator: gives every noted version the copies it is short of.

A write that reached fewer storage nodes than the target (a node was down) notes its version
or part before its row commits (metadata/replicas.py). Every few seconds, inside `shoal serve`
beside the GC daemon, and once per `shoal pipeline audit --repair`, a pass claims the notes of
each vnode that has some and, for each, while enough nodes are writable:

1. finds where the id is still live (the object's version, a part of a completed multipart
   object, or a part of an open upload); not found and older than the grace: the version was
   replaced, deleted or never committed, and the note goes;
2. copies each block from a good replica to new nodes (placement.choose, excluding the nodes
   that hold it);
3. adds the new nodes to the row's sharks (or the part's), conditionally on the id still
   being live, in one statement (queries.ADD_SHARKS); if it was replaced meanwhile, the
   copies are deleted again, since nothing names them;
4. removes the note.

Every step can be repeated: a pass killed anywhere leaves the note (its claim rolls back), and
the next one finds the version complete (crash after 3) or copies again (a PUT of the same
bytes is accepted); copies of a crash between 2 and 3 are left to the orphan job.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from dataclasses import dataclass
from datetime import timedelta

from shoal.metadata import MetadataStore
from shoal.metadata.errors import CommitUnknown, MetadataUnavailable, VnodeMoved
from shoal.metadata.replicas import SETTLE_GRACE, Note
from shoal.storage import (
    DEFAULT_BLOCK_SIZE,
    BlockRun,
    DataPath,
    DataUnavailable,
    NodeError,
    StorageUnavailable,
)

log = logging.getLogger("shoal.replication")

INTERVAL = timedelta(seconds=5)
BATCH_SIZE = 100
# Versions copied at once: enough to keep both ends busy, few enough that a pass after a
# long outage does not crowd out the gateway's own traffic to the nodes.
CONCURRENCY = 8


class Outcome(enum.Enum):
    RESTORED = "restored"  # copies added and named in the row
    COMPLETE = "complete"  # had its copies already (a pass died after naming them)
    GONE = "gone"  # no longer live: replaced, deleted, or never committed
    WAITING = "waiting"  # no node to copy to or no good replica to copy from: try later
    KEPT = "kept"  # not found yet but young, or changed under the copy: look again


@dataclass
class Tally:
    noted: int = 0  # notes looked at
    restored: int = 0
    complete: int = 0
    gone: int = 0
    waiting: int = 0  # waiting or kept: still noted after the pass

    def count(self, outcome: Outcome) -> None:
        self.noted += 1
        if outcome in (Outcome.WAITING, Outcome.KEPT):
            self.waiting += 1
        else:
            setattr(self, outcome.value, getattr(self, outcome.value) + 1)


class Rereplicator:
    def __init__(
        self,
        store: MetadataStore,
        data: DataPath,
        batch_size: int = BATCH_SIZE,
        concurrency: int = CONCURRENCY,
        grace: timedelta = SETTLE_GRACE,
    ) -> None:
        self.store = store
        self.data = data
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.grace = grace

    async def run_once(self) -> Tally:
        """One pass over the vnodes that hold notes; nothing while too few nodes are writable
        to give a version all its copies."""
        tally = Tally()
        target = await self.data.target_replicas()
        if len(await self.data.directory.writable_nodes()) < target:
            return tally
        gate = asyncio.Semaphore(self.concurrency)
        for vnode in await self.store.under_replicated.vnodes_with_notes():
            try:
                await self._vnode(vnode, target, gate, tally)
            except VnodeMoved:
                # Its notes moved with it; the next pass finds them on the new shard.
                log.info("re-replication: vnode %d moved; left for the next pass", vnode)
                await self.store.shards.follow_ring()
        if tally.noted:
            log.info(
                "re-replication: %d versions restored, %d already complete, %d gone, %d waiting",
                tally.restored,
                tally.complete,
                tally.gone,
                tally.waiting,
            )
        return tally

    async def run_forever(self, stop: asyncio.Event, interval: timedelta = INTERVAL) -> None:
        """The daemon inside `shoal serve`: a pass every `interval` (cheap when there are no
        notes: one statement per shard)."""
        while not stop.is_set():
            try:
                await self.run_once()
            except (MetadataUnavailable, CommitUnknown, StorageUnavailable) as exc:
                # An outage, expected now and then: one line, not a trace.
                log.warning("re-replication pass stopped: %s; the next pass retries", exc)
            except Exception:
                log.exception("re-replication pass failed; the next pass retries")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval.total_seconds())

    async def _vnode(self, vnode: int, target: int, gate: asyncio.Semaphore, tally: Tally) -> None:
        """Claim batches until one ends the notes or makes no progress."""
        while True:
            async with self.store.under_replicated.claim(
                vnode, self.batch_size, self.grace
            ) as claim:

                async def restore(note: Note) -> Outcome:
                    async with gate:
                        return await self._restore(note, target)

                outcomes = await asyncio.gather(*(restore(n) for n in claim.notes))
                done = [n for n, o in zip(claim.notes, outcomes, strict=True) if _done(o)]
                waiting = [
                    n for n, o in zip(claim.notes, outcomes, strict=True) if o is Outcome.WAITING
                ]
                await claim.remove(done)
                await claim.postpone(waiting)
            for outcome in outcomes:
                tally.count(outcome)
            if len(claim.notes) < self.batch_size or not done:
                return

    async def _restore(self, note: Note, target: int) -> Outcome:
        live = await self.store.under_replicated.locate(note)
        if live is None:
            return Outcome.GONE if note.settled else Outcome.KEPT
        holders = sorted(set(live.sharks))
        if len(holders) >= target:
            return Outcome.COMPLETE
        run = BlockRun(note.id, live.size, live.block_size or DEFAULT_BLOCK_SIZE, holders)
        try:
            added = await self.data.add_copies(run, target - len(holders))
        except (StorageUnavailable, DataUnavailable, NodeError) as exc:
            log.warning("re-replication of %s waits: %s", note.id, exc)
            return Outcome.WAITING
        if await self.store.under_replicated.add_sharks(note, added):
            return Outcome.RESTORED
        # Replaced or deleted (or a part completed into an object) while copying: no row
        # names these copies, and the claim keeps other re-replicators off this id.
        copies = BlockRun(note.id, live.size, run.block_size, added)
        with contextlib.suppress(Exception):
            await self.data.delete([copies])
        return Outcome.KEPT


def _done(outcome: Outcome) -> bool:
    return outcome in (Outcome.RESTORED, Outcome.COMPLETE, Outcome.GONE)
