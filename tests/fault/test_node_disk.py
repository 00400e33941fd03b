"""A storage node whose disk turns read-only under it (as the kernel remounts a file system
with errors): its /ready says 503 and why within seconds, its heartbeat offers no free space so
that writers place new blocks on the other nodes, its blocks can still be read, and all of it
turns back once the disk takes writes again.

The node's folder is a tmpfs of its own, remounted read-only and back with mount(8): root only.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shoal.cluster import MIN_FREE_BYTES
from shoal.ids import uuid7
from shoal.storage import NodeUnavailable, block_name
from tests.fixtures.storage import (
    HEARTBEAT_DEADLINE,
    MakeStorage,
    NodeProcess,
    StorageCluster,
    sample,
    start_node,
    wait_until_registered,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="mounting and remounting a tmpfs needs root"
)


@pytest.mark.slow
def test_a_node_whose_disk_turns_read_only_takes_no_new_blocks_and_serves_reads(
    make_storage: MakeStorage, run: Callable[..., Any], tmp_path: Path
) -> None:
    cluster = make_storage(nodes=2)
    with node_on_its_own_tmpfs(cluster, tmp_path, run) as (sick, disk):
        name, data = block_name(uuid7(), 0), os.urandom(100_000)
        assert run(cluster.client.put_block(sick.url, name, data))
        # That write left empty files made ahead for the next ones open on the disk
        # (BlockStore.make_spare), and a file system with files open for writing cannot be
        # remounted read-only by hand: the node starts again without them.
        sick.stop()
        cluster.restart(sick, run)
        wait_for(lambda: sick.readiness()[0] == 200)

        remount(disk, "ro")
        wait_for(lambda: sick.readiness()[0] == 503, 5)
        report = sick.readiness()[1]
        assert "Read-only file system" in report["reason"], report
        assert report["blocks_folder"] == str(sick.root)
        assert sample(sick.metrics(), "shoal_ready") == 0
        assert run(cluster.client.get_block(sick.url, name)) == data  # reads go on
        # A writer that chose it before the registry said so: a 503 that names the cause,
        # on which the data path writes the block to another node.
        with pytest.raises(NodeUnavailable, match="503 the disk does not take writes"):
            run(cluster.client.put_block(sick.url, block_name(uuid7(), 0), data))

        wait_for(lambda: free_bytes(cluster, sick, run) == 0, 5)
        path = cluster.data_path(replicas=2)  # a new view of the registry: three nodes alive
        for _ in range(6):
            written = run(path.write(uuid7(), one_chunk(os.urandom(64 * 1024))))
            assert sick.shark not in written.sharks
        assert len(sick.block_files()) == 1

        remount(disk, "rw")
        wait_for(lambda: sick.readiness()[0] == 200, 5)
        assert sample(sick.metrics(), "shoal_ready") == 1
        wait_for(lambda: free_bytes(cluster, sick, run) >= MIN_FREE_BYTES, 5)
        everywhere = cluster.data_path(replicas=3)
        written = run(everywhere.write(uuid7(), one_chunk(os.urandom(64 * 1024))))
        assert sick.shark in written.sharks


@pytest.mark.slow
def test_a_node_whose_blocks_folder_turns_read_only_refuses_writes_and_deletes_with_503(
    make_storage: MakeStorage, run: Callable[..., Any]
) -> None:
    """Only blocks/ read-only (a bind mount, a folder another tool locked): the probe's file in
    tmp/ still writes, but no block can be linked into place or removed. /ready says so, and
    writes and deletes are 503s that name the cause, not 500s."""
    cluster = make_storage(nodes=2)
    node = cluster.nodes[0]
    name, data = block_name(uuid7(), 0), os.urandom(100_000)
    assert run(cluster.client.put_block(node.url, name, data))
    with read_only_bind_mount(node.root / "blocks"):
        wait_for(lambda: node.readiness()[0] == 503, 5)
        assert "blocks is read-only" in node.readiness()[1]["reason"]
        with pytest.raises(NodeUnavailable, match="503 the disk does not take writes"):
            run(cluster.client.put_block(node.url, block_name(uuid7(), 0), data))
        with pytest.raises(NodeUnavailable, match="503 the disk does not take deletes"):
            run(cluster.client.delete_blocks(node.url, [name]))
        assert run(cluster.client.get_block(node.url, name)) == data  # reads go on
    wait_for(lambda: node.readiness()[0] == 200, 5)
    assert run(cluster.client.delete_blocks(node.url, [name])) == 1


@contextlib.contextmanager
def read_only_bind_mount(folder: Path) -> Iterator[None]:
    bound = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True)
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {bound.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)
        yield
    finally:
        unmount(folder)


def unmount(folder: Path) -> None:
    """umount, tried again while the mount is busy (a node's thread may still hold a file or
    the folder open for a moment), then lazily: the node's own folder is left either way."""
    deadline = time.monotonic() + 10
    while subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            subprocess.run(["umount", "--lazy", str(folder)], check=True)
            return
        time.sleep(0.1)


@contextlib.contextmanager
def node_on_its_own_tmpfs(
    cluster: StorageCluster, parent: Path, run: Callable[..., Any]
) -> Iterator[tuple[NodeProcess, Path]]:
    """A third node of `cluster` whose folder is a tmpfs (larger than the free space gateways
    ask of a node; a tmpfs takes memory only for what is written to it)."""
    disk = parent / "sick"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512m,mode=0700", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    node = None
    try:
        node = start_node(cluster, "sick", "dc0", parent)
        cluster.nodes.append(node)
        wait_until_registered(cluster, run)
        yield node, disk
    finally:
        if node is not None:
            node.stop()
        unmount(disk)


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not true within {timeout} s"
        time.sleep(0.2)


def remount(disk: Path, mode: str) -> None:
    """Remount read-only ("ro") or read-write ("rw"); tried again while the file system is
    busy (a readiness probe's file is open for a moment each second)."""
    deadline = time.monotonic() + 10
    while True:
        done = subprocess.run(
            ["mount", "-o", f"remount,{mode}", str(disk)], capture_output=True, text=True
        )
        if done.returncode == 0:
            return
        assert time.monotonic() < deadline, done.stderr
        time.sleep(0.1)


def free_bytes(cluster: StorageCluster, node: NodeProcess, run: Callable[..., Any]) -> int:
    entries = run(cluster.store.nodes.list(HEARTBEAT_DEADLINE))
    return next(n.free_bytes for n in entries if n.name == node.name)


async def one_chunk(data: bytes) -> AsyncIterator[bytes]:
    yield data
