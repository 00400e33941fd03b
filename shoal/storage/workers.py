"""A storage node's worker processes: more than one Python process serving one disk.

A node spends 2-3 ms of CPU per MiB written on HTTP, hashing, its event loop and hand-offs
to threads besides what the disk work itself costs, and a process runs its event loop on one
core: with several writers in flight the node's CPU, not the disk, can set the pace.
Workers are extra processes that run the same HTTP service on the node's listening socket,
bound once by the node process (so a port in use is still an error, which SO_REUSEPORT would
hide) and inherited: the kernel hands each new connection to whichever process accepts it
first, which favours the idle ones.

What the processes share: the disk (each has its own tmp/ folder, see BlockStore) and the
block count (in shared memory, server.BlockCount). A worker dies with its node process, a
`kill -9` included.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.context import SpawnProcess
from pathlib import Path

from aiohttp import web

import shoal.loop
from shoal.children import die_with_parent
from shoal.storage.blockfile import BlockStore
from shoal.storage.server import BlockCount, NodeIdentity, make_app

log = logging.getLogger("shoal.storage")

# Spawned, not forked: the node process has an event loop and threads, which fork does not copy.
_CONTEXT = multiprocessing.get_context("spawn")
STOP_SECONDS = 20
DISK_THREADS = 32


def listening_socket(host: str, port: int) -> socket.socket:
    """The node's one listening socket, shared by its processes."""
    return socket.create_server((host, port), backlog=1024)


async def serve(app: web.Application, sock: socket.socket) -> web.AppRunner:
    """Serve `app` on `sock` in this process; the caller cleans the runner up."""
    # A write in flight keeps two threads busy (one writing and fsyncing, one hashing); the
    # default pool, cores + 4 threads, would queue hashes behind other requests' fsyncs.
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(DISK_THREADS, thread_name_prefix="disk")
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    return runner


class Workers:
    """The node's worker processes (the node process itself serves too)."""

    def __init__(
        self,
        count: int,
        root: Path,
        secret: bytes,
        identity: NodeIdentity,
        blocks: BlockCount,
        sock: socket.socket,
    ) -> None:
        self.args = (root, secret, identity, blocks, sock, os.getpid())
        self.processes: list[SpawnProcess | None] = [None] * count

    def start(self) -> None:
        for index in range(len(self.processes)):
            self._start(index)

    def restart_dead(self) -> None:
        """Start again any worker that died (the node keeps serving on the others meanwhile)."""
        for index, process in enumerate(self.processes):
            if process is not None and not process.is_alive():
                log.error(
                    "storage worker %d exited with %s; restarting it", index + 1, process.exitcode
                )
                self._start(index)

    def stop(self) -> None:
        running = [p for p in self.processes if p is not None and p.is_alive()]
        for process in running:
            process.terminate()
        for process in running:
            process.join(STOP_SECONDS)
            if process.is_alive():
                process.kill()
                process.join()

    def _start(self, index: int) -> None:
        # Worker numbers start at 1: the node process is worker 0.
        process = _CONTEXT.Process(
            target=_worker_main, args=(index + 1, *self.args), name=f"storage-worker-{index + 1}"
        )
        process.start()
        self.processes[index] = process


def _worker_main(
    worker: int,
    root: Path,
    secret: bytes,
    identity: NodeIdentity,
    blocks: BlockCount,
    sock: socket.socket,
    parent: int,
) -> None:
    die_with_parent(parent, signal.SIGKILL)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    shoal.loop.run(_serve_until_stopped(worker, root, secret, identity, blocks, sock))


async def _serve_until_stopped(
    worker: int,
    root: Path,
    secret: bytes,
    identity: NodeIdentity,
    blocks: BlockCount,
    sock: socket.socket,
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    blocks.slot = worker
    store = BlockStore(root, worker=worker)
    runner = await serve(make_app(store, secret, identity, blocks), sock)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
