"""Bucket inventory configurations (S3 Inventory): kept on the catalog shard per bucket
incarnation, one row per configuration id, removed with the bucket.

The gateway validates a configuration and stores it as a JSON document (shoal/s3/inventory.py
describes its fields); `shoal pipeline inventory` reads them all, delivers the reports that
are due and records when it did.
"""

from __future__ import annotations

import builtins
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from shoal.metadata import queries
from shoal.metadata.base import Component
from shoal.metadata.errors import TooManyConfigurations

MAX_CONFIGURATIONS = 1000  # per bucket, as S3


@dataclass(frozen=True)
class InventorySetting:
    """One stored configuration, as the pipeline reads it: whose bucket, and its last
    delivery by the database clock (`now` is that clock when it was read)."""

    bucket_id: uuid.UUID
    owner: uuid.UUID
    bucket: str
    id: str
    configuration: dict[str, Any]
    delivered: datetime | None
    now: datetime


class Inventories(Component):
    async def put(self, owner: uuid.UUID, name: str, configuration: dict[str, Any]) -> None:
        """Add or replace the configuration `configuration["id"]` (validated by the caller);
        TooManyConfigurations when the bucket already has MAX_CONFIGURATIONS others."""
        bucket = await self.bucket(owner, name)
        params = {
            "bucket_id": bucket.id,
            "id": configuration["id"],
            "owner": owner,
            "bucket": name,
            "configuration": Jsonb(configuration),
            "limit": MAX_CONFIGURATIONS,
        }
        async with self.shards.catalog.pool.connection() as conn, conn.transaction():
            await conn.execute(queries.LOCK_BUCKET_INVENTORY, params)
            stored = await (await conn.execute(queries.PUT_INVENTORY, params)).fetchone()
        if stored is None:
            raise TooManyConfigurations(
                f"bucket {name!r} already has {MAX_CONFIGURATIONS} inventory configurations"
            )

    async def get(self, owner: uuid.UUID, name: str, config_id: str) -> dict[str, Any] | None:
        bucket = await self.bucket(owner, name)
        params = {"bucket_id": bucket.id, "id": config_id}
        async with self.shards.catalog.pool.reading() as conn:
            row = await (await conn.execute(queries.GET_INVENTORY, params)).fetchone()
        return None if row is None else dict(row[0])

    async def list(
        self, owner: uuid.UUID, name: str, after: str = "", limit: int = 100
    ) -> list[dict[str, Any]]:
        """The bucket's configurations in id order, those after `after`, at most `limit`."""
        bucket = await self.bucket(owner, name)
        params = {"bucket_id": bucket.id, "after": after, "limit": limit}
        async with self.shards.catalog.pool.reading() as conn:
            rows = await (await conn.execute(queries.LIST_INVENTORIES, params)).fetchall()
        return [dict(row[0]) for row in rows]

    async def delete(self, owner: uuid.UUID, name: str, config_id: str) -> bool:
        """Remove one configuration; False if the bucket had none of that id."""
        bucket = await self.bucket(owner, name)
        params = {"bucket_id": bucket.id, "id": config_id}
        async with self.shards.catalog.pool.connection() as conn:
            gone = await (await conn.execute(queries.DELETE_INVENTORY, params)).fetchone()
        return gone is not None

    async def all(self) -> builtins.list[InventorySetting]:
        """Every configuration of every bucket (the pipeline's reading)."""
        async with self.shards.catalog.pool.reading() as conn:
            rows = await (await conn.execute(queries.ALL_INVENTORIES)).fetchall()
        return [InventorySetting(r[0], r[1], r[2], r[3], dict(r[4]), r[5], r[6]) for r in rows]

    async def mark_delivered(self, bucket_id: uuid.UUID, config_id: str, at: datetime) -> None:
        params = {"bucket_id": bucket_id, "id": config_id, "delivered": at}
        async with self.shards.catalog.pool.connection() as conn:
            await conn.execute(queries.MARK_INVENTORY_DELIVERED, params)
