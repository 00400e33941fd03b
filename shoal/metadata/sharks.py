"""Which nodes a row names, changed when copies move: a drain's rebalance moves a copy from
one node to another, a dead node leaves the rows that name it (docs/storage.md, "Node
states"). Each change is one conditional statement on the row, never a read-modify-write."""

from __future__ import annotations

from dataclasses import dataclass

from shoal.metadata import queries
from shoal.metadata.base import Component
from shoal.metadata.replicas import Note
from shoal.metadata.shards import render, render_arms


@dataclass(frozen=True)
class Naming:
    """How many rows name a node: live ones and deletion records; `sole`: live rows the node
    alone holds."""

    rows: int
    sole: int


class Sharks(Component):
    async def replace(self, at: Note, old: str, new: str) -> bool:
        """Name `new` instead of `old` in the sharks of the version or part `at.id`, only where
        it is still live and still names `old` (queries.REPLACE_SHARK); False otherwise."""
        vnode = self.shards.ring.vnode_for_object(at.owner, at.bucket_id, at.name)
        params = {**at.key(), "old": old, "new": new}
        rows = await self.rows(vnode, queries.REPLACE_SHARK, params)
        return bool(rows and rows[0]["updated"])

    async def drop_dead(self, shark: str) -> int:
        """Take a dead node out of the sharks of every row that names it beside another node,
        noting each for re-replication in the same transaction, and out of every deletion
        record (GC could never delete its blocks); returns the live rows changed."""
        dropped = 0
        for shard in self.shards.placed():
            for vnode in shard.vnodes:
                async with shard.pool.connection() as conn, conn.transaction():
                    params = {"shark": shark}
                    await conn.execute(render(queries.NOTE_COPIES_ON_SHARK, vnode), params)
                    cur = await conn.execute(render(queries.DROP_NOTED_SHARK, vnode), params)
                    row = await cur.fetchone()
                    await conn.execute(render(queries.DROP_SHARK_FROM_RECORDS, vnode), params)
                    dropped += int(row[0]) if row else 0
        return dropped

    async def naming(self, shark: str) -> Naming:
        """How many rows, over every vnode, name the node `shark`."""
        total = sole = 0
        for shard in self.shards.placed():
            statement = render_arms(
                queries.ROWS_NAMING_SHARK, queries.ROWS_NAMING_SHARK_ARM, tuple(shard.vnodes)
            )
            rows = await self.shard_rows(shard, statement, {"shark": shark})
            total += int(rows[0]["named"])
            sole += int(rows[0]["sole"])
        return Naming(rows=total, sole=sole)
