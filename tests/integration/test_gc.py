"""Garbage collection against real storage nodes: what is reclaimed, what is kept, and
convergence after a crash or a node outage."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from shoal.gc import Collector, blocks_of
from shoal.metadata.partitions import ensure_windows
from shoal.metadata.ring import vnode_schema
from shoal.storage import block_runs
from tests.fixtures.garbage import World, block_ids, build_garbage, check_live, put
from tests.fixtures.postgres import unique
from tests.fixtures.storage import MakeStorage, StorageCluster

SHOAL = str(Path(sys.executable).parent / "shoal")
KiB = 1024


@pytest.fixture
def cluster(make_storage: MakeStorage) -> StorageCluster:
    return make_storage(nodes=3)


def test_gc_reclaims_every_kind_of_garbage_and_nothing_else(
    cluster: StorageCluster, run: Any
) -> None:
    path = cluster.data_path(replicas=2, block_size=16 * KiB)
    world = run(build_garbage(cluster.store, path))
    assert world.garbage <= block_ids(cluster)

    young = run(Collector(cluster.store, path, timedelta(hours=1)).run_once())
    assert young.records_reclaimed == 0 and world.garbage <= block_ids(cluster)

    done = run(Collector(cluster.store, path, timedelta(0)).run_once())
    assert done.records_failed == 0
    # 5 overwrites + 1 delete + 3 parts, and the deleted bucket's 4 objects.
    assert done.records_reclaimed == 13
    assert not world.garbage & block_ids(cluster)
    check_live(cluster.store, path, world, run)
    backlog = run(cluster.store.gc_book.backlog())
    assert sum(b.records for b in backlog) == 0
    assert run(Collector(cluster.store, path, timedelta(0)).run_once()).records_found == 0


def test_a_read_started_before_a_delete_completes(cluster: StorageCluster, run: Any) -> None:
    path = cluster.data_path(replicas=2, block_size=16 * KiB)
    owner = run(cluster.store.accounts.create(unique("rd"))).id
    world = World(owner=owner, bucket=unique("rd"))
    run(cluster.store.buckets.create(owner, world.bucket))
    data = os.urandom(400 * KiB)
    run(put(cluster.store, path, world, "big", data))

    async def read_while_deleting() -> bytes:
        version = await cluster.store.objects.get(owner, world.bucket, "big")
        runs = block_runs(version.id, version.content_length, version.sharks, version.properties)
        chunks = []
        async for chunk in path.read(runs):
            chunks.append(chunk)
            if len(chunks) == 2:
                await cluster.store.objects.delete(owner, world.bucket, "big")
                await Collector(cluster.store, path, timedelta(hours=24)).run_once()
        return b"".join(chunks)

    assert run(read_while_deleting()) == data


def test_concurrent_collectors_reclaim_each_record_once(cluster: StorageCluster, run: Any) -> None:
    path = cluster.data_path(replicas=2, block_size=16 * KiB)
    world = run(build_garbage(cluster.store, path))

    async def two() -> list[Any]:
        return list(
            await asyncio.gather(
                Collector(cluster.store, path, timedelta(0), batch_size=3).run_once(),
                Collector(cluster.store, path, timedelta(0), batch_size=3).run_once(),
            )
        )

    first, second = run(two())
    assert first.records_reclaimed + second.records_reclaimed >= 9  # the 9 deletion records
    assert not world.garbage & block_ids(cluster)
    check_live(cluster.store, path, world, run)


def test_a_node_down_keeps_its_records_until_a_later_run(cluster: StorageCluster, run: Any) -> None:
    path = cluster.data_path(replicas=2, block_size=16 * KiB)
    world = run(build_garbage(cluster.store, path))
    down = cluster.nodes[0]
    down.kill()
    partial = run(Collector(cluster.store, path, timedelta(0)).run_once())
    assert partial.records_failed > 0
    left = {uuid.UUID(f.name.split(".")[0]) for f in down.block_files()}
    assert world.garbage & left  # its garbage blocks are still there, and so are their records
    cluster.restart(down, run)
    final = run(Collector(cluster.store, path, timedelta(0)).run_once())
    assert final.records_failed == 0
    assert not world.garbage & block_ids(cluster)
    check_live(cluster.store, path, world, run)


def test_killed_gc_converges_when_run_again(cluster: StorageCluster, run: Any) -> None:
    path = cluster.data_path(replicas=2, block_size=16 * KiB)
    world = run(build_garbage(cluster.store, path))
    command = [SHOAL, "gc", "run", "--config", str(cluster.config_file), "--leeway", "0s"]
    crashed = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SHOAL_GC_FAULT_AFTER": "4"},
    )
    assert crashed.returncode == 3, crashed.stderr
    assert world.garbage & block_ids(cluster)  # it stopped midway
    again = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert not world.garbage & block_ids(cluster)
    check_live(cluster.store, path, world, run)
    status = subprocess.run(
        [SHOAL, "gc", "status", "--config", str(cluster.config_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "cli" in status and "found" in status


def test_reclaimed_windows_are_dropped_whole(cluster: StorageCluster, run: Any) -> None:
    path = cluster.data_path(replicas=1, block_size=16 * KiB)
    store = cluster.store
    owner = run(store.accounts.create(unique("win"))).id
    world = World(owner=owner, bucket=unique("win"))
    run(store.buckets.create(owner, world.bucket))
    old = run(put(store, path, world, "k", b"old"))
    run(put(store, path, world, "k", b"new"))
    vnode = store.ring.vnode_for_object(owner, run(store.buckets.get(owner, world.bucket)).id, "k")
    schema = vnode_schema(vnode)

    async def backdate() -> None:
        async with store.shards.of_vnode(vnode).pool.connection() as conn:
            # A window three days ago, and the record moved into it.
            await conn.execute("SET TimeZone = 'UTC'")
            await ensure_windows(conn, [vnode], timedelta(days=1), ahead=0)
            from shoal.metadata.partitions import _create_window, window_start

            start = window_start(
                (await (await conn.execute("SELECT now()")).fetchone())[0] - timedelta(days=3),
                timedelta(days=1),
            )
            await _create_window(
                conn, schema, "manta_bucket_deleted_object", start, timedelta(days=1)
            )
            await conn.execute(
                f"UPDATE {schema}.manta_bucket_deleted_object SET deleted_at = %s WHERE id = %s",
                (start + timedelta(hours=1), old),
            )

    run(backdate())
    done = run(Collector(store, path, timedelta(0)).run_once())
    assert done.records_reclaimed >= 1 and done.windows_dropped >= 1
    assert old not in block_ids(cluster)


def test_pause_and_status(cluster: StorageCluster, run: Any) -> None:
    config = str(cluster.config_file)
    subprocess.run([SHOAL, "gc", "pause", "--config", config], check=True, capture_output=True)
    assert run(cluster.store.gc_book.paused())
    status = subprocess.run(
        [SHOAL, "gc", "status", "--config", config], capture_output=True, text=True, check=True
    ).stdout
    assert "PAUSED" in status and "backlog" in status
    subprocess.run([SHOAL, "gc", "resume", "--config", config], check=True, capture_output=True)
    assert not run(cluster.store.gc_book.paused())


def test_record_expansion_names_part_blocks(cluster: StorageCluster, run: Any) -> None:
    from shoal.metadata.models import ObjectVersion

    part = uuid.uuid4()
    record = ObjectVersion(
        id=uuid.uuid4(),
        owner=uuid.uuid4(),
        bucket_id=uuid.uuid4(),
        name="x",
        created=None,  # type: ignore[arg-type]
        modified=None,
        creator=None,
        content_length=40,
        content_md5=hashlib.md5().digest(),  # type: ignore[arg-type]
        content_type=None,
        headers={},
        roles=[],
        sharks=["dc:a"],
        properties={"parts": [{"id": str(part), "size": 40, "block_size": 16, "sharks": ["dc:b"]}]},
    )
    [only] = blocks_of(record)
    assert (only.id, only.block_names()) == (part, [f"{part}.0", f"{part}.1", f"{part}.2"])
    assert only.sharks == ["dc:b"]
