"""`shoal db migrate`: bring every shard to the current schema; running it twice changes nothing.

Each scope (shard, catalog, one per vnode schema) has its own version sequence in
`shoal.schema_migrations`. Migrations run under an advisory lock, one transaction per scope,
so concurrent migrators wait for each other and a failed migration leaves no half-made scope.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

import psycopg
from psycopg import sql

from shoal.config import MetadataConfig, ShardConfig
from shoal.metadata import queries
from shoal.metadata.errors import SchemaError
from shoal.metadata.partitions import WINDOW_SETTING, ensure_windows, window_width
from shoal.metadata.ring import Ring, initial_ring, vnode_of_schema, vnode_schema
from shoal.metadata.schema import (
    CATALOG_MIGRATIONS,
    CREATE_MIGRATIONS_TABLE,
    RENUMBERED,
    SHARD_MIGRATIONS,
    VNODE_MIGRATIONS,
    Migration,
)
from shoal.metadata.shards import (
    MIN_SERVER_VERSION,
    first_line,
    missing_vnode_migrations,
    moves_first,
)

MIGRATION_LOCK = 0x5340A1  # advisory lock key shared by every migrator


async def migrate(shards: Sequence[ShardConfig], config: MetadataConfig) -> Ring:
    """Migrate every shard, store the ring on first use, create the deleted-table windows."""
    if not shards:
        raise SchemaError("no shards configured")
    conns = {s.name: await connect_shard(s) for s in shards}
    try:
        for conn in conns.values():
            await apply_migrations(conn, "shard", SHARD_MIGRATIONS)
            await store_setting(
                conn, WINDOW_SETTING, str(int(config.partition_window.total_seconds()))
            )
        catalog = conns[shards[0].name]
        await apply_migrations(catalog, "catalog", CATALOG_MIGRATIONS)
        ring = await _ring(catalog, [s.name for s in shards], config.vnodes)
        # A vnode in the middle of a move is the mover's: between its fence and its switch
        # the source's schema is renamed, and making `manta_bucket_<v>` again there would
        # make a second, empty copy (docs/metadata.md, "Shards and vnodes").
        cur = await catalog.execute(queries.MOVING_VNODES)
        moving = {row[0] for row in await cur.fetchall()}
        left_behind = []
        for name, conn in conns.items():
            vnodes = [v for v in ring.vnodes_of(name) if v not in moving]
            for vnode in vnodes:
                await apply_migrations(
                    conn, vnode_schema(vnode), VNODE_MIGRATIONS, vnode_schema(vnode)
                )
            await ensure_windows(conn, vnodes, await window_width(conn), config.partitions_ahead)
            applied: dict[str, list[int]] = dict(
                await (await conn.execute(queries.APPLIED_BY_SCOPE)).fetchall()
            )
            left_behind += [
                v
                for v in moving & set(ring.vnodes_of(name))
                if missing_vnode_migrations(applied, v)
            ]
        if left_behind:
            raise SchemaError(f"migrated all but the moving vnodes {moves_first(left_behind)}")
        return ring
    finally:
        for conn in conns.values():
            await conn.close()


async def applied_versions(conn: psycopg.AsyncConnection) -> dict[str, int]:
    """The highest applied version of each scope on one shard."""
    try:
        cur = await conn.execute(queries.APPLIED_VERSIONS)
    except psycopg.errors.UndefinedTable:
        return {}
    return dict(await cur.fetchall())


async def connect_shard(shard: ShardConfig) -> psycopg.AsyncConnection:
    try:
        conn = await psycopg.AsyncConnection.connect(shard.dsn, autocommit=True)
    except psycopg.OperationalError as exc:
        raise SchemaError(f"cannot connect to shard {shard.name}: {first_line(exc)}") from None
    if conn.info.server_version < MIN_SERVER_VERSION:
        await conn.close()
        raise SchemaError(
            f"shard {shard.name} runs PostgreSQL {conn.info.server_version // 10000}; "
            "Shoal needs 18 or newer"
        )
    return conn


async def apply_migrations(
    conn: psycopg.AsyncConnection,
    scope: str,
    migrations: Sequence[Migration],
    schema: str | None = None,
) -> None:
    async with conn.transaction():
        await conn.execute(queries.LOCK_MIGRATIONS, {"key": MIGRATION_LOCK})
        await conn.execute(CREATE_MIGRATIONS_TABLE)
        for renumbered in RENUMBERED:
            if renumbered.scope == scope:
                await conn.execute(queries.RENUMBER_MIGRATION, asdict(renumbered))
        cur = await conn.execute(queries.APPLIED_IN_SCOPE, {"scope": scope})
        done = {row[0] for row in await cur.fetchall()}
        for migration in migrations:
            if migration.version in done:
                continue
            if schema is None:
                await conn.execute(migration.ddl)
            else:
                await conn.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema))
                )
                ddl = sql.SQL(migration.ddl).format(
                    schema=sql.Identifier(schema), vnode=sql.Literal(vnode_of_schema(schema))
                )
                await conn.execute(ddl)
            await conn.execute(
                queries.RECORD_MIGRATION,
                {"scope": scope, "version": migration.version, "name": migration.name},
            )


async def store_setting(conn: psycopg.AsyncConnection, key: str, value: str) -> None:
    await conn.execute(queries.STORE_SETTING, {"key": key, "value": value})


async def _ring(catalog: psycopg.AsyncConnection, shard_names: list[str], vnodes: int) -> Ring:
    """The stored ring, or version 1 made from the configuration on first migrate."""
    async with catalog.transaction():
        await catalog.execute(queries.LOCK_MIGRATIONS, {"key": MIGRATION_LOCK})
        rows = await (await catalog.execute(queries.SELECT_RING)).fetchall()
        if rows:
            ring = Ring(version=rows[0][0], assignment=tuple(r[2] for r in rows))
        else:
            ring = initial_ring(shard_names, vnodes)
            await catalog.execute(
                queries.INSERT_RING, {"version": ring.version, "vnodes": ring.vnodes}
            )
            async with catalog.cursor() as cur:
                await cur.executemany(
                    queries.INSERT_RING_VNODE,
                    [
                        {"version": ring.version, "vnode": v, "shard": s}
                        for v, s in enumerate(ring.assignment)
                    ],
                )
    missing = sorted(set(ring.shards) - set(shard_names))
    if missing:
        raise SchemaError(
            f"ring version {ring.version} places vnodes on shard(s) {', '.join(missing)}, "
            "which the configuration does not name"
        )
    return ring
