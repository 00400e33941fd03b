"""One move of `shoal pipeline rebalance`, without Spark: the copy, the conditional update,
and the clean-up of either copy (storage.md, "Node states")."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from shoal.ids import uuid7
from shoal.metadata import ObjectWrite
from shoal.pipeline.jobs.rebalance import FixedDirectory, move_copy
from shoal.storage import DataPath, Node, block_runs
from tests.fixtures.postgres import unique
from tests.fixtures.storage import MakeStorage, StorageCluster

KiB = 1024
BLOCK_SIZE = 16 * KiB


@pytest.fixture(scope="module")
def cluster(make_storage: MakeStorage) -> StorageCluster:
    return make_storage(nodes=3, datacenters=1)


def mover(cluster: StorageCluster, targets: list[str]) -> DataPath:
    urls = {n.shark: n.url for n in cluster.nodes}
    nodes = [Node(n.name, n.datacenter, n.url, 2**40) for n in cluster.nodes if n.shark in targets]
    return DataPath(cluster.client, FixedDirectory(urls, nodes), block_size=BLOCK_SIZE)


def files_of(cluster: StorageCluster, shark: str, version: uuid.UUID) -> int:
    return len([f for f in cluster.node(shark).block_files() if f.name.startswith(str(version))])


def written(cluster: StorageCluster, run: Any, data: bytes) -> tuple[Any, str, ObjectWrite]:
    """An object on the first two nodes, written as the gateway writes it."""
    owner = run(cluster.store.accounts.create(unique("move"))).id
    bucket = unique("move")
    run(cluster.store.buckets.create(owner, bucket))
    first, second = cluster.nodes[0], cluster.nodes[1]
    path = mover(cluster, [first.shark, second.shark])

    async def once() -> Any:
        yield data

    version = uuid7()
    result = run(path.write(version, once()))
    write = ObjectWrite(
        id=version,
        content_length=result.size,
        content_md5=result.md5,
        sharks=sorted(result.sharks),
        properties={"block_size": result.block_size},
    )
    run(cluster.store.objects.put(owner, bucket, "k", write))
    return owner, bucket, write


def move_of(owner: Any, bucket_id: Any, write: ObjectWrite, leaving: str) -> tuple[Any, ...]:
    return (
        0,
        str(owner),
        str(bucket_id),
        "k",
        str(write.id),
        write.content_length,
        BLOCK_SIZE,
        list(write.sharks),
        leaving,
    )


def test_a_move_copies_renames_then_deletes_the_old_copy(cluster: StorageCluster, run: Any) -> None:
    data = bytes(range(256)) * 200  # 50 KiB: four blocks
    owner, bucket, write = written(cluster, run, data)
    old, new = cluster.nodes[0].shark, cluster.nodes[2].shark
    bucket_id = run(cluster.store.buckets.get(owner, bucket)).id
    path = mover(cluster, [new])
    assert run(move_copy(cluster.store, path, move_of(owner, bucket_id, write, old))) == "moved"
    live = run(cluster.store.objects.get(owner, bucket, "k"))
    assert sorted(live.sharks) == sorted([cluster.nodes[1].shark, new])
    assert files_of(cluster, old, write.id) == 0 and files_of(cluster, new, write.id) == 4
    read = mover(cluster, [])
    runs = block_runs(live.id, live.content_length, live.sharks, live.properties)

    async def whole() -> bytes:
        return b"".join([bytes(chunk) async for chunk in read.read(runs)])

    assert run(whole()) == data


def test_a_version_replaced_during_the_move_keeps_its_old_copy_and_loses_the_new(
    cluster: StorageCluster, run: Any
) -> None:
    owner, bucket, write = written(cluster, run, b"x" * (40 * KiB))
    old, new = cluster.nodes[0].shark, cluster.nodes[2].shark
    bucket_id = run(cluster.store.buckets.get(owner, bucket)).id
    stale = move_of(owner, bucket_id, write, old)
    # Replaced after the snapshot the move came from: the deletion record names the old node.
    run(cluster.store.objects.put(owner, bucket, "k", ObjectWrite(10, b"\0" * 16, data=b"y" * 10)))
    assert run(move_copy(cluster.store, mover(cluster, [new]), stale)) == "changed"
    assert files_of(cluster, new, write.id) == 0  # the new copy was deleted again
    assert files_of(cluster, old, write.id) == 3  # GC's to delete, by the deletion record
