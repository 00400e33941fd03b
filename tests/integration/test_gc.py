"""Garbage collection against real storage nodes: what is reclaimed, what is kept, and
convergence after a crash or a node outage."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from shoal.config import load_config
from shoal.gc import Collector, blocks_of
from shoal.ids import uuid7
from shoal.metadata import PartWrite, queries
from shoal.metadata.garbage import clear_window, vacuum_windows
from shoal.metadata.partitions import (
    ensure_window_holding,
    ensure_windows,
    window_name,
    window_start,
)
from shoal.metadata.ring import vnode_schema
from shoal.storage import block_runs
from tests.fixtures.backends import until_a_backend_waits
from tests.fixtures.garbage import (
    World,
    block_ids,
    build_garbage,
    check_live,
    dead_tuples,
    garbage_files,
    node_holding_most,
    once,
    put,
)
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

    replicas = garbage_files(cluster, world.garbage)
    done = run(Collector(cluster.store, path, timedelta(0)).run_once())
    assert done.records_failed == 0
    # 5 overwrites + 1 delete + the blocks a small object replaced + 3 parts, and the deleted
    # bucket's 4 objects; the deleted small object left no record.
    assert done.records_reclaimed == 14
    assert not world.garbage & block_ids(cluster)
    # "Blocks deleted" counts block replicas the nodes removed, the Spark job's figure too.
    assert done.blocks_deleted == replicas
    # The removed rows were vacuumed at the end of the pass.
    assert dead_tuples(shard_dsn(cluster)) == 0
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
    down, on_down = node_holding_most(cluster, world.garbage)
    down.kill()
    partial = run(Collector(cluster.store, path, timedelta(0)).run_once())
    assert partial.records_failed > 0
    left = {uuid.UUID(f.name.split(".")[0]) for f in down.block_files()}
    assert on_down <= left  # its garbage blocks are still there, and so are their records
    cluster.restart(down, run)
    final = run(Collector(cluster.store, path, timedelta(0)).run_once())
    assert final.records_failed == 0
    assert not world.garbage & block_ids(cluster)
    check_live(cluster.store, path, world, run)


def test_one_batch_keeps_exactly_the_records_on_a_node_that_is_down(
    cluster: StorageCluster, run: Any
) -> None:
    # One replica per version, so each record names one node; all records in one batch.
    path = cluster.data_path(replicas=1, block_size=16 * KiB)
    world = run(build_garbage(cluster.store, path))
    # Never all of the garbage: 14 records all on one of 3 nodes has odds of 3 ** -13.
    down, on_down = node_holding_most(cluster, world.garbage)
    assert on_down and on_down != world.garbage
    down.kill()
    partial = run(Collector(cluster.store, path, timedelta(0), batch_size=1000).run_once())
    # Blocks on the live nodes went in the same batches as the blocks that could not.
    assert not (world.garbage - on_down) & block_ids(cluster)
    assert partial.records_failed > 0 and partial.records_reclaimed > 0
    cluster.restart(down, run)
    assert on_down <= block_ids(cluster)  # their records were kept, so a later run finds them
    final = run(Collector(cluster.store, path, timedelta(0)).run_once())
    assert final.records_failed == 0 and not world.garbage & block_ids(cluster)
    check_live(cluster.store, path, world, run)


def test_killed_gc_converges_when_run_again(
    cluster: StorageCluster, run: Any, tmp_path: Path
) -> None:
    path = cluster.data_path(replicas=2, block_size=16 * KiB)
    world = run(build_garbage(cluster.store, path))
    # One worker, batches of two: the fault after 4 node delete batches then always stops a
    # pass with garbage left (4 workers may have all of it in flight by then).
    config = tmp_path / "shoal.toml"
    config.write_text(cluster.config_file.read_text() + "[gc]\nworkers = 1\nbatch_size = 2\n")
    command = [SHOAL, "gc", "run", "--config", str(config), "--leeway", "0s"]
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
    vnodes = [v for shard in store.shards.placed() for v in shard.vnodes]

    async def backdate() -> None:
        # A window three days ago in every vnode (the vnode passes drop theirs concurrently,
        # and every drop must be counted), and the record moved into its vnode's.
        for each in vnodes:
            schema = vnode_schema(each)
            async with store.shards.of_vnode(each).pool.connection() as conn:
                await conn.execute("SET TimeZone = 'UTC'")
                await ensure_windows(conn, [each], timedelta(days=1), ahead=0)
                now = (await (await conn.execute("SELECT now()")).fetchone())[0]
                start = window_start(now - timedelta(days=3), timedelta(days=1))
                table = "manta_bucket_deleted_object"
                await ensure_window_holding(conn, each, start, timedelta(days=1))
                if each == vnode:
                    await conn.execute(
                        f"UPDATE {schema}.{table} SET deleted_at = %s WHERE id = %s",
                        (start + timedelta(hours=1), old),
                    )

    run(backdate())
    done = run(Collector(store, path, timedelta(0)).run_once())
    # Both deleted tables' windows of three days ago, in every vnode.
    assert done.records_reclaimed >= 1 and done.windows_dropped >= 2 * len(vnodes)
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


def shard_dsn(cluster: StorageCluster) -> str:
    return load_config(cluster.config_file, None).metadata.shards[0].dsn


def records_in_current_window(cluster: StorageCluster, run: Any, count: int) -> tuple[int, str]:
    """`count` overwrites of one key: deletion records in the window of the database's now,
    on the key's vnode; returns (vnode, window name)."""
    store = cluster.store
    owner = run(store.accounts.create(unique("cw"))).id
    bucket = unique("cw")
    bucket_id = run(store.buckets.create(owner, bucket)).id
    from shoal.metadata import ObjectWrite

    for _ in range(count + 1):
        run(
            store.objects.put(
                owner, bucket, "k", ObjectWrite(content_length=0, content_md5=bytes(16))
            )
        )
    vnode = store.ring.vnode_for_object(owner, bucket_id, "k")
    with psycopg.connect(shard_dsn(cluster)) as conn:
        now = conn.execute("SELECT current_timestamp").fetchone()[0]  # type: ignore[index]
    start = window_start(now, store.gc_book.window)
    return vnode, window_name("manta_bucket_deleted_object", start)


