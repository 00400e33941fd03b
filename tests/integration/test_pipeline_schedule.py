"""`[pipeline] schedule` in a real `shoal serve`: jobs whose moment passed while no serve ran
are run at its start, once each, one after the other, as `shoal pipeline` children recorded
in the history; one killed outright is recorded as failed; a restart runs none again; and a
scheduler finds the cluster's lock held (another serve runs a job) and runs nothing.

Each run starts a Spark driver (tens of seconds), so the test makes one whole run in all: the
killed job, then the one due after it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from shoal.config import MetadataConfig, ShardConfig, load_config
from shoal.metadata import migrate, queries
from shoal.metadata.pipeline_runs import PipelineRun, read_runs, record_run
from shoal.pipeline.schedule import SCHEDULER_LOCK, Scheduler, schedule_rules
from tests.fixtures.postgres import create_databases
from tests.fixtures.serve import start_serve, stop_serve

SHOAL = str(Path(sys.executable).parent / "shoal")
JOBS = ("meter",)  # cheap on an empty store
KILLED = "audit"  # due first (by name), and killed as soon as it starts


@pytest.fixture
def shard(admin_dsn: str, run: Any) -> ShardConfig:
    [config] = create_databases(admin_dsn, 1)
    run(migrate([config], MetadataConfig(vnodes=2, partitions_ahead=1)))
    return config


def history(shard: ShardConfig, run: Any) -> list[PipelineRun]:
    async def read() -> list[PipelineRun]:
        async with await psycopg.AsyncConnection.connect(shard.dsn, autocommit=True) as conn:
            return await read_runs(conn, limit=50)

    return sorted(run(read()), key=lambda r: r.id or 0)


def seed_old_runs(shard: ShardConfig, run: Any) -> None:
    """Every job last ran two days ago: today's moment was missed."""

    async def write() -> None:
        async with await psycopg.AsyncConnection.connect(shard.dsn, autocommit=True) as conn:
            for job in (KILLED, *JOBS):
                await record_run(
                    conn, PipelineRun(job, datetime.now(UTC) - timedelta(days=2), "ok")
                )

    run(write())


def write_config(root: Path, shard: ShardConfig) -> Path:
    # A moment a few minutes ago (yesterday's, just after midnight UTC): missed either way.
    moment = (datetime.now(UTC) - timedelta(minutes=3)).strftime("%H:%M")
    config = root / "shoal.toml"
    config.write_text(
        f'data_dir = "{root / "data"}"\n'
        f'[metadata]\n[[metadata.shards]]\nname = "{shard.name}"\ndsn = "{shard.dsn}"\n'
        "[storage]\nlocal_nodes = 1\n[s3]\nworkers = 1\n[gc]\nenabled = false\n"
        '[pipeline]\nmaster = "local[1]"\npartitions = 2\n'
        "[pipeline.schedule]\n" + "".join(f'{job} = "daily {moment}"\n' for job in (KILLED, *JOBS))
    )
    config.chmod(0o600)  # it holds the shard's DSN
    return config


def scheduled_logs(data: Path) -> dict[str, int]:
    return {
        job: (data / "pipeline" / job / "scheduled.log").stat().st_size
        for job in (KILLED, *JOBS)
        if (data / "pipeline" / job / "scheduled.log").exists()
    }


def kill_child(job: str, config: Path, seconds: float = 60) -> None:
    """SIGKILL the `shoal pipeline JOB` child serve started, once it has."""
    wanted = [b"pipeline", job.encode(), b"--config", str(config).encode()]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            try:
                words = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue  # not a process, or gone
            if entry.name.isdigit() and words[3:7] == wanted:
                os.kill(int(entry.name), signal.SIGKILL)
                return
        time.sleep(0.05)
    raise TimeoutError(f"serve started no pipeline {job}")


@pytest.mark.slow
def test_missed_jobs_run_once_at_start_one_after_the_other(
    tmp_path: Path, shard: ShardConfig, run: Any
) -> None:
    seed_old_runs(shard, run)
    seeded = len(history(shard, run))
    config = write_config(tmp_path, shard)
    process, served = start_serve(config, tmp_path / "serve.log")
    try:
        kill_child(KILLED, config)
        deadline = time.monotonic() + 300
        while len(history(shard, run)) < seeded + 2 and time.monotonic() < deadline:
            assert process.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(1)
        killed, *runs = history(shard, run)[seeded:]
        assert killed.job == KILLED and killed.outcome == "failed", killed
        assert killed.error is not None and "exited with -9" in killed.error
        assert sorted(r.job for r in runs) == sorted(JOBS), (tmp_path / "serve.log").read_text()
        for r in runs:
            assert r.outcome == "ok", (r, scheduled_logs(served.data_dir))
        (after,) = runs
        # Never together: the next starts once the killed one has ended.
        assert killed.finished is not None and killed.finished <= after.started
        printed = subprocess.run(
            [SHOAL, "pipeline", "history", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert printed.count(" meter ") == 2 and printed.count(f" {KILLED} ") == 2
    finally:
        stop_serve(process)
    logs = scheduled_logs(served.data_dir)
    assert set(logs) == {KILLED, *JOBS}

    # Restarted, serve finds every job ran since its moment (a failed run counts): none starts.
    process, served = start_serve(config, tmp_path / "serve.log")
    try:
        time.sleep(5)
        assert process.poll() is None
        assert len(history(shard, run)) == seeded + 2
        assert scheduled_logs(served.data_dir) == logs
    finally:
        stop_serve(process)
    assert "runs on schedule: daily" in (tmp_path / "serve.log").read_text()


def test_no_job_runs_while_another_serve_holds_the_lock(
    tmp_path: Path, shard: ShardConfig, run: Any
) -> None:
    """A due job is left to the scheduler that holds the cluster's lock (here, the test's)."""
    seed_old_runs(shard, run)
    seeded = len(history(shard, run))
    config = load_config(write_config(tmp_path, shard), None)
    scheduler = Scheduler(config, [shard], schedule_rules(config), ["--config", "/nonexistent"])

    async def check_while_locked() -> None:
        async with await psycopg.AsyncConnection.connect(shard.dsn, autocommit=True) as other:
            await other.execute(queries.TRY_SCHEDULER_LOCK, {"key": SCHEDULER_LOCK})
            await scheduler.run_due(asyncio.Event())

    run(check_while_locked())
    assert len(history(shard, run)) == seeded
    assert scheduled_logs(config.data_dir) == {}  # no child was started
