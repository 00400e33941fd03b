"""The GC and pipeline metrics: a Prometheus collector over the census's last values.

`collect()` only reads `Census.last`, which the census refreshes in the background at most
once a minute: a scrape never reaches the database. Before the first refresh it yields
nothing; a shard that did not answer at the last refresh has no backlog samples (rather than
a zero that would read as "no garbage").
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shoal.admin.census import Census, Snapshot

OUTCOME_FIGURES = (
    ("found", "records_found"),
    ("reclaimed", "records_reclaimed"),
    ("failed", "records_failed"),
)


class CensusCollector(Collector):
    def __init__(self, census: Census) -> None:
        self.census = census

    def describe(self) -> Iterator[Metric]:
        """The metric families, without samples (registering never reads the census)."""
        return iter(_families())

    def collect(self) -> Iterator[Metric]:
        snapshot = self.census.last
        if snapshot is None:
            return iter(())
        return iter(_families(snapshot))


def _families(snapshot: Snapshot | None = None) -> list[Metric]:
    records = GaugeMetricFamily(
        "shoal_gc_backlog_records",
        "Deletion records waiting for GC (estimated past a size: see docs/operations.md)",
        labels=["shard"],
    )
    size = GaugeMetricFamily(
        "shoal_gc_backlog_bytes", "Bytes the waiting deletion records name", labels=["shard"]
    )
    oldest = GaugeMetricFamily(
        "shoal_gc_backlog_oldest_timestamp_seconds",
        "When the oldest waiting deletion happened (absent when nothing waits)",
        labels=["shard"],
    )
    windows = GaugeMetricFamily(
        "shoal_gc_deleted_windows", "Windows of the deleted tables", labels=["shard"]
    )
    last_records = GaugeMetricFamily(
        "shoal_gc_last_run_records", "Records of the last GC run, by outcome", labels=["outcome"]
    )
    last_duration = GaugeMetricFamily(
        "shoal_gc_last_run_duration_seconds", "How long the last GC run took"
    )
    last_end = GaugeMetricFamily(
        "shoal_gc_last_run_timestamp_seconds", "When the last GC run ended"
    )
    job_end = GaugeMetricFamily(
        "shoal_pipeline_last_run_timestamp_seconds",
        "When the job's last run ended",
        labels=["pipeline_job"],  # not `job`: Prometheus sets that label itself
    )
    job_duration = GaugeMetricFamily(
        "shoal_pipeline_last_run_duration_seconds",
        "How long the job's last run took",
        labels=["pipeline_job"],  # not `job`: Prometheus sets that label itself
    )
    job_success = GaugeMetricFamily(
        "shoal_pipeline_last_run_success",
        "1 if the job's last run ended ok, 0 if with problems or failed",
        labels=["pipeline_job"],  # not `job`: Prometheus sets that label itself
    )
    computed = GaugeMetricFamily(
        "shoal_census_timestamp_seconds", "When the GC and pipeline figures were last read"
    )
    families: list[Metric] = [
        records,
        size,
        oldest,
        windows,
        last_records,
        last_duration,
        last_end,
        job_end,
        job_duration,
        job_success,
        computed,
    ]
    if snapshot is None:
        return families

    computed.add_metric([], snapshot.computed_at.timestamp())
    for entry in snapshot.backlog:
        backlog = entry.backlog
        if backlog is None:
            continue
        records.add_metric([entry.shard], backlog.records)
        size.add_metric([entry.shard], backlog.bytes)
        windows.add_metric([entry.shard], backlog.windows)
        if backlog.oldest is not None:
            oldest.add_metric([entry.shard], backlog.oldest.timestamp())
    if snapshot.gc_runs:
        last = snapshot.gc_runs[0]
        for outcome, figure in OUTCOME_FIGURES:
            last_records.add_metric([outcome], getattr(last, figure))
        last_duration.add_metric([], (last.finished - last.started).total_seconds())
        last_end.add_metric([], last.finished.timestamp())
    for run in snapshot.last_pipeline_runs:
        if run.finished is None:
            continue
        job_end.add_metric([run.job], run.finished.timestamp())
        job_duration.add_metric([run.job], (run.finished - run.started).total_seconds())
        job_success.add_metric([run.job], 1.0 if run.outcome == "ok" else 0.0)
    return families
