"""Every version gets its copies back: objects and parts written while a storage node was down
have one copy and are noted; once the node is back, re-replication gives them their second
copy without an operator, and `shoal pipeline audit` agrees (or finds and `--repair` fixes a
version that nobody noted)."""

from __future__ import annotations

import hashlib
import secrets
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from shoal.cluster import RegistryDirectory
from shoal.config import MetadataConfig, load_config
from shoal.metadata import MetadataStore, ObjectWrite, PartWrite
from shoal.metadata.moves import Mover, add_shard
from shoal.metadata.ring import vnode_schema
from shoal.pipeline import run_job
from shoal.replication import Rereplicator
from shoal.storage import BlockRun, DataPath, Node, block_runs
from tests.fixtures.postgres import close_later, create_databases, unique
from tests.fixtures.serve import start_serve, stop_serve
from tests.fixtures.storage import HEARTBEAT_DEADLINE, MakeStorage, StorageCluster

SHOAL = str(Path(sys.executable).parent / "shoal")
KiB = 1024
MiB = 1024 * KiB
BLOCK_SIZE = 16 * KiB
# How long re-replication may take once the node is back (serve's daemon passes every 5 s).
RESTORE_SECONDS = 30


@dataclass
class Written:
    """What a test wrote: each key's bytes, and the open upload's part."""

    bucket: str
    objects: dict[str, bytes] = field(default_factory=dict)
    open_key: str = ""
    open_upload: str = ""
    open_part: bytes = b""


# Serve's deadline: five heartbeats, so a live node whose beats a loaded machine delays still
# counts as alive.
SERVE_HEARTBEAT_DEADLINE = timedelta(seconds=5)


class ServeOnNodes:
    """`shoal serve` with no storage nodes of its own, on the cluster's shard and nodes (which
    the test kills and starts again); a node silent for SERVE_HEARTBEAT_DEADLINE receives no new
    blocks."""

    def __init__(self, cluster: StorageCluster) -> None:
        root = cluster.config_file.parent
        shard = load_config(cluster.config_file, None).metadata.shards[0]
        self.config_file = root / "serve.toml"
        self.config_file.write_text(
            f'data_dir = "{root}"\n'
            f'[metadata]\n[[metadata.shards]]\nname = "{shard.name}"\ndsn = "{shard.dsn}"\n'
            f"[storage]\nlocal_nodes = 0\nblock_size = {BLOCK_SIZE}\n"
            "heartbeat_interval_seconds = 1\n"
            f"heartbeat_deadline_seconds = {SERVE_HEARTBEAT_DEADLINE.seconds}\n"
            "[s3]\nworkers = 1\n[gc]\nenabled = false\n"
            "[pipeline]\nscheduled = false\n"  # no Spark job starts at its hour meanwhile
        )
        self.process, self.served = start_serve(self.config_file, root / "serve.log")

    def client(self) -> Any:
        return self.served.raw_client(self.served.root)

    def stop(self) -> None:
        stop_serve(self.process)


@pytest.fixture
def cluster(make_storage: MakeStorage) -> StorageCluster:
    return make_storage(nodes=2)


@pytest.fixture
def serve(cluster: StorageCluster) -> Iterator[ServeOnNodes]:
    served = ServeOnNodes(cluster)
    try:
        yield served
    finally:
        served.stop()


def job(config_file: Path, spark: Any, name: str, tmp_path: Path, **options: Any) -> Any:
    config = load_config(config_file, None)
    return run_job(
        name,
        config,
        list(config.metadata.shards),
        spark=spark,
        output=tmp_path / "out",
        options=options,
    )


