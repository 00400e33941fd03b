"""Upgrading a cluster that earlier versions of Shoal migrated, with migrations that were
edited after they had landed (tests/fixtures/landed_migrations.py): `migrate` brings it to
the functions, triggers, columns and constraints of a cluster migrated afresh, and the names
written before the upgrade list, delete and leave the '/' directory exact after it."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from shoal.config import MetadataConfig, ShardConfig
from shoal.metadata import MetadataStore, shards
from shoal.metadata.errors import BucketNotEmpty, SchemaError
from shoal.metadata.migrate import migrate
from shoal.metadata.schema import CATALOG_MIGRATIONS, SHARD_MIGRATIONS, VNODE_MIGRATIONS
from tests.fixtures import landed_migrations as landed
from tests.fixtures.postgres import MIGRATING, create_databases, unique
from tests.integration.test_directory import assert_exact, walk, write
from tests.integration.test_listing import model_listing

CONFIG = MetadataConfig(vnodes=4, partitions_ahead=1)
KEYS = ["a/b/c.txt", "a/b/d.txt", "a/e.txt", "top.txt", "x/y/z/w.txt", "x/y/v.txt"]

# What makes two clusters' schemas the same, read from PostgreSQL's catalogs: Shoal's
# functions with their definitions, the triggers with their state (ENABLE REPLICA, ...), and
# the columns and constraints of its tables (the deleted tables' time windows left out:
# their names follow the clock).
SHOAL_SCHEMAS = "(n.nspname = 'shoal' OR n.nspname LIKE 'manta\\_bucket\\_%')"
NOT_A_WINDOW = "c.oid NOT IN (SELECT inhrelid FROM pg_inherits)"
SCHEMA_FACTS = {
    "functions": f"""
        SELECT n.nspname, p.proname, pg_get_function_identity_arguments(p.oid),
               pg_get_functiondef(p.oid)
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE {SHOAL_SCHEMAS}""",
    "triggers": f"""
        SELECT c.relname, n.nspname, t.tgname, t.tgenabled, pg_get_triggerdef(t.oid)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE NOT t.tgisinternal AND {SHOAL_SCHEMAS}""",
    "columns": f"""
        SELECT n.nspname, c.relname, a.attname, format_type(a.atttypid, a.atttypmod),
               a.attnotnull
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'p')
          AND {SHOAL_SCHEMAS} AND {NOT_A_WINDOW}""",
    "constraints": f"""
        SELECT n.nspname, c.relname, k.conname, pg_get_constraintdef(k.oid)
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE {SHOAL_SCHEMAS} AND {NOT_A_WINDOW}""",
}


def schema_facts(configs: list[ShardConfig]) -> dict[str, set[tuple[Any, ...]]]:
    facts: dict[str, set[tuple[Any, ...]]] = {kind: set() for kind in SCHEMA_FACTS}
    for config in configs:
        with psycopg.connect(config.dsn) as conn:
            for kind, query in SCHEMA_FACTS.items():
                facts[kind] |= {(config.name, *row) for row in conn.execute(query).fetchall()}
    return facts


def test_a_cluster_that_earlier_versions_migrated_is_upgraded_to_a_fresh_ones_schema(
    admin_dsn: str, run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh = create_databases(admin_dsn, 2)
    run(migrate(fresh, CONFIG))

    # As the versions that landed the edited migrations left a cluster: the first '/'
    # directory, DeleteBucket's marks without a token, and ring readers numbered 13.
    upgraded = create_databases(admin_dsn, 2)
    with monkeypatch.context() as earlier:
        earlier.setattr(
            MIGRATING, "SHARD_MIGRATIONS", (SHARD_MIGRATIONS[0], landed.SHARD_2_DIRECTORY)
        )
        earlier.setattr(
            MIGRATING,
            "VNODE_MIGRATIONS",
            (
                *VNODE_MIGRATIONS[:3],
                landed.VNODE_4_PREFIX_INDEX,
                landed.VNODE_5_DIRECTORY,
                landed.VNODE_6_MARKS,
            ),
        )
        run(migrate(upgraded, CONFIG))
        with psycopg.connect(upgraded[0].dsn, autocommit=True) as catalog:
            catalog.execute(
                "UPDATE shoal.schema_migrations SET version = 13 "
                "WHERE scope = 'catalog' AND version = 12"
            )
        # Names written through the earlier triggers (this code never checked the schema).
        earlier.setattr(shards, "check_schema", _no_check)
        owner, bucket, empty = run(_fill(upgraded))

    assert schema_facts(upgraded) != schema_facts(fresh)
    with pytest.raises(psycopg.errors.DuplicateTable):  # what happened before the renumbering
        run(_migrate_without_renumbering(upgraded, monkeypatch))
    run(migrate(upgraded, CONFIG))

    facts, wanted = schema_facts(upgraded), schema_facts(fresh)
    for kind in SCHEMA_FACTS:
        assert facts[kind] == wanted[kind], kind
    with psycopg.connect(upgraded[0].dsn) as catalog:
        versions = catalog.execute(
            "SELECT version FROM shoal.schema_migrations WHERE scope = 'catalog'"
        ).fetchall()
    assert sorted(v for (v,) in versions) == [m.version for m in CATALOG_MIGRATIONS]

    _use(upgraded, run, owner, bucket, empty)


async def _no_check(*_: Any) -> None:
    return None


async def _fill(configs: list[ShardConfig]) -> tuple[uuid.UUID, str, str]:
    """An account, a bucket holding KEYS and an empty one."""
    async with await MetadataStore.open(configs, 4, poll_ring=False) as store:
        owner = (await store.accounts.create(unique("upgrade"))).id
        buckets = []
        for keys in (KEYS, []):
            buckets.append(unique("upgrade"))
            await store.buckets.create(owner, buckets[-1])
            for key in keys:
                await store.objects.put(owner, buckets[-1], key, write(key))
        return owner, buckets[0], buckets[1]


async def _migrate_without_renumbering(
    configs: list[ShardConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as before:
        before.setattr(MIGRATING, "RENUMBERED", ())
        await migrate(configs, CONFIG)


def _use(configs: list[ShardConfig], run: Any, owner: uuid.UUID, bucket: str, empty: str) -> None:
    """The names written before the upgrade list, delete and keep the directory exact; the
    marks of DeleteBucket work."""
    store = run(MetadataStore.open(configs, 4, poll_ring=False))
    try:
        for prefix in ("", "a/", "a/b/", "x/", "x/y/"):
            listing = run(walk(store, owner, bucket, prefix))
            assert listing == model_listing(KEYS, prefix, "/", ""), prefix
        assert_exact(store, run, owner, bucket)
        with pytest.raises(BucketNotEmpty):
            run(store.buckets.delete(owner, bucket))
        run(store.buckets.delete(owner, empty))
        for key in KEYS[:3]:  # every name under a/
            run(store.objects.remove(owner, bucket, key))
        assert run(walk(store, owner, bucket, "")) == model_listing(KEYS[3:], "", "/", "")
        run(store.objects.put(owner, bucket, "a/new/k", write("a/new/k")))
        assert run(walk(store, owner, bucket, "a/")) == [("a/new/", True)]
        assert_exact(store, run, owner, bucket)
    finally:
        run(store.close())


def test_a_moving_vnode_is_migrated_once_its_move_is_over(
    admin_dsn: str, run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`migrate` leaves a vnode in the middle of a move to its move (making its schema again
    there would make a second, empty copy), says so, and takes it once the move is over;
    until then processes of the new release refuse to start, and say why."""
    configs = create_databases(admin_dsn, 2)
    with monkeypatch.context() as earlier:
        earlier.setattr(MIGRATING, "VNODE_MIGRATIONS", VNODE_MIGRATIONS[:-1])
        run(migrate(configs, CONFIG))
    last = VNODE_MIGRATIONS[-1].version
    with psycopg.connect(configs[0].dsn, autocommit=True) as catalog:
        _move_vnode_1(catalog, configs, "copying")
        with pytest.raises(SchemaError, match=r"all but the moving vnodes \(vnode\(s\) 1 are"):
            run(migrate(configs, CONFIG))
        with pytest.raises(
            SchemaError, match=rf"\(manta_bucket_1 without {last}\).*vnode\(s\) 1 are moving"
        ):
            run(MetadataStore.open(configs, 2, poll_ring=False))
        catalog.execute("UPDATE shoal.vnode_move SET step = 'rolled_back'")
    run(migrate(configs, CONFIG))
    store = run(MetadataStore.open(configs, 2, poll_ring=False))
    run(store.close())


