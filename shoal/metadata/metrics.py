"""The metadata tier's Prometheus metrics: each shard's connection pool, the sizes of
batched reads and group-committed writes, and the latency of statements by name
(docs/operations.md, "Metrics").

Made at first use (telemetry.py says why never at import). Statement latencies and batch
sizes are kept in plain numbers (telemetry.Tallies) and written with the pools' sample,
every second, by the gateway process's `telemetry.flushing` task. In a process that opened a
store without `shoal serve` (a test, a CLI command) nothing writes them, and they stay in
that process's own registry, where nobody reads them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import Gauge, Histogram

from shoal import telemetry
from shoal.metadata import queries

if TYPE_CHECKING:
    from shoal.metadata.shards import ShardSet

BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
READ = "read"
WRITE = "write"
# The name of a statement made from none of queries.py's (a shard_rows call that names none).
OTHER_STATEMENT = "other"


@dataclass
class MetadataMetrics:
    connections: Gauge
    waiting: Gauge
    commits_hung: Gauge
    batch_size: Histogram
    statement_duration: Histogram
    _statements: dict[str, telemetry.HistogramTally] = field(default_factory=dict)
    _batches: dict[str, telemetry.HistogramTally] = field(default_factory=dict)

    @classmethod
    def make(cls) -> MetadataMetrics:
        return cls(
            connections=Gauge(
                "shoal_metadata_pool_connections",
                "Connections of a shard's pool: size (all), busy (lent out), idle.",
                ["shard", "state"],
                multiprocess_mode="livesum",
            ),
            waiting=Gauge(
                "shoal_metadata_pool_waiting",
                "Calls waiting for a connection of a shard's pool.",
                ["shard"],
                multiprocess_mode="livesum",
            ),
            commits_hung=Gauge(
                "shoal_metadata_commits_hung",
                "1 while a shard's commits hang, as a gateway's commit probe finds: its writes "
                "are refused, its reads go on.",
                ["shard"],
                multiprocess_mode="livemax",
            ),
            batch_size=Histogram(
                "shoal_metadata_batch_size",
                "Statements per batch: batched point reads (read), group commits (write).",
                ["kind"],
                buckets=BATCH_SIZE_BUCKETS,
            ),
            statement_duration=Histogram(
                "shoal_metadata_statement_duration_seconds",
                "Time a call waits for a statement's rows, its batch and commit included.",
                ["statement"],
                buckets=telemetry.LATENCY_BUCKETS,
            ),
        )

    def statement_took(self, template: str, seconds: float) -> None:
        """One statement of queries.py (its template, as base.py runs it) took `seconds`."""
        tally = self._statements.get(template)
        if tally is None:
            child = self.statement_duration.labels(statement_name(template))
            tally = self._statements[template] = telemetry.tallies().histogram(child)
        tally.observe(seconds)

    def batch_sent(self, kind: str, size: int) -> None:
        tally = self._batches.get(kind)
        if tally is None:
            tally = telemetry.tallies().histogram(self.batch_size.labels(kind))
            self._batches[kind] = tally
        tally.observe(size)

    def sample_pools(self, shards: ShardSet) -> None:
        for name, shard in shards.shards.items():
            stats = shard.pool.get_stats()
            size, idle = stats.get("pool_size", 0), stats.get("pool_available", 0)
            self.connections.labels(name, "size").set(size)
            self.connections.labels(name, "idle").set(idle)
            self.connections.labels(name, "busy").set(max(0, size - idle))
            self.waiting.labels(name).set(stats.get("requests_waiting", 0))
            self.commits_hung.labels(name).set(shard.pool.commits_hang_since is not None)


_metrics: MetadataMetrics | None = None
_names: dict[str, str] | None = None


def metadata() -> MetadataMetrics:
    """This process's metadata metrics, made on first use."""
    global _metrics
    if _metrics is None:
        _metrics = MetadataMetrics.make()
    return _metrics


def statement_name(template: str) -> str:
    """A statement's label: its name in queries.py, in lower case (select_object,
    put_object, list_objects_merge, ...), a bounded set."""
    global _names
    if _names is None:
        _names = {
            text: name.lower()
            for name, text in vars(queries).items()
            if name.isupper() and isinstance(text, str)
        }
    return _names.get(template, OTHER_STATEMENT)


@contextlib.asynccontextmanager
async def sampling_pools(shards: ShardSet) -> AsyncIterator[None]:
    """Sample the pools of `shards` each time the process's metrics are written (every
    second, telemetry.flushing) while the context lasts."""
    tallies = telemetry.tallies()

    def sample() -> None:
        metadata().sample_pools(shards)

    tallies.before_flush.append(sample)
    try:
        yield
    finally:
        tallies.before_flush.remove(sample)
