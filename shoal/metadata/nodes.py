"""The storage node registry: nodes heartbeat their free space and blocks; writers pick live
nodes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from psycopg.rows import class_row

from shoal.metadata import queries
from shoal.metadata.base import Component


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
        async with self.shards.catalog.pool.reading() as conn:
            cur = conn.cursor(row_factory=class_row(StorageNode))
            await cur.execute(queries.LIST_NODES, {"deadline": deadline})
            return await cur.fetchall()
