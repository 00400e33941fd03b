"""The history of the Spark pipeline's runs: one row per run, whatever its outcome.

`run_job` records each run when it ends: `ok`, `problems` (the job finished but left
something undone, listed one line each) or `failed` (it raised; `error` is the first line).
`shoal pipeline history`, `shoal status` and the admin API read it back, newest first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from shoal.metadata import queries
from shoal.metadata.base import Component

OUTCOMES = ("ok", "problems", "failed")


@dataclass(frozen=True)
class PipelineRun:
    job: str
    started: datetime
    outcome: str  # one of OUTCOMES
    figures: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    error: str | None = None
    output: str | None = None
    finished: datetime | None = None  # set by the database when the run is recorded
    id: int | None = None

    @property
    def duration_seconds(self) -> float | None:
        if self.finished is None:
            return None
        return (self.finished - self.started).total_seconds()


async def record_run(conn: psycopg.AsyncConnection[Any], run: PipelineRun) -> int:
    """Record a finished run; returns its id."""
    cur = await conn.execute(
        queries.RECORD_PIPELINE_RUN,
        {
            "job": run.job,
            "started": run.started,
            "outcome": run.outcome,
            # Figures are a job's own summary: a value JSON has no type for (a path, a date)
            # is kept as its text.
            "figures": Jsonb(run.figures, dumps=lambda value: json.dumps(value, default=str)),
            "problems": list(run.problems),
            "error": run.error,
            "output": run.output,
        },
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def read_runs(
    conn: psycopg.AsyncConnection[Any], job: str | None = None, limit: int = 50
) -> list[PipelineRun]:
    """The last `limit` runs, newest first, of one job or of all."""
    cur = conn.cursor(row_factory=class_row(PipelineRun))
    await cur.execute(queries.PIPELINE_RUNS, {"job": job, "limit": limit})
    return await cur.fetchall()


async def read_last_per_job(conn: psycopg.AsyncConnection[Any]) -> list[PipelineRun]:
    """The newest run of each job that ever ran, by job name."""
    cur = conn.cursor(row_factory=class_row(PipelineRun))
    await cur.execute(queries.LAST_PIPELINE_RUN_PER_JOB)
    return await cur.fetchall()


class PipelineBook(Component):
    """The run history through the store's catalog pool."""

    async def record(self, run: PipelineRun) -> int:
        async with self.shards.catalog.pool.connection() as conn:
            return await record_run(conn, run)

    async def runs(self, job: str | None = None, limit: int = 50) -> list[PipelineRun]:
        async with self.shards.catalog.pool.reading() as conn:
            return await read_runs(conn, job, limit)
