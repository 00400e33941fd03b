"""A storage node's metrics on its admin listener (real node processes): block operations and
bytes moved by exactly what was done, fsyncs timed, checksum failures counted, disk and block
gauges set, worker processes summed; and the registry's block counts and admin URLs."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.multiprocess import MultiProcessCollector

from shoal.ids import uuid7
from shoal.storage import BlockClient, NodeRefused, block_name
from shoal.storage.blockfile import checksum_of
from shoal.telemetry import folder_for
from tests.fixtures.storage import (
    HEARTBEAT_DEADLINE,
    MakeStorage,
    NodeProcess,
    Samples,
    StorageCluster,
    head_block,
    read_range,
    sample,
)


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return sample(after, name, **labels) - sample(before, name, **labels)


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not true within {timeout} s"
        time.sleep(0.2)


def test_a_nodes_metrics_move_by_exactly_its_block_operations(
    make_storage: MakeStorage, run: Callable[..., Any]
) -> None:
    cluster = make_storage(nodes=1)
    node, client = cluster.nodes[0], cluster.client
    version = uuid7()
    blocks = {block_name(version, index): os.urandom(size) for index, size in enumerate(SIZES)}
    names = list(blocks)
    before = node.metrics()

    for name, data in blocks.items():
        assert run(client.put_block(node.url, name, data))
    with pytest.raises(NodeRefused):  # data that does not match the checksum sent with it
        run(client.put_block(node.url, block_name(version, 9), b"x" * 100, checksum_of(b"y")))
    assert run(client.get_block(node.url, names[0])) == blocks[names[0]]
    assert run(client.get_block(node.url, names[2])) == blocks[names[2]]
    assert read_range(cluster.secret, node.url, names[1], 10, 110) == blocks[names[1]][10:110]
    assert head_block(cluster.secret, node.url, names[1])  # a HEAD reads no block data
    run(client.delete_block(node.url, names[0]))
    assert run(client.delete_blocks(node.url, [names[1], block_name(version, 8)])) == 1

    operations = "shoal_node_block_operations_total"
    # A read is counted once its block is sent: its client may have it a moment before.
    wait_for(lambda: moved(before, node.metrics(), operations, operation="read") >= 3)
    after = node.metrics()
    assert moved(before, after, operations, operation="write") == 3
    assert moved(before, after, operations, operation="read") == 3
    assert moved(before, after, operations, operation="delete") == 3  # one was not there
    block_bytes = "shoal_node_block_bytes_total"
    assert moved(before, after, block_bytes, direction="written") == sum(SIZES)
    assert moved(before, after, block_bytes, direction="read") == SIZES[0] + SIZES[2] + 100
    assert moved(before, after, "shoal_node_checksum_failures_total") == 1
    # Each new block: its file's fsync and its folder's.
    assert moved(before, after, "shoal_node_fsync_duration_seconds_count") == 6
    assert moved(before, after, "shoal_node_fsync_duration_seconds_sum") > 0

    # The gauges the heartbeat sets (every second here), and what it tells the registry.
    wait_for(lambda: sample(node.metrics(), "shoal_node_blocks") == 1)
    gauges = node.metrics()
    assert sample(gauges, "shoal_node_disk_bytes", state="used") > 0
    assert sample(gauges, "shoal_node_disk_bytes", state="free") > 0
    assert sample(gauges, "shoal_ready") == 1
    wait_for(lambda: registered(cluster, run)[node.name].blocks == 1)
    entry = registered(cluster, run)[node.name]
    assert entry.admin_url == f"http://127.0.0.1:{node.admin_port}"
    assert f"{node.shark}" in db_status(cluster) and "1 blocks" in db_status(cluster)


SIZES = (1000, 70_000, 1024 * 1024)


def test_a_node_with_worker_processes_sums_their_metrics(
    make_storage: MakeStorage, run: Callable[..., Any]
) -> None:
    cluster = make_storage(nodes=1, node_workers=2)
    node = cluster.nodes[0]
    wait_for(lambda: (node.root / "tmp" / "w1").is_dir(), 60)  # the worker serves
    before = node.metrics()
    version = uuid7()
    written = 0
    # New connections until both processes took some of the writes (the kernel hands each
    # connection to whichever process accepts it first).
    for _ in range(20):
        written += run(write_on_new_connections(cluster, node, version, first=written))
        if len(writes_by_process(node)) == 2:
            break
    by_process = writes_by_process(node)
    assert len(by_process) == 2 and sum(by_process.values()) == written, by_process

    after = node.metrics()
    operations = "shoal_node_block_operations_total"
    assert moved(before, after, operations, operation="write") == written
    assert moved(before, after, "shoal_node_block_bytes_total", direction="written") == (
        written * BLOCK_BYTES
    )
    # The block count is the processes' shared one; the heartbeat reports it.
    wait_for(lambda: sample(node.metrics(), "shoal_node_blocks") == written)
    wait_for(lambda: registered(cluster, run)[node.name].blocks == written)


BLOCK_BYTES = 4096
CONNECTIONS = 8


async def write_on_new_connections(
    cluster: StorageCluster, node: NodeProcess, version: Any, first: int
) -> int:
    """CONNECTIONS blocks at once, each on a connection of its own."""

    async def put(index: int) -> None:
        client = BlockClient(cluster.secret)
        try:
            data = os.urandom(BLOCK_BYTES)
            assert await client.put_block(node.url, block_name(version, first + index), data)
        finally:
            await client.close()

    await asyncio.gather(*(put(index) for index in range(CONNECTIONS)))
    return CONNECTIONS


def writes_by_process(node: NodeProcess) -> dict[str, float]:
    """Block writes counted by each of the node's processes (its metric files, by pid)."""
    counts = {}
    folder = node.root.parent / folder_for(node.root, "node").name  # TMPDIR: start_node
    for path in folder.glob("counter_*.db"):
        families = MultiProcessCollector.merge([str(path)], accumulate=False)
        writes = [
            one.value
            for family in families
            for one in family.samples
            if one.name == "shoal_node_block_operations_total"
            and one.labels.get("operation") == "write"
            and one.value
        ]
        if writes:
            counts[path.name] = sum(writes)
    return counts


def registered(cluster: StorageCluster, run: Callable[..., Any]) -> dict[str, Any]:
    return {n.name: n for n in run(cluster.store.nodes.list(HEARTBEAT_DEADLINE))}


def db_status(cluster: StorageCluster) -> str:
    command = [sys.executable, "-m", "shoal.cli", "db", "status"]
    command += ["--config", str(cluster.config_file)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    return result.stdout
