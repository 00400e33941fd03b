"""Metrics: Prometheus counters, gauges and histograms, summed over a service's processes.

A gateway or a storage node serves one port from several processes (shoal/workers.py), and
a scrape reaches only the one that runs the admin listener. prometheus_client's
multiprocess mode keeps each process's values in memory-mapped files in one folder, and the
listener sums the files of every process when it is scraped.

That mode is chosen per process, when a metric is made: `share_between_processes` must run
in a service's first process before any metric exists, and the processes it starts inherit
the folder through the environment. So Shoal makes its metrics lazily, at first use (each
component's `metrics()` accessor), never at import time.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import glob
import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    values,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import REGISTRY, Collector

from shoal.keyfiles import fresh_private_folder
from shoal.loop import in_background

log = logging.getLogger("shoal")

# prometheus_client's name for the folder; the processes a service starts inherit it.
FOLDER_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"

# Latency buckets from half a millisecond (a HEAD served from a warm pool) to a minute (a
# large object over a slow link).
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


def folder_for(root: Path, service: str) -> Path:
    """Where the processes of the `service` working on `root` (a data directory, a node's
    folder) keep their metrics: in the temporary folder (TMPDIR), under a name of their own
    that a restart empties again.

    Not beside the data: the metrics are memory-mapped files written on every request, and a
    process that writes a mapped page its file system cannot take (a full disk) is killed
    (SIGBUS); and a file system with such files open for writing cannot be remounted
    read-only by hand.
    """
    digest = hashlib.sha256(str(root.absolute()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"shoal-{service}-metrics-{os.getuid()}-{digest}"


def share_between_processes(folder: Path) -> Path:
    """In a service's first process, before any metric is made: keep this process's metrics,
    and those of every process it starts from now on, in `folder`, emptied first (what a
    previous run left there would be counted again); or, where another user took that name
    first, in a new folder beside it. Returns the folder used."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder = fresh_private_folder(folder)
    os.environ[FOLDER_VARIABLE] = str(folder)
    # prometheus_client chose its value class when it was imported; choose it again.
    values.ValueClass = values.MultiProcessValue()
    return folder


@contextlib.contextmanager
def sharing(folder: Path) -> Iterator[None]:
    """share_between_processes(folder) for the duration of the block, the folder removed at
    its end (a service killed outright leaves it to its next start, which empties it)."""
    used = share_between_processes(folder)
    try:
        yield
    finally:
        shutil.rmtree(used, ignore_errors=True)


def shared() -> bool:
    """Whether this process keeps its metrics in a shared folder."""
    return FOLDER_VARIABLE in os.environ


def forget_process(pid: int) -> None:
    """After a worker process died: its live gauges (requests in flight) stop counting."""
    if shared():
        mark_process_dead(pid)


def exposition(extra: Iterable[Collector] = ()) -> tuple[bytes, str]:
    """The text a scrape gets: every process's metrics and those `extra` collectors make
    when asked, and its content type."""
    registry = _everyones()
    for collector in extra:
        registry.register(collector)
    return generate_latest(registry), CONTENT_TYPE_LATEST


def families() -> list[Metric]:
    """Every process's metrics, summed as a scrape sees them, for a reader in this process
    (admin/rates.py)."""
    return list(_everyones().collect())


def _everyones() -> CollectorRegistry:
    registry = CollectorRegistry()
    if shared():
        _SharedFiles(registry)
    else:  # one process (tests, a tool): its own registry
        registry.register(_Everything())
    return registry


_ready: Gauge | None = None


def set_ready(ready: bool) -> None:
    """`shoal_ready`: 1 while this process can do its work, 0 when not. A service's value is
    the smallest of its live processes' (livemin): 1 only when every one of them is ready."""
    global _ready
    if _ready is None:
        _ready = Gauge(
            "shoal_ready",
            "1 when every live process of the service is ready, else 0.",
            multiprocess_mode="livemin",
        )
    _ready.set(1 if ready else 0)


