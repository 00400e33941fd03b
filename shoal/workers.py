"""Worker processes: more than one Python process serving one listening socket.

A Python process runs its event loop on one core. Where a service's own CPU sets the pace
(the gateway's per-request work, a storage node's hashing and HTTP), extra processes serve
the same port. The parent binds the socket once (so a port in use is still an error, which
SO_REUSEPORT would hide) and each worker inherits it: the kernel hands a new connection to
whichever process accepts it first, which favours the idle ones.

Workers are spawned, not forked (the parent has an event loop and threads, which fork does
not copy), die with their parent (a `kill -9` included), and are restarted when they die
(when: shoal.restarts). They log as their parent does (shoal.logs).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import socket
import sys
from collections.abc import Callable, Coroutine
from multiprocessing.context import SpawnProcess
from typing import Any

import shoal.logs
import shoal.loop
from shoal import telemetry
from shoal.children import die_with_parent
from shoal.restarts import Restarts

log = logging.getLogger("shoal")

_CONTEXT = multiprocessing.get_context("spawn")
STOP_SECONDS = 20
# Connections the kernel queues for a listening socket before anyone accepts them. The
# default of servers (asyncio's 100) overflows in the second a worker is down under load,
# and a connection dropped there is retried by its client only after a second or more.
LISTEN_BACKLOG = 1024


def stop_on_signals() -> asyncio.Event:
    """An event the running loop sets on SIGINT or SIGTERM: how a service learns to stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    return stop


def listening_socket(host: str, port: int) -> socket.socket:
    """A service's one listening socket, shared by its processes (port 0: one the kernel
    picks, free by construction)."""
    return socket.create_server((host, port), backlog=LISTEN_BACKLOG)


def inherited_socket(fd: int) -> socket.socket:
    """The listening socket a process was started with, on file descriptor `fd`: its parent
    bound it, so no other process can take the port between its choice and the bind
    (LocalNodes). OSError if `fd` is not a listening TCP socket."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:  # not open (EBADF), or a file (ENOTSOCK)
        raise OSError(f"file descriptor {fd} is not an open socket") from None
    if sock.type != socket.SOCK_STREAM or not sock.getsockopt(
        socket.SOL_SOCKET, socket.SO_ACCEPTCONN
    ):
        sock.detach()  # not ours to close
        raise OSError(f"file descriptor {fd} is not a listening TCP socket")
    return sock


class WorkerProcesses:
    """`count` processes each running `target(worker, *args)` on its own event loop; the
    parent process is worker 0.

    `target` must be a module-level coroutine function (it is pickled by name) and `args`
    picklable;
    a socket in `args` reaches the worker as a duplicate of the parent's.
    """

    def __init__(
        self,
        name: str,
        count: int,
        target: Callable[..., Coroutine[Any, Any, None]],
        *args: Any,
    ) -> None:
        self.name = name
        self.target = target
        self.args = args
        self.processes: list[SpawnProcess | None] = [None] * count
        self.schedules = [Restarts() for _ in range(count)]
        self.restarts = 0  # workers started again after they exited

    def start(self) -> None:
        for index in range(len(self.processes)):
            self._start(index)

    def restart_dead(self) -> None:
        """Start again any worker that died, now or after its back-off (the others keep
        serving meanwhile). Called every second or so by the parent's loop."""
        for index, (process, schedule) in enumerate(
            zip(self.processes, self.schedules, strict=True)
        ):
            if process is None:
                continue
            if not schedule.waiting:
                if process.is_alive():
                    continue
                lived, pause = schedule.exited()
                log.error(
                    "%s worker %d exited with %s after %.0f s; restarting it in %.0f s",
                    self.name,
                    index + 1,
                    process.exitcode,
                    lived,
                    pause,
                )
                assert process.pid is not None  # it was started
                telemetry.forget_process(process.pid)  # its requests in flight are gone
            if schedule.due():
                self._start(index)
                self.restarts += 1

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
        # Worker numbers start at 1: the parent process is worker 0.
        process = _CONTEXT.Process(
            target=_worker_main,
            args=(os.getpid(), shoal.logs.current_format(), self.target, index + 1, *self.args),
            name=f"{self.name}-worker-{index + 1}",
        )
        process.start()
        self.processes[index] = process
        self.schedules[index].started()


def _worker_main(
    parent: int,
    log_format: str,
    target: Callable[..., Coroutine[Any, Any, None]],
    worker: int,
    *args: Any,
) -> None:
    die_with_parent(parent, signal.SIGKILL)
    shoal.logs.configure(log_format)
    try:
        shoal.loop.run(target(worker, *args))
    except Exception:  # logged in the process's format, not printed by multiprocessing
        log.exception("worker %d failed", worker)
        sys.exit(1)
