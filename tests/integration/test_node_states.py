"""Node states in the registry, and the statements that move a copy between nodes or take a
dead node out of the rows (docs/storage.md, "Node states")."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from shoal.cluster import MIN_FREE_BYTES, RegistryDirectory
from shoal.metadata import MetadataStore, ObjectWrite, PartWrite, queries
from shoal.metadata.replicas import Note
from shoal.metadata.ring import vnode_schema
from shoal.storage import BlockClient
from tests.fixtures.postgres import unique

A, B, C = "dc0:a", "dc1:b", "dc0:c"
DEADLINE = timedelta(seconds=30)


@pytest.fixture(scope="module")
def store(make_store: Any) -> MetadataStore:
    return make_store(vnodes=4)  # type: ignore[no-any-return]


def bucket_of(store: MetadataStore, run: Any) -> tuple[uuid.UUID, str, uuid.UUID]:
    owner = run(store.accounts.create(unique("nodes"))).id
    bucket = unique("nodes")
    found = run(store.buckets.create(owner, bucket))
    return owner, bucket, found.id


def version(sharks: list[str], size: int = 10) -> ObjectWrite:
    return ObjectWrite(content_length=size, content_md5=b"\0" * 16, sharks=sharks)


async def heartbeat(store: MetadataStore, name: str, url: str) -> None:
    """A node's heartbeat, as its statement runs (the parameters of any schema version:
    psycopg ignores those a statement does not name)."""
    params = {
        "name": name,
        "datacenter": "dc0",
        "url": url,
        "capacity_bytes": 4 * MIN_FREE_BYTES,
        "free_bytes": 2 * MIN_FREE_BYTES,
        "blocks": 0,
        "admin_url": None,
    }
    async with store.shards.catalog.pool.connection() as conn:
        await conn.execute(queries.HEARTBEAT_NODE, params)


def test_drained_and_dead_nodes_get_no_new_blocks_and_dead_ones_are_read_last(
    store: MetadataStore, run: Any
) -> None:
    names = [unique("n") for _ in range(3)]
    for name in names:
        run(heartbeat(store, name, "http://127.0.0.1:1"))
    assert all(run(store.nodes.states())[n] == "active" for n in names)
    assert run(store.nodes.set_state(names[1], "draining"))
    assert run(store.nodes.set_state(names[2], "dead"))
    assert not run(store.nodes.set_state(unique("nobody"), "dead"))
    # A heartbeat refreshes the address and free space, never the state.
    run(heartbeat(store, names[1], "http://127.0.0.1:2"))
    assert run(store.nodes.states())[names[1]] == "draining"

    directory = RegistryDirectory(store, DEADLINE, BlockClient(b"x" * 32))
    writable = {n.name for n in run(directory.writable_nodes())}
    assert names[0] in writable and not writable & set(names[1:])
    assert not directory.unreachable(f"dc0:{names[1]}")  # a draining node is read as usual
    assert directory.unreachable(f"dc0:{names[2]}")  # a dead one last
    assert run(directory.url_of(f"dc0:{names[1]}")) == "http://127.0.0.1:2"

    assert run(store.nodes.remove(names[2]))
    assert names[2] not in run(store.nodes.states())
    assert not run(store.nodes.remove(names[2]))


def test_replace_names_the_new_node_only_where_the_version_is_live_and_names_the_old(
    store: MetadataStore, run: Any
) -> None:
    owner, bucket, bucket_id = bucket_of(store, run)
    first = version([A, B])
    run(store.objects.put(owner, bucket, "k", first))
    note = Note(owner, bucket_id, "k", first.id)
    assert run(store.sharks.replace(note, A, C))
    assert run(store.objects.get(owner, bucket, "k")).sharks == [B, C]
    assert not run(store.sharks.replace(note, A, C))  # no longer names A: nothing to do
    # The new node already named (a re-replicator's copy went there too): named once.
    assert run(store.sharks.replace(note, B, C))
    assert run(store.objects.get(owner, bucket, "k")).sharks == [C]

    run(store.objects.put(owner, bucket, "k", version([A, B])))  # replaces `first`
    assert not run(store.sharks.replace(note, C, A))  # a replaced version is left alone
    assert run(store.objects.get(owner, bucket, "k")).sharks == [A, B]


def test_replace_in_an_open_part_and_in_a_part_of_an_assembled_object(
    store: MetadataStore, run: Any
) -> None:
    owner, bucket, bucket_id = bucket_of(store, run)
    upload = run(store.uploads.create(owner, bucket, "mp"))
    parts = [
        PartWrite(part_number=1, content_length=10, content_md5=b"\1" * 16, sharks=[A, B]),
        PartWrite(part_number=2, content_length=10, content_md5=b"\2" * 16, sharks=[A, C]),
    ]
    for part in parts:
        run(store.uploads.put_part(owner, bucket, "mp", upload.id, part))
    open_part = Note(owner, bucket_id, "mp", parts[0].id)
    assert run(store.sharks.replace(open_part, B, C))
    listed = run(store.uploads.list_parts(owner, bucket, "mp", upload.id))
    assert [p.sharks for p in listed] == [[A, C], [A, C]]

    chosen = [(p.part_number, p.content_md5) for p in parts]
    run(store.uploads.complete(owner, bucket, "mp", upload.id, chosen, min_part_size=1))
    assert run(store.objects.get(owner, bucket, "mp")).sharks == [A, C]
    assert run(store.sharks.replace(Note(owner, bucket_id, "mp", parts[1].id), A, B))
    assembled = run(store.objects.get(owner, bucket, "mp"))
    assert [p["sharks"] for p in assembled.properties["parts"]] == [[A, C], [C, B]]
    assert assembled.sharks == sorted({A, B, C})  # part 1 still names A
    assert run(store.sharks.replace(Note(owner, bucket_id, "mp", parts[0].id), A, B))
    assert run(store.objects.get(owner, bucket, "mp")).sharks == sorted({B, C})


def test_a_dead_node_leaves_every_row_with_another_copy_and_each_is_noted(
    make_store: Any, run: Any
) -> None:
    store = make_store(vnodes=4)
    owner, bucket, _ = bucket_of(store, run)
    dead = "dc9:dead"
    for index in range(6):
        run(store.objects.put(owner, bucket, f"two-{index}", version([A, dead])))
    run(store.objects.put(owner, bucket, "alone", version([dead])))
    upload = run(store.uploads.create(owner, bucket, "mp"))
    parts = [
        PartWrite(part_number=1, content_length=10, content_md5=b"\1" * 16, sharks=[dead, B]),
        PartWrite(part_number=2, content_length=10, content_md5=b"\2" * 16, sharks=[dead]),
    ]
    for part in parts:
        run(store.uploads.put_part(owner, bucket, "mp", upload.id, part))
    chosen = [(p.part_number, p.content_md5) for p in parts]
    run(store.uploads.complete(owner, bucket, "mp", upload.id, chosen, min_part_size=1))
    open_upload = run(store.uploads.create(owner, bucket, "open"))
    open_part = PartWrite(
        part_number=1, content_length=10, content_md5=b"\3" * 16, sharks=[dead, C]
    )
    run(store.uploads.put_part(owner, bucket, "open", open_upload.id, open_part))
    run(store.objects.put(owner, bucket, "replaced", version([dead, B])))
    run(store.objects.put(owner, bucket, "replaced", version([A, B])))  # a deletion record
    gone = run(store.uploads.create(owner, bucket, "gone"))
    gone_part = PartWrite(part_number=1, content_length=10, content_md5=b"\4" * 16, sharks=[dead])
    run(store.uploads.put_part(owner, bucket, "gone", gone.id, gone_part))
    chosen = [(1, gone_part.content_md5)]
    run(store.uploads.complete(owner, bucket, "gone", gone.id, chosen, min_part_size=1))
    run(store.objects.delete(owner, bucket, "gone"))  # a deletion record with parts

    before = run(store.sharks.naming(dead))
    # 6 + alone + the assembled object + the open part + the two deletion records
    assert (before.rows, before.sole) == (11, 1)
    assert run(store.sharks.drop_dead(dead)) == 8
    assert run(store.under_replicated.count()) == 8  # 6 versions, one part of each upload
    for index in range(6):
        assert run(store.objects.get(owner, bucket, f"two-{index}")).sharks == [A]
    assert run(store.objects.get(owner, bucket, "alone")).sharks == [dead]
    assembled = run(store.objects.get(owner, bucket, "mp"))
    assert [p["sharks"] for p in assembled.properties["parts"]] == [[B], [dead]]
    assert assembled.sharks == sorted([B, dead])
    [listed] = run(store.uploads.list_parts(owner, bucket, "open", open_upload.id))
    assert listed.sharks == [C]
    after = run(store.sharks.naming(dead))
    # alone, and the part only it holds; the deletion record forgot it (GC never could)
    assert (after.rows, after.sole) == (2, 1)
    assert run(store.sharks.drop_dead(dead)) == 0  # again: nothing more to take
    assert not any(dead in str(record) for record in deletion_records(store, run))


def deletion_records(store: MetadataStore, run: Any) -> list[tuple[Any, ...]]:
    """The sharks and properties of every deletion record of the store."""

    async def read() -> list[tuple[Any, ...]]:
        found: list[tuple[Any, ...]] = []
        for shard in store.shards.placed():
            for vnode in shard.vnodes:
                async with shard.pool.connection() as conn:
                    statement = f'SELECT sharks, properties FROM "{vnode_schema(vnode)}".'
                    cur = await conn.execute(statement + "manta_bucket_deleted_object")
                    found += await cur.fetchall()
        return found

    records = run(read())
    assert len(records) == 2
    return records
