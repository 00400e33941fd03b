"""Notes of versions short of their copies, for re-replication (docs/storage.md).

A write that reached fewer storage nodes than the target notes its version (or multipart
part, by id) in the vnode's `manta_bucket_under_replicated` before its row commits; a
re-replicator claims notes, finds where each id is still live, adds copies, records the new
sharks with one conditional statement, and removes the note. A write at full replication
notes nothing and costs nothing more.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import psycopg
from psycopg.rows import dict_row

from shoal.metadata import queries
from shoal.metadata.base import Component
from shoal.metadata.shards import render, render_arms

# A note whose version is not found is dropped only once it is this old: until then its
# write may still be committing (the note goes in first).
SETTLE_GRACE = timedelta(minutes=5)


@dataclass(frozen=True)
class Note:
    """A version (or part) noted as short of copies; `settled` once past the grace."""

    owner: uuid.UUID
    bucket_id: uuid.UUID
    name: str
    id: uuid.UUID
    settled: bool = False

    def key(self) -> dict[str, object]:
        return {"owner": self.owner, "bucket_id": self.bucket_id, "name": self.name, "id": self.id}


@dataclass(frozen=True)
class LiveRun:
    """Where the blocks of a noted id are, as its live row says."""

    size: int
    block_size: int | None  # None: the default of versions written before it was recorded
    sharks: list[str]


@dataclass
class ClaimedNotes:
    """Notes held by one re-replicator until its `claim` block ends."""

    notes: list[Note]
    _conn: psycopg.AsyncConnection
    _vnode: int
    removed: int = field(default=0)

    async def remove(self, notes: Sequence[Note]) -> None:
        """Drop notes that are done (committed when the claim block ends)."""
        if notes:
            cur = await self._conn.execute(
                render(queries.REMOVE_UNDER_REPLICATED, self._vnode), {"ids": [n.id for n in notes]}
            )
            self.removed += cur.rowcount

    async def postpone(self, notes: Sequence[Note]) -> None:
        """Send notes that must wait to the back of the vnode's queue."""
        if notes:
            await self._conn.execute(
                render(queries.POSTPONE_UNDER_REPLICATED, self._vnode),
                {"ids": [n.id for n in notes]},
            )


class UnderReplicated(Component):
    async def note(self, owner: uuid.UUID, bucket_id: uuid.UUID, name: str, id: uuid.UUID) -> None:
        """Note a version or part as short of copies (a note already there stays as it is)."""
        vnode = self.shards.ring.vnode_for_object(owner, bucket_id, name)
        params = {"owner": owner, "bucket_id": bucket_id, "name": name, "id": id}
        await self.rows(vnode, queries.NOTE_UNDER_REPLICATED, params)

    @contextlib.asynccontextmanager
    async def claim(
        self, vnode: int, limit: int = 100, grace: timedelta = SETTLE_GRACE
    ) -> AsyncIterator[ClaimedNotes]:
        """The oldest notes of a vnode, locked for this caller until the block ends."""
        async with self.shards.of_vnode(vnode).pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                render(queries.CLAIM_UNDER_REPLICATED, vnode), {"grace": grace, "limit": limit}
            )
            notes = [Note(**row) for row in await cur.fetchall()]
            yield ClaimedNotes(notes=notes, _conn=conn, _vnode=vnode)

    async def locate(self, note: Note) -> LiveRun | None:
        """Where the noted id's blocks are, or None when it is no longer live."""
        vnode = self.shards.ring.vnode_for_object(note.owner, note.bucket_id, note.name)
        rows = await self.read_rows(vnode, queries.LOCATE_UNDER_REPLICATED, note.key())
        if not rows:
            return None
        row = rows[0]
        block_size = row["block_size"]
        return LiveRun(
            size=row["size"] or 0,
            block_size=int(block_size) if block_size else None,
            sharks=list(row["sharks"] or []),
        )

    async def add_sharks(self, note: Note, added: Sequence[str]) -> bool:
        """Name `added` among the noted id's sharks, only where it is still live; False when
        it was replaced or deleted meanwhile (queries.ADD_SHARKS)."""
        vnode = self.shards.ring.vnode_for_object(note.owner, note.bucket_id, note.name)
        params = {**note.key(), "added": list(added)}
        rows = await self.rows(vnode, queries.ADD_SHARKS, params)
        return bool(rows and rows[0]["updated"])

    async def vnodes_with_notes(self) -> list[int]:
        """The vnodes holding notes, read under one ring (a vnode that moved since this
        process read the ring is found on its new shard, not missed)."""

        async def read() -> list[int]:
            found: list[int] = []
            for shard in self.shards.placed():
                arm = queries.UNDER_REPLICATED_VNODE_ARM
                statement = render_arms("{arms}", arm, tuple(shard.vnodes))
                rows = await self.shard_rows(shard, statement, {}, template=arm)
                found += [row["vnode"] for row in rows]
            return sorted(found)

        return await self.under_one_ring(read)

    async def count(self) -> int:
        """Notes waiting, over every vnode (under one ring, as vnodes_with_notes)."""

        async def read() -> int:
            total = 0
            for shard in self.shards.placed():
                statement = render_arms(
                    queries.UNDER_REPLICATED_COUNT,
                    queries.UNDER_REPLICATED_COUNT_ARM,
                    tuple(shard.vnodes),
                )
                rows = await self.shard_rows(
                    shard, statement, {}, template=queries.UNDER_REPLICATED_COUNT
                )
                total += int(rows[0]["notes"])
            return total

        return await self.under_one_ring(read)
