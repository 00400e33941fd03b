"""A connection's socket watched by the event loop for as long as a batcher holds the
connection: one registration for all its waits, instead of one per wait.

Why: psycopg's own wait registers the socket with the event loop, sleeps until the server's
answer arrives, and removes the socket again. Under uvloop that is eight system calls a wait
(a check of the descriptor, a switch to non-blocking mode, the registration, its removal),
and a statement sent alone waits once. With the pool's checkout and the sender task, that
was about a third of a lone point read's CPU, and an eighth of a HEAD's in the gateway
(docs/decisions.md, "A batcher keeps its connection"; `bench/cpu_split.py head
--concurrency 1`).

What psycopg's wait does that this one does not: a timeout (no batch has one), and, when its
task is cancelled, a cancel request to the server and a drain of the answer. A batcher closes
a connection whose batch was interrupted instead, so nothing is left to drain.

What it does as psycopg's wait does: it does not trust the event loop alone. On a socket in
error (the server ended the backend while a batch it had not read was in its buffer), uvloop
reports readiness once and then drops the registration, where a level-triggered loop would
report it for as long as it lasts; a wait that missed that one report would sleep for ever.
So a wait that nothing woke for CHECK_SECONDS asks the socket itself (a zero-timeout poll),
and registers it again if it is ready (tests/integration/test_batched_reads.py has the case;
tests/fault/test_metadata_restarts.py the restarts that show it).
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg.abc import PQGen
from psycopg.waiting import Ready, Wait

from shoal.loop import TIMER_SLACK_SECONDS

RV = TypeVar("RV")

# How long a wait trusts the event loop before it asks the socket itself (psycopg's own wait
# wakes as often).
CHECK_SECONDS = 0.1


class SocketWatch:
    """The readiness of one connection's socket, from `__init__` until `stop`.

    The socket readable while nobody waits means the server spoke unasked: it is ending the
    backend (a shutdown, pg_terminate_backend) or the connection broke. The registration is
    level-triggered, so it would wake the event loop on every turn from then on: the watch
    stops at once and calls `unasked`, and the holder lets the connection go.
    """

    def __init__(self, conn: psycopg.AsyncConnection[Any], unasked: Callable[[], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._fileno = conn.pgconn.socket
        self._unasked = unasked
        self._woken: asyncio.Future[None] | None = None
        self._wanted = 0
        self._ready = 0
        # One timer for the checks of every wait: at its turn it looks at how long the wait
        # then in progress has lasted. A timer made and cancelled per wait cost about 4 us,
        # and a lone read waits once (docs/decisions.md, "Small cuts per request").
        self._waiting_since = 0.0
        self._check_timer: asyncio.TimerHandle | None = None
        self._loop.add_reader(self._fileno, self._on_ready, Ready.R)
        self.watching = True

    def stop(self) -> None:
        """No more watching; before the connection goes back to its pool or is closed."""
        if self.watching:
            self.watching = False
            self._loop.remove_reader(self._fileno)

    async def wait(self, gen: PQGen[RV]) -> RV:
        """Run `gen`, a psycopg generator working on this connection, to its end: what
        psycopg's AsyncConnection.wait does, on the watched socket."""
        try:
            state = next(gen)
            while True:
                state = gen.send(await self._ready_for(state))
        except StopIteration as done:
            # A generator's return value arrives untyped, on StopIteration.
            return done.value  # type: ignore[no-any-return]
        except OSError as exc:  # what psycopg's wait makes of it too
            raise psycopg.OperationalError("connection socket closed") from exc

    async def _ready_for(self, wanted: Wait) -> int:
        if not self.watching:  # it spoke unasked, or its holder let it go
            raise psycopg.OperationalError("the connection's socket is no longer watched")
        self._wanted, self._ready = wanted, 0
        self._woken = self._loop.create_future()
        self._waiting_since = self._loop.time()
        writing = bool(wanted & Wait.W)
        if writing:  # only while a large batch fills the socket's buffer
            self._loop.add_writer(self._fileno, self._on_ready, Ready.W)
        if self._check_timer is None:
            self._check_later(CHECK_SECONDS)
        try:
            await self._woken
        finally:
            self._woken = None
            if writing:
                self._loop.remove_writer(self._fileno)
        return self._ready

    def _check_later(self, seconds: float) -> None:
        self._check_timer = self._loop.call_later(seconds, self._check)

    def _check(self) -> None:
        """The timer's turn. A wait that nothing woke for CHECK_SECONDS: is the socket ready
        all the same? A younger wait is looked at again when it is that old; with no wait in
        progress, the next wait sets the timer again."""
        self._check_timer = None
        woken = self._woken
        if woken is None or woken.done():
            return
        younger_by = self._waiting_since + CHECK_SECONDS - self._loop.time()
        if younger_by > TIMER_SLACK_SECONDS:
            self._check_later(younger_by)
            return
        try:
            ready = _ready_now(self._fileno, self._wanted)
            if ready:  # the loop's registration was lost: make it again
                self._loop.remove_reader(self._fileno)
                self._loop.add_reader(self._fileno, self._on_ready, Ready.R)
        except (OSError, RuntimeError) as exc:
            woken.set_exception(psycopg.OperationalError(f"connection socket unusable: {exc}"))
            return
        if ready:
            self._on_ready(Ready(ready))
        if not woken.done():
            self._check_later(CHECK_SECONDS)

    def _on_ready(self, ready: Ready) -> None:
        woken = self._woken
        if woken is None:
            if ready == Ready.R:
                self.stop()
                self._unasked()
            return
        self._ready |= ready
        if self._ready & self._wanted and not woken.done():
            woken.set_result(None)


def _ready_now(fileno: int, wanted: int) -> int:
    """What the socket is ready for at this moment, of what `wanted` asks (an error or a
    hang-up counts as readable: reading it is what tells the caller)."""
    poller = select.poll()
    asked = (select.POLLIN if wanted & Wait.R else 0) | (select.POLLOUT if wanted & Wait.W else 0)
    poller.register(fileno, asked)
    events = sum(event for _, event in poller.poll(0))
    if events & select.POLLNVAL:
        raise OSError(f"descriptor {fileno} is not open")
    ready = 0
    if wanted & Wait.R and events & (select.POLLIN | select.POLLERR | select.POLLHUP):
        ready |= Ready.R
    if wanted & Wait.W and events & (select.POLLOUT | select.POLLERR | select.POLLHUP):
        ready |= Ready.W
    return ready
