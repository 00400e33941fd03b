"""The schema read back from PostgreSQL's catalog matches RFD 149 column by column."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from shoal.metadata import MetadataStore, ObjectWrite
from shoal.metadata.ring import vnode_schema
from tests.fixtures.postgres import MakeStore, unique

TS = "timestamp with time zone"
NOW = "CURRENT_TIMESTAMP"

# (column, type, NOT NULL, default) exactly as RFD 149 declares them.
RFD_149 = {
    "manta_bucket": [
        ("id", "uuid", True, None),
        ("name", "text", True, None),
        ("owner", "uuid", True, None),
        ("created", TS, True, NOW),
    ],
    "manta_bucket_object": [
        ("id", "uuid", True, None),
        ("name", "text", True, None),
        ("owner", "uuid", True, None),
        ("bucket_id", "uuid", True, None),
        ("created", TS, True, NOW),
        ("modified", TS, True, NOW),
        ("creator", "uuid", False, None),
        ("content_length", "bigint", False, None),
        ("content_md5", "bytea", False, None),
        ("content_type", "text", False, None),
        ("headers", "hstore", False, None),
        ("roles", "uuid[]", False, None),
        ("sharks", "text[]", False, None),
        ("properties", "jsonb", False, None),
    ],
    "manta_bucket_deleted_bucket": [
        ("id", "uuid", True, None),
        ("name", "text", True, None),
        ("owner", "uuid", True, None),
        ("created", TS, True, None),
        ("deleted_at", TS, True, NOW),
    ],
    "manta_bucket_deleted_object": [
        ("id", "uuid", True, None),
        ("name", "text", True, None),
        ("owner", "uuid", True, None),
        ("bucket_id", "uuid", True, None),
        ("created", TS, True, None),
        ("modified", TS, True, None),
        ("creator", "uuid", False, None),
        ("content_length", "bigint", False, None),
        ("content_md5", "bytea", False, None),
        ("content_type", "text", False, None),
        ("headers", "hstore", False, None),
        ("roles", "uuid[]", False, None),
        ("sharks", "text[]", False, None),
        ("properties", "jsonb", False, None),
        ("deleted_at", TS, True, NOW),
    ],
}
PRIMARY_KEYS = {
    "manta_bucket": ["owner", "name"],
    "manta_bucket_object": ["owner", "bucket_id", "name"],
    "manta_bucket_deleted_bucket": None,
    "manta_bucket_deleted_object": None,
}
DELETED_TABLE_INDEXES = {
    "manta_bucket_deleted_bucket": {
        "manta_bucket_deleted_bucket_id_idx": ["id"],
        "manta_bucket_deleted_bucket_deleted_at_idx": ["deleted_at"],
    },
    "manta_bucket_deleted_object": {
        "manta_bucket_deleted_object_id_idx": ["id"],
        "manta_bucket_deleted_object_deleted_at_idx": ["deleted_at"],
    },
}

COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       pg_get_expr(d.adbin, d.adrelid), co.collname
FROM pg_attribute a
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 100
WHERE a.attrelid = (%(schema)s || '.' || %(table)s)::regclass AND a.attnum > 0
  AND NOT a.attisdropped
ORDER BY a.attnum
"""

PRIMARY_KEY = """
SELECT array_agg(a.attname ORDER BY k.ord)
FROM pg_constraint c
CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum
WHERE c.conrelid = (%(schema)s || '.' || %(table)s)::regclass AND c.contype = 'p'
"""

INDEXES = """
SELECT i.relname, array_agg(a.attname ORDER BY k.ord), x.indisunique
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
CROSS JOIN LATERAL unnest(x.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum
WHERE x.indrelid = (%(schema)s || '.' || %(table)s)::regclass
GROUP BY i.relname, x.indisunique
"""


@pytest.fixture(scope="module")
def store(make_store: MakeStore) -> MetadataStore:
    return make_store(shards=2, vnodes=4)


def fetch(
    store: MetadataStore, run: Callable[[Awaitable[Any]], Any], vnode: int, query: str, table: str
) -> list[tuple[Any, ...]]:
    async def go() -> list[tuple[Any, ...]]:
        async with store.shards.of_vnode(vnode).pool.connection() as conn:
            cur = await conn.execute(query, {"schema": vnode_schema(vnode), "table": table})
            return await cur.fetchall()

    return run(go())


