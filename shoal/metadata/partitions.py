"""Time windows of the deleted tables: range partitions by deleted_at, created ahead of time.

A window that GC has fully reclaimed is detached and dropped whole (cheap, no dead tuples)
instead of deleted row by row. There is no default partition (it would block detaching), so
a window must exist before any record falls in it: migrate creates the next few, `shoal serve`
keeps creating them, and a write that finds none creates its window and retries.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
from psycopg import sql

from shoal.metadata import queries
from shoal.metadata.ring import vnode_schema
from shoal.metadata.schema import DELETED_TABLES

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
WINDOW_SETTING = "partition_window_seconds"


def window_start(moment: datetime, width: timedelta) -> datetime:
    """The start of the window holding `moment`; windows are aligned on the Unix epoch."""
    elapsed = (moment - EPOCH) // width
    return EPOCH + elapsed * width


def window_name(table: str, start: datetime) -> str:
    return f"{table}_w{start.astimezone(UTC):%Y%m%dt%H%M}"


def window_end(name: str, width: timedelta) -> datetime | None:
    """The end of the window a partition name stands for (None if it is not a window)."""
    try:
        start = datetime.strptime(name.rsplit("_w", 1)[1], "%Y%m%dt%H%M").replace(tzinfo=UTC)
    except (IndexError, ValueError):
        return None
    return start + width


async def ensure_windows(
    conn: psycopg.AsyncConnection, vnodes: list[int], width: timedelta, ahead: int
) -> int:
    """Create the window holding the database's `now` and `ahead` more; returns the count made."""
    row = await (await conn.execute(queries.DATABASE_NOW)).fetchone()
    assert row is not None
    now = row[0]
    created = 0
    for vnode in vnodes:
        for index in range(ahead + 1):
            created += await ensure_window_holding(conn, vnode, now + index * width, width)
    return created


async def ensure_window_holding(
    conn: psycopg.AsyncConnection, vnode: int, moment: datetime, width: timedelta
) -> int:
    """Create the window of each deleted table of `vnode` that holds `moment`, where missing;
    returns the count made."""
    start = window_start(moment, width)
    created = 0
    for table in DELETED_TABLES:
        created += await create_window(conn, vnode_schema(vnode), table, start, width)
    return created


async def ensure_window_for_now(
    conn: psycopg.AsyncConnection, vnode: int, width: timedelta
) -> None:
    """The write path's fallback when no window holds the current time."""
    await ensure_windows(conn, [vnode], width, ahead=1)


async def window_width(conn: psycopg.AsyncConnection) -> timedelta:
    cur = await conn.execute(queries.SELECT_SETTING, {"key": WINDOW_SETTING})
    row = await cur.fetchone()
    if row is None:
        raise LookupError("partition window is not set: the shard is not migrated")
    return timedelta(seconds=int(row[0]))


async def create_window(
    conn: psycopg.AsyncConnection, schema: str, table: str, start: datetime, width: timedelta
) -> int:
    name = window_name(table, start)
    exists = await conn.execute(queries.TABLE_EXISTS, {"schema": schema, "table": name})
    if await exists.fetchone():
        return 0
    # REPLICA IDENTITY FULL: while the vnode moves to another shard, its tables are published
    # for logical replication (moves.py), and PostgreSQL refuses a DELETE (GC reclaiming a
    # record) from a published window without a replica identity; these tables have no key.
    statement = sql.SQL(
        "CREATE TABLE IF NOT EXISTS {schema}.{name} PARTITION OF {schema}.{table} "
        "FOR VALUES FROM ({start}) TO ({end}); "
        "ALTER TABLE {schema}.{name} REPLICA IDENTITY FULL"
    ).format(
        schema=sql.Identifier(schema),
        name=sql.Identifier(name),
        table=sql.Identifier(table),
        start=sql.Literal(start),
        end=sql.Literal(start + width),
    )
    try:
        await conn.execute(statement)
    except (psycopg.errors.DuplicateTable, psycopg.errors.UniqueViolation):
        return 0  # another process created it first
    return 1
