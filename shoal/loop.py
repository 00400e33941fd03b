"""The one way Shoal runs an event loop: uvloop, asyncio's loop on libuv.

Measured on the metadata path (one caller putting objects in a loop, bench/RESULTS.md): 0.45 ms
a put on uvloop against 0.61 ms on asyncio's default loop, the same statement and database.
Every process of Shoal that serves or calls over the network runs its loop through here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on a uvloop loop."""
    return uvloop.run(coroutine)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop for code that drives one by hand (test fixtures, Spark executors)."""
    return uvloop.new_event_loop()
