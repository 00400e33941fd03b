"""A storage node's worker processes: more than one Python process serving one disk.

A node spends ~1 ms of CPU per MiB written on HTTP, its event loop and hand-offs to
threads besides what the disk work itself costs (bench/storage_bench.py), and a process runs
its event loop on one core: with several writers in flight the node's CPU, not the disk, can
set the pace. Workers (shoal.workers) are extra processes that run the same HTTP service on
the node's socket.

What the processes share: the disk (each has its own tmp/ folder, see BlockStore) and the
block count (in shared memory, server.BlockCount).
"""

from __future__ import annotations

import asyncio
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aiohttp import web

import shoal.loop
from shoal.storage.blockfile import BlockStore
from shoal.storage.server import BlockCount, NodeIdentity, make_app
from shoal.workers import WorkerProcesses, stop_on_signals

DISK_THREADS = 32


async def serve(app: web.Application, sock: socket.socket) -> web.AppRunner:
    """Serve `app` on `sock` in this process; the caller cleans the runner up."""
    # A thread is busy for a block's whole write and fsyncs; the default pool, cores + 4
    # threads, would queue short reads behind other requests' fsyncs.
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(DISK_THREADS, thread_name_prefix="disk")
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    return runner


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
    store = BlockStore(root, worker=worker)
    runner = await serve(make_app(store, secret, identity, blocks), sock)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
