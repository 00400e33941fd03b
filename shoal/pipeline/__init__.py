"""The Spark pipeline: `shoal pipeline JOB` runs one PySpark job and prints its summary."""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from shoal.config import Config, ShardConfig
from shoal.metadata import MetadataStore
from shoal.metadata.outage import connection_failed
from shoal.metadata.pipeline_runs import PipelineRun, record_run
from shoal.pipeline.context import JobContext, Summary
from shoal.pipeline.progress import Progress

if TYPE_CHECKING:  # Spark loads with a job, not with the scheduler in `serve` that reads JOBS
    from pyspark.sql import SparkSession

log = logging.getLogger("shoal.pipeline")

# How long a run that reached the metadata tier waits for it to note the run in the history:
# `serve` starts a killed embedded PostgreSQL again within seconds (its crash recovery
# included).
RECORD_WAIT_SECONDS = 20.0
RECORD_RETRY_SECONDS = 0.5

JOBS = ("gc", "audit", "orphans", "meter", "lifecycle", "inventory", "rebalance")


def run_job(
    job: str,
    config: Config,
    shards: list[ShardConfig],
    *,
    master: str | None = None,
    output: Path | None = None,
    options: dict[str, Any] | None = None,
    spark: SparkSession | None = None,
) -> Summary:
    """Run one job on Spark; its detailed output goes under `output/<job>/<timestamp>/`.

    With `spark`, the job runs in that session (tests share one); otherwise it makes its own.
    Every run is recorded in the pipeline history (shoal.pipeline_run), one that raised too.
    """
    if job not in JOBS:
        raise ValueError(f"unknown job {job!r}; jobs are {', '.join(JOBS)}")
    # Before the Spark session starts: a run takes as long as its operator waits for it.
    started = datetime.now(UTC)
    root = output or config.data_dir / "pipeline"
    folder = root / job / started.strftime("%Y%m%dT%H%M%S%fZ")
    ring = None
    try:
        ring = asyncio.run(_ring(shards))
        summary = _run(job, config, shards, ring, master, root, folder, options, spark, started)
    except Exception as exc:
        failed = str(folder.absolute())
        run = PipelineRun(job, started, "failed", error=failure_line(exc), output=failed)
        # A job that reached the metadata tier and lost it on the way (PostgreSQL killed,
        # and started again by `serve`) waits for it to come back to note its failure; one
        # that never reached it says so in its error and waits for nothing.
        _record(shards, run, job_failed=True, wait=RECORD_WAIT_SECONDS if ring is not None else 0.0)
        raise
    outcome = "problems" if summary.problems else "ok"
    _record(
        shards,
        PipelineRun(
            job,
            started,
            outcome,
            figures=summary.figures,
            problems=summary.problems,
            output=str(summary.output.absolute()),
        ),
        wait=RECORD_WAIT_SECONDS,
    )
    return summary


def _run(
    job: str,
    config: Config,
    shards: list[ShardConfig],
    ring: Any,
    master: str | None,
    root: Path,
    folder: Path,
    options: dict[str, Any] | None,
    spark: SparkSession | None,
    started: datetime,
) -> Summary:
    from shoal.pipeline.session import spark_session

    module = importlib.import_module(f"shoal.pipeline.jobs.{job}")
    run_module: Callable[[JobContext], Summary] = module.run  # each job module's entry point
    log_file = folder.parent / "spark.log"
    session = spark if spark is not None else spark_session(job, master, log_file, config.pipeline)
    progress = Progress(job, session.sparkContext)
    progress.start()
    try:
        context = JobContext(
            spark=session,
            config=config,
            shards=shards,
            ring=ring,
            output=folder,
            options=dict(options or {}),
            started=started,
            progress=progress,
        )
        summary = run_module(context)
        progress.finish()
        return summary
    finally:
        progress.finish(finished=False)  # a job that raised: its error says what became of it
        progress.stop()
        if spark is None:
            session.stop()
        make_private(root, folder.parent)


