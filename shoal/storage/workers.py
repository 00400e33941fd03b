"""A storage node's worker processes: more than one Python process serving one disk.

A node's threads share one interpreter lock: the disk work and the socket copies run without
it, but parsing requests and hashing blocks take it. With many writers in flight on a machine
with cores to spare, workers (shoal.workers) are extra processes that run the same service
on the node's socket.

What the processes share: the disk (each has its own tmp/ folder, see BlockStore) and the
block count (in shared memory, server.BlockCount).
"""

from __future__ import annotations

import socket
from pathlib import Path

import shoal.loop
from shoal.storage.blockfile import BlockStore, in_thread
from shoal.storage.server import BlockCount, NodeIdentity, NodeServer
from shoal.workers import WorkerProcesses, stop_on_signals


def node_workers(
    count: int,
    root: Path,
    secret: bytes,
    identity: NodeIdentity,
    blocks: BlockCount,
    sock: socket.socket,
) -> WorkerProcesses:
    """`count` extra processes serving the node's socket (the node process serves too)."""
    return WorkerProcesses("storage", count, _serve_node, root, secret, identity, blocks, sock)


def _serve_node(
    worker: int,
    root: Path,
    secret: bytes,
    identity: NodeIdentity,
    blocks: BlockCount,
    sock: socket.socket,
) -> None:
    shoal.loop.run(_serve_until_stopped(worker, root, secret, identity, blocks, sock))


async def _serve_until_stopped(
    worker: int,
    root: Path,
    secret: bytes,
    identity: NodeIdentity,
    blocks: BlockCount,
    sock: socket.socket,
) -> None:
    stop = stop_on_signals()
    blocks.slot = worker
    server = NodeServer(sock, BlockStore(root, worker=worker), secret, identity, blocks)
    server.serve_in_thread()
    try:
        await stop.wait()
    finally:
        await in_thread(server.stop)