# Columns Shoal adds after RFD 149's (docs/metadata.md, "Additions, and why").
ADDED_COLUMNS = {"manta_bucket_object": [("data", "bytea", False, None)]}


@pytest.mark.parametrize("table", sorted(RFD_149))
def test_columns_match_rfd_149_on_every_vnode(store: MetadataStore, run: Any, table: str) -> None:
    for vnode in range(store.ring.vnodes):
        rows = fetch(store, run, vnode, COLUMNS, table)
        assert [(name, type_, notnull, default) for name, type_, notnull, default, _ in rows] == (
            RFD_149[table] + ADDED_COLUMNS.get(table, [])
        ), f"{table} on vnode {vnode}"
        collations = {name: coll for name, _, _, _, coll in rows if coll}
        assert collations == {"name": "C"}  # names compare by UTF-8 bytes (our addition)


@pytest.mark.parametrize("table", sorted(PRIMARY_KEYS))
def test_primary_keys_match_rfd_149(store: MetadataStore, run: Any, table: str) -> None:
    [(columns,)] = fetch(store, run, 0, PRIMARY_KEY, table)
    assert columns == PRIMARY_KEYS[table]


@pytest.mark.parametrize("table", sorted(DELETED_TABLE_INDEXES))
def test_deleted_tables_have_rfd_149_indexes_and_are_partitioned(
    store: MetadataStore, run: Any, table: str
) -> None:
    rows = fetch(store, run, 1, INDEXES, table)
    assert {name: columns for name, columns, _ in rows} == DELETED_TABLE_INDEXES[table]
    assert not any(unique for _, _, unique in rows)
    partitioning = fetch(
        store,
        run,
        1,
        "SELECT partstrat, (SELECT attname FROM pg_attribute WHERE attrelid = partrelid "
        "AND attnum = partattrs[0]), partdefid FROM pg_partitioned_table "
        "WHERE partrelid = (%(schema)s || '.' || %(table)s)::regclass",
        table,
    )
    assert partitioning == [("r", "deleted_at", 0)]  # range on deleted_at, no default partition


def test_vnode_schemas_live_on_the_shard_the_ring_names(store: MetadataStore, run: Any) -> None:
    async def schemas(shard_name: str) -> set[str]:
        async with store.shards.shards[shard_name].pool.connection() as conn:
            cur = await conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'manta\\_bucket\\_%'"
            )
            return {row[0] for row in await cur.fetchall()}

    for name, shard in store.shards.shards.items():
        assert run(schemas(name)) == {vnode_schema(v) for v in shard.vnodes}
    assert sorted(v for s in store.shards.shards.values() for v in s.vnodes) == [0, 1, 2, 3]


def test_small_object_bytes_stay_out_of_the_heap_row(store: MetadataStore, run: Any) -> None:
    """A 4 KiB object's bytes go to the TOAST table (STORAGE EXTERNAL), so listings still
    read ~30 rows a heap page; a few bytes stay in the row."""
    owner = run(store.accounts.create(unique("toast"))).id
    bucket = unique("toast")
    run(store.buckets.create(owner, bucket))
    for name, size in (("big", 4096), ("tiny", 10)):
        data = os.urandom(size)
        write = ObjectWrite(content_length=size, content_md5=hashlib.md5(data).digest(), data=data)
        run(store.objects.put(owner, bucket, name, write))
        assert run(store.objects.get(owner, bucket, name)).data == data

    async def kept_in_toast(name: str) -> bool:
        found = await store.objects.bucket(owner, bucket)
        vnode = store.ring.vnode_for_object(owner, found.id, name)
        async with store.shards.of_vnode(vnode).pool.connection() as conn:
            cur = await conn.execute(
                "SELECT pg_column_toast_chunk_id(data) IS NOT NULL "
                f"FROM {vnode_schema(vnode)}.manta_bucket_object "
                "WHERE owner = %s AND bucket_id = %s AND name = %s",
                (owner, found.id, name),
            )
            return bool((await cur.fetchone())[0])  # type: ignore[index]

    assert run(kept_in_toast("big"))
    assert not run(kept_in_toast("tiny"))