def test_a_catalog_from_before_vnode_moves_is_told_to_migrate(admin_dsn: str, run: Any) -> None:
    """A process of this release on a catalog older than vnode moves says to migrate (its
    advice on moving vnodes reads a table that catalog does not have yet)."""
    configs = create_databases(admin_dsn, 1)
    run(migrate(configs, CONFIG))
    with psycopg.connect(configs[0].dsn, autocommit=True) as catalog:  # as before moves
        catalog.execute("DROP TABLE shoal.vnode_move")
        catalog.execute("DELETE FROM shoal.schema_migrations WHERE scope = 'catalog'")
    with pytest.raises(SchemaError, match=r"\(catalog without 1, .*run `shoal db migrate`$"):
        run(MetadataStore.open(configs, 2, poll_ring=False))


def test_a_vnode_fenced_away_is_left_to_its_move(admin_dsn: str, run: Any) -> None:
    """Between a move's fence and its switch the source's schema and its migrations go by the
    move's copy's name: `migrate` and a process that opens the shards leave that vnode to the
    target, rather than find it unmigrated."""
    configs = create_databases(admin_dsn, 2)
    run(migrate(configs, CONFIG))
    with psycopg.connect(configs[0].dsn, autocommit=True) as catalog:
        source = _move_vnode_1(catalog, configs, "fenced")
    dsn = next(c.dsn for c in configs if c.name == source)
    with psycopg.connect(dsn, autocommit=True) as shard:  # as the fence renames them
        shard.execute("ALTER SCHEMA manta_bucket_1 RENAME TO moved_manta_bucket_1_m7")
        shard.execute(
            "UPDATE shoal.schema_migrations SET scope = 'moved_manta_bucket_1_m7' "
            "WHERE scope = 'manta_bucket_1'"
        )
    run(migrate(configs, CONFIG))
    store = run(MetadataStore.open(configs, 2, poll_ring=False))
    run(store.close())


def _move_vnode_1(catalog: psycopg.Connection[Any], configs: list[ShardConfig], step: str) -> str:
    """Record move 7 of vnode 1 to the other shard, at `step`, as a mover would have left it;
    the source shard's name."""
    (source,) = catalog.execute(
        "SELECT shard FROM shoal.ring_vnode WHERE vnode = 1 ORDER BY version DESC LIMIT 1"
    ).fetchone() or ("",)
    target = next(c.name for c in configs if c.name != source)
    catalog.execute(
        "INSERT INTO shoal.vnode_move (id, vnode, source, target, step) VALUES (7, 1, %s, %s, %s)",
        (source, target, step),
    )
    return str(source)
