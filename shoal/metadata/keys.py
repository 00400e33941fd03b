"""Access keys of accounts (Ozone's s3SecretTable): the secret is stored encrypted by the caller."""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from psycopg.rows import class_row

from shoal.metadata import queries
from shoal.metadata.base import Component
from shoal.metadata.errors import AccessKeyNotFound


@dataclass(frozen=True)
class AccessKey:
    access_key_id: str
    account_id: uuid.UUID
    secret_encrypted: bytes
    created: datetime
    revoked: datetime | None


class Keys(Component):
    async def add(
        self, account_id: uuid.UUID, access_key_id: str, secret_encrypted: bytes
    ) -> AccessKey:
        params = {
            "access_key_id": access_key_id,
            "account_id": account_id,
            "secret_encrypted": secret_encrypted,
        }
        return (await self._rows(queries.INSERT_ACCESS_KEY, params))[0]

    async def get(self, access_key_id: str) -> AccessKey:
        params = {"access_key_id": access_key_id}
        found = await self._rows(queries.SELECT_ACCESS_KEY, params, reads=True)
        if not found:
            raise AccessKeyNotFound(f"no access key {access_key_id}")
        return found[0]

    async def list(self, account_id: uuid.UUID) -> list[AccessKey]:
        return await self._rows(queries.LIST_ACCESS_KEYS, {"account_id": account_id}, reads=True)

    async def revoke(self, access_key_id: str) -> None:
        async with self.shards.catalog.pool.connection() as conn:
            cur = await conn.execute(queries.REVOKE_ACCESS_KEY, {"access_key_id": access_key_id})
            if await cur.fetchone() is None:
                raise AccessKeyNotFound(f"no active access key {access_key_id}")

    async def _rows(
        self, query: str, params: Mapping[str, object], *, reads: bool = False
    ) -> builtins.list[AccessKey]:
        pool = self.shards.catalog.pool
        async with pool.reading() if reads else pool.connection() as conn:
            cur = conn.cursor(row_factory=class_row(AccessKey))
            await cur.execute(query, params)
            return await cur.fetchall()