def _record(
    shards: list[ShardConfig], run: PipelineRun, *, job_failed: bool = False, wait: float = 0.0
) -> None:
    """Add the run to the history, trying again for up to `wait` seconds while the catalog's
    PostgreSQL cannot be reached. A history that cannot be written costs a warning, never the
    run's own result. Not when a failed job could not reach the shard either: its own error,
    the one line the user sees, says so already."""

    async def write() -> None:
        async with await psycopg.AsyncConnection.connect(
            shards[0].dsn, autocommit=True, connect_timeout=10
        ) as conn:
            await record_run(conn, run)

    deadline = time.monotonic() + wait
    while True:
        try:
            asyncio.run(write())
            return
        except Exception as exc:
            if connection_failed(exc) and time.monotonic() < deadline:
                time.sleep(RECORD_RETRY_SECONDS)
                continue
            level = logging.DEBUG if job_failed and connection_failed(exc) else logging.WARNING
            log.log(level, "pipeline %s: the run was not recorded in the history: %s", run.job, exc)
            return


def make_private(*trees: Path) -> None:
    """Folders 0700 and files 0600 in these trees: outputs name every object and account.

    Spark writes them with `fs.permissions.umask-mode` 077 (session.py), and `shoal` runs
    with umask 077, but a session made elsewhere (a test's, a notebook's) or an executor
    with another umask may not: this makes sure, on a file system the driver sees.
    """
    for tree in trees:
        if not tree.exists():
            continue
        tree.chmod(0o700)
        for folder, folders, files in os.walk(tree):
            for name in folders:
                os.chmod(os.path.join(folder, name), 0o700)
            for name in files:
                os.chmod(os.path.join(folder, name), 0o600)


# Spark reports an error raised in an executor's Python code as a PythonException (or a
# Py4JJavaError holding one) whose first line says only that the worker raised; the worker's
# own traceback follows in the text.
_TRACEBACK = "Traceback (most recent call last):"
# A failure of Spark's own (Py4JJavaError) says first which call of the JVM it was, then the
# JVM's exception; a task's failure inside it names the task and host before its own error.
_JAVA_CALL = "An error occurred while calling "
_TASK_FAILURE = re.compile(r"most recent failure: Lost task .*?\): (.*)")
# What Spark appends to a crashed Python worker's error: advice for Spark's developers.
_SPARK_ADVICE = " Consider setting "


def failure_line(exc: BaseException) -> str:
    """Why a job failed, in one line: the error itself, or, for one an executor raised, the
    last exception line of the worker's traceback (`OperationalError: connection failed: ...`;
    a Shoal error's message alone, which names its shard or node)."""
    text = str(exc)
    at = text.rfind(_TRACEBACK)
    if at >= 0:
        for line in text[at + len(_TRACEBACK) :].splitlines():
            if line.strip() and not line[0].isspace():
                return _short(_without_module(line.strip()))
    lines = text.strip().splitlines()
    if not lines:
        return type(exc).__name__
    if lines[0].startswith(_JAVA_CALL) and len(lines) > 1:
        return _short(_java_failure(lines[1].removeprefix(": ")))
    return _short(lines[0])


def _java_failure(line: str) -> str:
    """The JVM's exception line without its package, and for a failed task only the task's
    own error (an executor that died: `Python worker exited unexpectedly (crashed)`)."""
    task = _TASK_FAILURE.search(line)
    if task is None:
        return _without_module(line)
    cause = _without_module(task.group(1)).split(_SPARK_ADVICE)[0]
    return f"a Spark task failed: {cause}"


def _without_module(line: str) -> str:
    """`psycopg.OperationalError: x` -> `OperationalError: x`; `shoal.<...>.Error: x` -> `x`."""
    name, colon, message = line.partition(": ")
    if not colon or " " in name:
        return line
    if name.startswith("shoal."):
        return message
    return f"{name.rsplit('.', 1)[-1]}: {message}"


def _short(line: str) -> str:
    return line if len(line) <= 300 else line[:297] + "..."


async def _ring(shards: list[ShardConfig]) -> Any:
    async with await MetadataStore.open(shards, 1) as store:
        return store.ring


__all__ = ["JOBS", "Summary", "failure_line", "make_private", "run_job"]