def body(size: int, seed: int) -> bytes:
    """`size` bytes that differ from block to block and from object to object."""
    pattern = hashlib.sha256(f"{seed}".encode()).digest()
    return (pattern * (size // len(pattern) + 1))[:size]


@pytest.mark.slow
def test_node_down_during_writes_then_back_restores_every_copy(
    cluster: StorageCluster, serve: ServeOnNodes, spark: Any, run: Any, tmp_path: Path
) -> None:
    up, down = cluster.nodes
    s3 = serve.client()
    written = Written(bucket=unique("repl"))
    s3.create_bucket(Bucket=written.bucket)

    down.kill()
    wait_until_not_writable(cluster, down.shark, run)
    write_objects(s3, written)
    owner = run(cluster.store.accounts.get_by_name("root")).id
    rows = run(live_runs(cluster.store, owner, written))
    # 8 objects, a completed upload of two parts, one open part: one copy each, all noted.
    assert len(rows) == 11
    assert all(run_.sharks == [up.shark] for run_ in rows)
    assert run(cluster.store.under_replicated.count()) == 11

    cluster.restart(down, run)
    started = time.monotonic()
    # A pass adds each version's copy, then removes the notes of its batch: wait for both.
    while time.monotonic() - started < RESTORE_SECONDS:
        rows = run(live_runs(cluster.store, owner, written))
        restored = all(sorted(r.sharks) == sorted([up.shark, down.shark]) for r in rows)
        if restored and run(cluster.store.under_replicated.count()) == 0:
            break
        time.sleep(0.5)
    assert all(sorted(r.sharks) == sorted([up.shark, down.shark]) for r in rows), rows
    assert run(cluster.store.under_replicated.count()) == 0
    check_bytes_on_every_node(cluster, written, rows, run)
    s3.close()

    audit = job(serve.config_file, spark, "audit", tmp_path)
    assert audit.figures["versions under-replicated"] == 0
    assert audit.figures["blocks missing"] == 0 and audit.figures["blocks corrupt"] == 0


def test_a_version_replaced_before_its_copy_is_dropped_and_the_live_one_restored(
    cluster: StorageCluster, run: Any
) -> None:
    up, down = cluster.nodes
    directory = Hiding(cluster, {down.shark})
    path = DataPath(cluster.client, directory, block_size=BLOCK_SIZE)
    owner = run(cluster.store.accounts.create(unique("repl"))).id
    bucket = unique("repl")
    run(cluster.store.buckets.create(owner, bucket))
    first = run(put(cluster.store, path, owner, bucket, "k", body(40 * KiB, 1)))
    second = run(put(cluster.store, path, owner, bucket, "k", body(20 * KiB, 2)))
    assert run(cluster.store.under_replicated.count()) == 2

    directory.hidden.clear()
    tally = run(Rereplicator(cluster.store, path, grace=timedelta(0)).run_once())
    # The replaced version is no longer live: its note goes, and it gets no copy.
    assert (tally.restored, tally.gone, tally.waiting) == (1, 1, 0)
    assert run(cluster.store.under_replicated.count()) == 0
    assert not [f for f in down.block_files() if f.name.startswith(str(first))]
    live = run(cluster.store.objects.get(owner, bucket, "k"))
    assert live.id == second and sorted(live.sharks) == sorted([up.shark, down.shark])
    assert len([f for f in down.block_files() if f.name.startswith(str(second))]) == 2
    # The same statement names no copy of a version that is not live.
    from shoal.metadata.replicas import Note

    note = Note(owner, live.bucket_id, "k", first)
    assert not run(cluster.store.under_replicated.add_sharks(note, [down.shark]))


class MovedWhenReached(Rereplicator):
    """A pass during which another process moves the vnode: after the pass listed the vnodes
    with notes, before it claims this one's."""

    def __init__(self, *args: Any, move: Callable[[int], Awaitable[None]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.move = move

    async def _vnode(self, vnode: int, *args: Any) -> None:
        await self.move(vnode)
        await super()._vnode(vnode, *args)


def test_notes_of_a_vnode_that_moves_are_restored_on_its_new_shard(
    make_storage: MakeStorage, admin_dsn: str, run: Any
) -> None:
    """A vnode whose notes wait moves to another shard: before a pass (this process's ring
    is stale), and during one. Each time its note is restored where the vnode now is, at the
    latest by the next pass, and no note is lost."""
    cluster = make_storage(nodes=2, vnodes=2)
    up, down = cluster.nodes
    [home] = load_config(cluster.config_file, None).metadata.shards
    spare = replace(create_databases(admin_dsn, 1)[0], name="s1")
    key = secrets.token_bytes(32)
    layout = MetadataConfig(vnodes=2, partitions_ahead=1)
    run(add_shard(home, spare, key, layout))
    store = run(MetadataStore.open([home], 4, shard_key=key, poll_ring=False))
    close_later(lambda: run(store.close()))
    counter = run(MetadataStore.open([home], 2, shard_key=key, poll_ring=False))
    close_later(lambda: run(counter.close()))
    directory = Hiding(cluster, {down.shark})
    path = DataPath(cluster.client, directory, block_size=BLOCK_SIZE)
    owner = run(store.accounts.create(unique("moved"))).id
    bucket = run(store.buckets.create(owner, unique("moved")))

    async def move(vnode: int) -> None:
        async with Mover([home, spare], layout, grace=timedelta(0)) as mover:
            assert await mover.move(vnode, spare.name) is not None

    def restored(key: str, version: uuid.UUID) -> bool:
        live = run(store.objects.get(owner, bucket.name, key))
        copies = [f for f in down.block_files() if f.name.startswith(str(version))]
        both = sorted(live.sharks) == sorted([up.shark, down.shark])
        return live.id == version and both and len(copies) == 2  # 20 KiB: two 16 KiB blocks

    # Before a pass: the vnode moves, and this process learns of it only from the pass.
    directory.hidden = {down.shark}
    first = run(put(store, path, owner, bucket.name, "a", body(20 * KiB, 1)))
    vnode = store.ring.vnode_for_object(owner, bucket.id, "a")
    run(move(vnode))
    assert store.ring.shard_of(vnode) == home.name  # stale
    assert counter.ring.shard_of(vnode) == home.name  # stale too, and counts the note
    assert run(counter.under_replicated.count()) == 1
    directory.hidden = set()
    tally = run(Rereplicator(store, path, grace=timedelta(0)).run_once())
    assert store.ring.shard_of(vnode) == spare.name
    assert tally.restored == 1 and restored("a", first)
    assert run(store.under_replicated.count()) == 0

    # During a pass (the other vnode): the claim meets the vnode gone; the next pass finds it
    # on its new shard.
    other = next(
        f"b{i}"
        for i in range(100)
        if store.ring.vnode_for_object(owner, bucket.id, f"b{i}") != vnode
    )
    directory.hidden = {down.shark}
    second = run(put(store, path, owner, bucket.name, other, body(20 * KiB, 2)))
    directory.hidden = set()
    mid_pass = MovedWhenReached(store, path, grace=timedelta(0), move=move)
    tally = run(mid_pass.run_once())
    assert tally.restored == 0 and store.ring.shard_of(1 - vnode) == spare.name
    assert run(store.under_replicated.count()) == 1
    tally = run(Rereplicator(store, path, grace=timedelta(0)).run_once())
    assert tally.restored == 1 and restored(other, second)
    assert run(store.under_replicated.count()) == 0


@pytest.mark.slow
def test_audit_finds_and_repairs_a_version_nobody_noted(
    cluster: StorageCluster, spark: Any, run: Any, tmp_path: Path
) -> None:
    up, down = cluster.nodes
    directory = Hiding(cluster, {down.shark})
    path = DataPath(cluster.client, directory, block_size=BLOCK_SIZE)
    owner = run(cluster.store.accounts.create(unique("repl"))).id
    bucket = unique("repl")
    run(cluster.store.buckets.create(owner, bucket))
    data = body(40 * KiB, 3)
    version = run(put(cluster.store, path, owner, bucket, "lost-note", data))
    part_data = body(30 * KiB, 4)
    upload = run(cluster.store.uploads.create(owner, bucket, "open"))
    part = run(put_part(cluster.store, path, owner, bucket, upload.id, part_data))
    delete_notes(cluster, run)  # as if the notes were lost: only the audit can find them
    directory.hidden.clear()

    found = job(cluster.config_file, spark, "audit", tmp_path)
    assert found.figures["versions under-replicated"] == 2
    assert found.figures["versions re-replicated"] == 0
    repaired = job(cluster.config_file, spark, "audit", tmp_path, repair=True)
    assert repaired.figures["versions re-replicated"] == 2
    after = job(cluster.config_file, spark, "audit", tmp_path)
    assert after.figures["versions under-replicated"] == 0
    assert after.figures["blocks missing"] == 0

    live = run(cluster.store.objects.get(owner, bucket, "lost-note"))
    assert live.id == version and sorted(live.sharks) == sorted([up.shark, down.shark])
    [stored_part] = run(cluster.store.uploads.list_parts(owner, bucket, "open", upload.id))
    assert stored_part.id == part and sorted(stored_part.sharks) == sorted([up.shark, down.shark])
    for node in (up, down):
        assert run(read_run(cluster, node.url, version, len(data))) == data
        assert run(read_run(cluster, node.url, part, len(part_data))) == part_data


# -- helpers ------------------------------------------------------------------------------------


class Hiding(RegistryDirectory):
    """The registry as a writer sees it while the nodes in `hidden` are down (they stay
    registered, so the target stays two copies)."""

    def __init__(self, cluster: StorageCluster, hidden: set[str]) -> None:
        super().__init__(cluster.store, HEARTBEAT_DEADLINE, cluster.client)
        self.hidden = hidden

    async def writable_nodes(self) -> list[Node]:
        return [n for n in await super().writable_nodes() if n.shark not in self.hidden]


async def once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def put(
    store: MetadataStore, path: DataPath, owner: uuid.UUID, bucket: str, key: str, data: bytes
) -> uuid.UUID:
    """Write an object as the gateway does: blocks, then the row (noted when short)."""
    from shoal.ids import uuid7

    version = uuid7()
    result = await path.write(version, once(data))
    write = ObjectWrite(
        id=version,
        content_length=result.size,
        content_md5=result.md5,
        sharks=result.sharks,
        properties={"block_size": result.block_size},
        under_replicated=result.under_replicated,
    )
    await store.objects.put(owner, bucket, key, write)
    return version


async def put_part(
    store: MetadataStore,
    path: DataPath,
    owner: uuid.UUID,
    bucket: str,
    upload: uuid.UUID,
    data: bytes,
) -> uuid.UUID:
    from shoal.ids import uuid7

    part_id = uuid7()
    result = await path.write(part_id, once(data))
    write = PartWrite(
        id=part_id,
        part_number=1,
        content_length=result.size,
        content_md5=result.md5,
        sharks=result.sharks,
        properties={"block_size": result.block_size},
        under_replicated=result.under_replicated,
    )
    await store.uploads.put_part(owner, bucket, "open", upload, write)
    return part_id


def delete_notes(cluster: StorageCluster, run: Any) -> None:
    dsn = load_config(cluster.config_file, None).metadata.shards[0].dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        for vnode in range(cluster.store.ring.vnodes):
            conn.execute(f'DELETE FROM "{vnode_schema(vnode)}".manta_bucket_under_replicated')
    assert run(cluster.store.under_replicated.count()) == 0


async def read_run(cluster: StorageCluster, url: str, run_id: uuid.UUID, size: int) -> bytes:
    """A run's bytes as one node holds them (each block checked against its checksum)."""
    run = BlockRun(run_id, size, BLOCK_SIZE, [])
    return b"".join([bytes(await cluster.client.get_block(url, n)) for n in run.block_names()])


def wait_until_not_writable(cluster: StorageCluster, shark: str, run: Any) -> None:
    """Until serve's gateway stops offering blocks to the killed node: its heartbeat is past
    serve's deadline, and the gateway has read the registry again (every 2 s)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        nodes = run(cluster.store.nodes.list(SERVE_HEARTBEAT_DEADLINE))
        if not any(n.shark == shark and n.alive for n in nodes):
            time.sleep(2.5)
            return
        time.sleep(0.2)
    raise TimeoutError(f"{shark} still counts as alive")


def write_objects(s3: Any, written: Written) -> None:
    """Objects of one and several blocks (all over the 4 KiB kept in rows), a completed
    upload of two parts, and an open upload with one part."""
    for index, size in enumerate((5 * KiB, 9 * KiB, 16 * KiB, 17 * KiB, 40 * KiB, 64 * KiB)):
        key = f"object-{index}"
        written.objects[key] = body(size, index)
        s3.put_object(Bucket=written.bucket, Key=key, Body=written.objects[key])
    source = "object-4"
    s3.copy_object(
        Bucket=written.bucket, Key="copy", CopySource={"Bucket": written.bucket, "Key": source}
    )
    written.objects["copy"] = written.objects[source]
    written.objects["again"] = body(6 * KiB, 99)
    s3.put_object(Bucket=written.bucket, Key="again", Body=written.objects["again"])

    parts = [body(5 * MiB, 100), body(20 * KiB, 101)]
    upload = s3.create_multipart_upload(Bucket=written.bucket, Key="multipart")["UploadId"]
    etags = [
        s3.upload_part(
            Bucket=written.bucket, Key="multipart", UploadId=upload, PartNumber=n, Body=data
        )["ETag"]
        for n, data in enumerate(parts, start=1)
    ]
    s3.complete_multipart_upload(
        Bucket=written.bucket,
        Key="multipart",
        UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]},
    )
    written.objects["multipart"] = b"".join(parts)

    written.open_key = "still-open"
    written.open_part = body(12 * KiB, 102)
    written.open_upload = s3.create_multipart_upload(Bucket=written.bucket, Key=written.open_key)[
        "UploadId"
    ]
    s3.upload_part(
        Bucket=written.bucket,
        Key=written.open_key,
        UploadId=written.open_upload,
        PartNumber=1,
        Body=written.open_part,
    )


async def live_runs(store: MetadataStore, owner: uuid.UUID, written: Written) -> list[BlockRun]:
    """Every run of blocks the live rows name: each object's own, each part of the completed
    upload, and the open upload's part."""
    runs = []
    for key in written.objects:
        version = await store.objects.get(owner, written.bucket, key, with_data=False)
        runs += block_runs(version.id, version.content_length, version.sharks, version.properties)
    [part] = await store.uploads.list_parts(
        owner, written.bucket, written.open_key, uuid.UUID(written.open_upload)
    )
    runs.append(BlockRun(part.id, part.content_length, BLOCK_SIZE, part.sharks))
    return runs


def check_bytes_on_every_node(
    cluster: StorageCluster, written: Written, runs: list[BlockRun], run: Any
) -> None:
    """Both nodes hold every block of every run, with the bytes that were written."""
    expected = b"".join(written.objects.values()) + written.open_part
    for node in cluster.nodes:
        held = b"".join(run(read_run(cluster, node.url, r.id, r.size)) for r in runs)
        assert held == expected, node.shark
