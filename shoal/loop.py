"""The one way Shoal runs an event loop: uvloop, asyncio's loop on libuv.

Measured on the metadata path (one caller putting objects in a loop): a put takes about a
quarter less time on uvloop than on asyncio's default loop, the same statement and database
(docs/decisions.md, "uvloop"; `bench/metadata_bench.py`, put at one caller).
Every process of Shoal that serves or calls over the network runs its loop through here.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")

# A timer may fire this much before its time: uvloop's timers count whole milliseconds. A
# callback that checks a deadline on its timer's turn counts the deadline reached within it.
TIMER_SLACK_SECONDS = 0.001

# Net new container objects between young collections (CPython 3.11: 700). A page of
# 1000 listed keys makes a few thousand at once.
YOUNG_COLLECTION_THRESHOLD = 10_000


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on a uvloop loop."""
    return uvloop.run(coroutine)


@contextlib.asynccontextmanager
async def in_background(work: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    """Run `work` as a task while the block runs; at its end the task is cancelled, and
    waited for."""
    task = asyncio.create_task(work)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop for code that drives one by hand (test fixtures, Spark executors)."""
    return uvloop.new_event_loop()


def settle_heap() -> None:
    """After a server process has started: keep the cyclic garbage collector off what startup
    built, and let it run less often.

    A listing page holds a few thousand rows and entries at once. At CPython's default
    threshold each page set off several young collections, and each moved the page's live
    rows a generation up, toward the collections that walk everything startup allocated.
    Measured with bench/gateway_instructions.py list: 14.15 million instructions a page,
    13.18 million with this, 12.84 million with no collection at all.
    """
    gc.collect()
    gc.freeze()  # what exists now is never collected again, so it is not walked either
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, old)