def record_ids(dsn: str, vnode: int, window: str) -> set[uuid.UUID]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT id FROM {vnode_schema(vnode)}.{window}").fetchall()
    return {r[0] for r in rows}


def test_a_window_holding_only_reclaimed_records_is_truncated_whole(
    cluster: StorageCluster, run: Any
) -> None:
    vnode, window = records_in_current_window(cluster, run, 5)
    dsn = shard_dsn(cluster)
    ids = record_ids(dsn, vnode, window)
    assert len(ids) == 5
    table = f"{vnode_schema(vnode)}.{window}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        filenode = "SELECT pg_relation_filenode(%s::regclass)"
        before = conn.execute(filenode, (table,)).fetchone()
        cleared = clear_window(conn, vnode, window, list(ids))
        after = conn.execute(filenode, (table,)).fetchone()
    assert before != after  # a new, empty file: truncated, not deleted row by row
    assert cleared.whole and cleared.removed == 5
    assert record_ids(dsn, vnode, window) == set()
    assert dead_tuples(dsn) == 0


@pytest.mark.parametrize("writer_seconds", [0.5, 3.0])
def test_a_record_written_into_the_window_meanwhile_survives(
    cluster: StorageCluster, run: Any, writer_seconds: float
) -> None:
    """A writer holds an uncommitted deletion record in the window while GC clears it: GC
    waits for the lock (0.5 s) or gives up waiting (3 s, past the 2 s lock timeout); either
    way it removes only the reclaimed records, row by row, and the new one stays."""
    vnode, window = records_in_current_window(cluster, run, 3)
    dsn = shard_dsn(cluster)
    reclaimed = record_ids(dsn, vnode, window)
    newcomer = uuid.uuid4()
    schema = vnode_schema(vnode)
    writer = psycopg.connect(dsn)
    try:
        writer.execute(
            f"INSERT INTO {schema}.manta_bucket_deleted_object "
            "(id, name, owner, bucket_id, created, modified, content_length) "
            "VALUES (%s, 'new', %s, %s, now(), now(), 0)",
            (newcomer, uuid.uuid4(), uuid.uuid4()),
        )
        assert record_ids(dsn, vnode, window) == reclaimed  # not committed yet
        result: list[Any] = []

        def clear() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                result.append(clear_window(conn, vnode, window, list(reclaimed)))

        async def until_gc_waits_for_the_lock() -> None:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as watcher:
                await until_a_backend_waits(watcher, "Lock")

        clearing = threading.Thread(target=clear)
        clearing.start()
        run(until_gc_waits_for_the_lock())
        time.sleep(writer_seconds)  # GC waits this long: less, or more, than its lock timeout
        writer.commit()
        clearing.join(30)
    finally:
        writer.close()
    [cleared] = result
    assert not cleared.whole and cleared.removed == len(reclaimed)
    assert record_ids(dsn, vnode, window) == {newcomer}
    with psycopg.connect(dsn, autocommit=True) as conn:
        vacuum_windows(conn, [(vnode, window)])
    assert dead_tuples(dsn) == 0


