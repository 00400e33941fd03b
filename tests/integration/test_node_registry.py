"""The storage node registry's block counts and admin URLs (catalog migration 8), on a
catalog that already had nodes before it, and the migration runner's handling of versions
that arrive out of order (a lower version merged after a higher one was applied)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import psycopg

from shoal.config import MetadataConfig
from shoal.metadata import MetadataStore, migrate
from shoal.metadata.migrate import apply_migrations
from shoal.metadata.schema import CATALOG_MIGRATIONS, SHARD_MIGRATIONS, Migration
from tests.fixtures.postgres import close_later, create_databases

DEADLINE = timedelta(seconds=30)
ADDED = 8  # the catalog migration that adds blocks and admin_url


def test_nodes_registered_before_the_migration_keep_their_rows_and_then_report_blocks(
    admin_dsn: str, run: Callable[[Awaitable[Any]], Any]
) -> None:
    shards = create_databases(admin_dsn, 1)

    async def registry_before_the_migration() -> None:
        async with await psycopg.AsyncConnection.connect(shards[0].dsn, autocommit=True) as conn:
            await apply_migrations(conn, "shard", SHARD_MIGRATIONS)
            await apply_migrations(
                conn, "catalog", [m for m in CATALOG_MIGRATIONS if m.version < ADDED]
            )
            await conn.execute(
                "INSERT INTO shoal.storage_node (name, datacenter, url, capacity_bytes,"
                " free_bytes, heartbeat) VALUES ('n0', 'dc0', 'http://127.0.0.1:1', 10, 5, now())"
            )

    run(registry_before_the_migration())
    run(migrate(shards, MetadataConfig(vnodes=2, partitions_ahead=1)))
    store = run(MetadataStore.open(shards, 2, poll_ring=False))
    close_later(lambda: run(store.close()))

    [old] = run(store.nodes.list(DEADLINE))
    assert (old.name, old.free_bytes, old.blocks, old.admin_url) == ("n0", 5, None, None)
    run(
        store.nodes.heartbeat(
            "n0", "dc0", "http://127.0.0.1:1", 10, 4, blocks=3, admin_url="http://127.0.0.1:2"
        )
    )
    run(store.nodes.heartbeat("n1", "dc0", "http://127.0.0.1:3", 10, 0, blocks=0, admin_url=None))
    nodes = {n.name: n for n in run(store.nodes.list(DEADLINE))}
    assert (nodes["n0"].blocks, nodes["n0"].admin_url) == (3, "http://127.0.0.1:2")
    assert (nodes["n1"].blocks, nodes["n1"].admin_url, nodes["n1"].free_bytes) == (0, None, 0)


def test_a_version_below_the_highest_applied_is_still_applied(
    admin_dsn: str, run: Callable[[Awaitable[Any]], Any]
) -> None:
    """The runner applies every version a scope lacks, in the order of its tuple: a branch
    that numbered its migration past one still unmerged works before and after the merge."""
    shard = create_databases(admin_dsn, 1)[0]
    first = Migration(1, "first", "CREATE TABLE shoal.gap_first (id int)")
    merged_later = Migration(2, "merged later", "CREATE TABLE shoal.gap_merged_later (id int)")
    third = Migration(3, "third", "CREATE TABLE shoal.gap_third (id int)")

    async def apply_before_and_after_the_merge() -> list[int]:
        async with await psycopg.AsyncConnection.connect(shard.dsn, autocommit=True) as conn:
            await apply_migrations(conn, "gap-check", [first, third])
            await apply_migrations(conn, "gap-check", [first, merged_later, third])
            await apply_migrations(conn, "gap-check", [first, merged_later, third])  # nothing left
            await conn.execute("SELECT FROM shoal.gap_merged_later")  # exists
            cur = await conn.execute(
                "SELECT version FROM shoal.schema_migrations WHERE scope = 'gap-check'"
                " ORDER BY version"
            )
            return [row[0] for row in await cur.fetchall()]

    assert run(apply_before_and_after_the_merge()) == [1, 2, 3]
