"""What every job gets: the Spark session, the shards and ring, the registry, the output."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from shoal.config import Config, ShardConfig
from shoal.metadata import MetadataStore
from shoal.metadata.nodes import DEAD
from shoal.metadata.ring import Ring
from shoal.pipeline.progress import Progress

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

T = TypeVar("T")


@dataclass
class JobContext:
    spark: SparkSession
    config: Config
    shards: list[ShardConfig]
    ring: Ring
    output: Path  # this run's folder of Parquet output
    options: dict[str, Any] = field(default_factory=dict)
    started: datetime = field(default_factory=lambda: datetime.now(UTC))
    # The job's phases, reported while it runs (progress.py).
    progress: Progress = field(default_factory=lambda: Progress("job"))

    @property
    def dsns(self) -> dict[str, str]:
        return {s.name: s.dsn for s in self.shards}

    def node_urls(self) -> dict[str, str]:
        """Where each storage node answers, live or not (its blocks may still be there); a
        node marked dead is left out, as nothing is asked of it any more."""

        async def read(store: MetadataStore) -> dict[str, str]:
            nodes = await store.nodes.list(timedelta(days=3650))
            states = await store.nodes.states()
            return {n.shark: n.url for n in nodes if states.get(n.name) != DEAD}

        return self.with_store(read)

    def with_store(
        self, action: Callable[[MetadataStore], Awaitable[T]], connections: int = 4
    ) -> T:
        """Run `action(store)` with a metadata store, from the driver, with up to
        `connections` connections per shard: as many as `action` uses at once (a call that
        waits too long for one fails)."""

        async def run() -> T:
            async with await MetadataStore.open(self.shards, connections) as store:
                return await action(store)

        return asyncio.run(run())


@dataclass
class Summary:
    """What a job did: rows for the summary table, and the same as JSON for machines.

    `problems` are what the job had to leave undone, one line each (a bucket skipped, say);
    `shoal pipeline` prints them and then exits 1, as `shoal gc run` does for kept records.
    """

    job: str
    figures: dict[str, Any]
    output: Path
    problems: list[str] = field(default_factory=list)

    def table(self) -> str:
        width = max(len(k) for k in self.figures) if self.figures else 0
        lines = [f"shoal pipeline {self.job}"]
        lines += [
            f"  {k:<{width}}  {v:>,}" if isinstance(v, int) else f"  {k:<{width}}  {v}"
            for k, v in self.figures.items()
        ]
        lines.append(f"  {'output':<{width}}  {self.output}")
        lines += [f"  problem: {problem}" for problem in self.problems]
        return "\n".join(lines)