def test_a_bucket_deleted_with_open_uploads_leaves_them_to_gc(
    cluster: StorageCluster, run: Any
) -> None:
    store, path = cluster.store, cluster.data_path(replicas=2, block_size=16 * KiB)
    owner = run(store.accounts.create(unique("uploads"))).id
    bucket = unique("uploads")
    found = run(store.buckets.create(owner, bucket))

    async def open_uploads() -> uuid.UUID:
        upload = await store.uploads.create(owner, bucket, "big")
        part_id = uuid7()
        written = await path.write(part_id, once(os.urandom(20 * KiB)))
        part = PartWrite(
            id=part_id,
            part_number=1,
            content_length=written.size,
            content_md5=written.md5,
            sharks=written.sharks,
            properties={"block_size": written.block_size},
        )
        await store.uploads.put_part(owner, bucket, "big", upload.id, part)
        await store.uploads.create(owner, bucket, "never-a-part")
        return part_id

    part_id = run(open_uploads())
    run(store.buckets.delete(owner, bucket))  # no objects: the open uploads do not hold it
    assert part_id in block_ids(cluster)
    done = run(Collector(store, path, timedelta(0)).run_once())
    assert done.records_failed == 0
    assert part_id not in block_ids(cluster)
    assert not run(store.buckets.has_content(owner, found.id))  # no upload row left either
    vnode = store.ring.vnode_for_bucket(owner, bucket)

    async def deleted_buckets() -> list[uuid.UUID]:
        async with store.garbage.claim_deleted_buckets(vnode, timedelta(0)) as claim:
            return [b.id for b in claim.buckets]

    assert found.id not in run(deleted_buckets())


def test_gc_leaves_alone_a_vnode_that_a_mover_holds(cluster: StorageCluster, run: Any) -> None:
    """While a mover holds a vnode (its move lock, as `Mover.move` takes it before copying),
    a GC pass reclaims nothing there and says so, and a window is cleared row by row (a
    TRUNCATE would not reach the vnode's copy); once the mover lets go, GC reclaims it."""
    path = cluster.data_path(replicas=2, block_size=16 * KiB)
    world = run(build_garbage(cluster.store, path))
    vnodes = list(range(cluster.store.ring.vnodes))
    dsn = shard_dsn(cluster)
    with psycopg.connect(dsn, autocommit=True) as mover:
        for vnode in vnodes:
            mover.execute(queries.VNODE_MOVE_LOCK, {"vnode": vnode})
        collector = Collector(cluster.store, path, timedelta(0))
        held = run(collector.run_once())
        assert held.records_found == 0 and held.records_reclaimed == 0
        assert collector.vnodes_skipped == vnodes
        assert world.garbage <= block_ids(cluster)
        with psycopg.connect(dsn, autocommit=True) as conn:
            vnode, window, ids = _a_window_of_records(conn)
            cleared = clear_window(conn, vnode, window, ids)
        assert not cleared.whole and cleared.removed == len(ids)
        for vnode in vnodes:
            mover.execute(queries.VNODE_MOVE_UNLOCK, {"vnode": vnode})
    freed = Collector(cluster.store, path, timedelta(0))
    done = run(freed.run_once())
    assert done.records_failed == 0 and freed.vnodes_skipped == []
    assert done.records_reclaimed > 0


def _a_window_of_records(conn: psycopg.Connection[Any]) -> tuple[int, str, list[uuid.UUID]]:
    """(vnode, window, its record ids) of some window of a deleted-object table that holds
    records."""
    row = conn.execute(
        "SELECT c.relname, n.nspname FROM pg_class c JOIN pg_namespace n"
        " ON n.oid = c.relnamespace WHERE c.relispartition"
        " AND c.relname LIKE 'manta\\_bucket\\_deleted\\_object\\_w%%' AND c.reltuples <> 0"
        " ORDER BY n.nspname, c.relname"
    ).fetchall()
    for window, schema in row:
        ids = [r[0] for r in conn.execute(f'SELECT id FROM {schema}."{window}"').fetchall()]
        if ids:
            return int(schema.rsplit("_", 1)[1]), window, ids
    raise AssertionError("no window holds a deletion record")
