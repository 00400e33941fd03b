"""`shoal db status`: what each shard holds, read from the catalogs and the tables themselves."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import psycopg
from psycopg import sql
from psycopg.rows import class_row

from shoal.config import ShardConfig
from shoal.metadata import queries
from shoal.metadata.errors import SchemaError
from shoal.metadata.migrate import applied_versions
from shoal.metadata.nodes import StorageNode
from shoal.metadata.ring import MOVED_COPY_PREFIX, VNODE_SCHEMA_PREFIX, Ring, vnode_schema
from shoal.metadata.shards import first_line, read_ring, scalar

VNODE_TABLES = (
    "manta_bucket",
    "manta_bucket_object",
    "manta_bucket_deleted_bucket",
    "manta_bucket_deleted_object",
    "manta_bucket_upload",
    "manta_bucket_upload_part",
    "manta_bucket_under_replicated",  # versions waiting for re-replication
)
SHARD_TABLES = ("bucket_directory",)  # the '/' directory of the shard's vnodes
CATALOG_TABLES = ("account", "access_key", "bucket_name", "storage_node")


@dataclass
class ShardStatus:
    name: str
    server_version: str
    vnodes: list[int]
    schema_versions: dict[str, int]
    row_counts: dict[str, int] = field(default_factory=dict)
    windows: int = 0


@dataclass
class ClusterStatus:
    ring: Ring
    shards: list[ShardStatus]
    nodes: list[StorageNode]


async def cluster_status(configs: Sequence[ShardConfig], node_deadline: timedelta) -> ClusterStatus:
    async with await _connect(configs[0]) as catalog:
        ring = await read_ring(catalog)
        cur = catalog.cursor(row_factory=class_row(StorageNode))
        await cur.execute(queries.LIST_NODES, {"deadline": node_deadline})
        nodes = await cur.fetchall()
    statuses = []
    for index, config in enumerate(configs):
        statuses.append(await _shard_status(config, ring, with_catalog=index == 0))
    return ClusterStatus(ring=ring, shards=statuses, nodes=nodes)


async def _connect(config: ShardConfig) -> psycopg.AsyncConnection:
    try:
        return await psycopg.AsyncConnection.connect(
            config.dsn, autocommit=True, connect_timeout=10
        )
    except psycopg.OperationalError as exc:
        raise SchemaError(f"cannot connect to shard {config.name}: {first_line(exc)}") from None


async def _shard_status(config: ShardConfig, ring: Ring, with_catalog: bool) -> ShardStatus:
    async with await _connect(config) as conn:
        vnodes = ring.vnodes_of(config.name)
        versions = await applied_versions(conn)
        status = ShardStatus(
            name=config.name,
            server_version=conn.info.parameter_status("server_version") or "?",
            vnodes=vnodes,
            schema_versions=summarize_versions(versions),
        )
        shoal_tables = (*SHARD_TABLES, *(CATALOG_TABLES if with_catalog else ()))
        tables = [(vnode_schema(v), t) for v in vnodes for t in VNODE_TABLES]
        tables += [("shoal", t) for t in shoal_tables]
        if tables:
            arms = sql.SQL(" UNION ALL ").join(
                sql.SQL("SELECT {label} AS name, count(*) FROM {schema}.{table}").format(
                    label=sql.Literal(table),
                    schema=sql.Identifier(schema),
                    table=sql.Identifier(table),
                )
                for schema, table in tables
            )
            query = sql.SQL("SELECT name, sum(count)::bigint FROM ({arms}) c GROUP BY name").format(
                arms=arms
            )
            rows = await (await conn.execute(query)).fetchall()
            counts: dict[str, int] = {name: count for name, count in rows}
            status.row_counts = {t: counts.get(t, 0) for t in (*VNODE_TABLES, *shoal_tables)}
        windows = await conn.execute(queries.COUNT_WINDOWS, {})
        status.windows = scalar(await windows.fetchone(), int)
        return status


def summarize_versions(versions: dict[str, int]) -> dict[str, int]:
    """Shard and catalog versions as they are; vnode schemas as their lowest version. The
    old copies a vnode move leaves until its grace period ends (`moved_manta_bucket_*`) are
    left out: no statement uses them, and `shoal ring status` lists them."""
    summary = {
        k: v
        for k, v in versions.items()
        if not k.startswith((VNODE_SCHEMA_PREFIX, MOVED_COPY_PREFIX))
    }
    vnode_versions = [v for k, v in versions.items() if k.startswith(VNODE_SCHEMA_PREFIX)]
    if vnode_versions:
        summary["vnode"] = min(vnode_versions)
    return summary
