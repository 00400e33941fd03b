"""The gateway's request rates for the admin API (`GET /admin/v1/requests`).

The serve process reads the gateway's own counter, `shoal_s3_requests_total` summed over its
worker processes (telemetry.families: the files a scrape reads, read in process), every few
seconds, and keeps the samples of the last minute. A rate is what the counter grew between
the oldest sample of that window and one taken when asked, over the seconds between them:
no Prometheus server is needed to see what the gateway is doing now.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from shoal import telemetry
from shoal.admin.app import json_answer
from shoal.loop import in_background

log = logging.getLogger("shoal")

REQUESTS_COUNTER = "shoal_s3_requests_total"
WINDOW_SECONDS = 60.0
SAMPLE_SECONDS = 5.0
# A sample younger than this is fresh enough for an answer.
FRESH_SECONDS = 1.0


@dataclass(frozen=True)
class Counted:
    """What the counter said at one moment: requests by operation, and 5xx answers."""

    by_operation: dict[str, float]
    errors: float


def counted_requests() -> Counted:
    """The gateway's request counter now, summed over its processes."""
    by_operation: dict[str, float] = {}
    errors = 0.0
    for family in telemetry.families():
        for sample in family.samples:
            if sample.name != REQUESTS_COUNTER:
                continue
            operation = sample.labels.get("operation", "Unknown")
            by_operation[operation] = by_operation.get(operation, 0.0) + sample.value
            if sample.labels.get("status_class") == "5xx":
                errors += sample.value
    return Counted(by_operation, errors)


@dataclass(frozen=True)
class _Sample:
    at: float  # time.monotonic()
    counted: Counted


class RequestRates:
    """Samples of the request counter over the last `window` seconds, and rates from them."""

    def __init__(
        self,
        window: float = WINDOW_SECONDS,
        every: float = SAMPLE_SECONDS,
        read: Callable[[], Counted] = counted_requests,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window = window
        self.every = every
        self._read = read
        self._clock = clock
        self._samples: deque[_Sample] = deque()

    def sample(self) -> None:
        now = self._clock()
        self._samples.append(_Sample(now, self._read()))
        # Keep one sample at or before the window's start, so that a rate covers all of it.
        while len(self._samples) > 1 and self._samples[1].at <= now - self.window:
            self._samples.popleft()

    def rates(self) -> dict[str, Any]:
        """The admin API's answer: requests and 5xx errors a second, in all and by
        operation, over the window (or what of it has been sampled since the start)."""
        if not self._samples or self._clock() - self._samples[-1].at >= FRESH_SECONDS:
            self.sample()
        first, last = self._samples[0], self._samples[-1]
        seconds = last.at - first.at
        if seconds <= 0:
            return {
                "window_seconds": 0.0,
                "requests_per_second": 0.0,
                "errors_per_second": 0.0,
                "by_operation": [],
            }

        def rate(before: float, after: float) -> float:
            # A counter only grows; a drop (nothing here resets it) counts as none.
            return round(max(0.0, after - before) / seconds, 3)

        was = first.counted.by_operation
        per_operation = {
            operation: rate(was.get(operation, 0.0), now)
            for operation, now in last.counted.by_operation.items()
        }
        busy = [operation for operation, per_second in per_operation.items() if per_second > 0]
        busy.sort(key=lambda operation: (-per_operation[operation], operation))
        by_operation = [
            {"operation": operation, "requests_per_second": per_operation[operation]}
            for operation in busy
        ]
        return {
            "window_seconds": round(seconds, 1),
            "requests_per_second": rate(
                sum(first.counted.by_operation.values()), sum(last.counted.by_operation.values())
            ),
            "errors_per_second": rate(first.counted.errors, last.counted.errors),
            "by_operation": by_operation,
        }

    @contextlib.asynccontextmanager
    async def sampling(self) -> AsyncIterator[RequestRates]:
        """Sample now, then every `every` seconds while the context lasts."""
        async with in_background(self._sample_forever()):
            yield self

    async def _sample_forever(self) -> None:
        while True:
            try:
                self.sample()
            except Exception as exc:  # the rates must never stop the serve
                log.warning("sampling the request counter failed: %r", exc)
            await asyncio.sleep(self.every)


def rates_routes(rates: RequestRates) -> web.RouteTableDef:
    """`GET /admin/v1/requests` (the admin token is checked by the admin app)."""
    routes = web.RouteTableDef()

    @routes.get("/admin/v1/requests")
    async def requests(request: web.Request) -> web.Response:
        return json_answer(rates.rates())

    return routes
