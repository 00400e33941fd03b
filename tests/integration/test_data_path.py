"""The data path against real storage-node processes: round trips, ranges, failures."""

from __future__ import annotations

import asyncio
import os
import random
import threading
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from shoal.ids import uuid7
from shoal.pipeline.jobs.rebalance import FixedDirectory
from shoal.storage import (
    BlockClient,
    BlockRun,
    DataPath,
    DataUnavailable,
    StorageUnavailable,
    WriteResult,
    block_runs,
)
from shoal.storage.datapath import DELETE_BATCH, DELETES_IN_FLIGHT
from tests.fixtures.storage import MakeStorage, StorageCluster
from tests.integration.test_node_client import node_answering

MiB = 1024 * 1024
BLOCK = MiB


async def chunks_of(data: bytes, seed: int = 0) -> AsyncIterator[bytes]:
    """The data in chunks of random sizes, as a network stream delivers it."""
    rng = random.Random(seed)
    position = 0
    while position < len(data):
        size = rng.randint(1, 300_000)
        yield data[position : position + size]
        position += size
        await asyncio.sleep(0)


async def collect(stream: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in stream])


def runs_of(version: uuid.UUID, result: WriteResult) -> list[BlockRun]:
    return [BlockRun(version, result.size, result.block_size, result.sharks)]


