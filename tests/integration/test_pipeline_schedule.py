"""`[pipeline] schedule` in a real `shoal serve`: two jobs whose moment passed while no serve
ran are run at its start, once each, one after the other, as `shoal pipeline` children
recorded in the history; a restart runs neither again.

Each run starts a Spark driver (tens of seconds), so the test makes two runs in all."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from shoal.config import MetadataConfig, ShardConfig
from shoal.metadata import migrate
from shoal.metadata.pipeline_runs import PipelineRun, read_runs, record_run
from shoal.ports import free_port
from tests.fixtures.postgres import create_databases
from tests.fixtures.serve import start_serve, stop_serve

SHOAL = str(Path(sys.executable).parent / "shoal")
JOBS = ("meter", "lifecycle")  # cheap on an empty store


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
    """Both jobs last ran two days ago: today's moment was missed."""

    async def write() -> None:
        async with await psycopg.AsyncConnection.connect(shard.dsn, autocommit=True) as conn:
            for job in JOBS:
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
        f'schedule = {{ meter = "daily {moment}", lifecycle = "daily {moment}" }}\n'
    )
    config.chmod(0o600)  # it holds the shard's DSN
    return config


def scheduled_logs(data: Path) -> dict[str, int]:
    return {
        job: (data / "pipeline" / job / "scheduled.log").stat().st_size
        for job in JOBS
        if (data / "pipeline" / job / "scheduled.log").exists()
    }


@pytest.mark.slow
def test_missed_jobs_run_once_at_start_one_after_the_other(
    tmp_path: Path, shard: ShardConfig, run: Any
) -> None:
    seed_old_runs(shard, run)
    seeded = len(history(shard, run))
    config = write_config(tmp_path, shard)
    process, served = start_serve(config, free_port(), tmp_path / "serve.log")
    try:
        deadline = time.monotonic() + 300
        while len(history(shard, run)) < seeded + 2 and time.monotonic() < deadline:
            assert process.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(1)
        runs = history(shard, run)[seeded:]
        assert sorted(r.job for r in runs) == sorted(JOBS), (tmp_path / "serve.log").read_text()
        for r in runs:
            assert r.outcome == "ok", (r, scheduled_logs(served.data_dir))
        first, second = runs
        assert first.finished is not None and first.finished <= second.started  # never together
        printed = subprocess.run(
            [SHOAL, "pipeline", "history", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert printed.count(" meter ") == 2 and printed.count(" lifecycle ") == 2
    finally:
        stop_serve(process)
    logs = scheduled_logs(served.data_dir)
    assert set(logs) == set(JOBS)

    # Restarted, serve finds both jobs ran since their moment: nothing starts.
    process, served = start_serve(config, free_port(), tmp_path / "serve.log")
    try:
        time.sleep(5)
        assert process.poll() is None
        assert len(history(shard, run)) == seeded + 2
        assert scheduled_logs(served.data_dir) == logs
    finally:
        stop_serve(process)
    assert "runs on schedule: daily" in (tmp_path / "serve.log").read_text()