# How often the counts of the request path reach the shared files (`Tallies`).
FLUSH_SECONDS = 1.0


class CounterTally:
    """Increments of one (labelled) counter, kept in a plain number until `flush`: in
    multiprocess mode every increment takes a lock and writes a memory-mapped file, about a
    microsecond, which the request path pays several times per request
    (bench/metrics_bench.py)."""

    __slots__ = ("counter", "pending")

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        self.pending = 0.0

    def inc(self, amount: float = 1) -> None:
        self.pending += amount

    def flush(self) -> None:
        if self.pending:
            amount, self.pending = self.pending, 0.0
            self.counter.inc(amount)


class HistogramTally:
    """Observations of one (labelled) histogram, kept as plain bucket counts and a sum until
    `flush`, which adds them to the histogram's values as `observe` would have one by one.
    prometheus_client has no public call that adds many observations at once, so this uses
    the histogram's own attributes (`_upper_bounds`, `_buckets`, `_sum`);
    tests/e2e/test_metrics.py checks the counts and sums a scrape shows."""

    __slots__ = ("bounds", "counts", "histogram", "total")

    def __init__(self, histogram: Histogram) -> None:
        self.histogram = histogram
        self.bounds: list[float] = histogram._upper_bounds  # ends with +Inf
        self.counts = [0] * len(self.bounds)
        self.total = 0.0

    def observe(self, amount: float) -> None:
        # The first bucket whose bound is at least `amount`, as Histogram.observe finds it.
        self.counts[bisect.bisect_left(self.bounds, amount)] += 1
        self.total += amount

    def flush(self) -> None:
        if not any(self.counts):
            return
        counts, self.counts = self.counts, [0] * len(self.bounds)
        total, self.total = self.total, 0.0
        self.histogram._sum.inc(total)
        for index, count in enumerate(counts):
            if count:
                self.histogram._buckets[index].inc(count)


class Tallies:
    """A process's tallies, written to the shared files every FLUSH_SECONDS (`flushing`)."""

    def __init__(self) -> None:
        self.tallies: list[CounterTally | HistogramTally] = []
        self.before_flush: list[Callable[[], None]] = []  # gauges set from plain numbers

    def counter(self, counter: Counter) -> CounterTally:
        tally = CounterTally(counter)
        self.tallies.append(tally)
        return tally

    def histogram(self, histogram: Histogram) -> HistogramTally:
        tally = HistogramTally(histogram)
        self.tallies.append(tally)
        return tally

    def flush(self) -> None:
        for update in self.before_flush:
            update()
        for tally in self.tallies:
            tally.flush()


_tallies = Tallies()


def tallies() -> Tallies:
    """This process's tallies: the metrics of the request path register theirs here."""
    return _tallies


@contextlib.asynccontextmanager
async def flushing(seconds: float = FLUSH_SECONDS) -> AsyncIterator[None]:
    """Write this process's tallies to its metrics every `seconds` while the context lasts,
    and once more at its end."""

    async def flush_forever() -> None:
        while True:
            await asyncio.sleep(seconds)
            _flush()

    try:
        async with in_background(flush_forever()):
            yield
    finally:
        _flush()


def _flush() -> None:
    try:
        _tallies.flush()
    except Exception as exc:  # a metric must never stop the process
        log.warning("writing the metrics failed: %r", exc)


class _SharedFiles(MultiProcessCollector):
    """prometheus_client's collector of the folder's files, but for a file a process is
    creating at that moment (empty until sized; reading it failed the whole scrape, which a
    worker restarted while Prometheus scrapes would meet)."""

    def collect(self) -> Iterable[Metric]:
        files = []
        for path in glob.glob(os.path.join(self._path, "*.db")):
            with contextlib.suppress(FileNotFoundError):  # a dead process's, just removed
                if os.path.getsize(path) > 0:
                    files.append(path)
        return self.merge(files, accumulate=True)


class _Everything(Collector):
    """The process's default registry, as one collector of another registry."""

    def collect(self) -> Iterable[Metric]:
        return REGISTRY.collect()
