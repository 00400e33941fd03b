"""The GC queries: leeway by the database clock, disjoint batches, removal after reclaim."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import pytest

from shoal.metadata import MetadataStore, ObjectWrite
from shoal.metadata.partitions import ensure_window_holding, window_width
from shoal.metadata.ring import vnode_schema
from tests.fixtures.postgres import MakeStore, unique


@pytest.fixture(scope="module")
def store(make_store: MakeStore) -> MetadataStore:
    # One vnode, so every record of the module lands in the same deleted table.
    return make_store(shards=1, vnodes=1, pool_max_size=10)


@pytest.fixture
def garbage_ids(store: MetadataStore, run: Any) -> set[uuid.UUID]:
    """Ten fresh deletion records (ten overwritten versions)."""
    owner = run(store.accounts.create(unique("gc"))).id
    bucket = unique("gc")
    run(store.buckets.create(owner, bucket))
    versions = [ObjectWrite(content_length=1, content_md5=bytes(16)) for _ in range(11)]
    for version in versions:
        run(store.objects.put(owner, bucket, "k", version))
    return {v.id for v in versions[:-1]}


async def claim_ids(store: MetadataStore, leeway: timedelta, limit: int = 1000) -> set[uuid.UUID]:
    async with store.garbage.claim_deleted_objects(0, leeway, limit) as claim:
        return {r.id for r in claim.records}


def test_records_younger_than_the_leeway_are_not_claimed(
    store: MetadataStore, run: Any, garbage_ids: set[uuid.UUID]
) -> None:
    assert not garbage_ids & run(claim_ids(store, timedelta(hours=1)))
    assert garbage_ids <= run(claim_ids(store, timedelta(0)))


def test_age_is_judged_by_the_database_clock(
    store: MetadataStore, run: Any, garbage_ids: set[uuid.UUID]
) -> None:
    async def backdate() -> None:
        async with store.shards.of_vnode(0).pool.connection() as conn:
            # Two hours ago may be in the previous window (just after midnight, with windows
            # of a day), which the store did not create: windows start at migration time.
            cursor = await conn.execute("SELECT current_timestamp - interval '2 hours'")
            row = await cursor.fetchone()
            assert row is not None
            await ensure_window_holding(conn, 0, row[0], await window_width(conn))
            await conn.execute(
                f"UPDATE {vnode_schema(0)}.manta_bucket_deleted_object "
                "SET deleted_at = current_timestamp - interval '2 hours' WHERE id = ANY(%s)",
                (list(garbage_ids),),
            )

    run(backdate())
    assert garbage_ids <= run(claim_ids(store, timedelta(hours=1)))


def test_concurrent_workers_get_disjoint_batches(
    store: MetadataStore, run: Any, garbage_ids: set[uuid.UUID]
) -> None:
    both_holding = asyncio.Event()
    holders = 0

    async def worker() -> set[uuid.UUID]:
        nonlocal holders
        async with store.garbage.claim_deleted_objects(0, timedelta(0), limit=4) as claim:
            holders += 1
            if holders == 2:
                both_holding.set()
            await asyncio.wait_for(both_holding.wait(), 10)
            return {r.id for r in claim.records}

    async def two_workers() -> list[set[uuid.UUID]]:
        return list(await asyncio.gather(worker(), worker()))

    first, second = run(two_workers())
    assert len(first) == len(second) == 4
    assert not first & second


def test_removed_records_are_gone_and_a_failed_worker_keeps_its_batch(
    store: MetadataStore, run: Any, garbage_ids: set[uuid.UUID]
) -> None:
    async def fail_midway() -> None:
        async with store.garbage.claim_deleted_objects(0, timedelta(0), limit=1000) as claim:
            await claim.remove([r for r in claim.records if r.id in garbage_ids])
            raise RuntimeError("worker died after deleting blocks")

    with pytest.raises(RuntimeError):
        run(fail_midway())
    assert garbage_ids <= run(claim_ids(store, timedelta(0)))

    async def reclaim() -> int:
        async with store.garbage.claim_deleted_objects(0, timedelta(0), limit=1000) as claim:
            await claim.remove([r for r in claim.records if r.id in garbage_ids])
            return claim.removed

    assert run(reclaim()) == len(garbage_ids)
    assert not garbage_ids & run(claim_ids(store, timedelta(0)))


def test_deleted_bucket_contents_are_listed_and_removed(store: MetadataStore, run: Any) -> None:
    owner = run(store.accounts.create(unique("gcb"))).id
    bucket = unique("gcb")
    found = run(store.buckets.create(owner, bucket))
    for name in [f"k{i}" for i in range(5)] + ["dir/sub/x", "dir/y"]:
        run(
            store.objects.put(
                owner, bucket, name, ObjectWrite(content_length=1, content_md5=bytes(16))
            )
        )
    upload = run(store.uploads.create(owner, bucket, "mpu"))
    from shoal.metadata import PartWrite

    run(
        store.uploads.put_part(
            owner,
            bucket,
            "mpu",
            upload.id,
            PartWrite(part_number=1, content_length=1, content_md5=bytes(16)),
        )
    )
    run(store.buckets.delete(owner, bucket, force=True))

    contents = run(store.garbage.bucket_contents(owner, found.id))
    assert sorted(r.name for r in contents) == [
        "dir/sub/x",
        "dir/y",
        "k0",
        "k1",
        "k2",
        "k3",
        "k4",
        "mpu",
    ]
    part_record = next(r for r in contents if r.name == "mpu")
    assert part_record.properties["upload_id"] == str(upload.id)

    run(store.garbage.remove_bucket_contents(owner, found.id, contents))
    assert run(store.garbage.bucket_contents(owner, found.id)) == []
    assert not run(store.buckets.has_content(owner, found.id))

    async def directory_rows() -> int:
        count = 0
        for shard in store.shards.placed():
            async with shard.pool.connection() as conn:
                cur = await conn.execute(
                    "SELECT count(*) FROM shoal.bucket_directory WHERE bucket_id = %s", [found.id]
                )
                count += int((await cur.fetchone())[0])  # type: ignore[index]
        return count

    assert run(directory_rows()) == 0  # its '/' directory went with its names and uploads

    async def drop_record() -> list[uuid.UUID]:
        async with store.garbage.claim_deleted_buckets(0, timedelta(0)) as claim:
            mine = [b for b in claim.buckets if b.id == found.id]
            for b in mine:
                await claim.remove(b)
            return [b.id for b in mine]

    assert run(drop_record()) == [found.id]
    assert run(drop_record()) == []
