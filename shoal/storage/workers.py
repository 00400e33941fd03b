"""A storage node's worker processes: more than one Python process serving one disk.

A node's threads share one interpreter lock: the disk work and the socket copies run without
it, but parsing requests and hashing blocks take it. With many writers in flight on a machine
with cores to spare, workers (shoal.workers) are extra processes that run the same service
on the node's socket.

What the processes share: the disk (each has its own tmp/ folder, see BlockStore), the block
count (in shared memory, server.BlockCount) and the tokens already accepted (in shared memory,
auth.ReplayCache), so that a token one process answered is refused by the others.
"""

from __future__ import annotations

import socket
from collections.abc import Collection
from pathlib import Path

from shoal.storage.auth import ReplayCache
from shoal.storage.blockfile import BlockStore, in_thread
from shoal.storage.server import BlockCount, NodeIdentity, NodeServer
from shoal.storage.tls import ServerFiles
from shoal.workers import WorkerProcesses, stop_on_signals


def node_workers(
    count: int,
    root: Path,
    direct_writes: bool,
    secret: bytes,
    identity: NodeIdentity,
    blocks: BlockCount,
    sock: socket.socket,
    *,
    replays: ReplayCache,
    addresses: Collection[str] = (),
    tls: ServerFiles | None = None,
) -> WorkerProcesses:
    """`count` extra processes serving the node's socket (the node process serves too),
    sharing the node process's `replays`, writing blocks as it does (`direct_writes`)."""
    access = (tuple(addresses), replays, tls)
    return WorkerProcesses(
        "storage",
        count,
        _serve_until_stopped,
        root,
        direct_writes,
        secret,
        identity,
        blocks,
        sock,
        access,
    )


async def _serve_until_stopped(
    worker: int,
    root: Path,
    direct_writes: bool,
    secret: bytes,
    identity: NodeIdentity,
    blocks: BlockCount,
    sock: socket.socket,
    access: tuple[tuple[str, ...], ReplayCache, ServerFiles | None],
) -> None:
    stop = stop_on_signals()
    blocks.slot = worker
    addresses, replays, tls = access
    store = BlockStore(root, worker=worker, direct_writes=direct_writes)
    server = NodeServer(
        sock, store, secret, identity, blocks, addresses=addresses, replays=replays, tls=tls
    )
    server.serve_in_thread()
    try:
        await stop.wait()
    finally:
        await in_thread(server.stop)