@pytest.fixture(scope="module")
def cluster(make_storage: MakeStorage) -> StorageCluster:
    return make_storage(nodes=3, datacenters=2)


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize(
    "size", [0, 1, BLOCK, BLOCK + 1, 50 * MiB], ids=["0B", "1B", "1block", "1block+1", "50MiB"]
)
def test_round_trip_and_ranges(cluster: StorageCluster, run: Any, size: int, replicas: int) -> None:
    path = cluster.data_path(replicas=replicas)
    data = os.urandom(size)
    version = uuid7()
    result = run(path.write(version, chunks_of(data)))
    assert result.size == size and len(result.sharks) == replicas
    assert len({s.split(":")[0] for s in result.sharks}) == replicas  # distinct datacenters
    import hashlib

    assert result.md5 == hashlib.md5(data).digest()
    runs = runs_of(version, result)
    assert run(collect(path.read(runs))) == data
    ranges = [
        (0, 1),
        (size - 1, size),
        (BLOCK - 3, BLOCK + 3),
        (max(0, size - 500), size),
        (size // 3, 2 * size // 3),
        (BLOCK, 2 * BLOCK + 7),
    ]
    for start, end in ranges:
        start, end = max(0, min(start, size)), max(0, min(end, size))
        assert run(collect(path.read(runs, start, end))) == data[start:end], (start, end)


def test_checksums_are_s3s(cluster: StorageCluster, run: Any) -> None:
    import base64
    import hashlib
    import zlib

    data = b"The quick brown fox jumps over the lazy dog"
    result = run(cluster.data_path().write(uuid7(), chunks_of(data)))
    assert result.checksums["sha256"] == base64.b64encode(hashlib.sha256(data).digest()).decode()
    assert (
        result.checksums["crc32"] == base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    )
    # Known CRC32C of this sentence (RFC 3720 test vectors use other inputs; this is crc32c's).
    assert result.checksums["crc32c"] == base64.b64encode(bytes.fromhex("22620404")).decode()


def test_multipart_object_reads_through_its_parts(cluster: StorageCluster, run: Any) -> None:
    path = cluster.data_path(block_size=64 * 1024)
    parts, datas = [], []
    for number in (1, 2, 3):
        data = os.urandom(100_000 * number)
        part_id = uuid7()
        result = run(path.write(part_id, chunks_of(data)))
        parts.append(
            {
                "id": str(part_id),
                "size": result.size,
                "block_size": result.block_size,
                "sharks": result.sharks,
                "part_number": number,
            }
        )
        datas.append(data)
    whole = b"".join(datas)
    runs = block_runs(uuid7(), len(whole), [], {"parts": parts})
    assert run(collect(path.read(runs))) == whole
    assert run(collect(path.read(runs, 99_990, 300_010))) == whole[99_990:300_010]


def test_read_survives_a_replica_killed_midway(make_storage: MakeStorage, run: Any) -> None:
    cluster = make_storage(nodes=2)
    path = cluster.data_path(replicas=2)
    data = os.urandom(12 * MiB)
    version = uuid7()
    result = run(path.write(version, chunks_of(data)))

    async def read_and_kill() -> bytes:
        received = []
        async for chunk in path.read(runs_of(version, result)):
            received.append(chunk)
            if len(received) == 2:
                cluster.node(result.sharks[0]).kill()
        return b"".join(received)

    assert run(read_and_kill()) == data


def test_write_replaces_a_replica_killed_midway(make_storage: MakeStorage, run: Any) -> None:
    cluster = make_storage(nodes=3)
    path = cluster.data_path(replicas=2)
    data = os.urandom(10 * MiB)
    version = uuid7()
    killed: list[str] = []

    async def stream() -> AsyncIterator[bytes]:
        async for chunk in chunks_of(data):
            yield chunk
            holders = [
                n for n in cluster.nodes if any(str(version) in f.name for f in n.block_files())
            ]
            if not killed and len(holders) == 2:
                holders[0].kill()
                killed.append(holders[0].shark)

    result = run(path.write(version, stream()))
    assert killed and killed[0] not in result.sharks and len(result.sharks) == 2
    for shark in result.sharks:
        held = {
            f.name for f in cluster.node(shark).block_files() if f.name.startswith(str(version))
        }
        assert len(held) == 10  # the replacement received the blocks written before it joined
    assert run(collect(path.read(runs_of(version, result)))) == data


def test_write_fails_cleanly_without_a_spare_node(make_storage: MakeStorage, run: Any) -> None:
    cluster = make_storage(nodes=2)
    path = cluster.data_path(replicas=2)
    version = uuid7()

    async def stream() -> AsyncIterator[bytes]:
        for index in range(8):
            yield os.urandom(MiB)
            if index == 3:
                cluster.nodes[1].kill()

    with pytest.raises(StorageUnavailable):
        run(path.write(version, stream()))
    survivor = cluster.nodes[0]
    assert not [f for f in survivor.block_files() if f.name.startswith(str(version))]


def test_a_body_cut_short_leaves_no_blocks_and_no_thread(cluster: StorageCluster, run: Any) -> None:
    """A client that disconnects mid-body (its body raises ConnectionResetError, as the
    gateway's does) while blocks are hashed in a thread and sent: the write fails with that
    error, every block it stored is deleted again, and no hashing thread is left behind."""
    path = cluster.data_path(replicas=2)
    run(path.write(uuid7(), chunks_of(os.urandom(2 * MiB))))  # the loop's hashing thread exists
    threads = threading.active_count()
    version = uuid7()
    data = os.urandom(3 * MiB + 5000)  # a short last block when the body is cut

    async def cut_short() -> AsyncIterator[bytes]:
        async for chunk in chunks_of(data):
            yield chunk
        raise ConnectionResetError("the client closed the connection mid-body")

    with pytest.raises(ConnectionResetError):
        run(path.write(version, cut_short()))
    for node in cluster.nodes:
        assert not [f for f in node.block_files() if f.name.startswith(str(version))]
    assert threading.active_count() == threads


def test_corrupted_block_is_read_from_the_other_replica(cluster: StorageCluster, run: Any) -> None:
    path = cluster.data_path(replicas=2)
    data = os.urandom(3 * MiB)
    version = uuid7()
    result = run(path.write(version, chunks_of(data)))
    # Block 0 is tried first on sharks[0]; corrupt it there, past the 48-byte header.
    first = cluster.node(result.sharks[0])
    block_file = next(f for f in first.block_files() if f.name == f"{version}.0")
    with open(block_file, "r+b") as handle:
        handle.seek(48 + 1000)
        byte = handle.read(1)
        handle.seek(48 + 1000)
        handle.write(bytes([byte[0] ^ 0xFF]))
    assert run(collect(path.read(runs_of(version, result)))) == data


def test_a_block_its_row_misplaces_is_read_from_the_node_that_holds_it(
    cluster: StorageCluster, run: Any
) -> None:
    """After the metadata is restored from a backup taken before a drain moved the copies,
    rows name nodes that no longer hold their blocks: a read that finds no good copy where
    the row says asks the other nodes, and fails only when none has one."""
    path = cluster.data_path(replicas=2)
    data = os.urandom(2 * MiB + 5)
    version = uuid7()
    result = run(path.write(version, chunks_of(data)))
    (elsewhere,) = [n for n in cluster.nodes if n.shark not in result.sharks]
    names = BlockRun(version, result.size, result.block_size, result.sharks).block_names()

    async def move_the_copies() -> None:
        for name in names:
            block = await cluster.client.get_block(cluster.node(result.sharks[0]).url, name)
            await cluster.client.put_block(elsewhere.url, name, block)
        for shark in result.sharks:
            assert await cluster.client.delete_blocks(cluster.node(shark).url, names) == 3

    run(move_the_copies())
    assert run(collect(path.read(runs_of(version, result)))) == data
    assert run(collect(path.read(runs_of(version, result), 1, 7))) == data[1:7]

    assert run(cluster.client.delete_blocks(elsewhere.url, names)) == 3
    with pytest.raises(DataUnavailable, match="no replica of block"):
        run(collect(path.read(runs_of(version, result))))


def test_delete_removes_every_block_and_is_idempotent(cluster: StorageCluster, run: Any) -> None:
    path = cluster.data_path(replicas=2, block_size=64 * 1024)
    version = uuid7()
    result = run(path.write(version, chunks_of(os.urandom(300_000))))
    runs = runs_of(version, result)
    first = run(path.delete(runs))
    assert first.complete and first.deleted == 2 * 5 and first.missing == 0
    for node in cluster.nodes:
        assert not [f for f in node.block_files() if f.name.startswith(str(version))]
    second = run(path.delete(runs))
    assert second.complete and second.deleted == 0 and second.missing == 10


def test_write_needs_enough_writable_nodes(cluster: StorageCluster, run: Any) -> None:
    path: DataPath = cluster.data_path(replicas=4)
    with pytest.raises(StorageUnavailable):
        run(path.write(uuid7(), chunks_of(b"x")))


def test_a_version_is_read_where_its_properties_say(cluster: StorageCluster, run: Any) -> None:
    """Bytes come from the row only for a small object (properties.inline): a row that a
    gateway older than small objects overwrote keeps stale bytes in `data` (rolling upgrade)."""
    from shoal.metadata import ObjectVersion
    from shoal.s3.payload import read_version

    path = cluster.data_path()
    data, version = os.urandom(10), uuid7()
    result = run(path.write(version, chunks_of(data)))
    now = datetime.now(UTC)

    def row(properties: dict[str, Any], stored: bytes | None) -> ObjectVersion:
        return ObjectVersion(
            id=version,
            owner=uuid.uuid4(),
            bucket_id=uuid.uuid4(),
            name="k",
            created=now,
            modified=now,
            creator=None,
            content_length=10,
            content_md5=result.md5,
            content_type=None,
            headers={},
            roles=[],
            sharks=result.sharks,
            properties=properties,
            data=stored,
        )

    stale = row({"block_size": result.block_size}, b"stale data")
    assert run(collect(read_version(path, stale))) == data
    small = row({"inline": True}, b"small data")
    assert run(collect(read_version(path, small, 2, 5))) == b"all"
    with pytest.raises(ValueError, match="without its bytes"):
        read_version(path, row({"inline": True}, None))


def test_a_node_that_fails_a_delete_request_is_asked_nothing_more(run: Any) -> None:
    requests = 0

    async def failing(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        requests += 1
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy")
        await writer.drain()

    async def delete() -> Any:
        client = BlockClient(b"s" * 32)
        try:
            async with node_answering(failing) as url:
                path = DataPath(client, FixedDirectory({"dc:n1": url}, []))
                names = [f"{uuid7()}.0" for _ in range(DELETE_BATCH * (DELETES_IN_FLIGHT + 3))]
                return await path.delete_names({"dc:n1": names})
        finally:
            await client.close()

    outcome = run(delete())
    assert outcome.failed_nodes == ["dc:n1"] and "503" in outcome.reasons["dc:n1"]
    assert outcome.deleted == 0
    # The requests already out when the first failed, not one for each of the 7 batches.
    assert requests <= DELETES_IN_FLIGHT


def test_a_node_that_did_not_answer_a_delete_is_skipped_until_it_answers(run: Any) -> None:
    async def delete_twice() -> tuple[Any, Any, bool]:
        client = BlockClient(b"s" * 32)
        directory = FixedDirectory({"dc:n1": "http://127.0.0.1:1"}, [])  # nothing listens
        path = DataPath(client, directory)
        try:
            names = {"dc:n1": [f"{uuid7()}.0"]}
            first = await path.delete_names(names)
            marked = directory.unreachable("dc:n1")
            return first, await path.delete_names(names), marked
        finally:
            await client.close()

    first, second, marked = run(delete_twice())
    assert first.failed_nodes == ["dc:n1"] and marked
    assert second.failed_nodes == ["dc:n1"] and "nor its /status now" in second.reasons["dc:n1"]
