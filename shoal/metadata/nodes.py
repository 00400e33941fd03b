"""The storage node registry: nodes heartbeat their free space and blocks; writers pick live
nodes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from psycopg.rows import class_row

from shoal.metadata import queries
from shoal.metadata.base import Component
from shoal.metadata.shards import ShardPool

# What an operator made of a node: `active` takes new blocks, `draining` takes none and is
# emptied by `shoal pipeline rebalance`, `dead` is asked for nothing (its copies are made
# again elsewhere). Reads still use a draining node.
ACTIVE, DRAINING, DEAD = "active", "draining", "dead"
NODE_STATES = (ACTIVE, DRAINING, DEAD)


@dataclass(frozen=True)
class StorageNode:
    name: str
    datacenter: str
    url: str
    capacity_bytes: int | None
    free_bytes: int | None  # 0 from a node whose disk takes no writes now
    blocks: int | None  # None: not heartbeated since the node's version had the column
    admin_url: str | None  # its admin listener (/ready, /metrics), if it runs one
    heartbeat: datetime | None
    registered: datetime
    alive: bool  # heartbeat within the deadline, by the database clock

    @property
    def shark(self) -> str:
        return f"{self.datacenter}:{self.name}"


class Nodes(Component):
    async def heartbeat(
        self,
        name: str,
        datacenter: str,
        url: str,
        capacity_bytes: int,
        free_bytes: int,
        *,
        blocks: int,
        admin_url: str | None,
    ) -> None:
        """Register the node, or refresh its addresses, free space, block count and
        heartbeat time."""
        params = {
            "name": name,
            "datacenter": datacenter,
            "url": url,
            "capacity_bytes": capacity_bytes,
            "free_bytes": free_bytes,
            "blocks": blocks,
            "admin_url": admin_url,
        }
        async with self.shards.catalog.pool.connection() as conn:
            await conn.execute(queries.HEARTBEAT_NODE, params)

    async def list(self, deadline: timedelta) -> list[StorageNode]:
        """Every registered node; `alive` if its heartbeat is within `deadline`. While the
        catalog's commits hang (ShardPool.probe_commits), the nodes' heartbeats cannot land:
        the deadline is stretched by the hang, until a deadline after it ended, so that a
        node is not taken for dead for what the catalog could not record."""
        catalog = self.shards.catalog.pool
        async with catalog.reading() as conn:
            cur = conn.cursor(row_factory=class_row(StorageNode))
            await cur.execute(queries.LIST_NODES, {"deadline": stretched(deadline, catalog)})
            return await cur.fetchall()

    # -- node states (docs/storage.md, "Node states") -------------------------------------

    async def states(self) -> dict[str, str]:
        """Each registered node's state, by name: active, draining or dead."""
        async with self.shards.catalog.pool.reading() as conn:
            cur = await conn.execute(queries.NODE_STATES)
            return dict(await cur.fetchall())

    async def set_state(self, name: str, state: str) -> bool:
        """Give a node a state (one of NODE_STATES); False when no such node is registered."""
        if state not in NODE_STATES:
            raise ValueError(f"unknown node state {state!r}")
        async with self.shards.catalog.pool.connection() as conn:
            cur = await conn.execute(queries.SET_NODE_STATE, {"name": name, "state": state})
            return await cur.fetchone() is not None

    async def remove(self, name: str) -> bool:
        """Delete a node's registration; False when there was none. A node that still runs
        registers again (as a new, empty, active node) at its next heartbeat."""
        async with self.shards.catalog.pool.connection() as conn:
            cur = await conn.execute(queries.DELETE_NODE, {"name": name})
            return await cur.fetchone() is not None


def stretched(deadline: timedelta, catalog: ShardPool) -> timedelta:
    """The heartbeat `deadline`, stretched by how long the catalog's commits hang now, or
    hung the last time if that ended less than a deadline ago: the heartbeats that could not
    land meanwhile do not count against their nodes."""
    return deadline + timedelta(seconds=catalog.commits_hung_for(deadline.total_seconds()))
