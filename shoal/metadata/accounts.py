"""Accounts (the `owner` of RFD 149's rows), kept on the catalog shard."""

from __future__ import annotations

import re
import uuid

from psycopg.rows import class_row

from shoal.metadata import queries
from shoal.metadata.base import Component
from shoal.metadata.errors import AccountNotFound, InvalidName
from shoal.metadata.models import Account

_ACCOUNT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class Accounts(Component):
    async def create(self, name: str) -> Account:
        """A new account; names are unique."""
        if not _ACCOUNT_NAME.fullmatch(name):
            raise InvalidName(
                f"invalid account name {name!r}: use 1 to 64 letters, digits, '.', '_' or '-'"
            )
        async with self.shards.catalog.pool.connection() as conn:
            cur = conn.cursor(row_factory=class_row(Account))
            await cur.execute(queries.INSERT_ACCOUNT, {"id": uuid.uuid4(), "name": name})
            account = await cur.fetchone()
        if account is None:
            raise InvalidName(f"an account named {name!r} already exists")
        return account

    async def list(self) -> list[Account]:
        async with self.shards.catalog.pool.reading() as conn:
            cur = conn.cursor(row_factory=class_row(Account))
            await cur.execute(queries.LIST_ACCOUNTS)
            return await cur.fetchall()

    async def get(self, account_id: uuid.UUID) -> Account:
        return await self._one(queries.SELECT_ACCOUNT, {"id": account_id}, str(account_id))

    async def get_by_name(self, name: str) -> Account:
        return await self._one(queries.SELECT_ACCOUNT_BY_NAME, {"name": name}, repr(name))

    async def _one(self, query: str, params: dict[str, object], label: str) -> Account:
        async with self.shards.catalog.pool.reading() as conn:
            cur = conn.cursor(row_factory=class_row(Account))
            await cur.execute(query, params)
            account = await cur.fetchone()
        if account is None:
            raise AccountNotFound(f"no account {label}")
        return account
