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

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Gauge,
    generate_latest,
    values,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import REGISTRY, Collector

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


def share_between_processes(folder: Path) -> None:
    """In a service's first process, before any metric is made: keep this process's metrics,
    and those of every process it starts from now on, in `folder`, emptied first (what a
    previous run left there would be counted again)."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(mode=0o700, parents=True)
    os.environ[FOLDER_VARIABLE] = str(folder)
    # prometheus_client chose its value class when it was imported; choose it again.
    values.ValueClass = values.MultiProcessValue()


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
        MultiProcessCollector(registry)
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


class _Everything(Collector):
    """The process's default registry, as one collector of another registry."""

    def collect(self):  # type: ignore[no-untyped-def]  # prometheus_client's own signature
        return REGISTRY.collect()
