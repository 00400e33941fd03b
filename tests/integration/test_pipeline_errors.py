"""What a job, or any command, says when it cannot do its work: one line naming the cause
(a node, a shard, Java, the data directory), and a non-zero exit status."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from shoal.config import MetadataConfig, ShardConfig
from shoal.metadata import MetadataStore, MetadataUnavailable, ObjectWrite, migrate
from shoal.metadata.ring import initial_ring
from shoal.pipeline import failure_line, io
from shoal.pipeline.io import connect
from tests.fixtures.postgres import create_databases

SHOAL = str(Path(sys.executable).parent / "shoal")


def shoal(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SHOAL, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The error line of a failed command, checked to be its only line on stderr."""
    assert result.returncode == 1, (result.stdout, result.stderr[-2000:])
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("shoal: error: ")
    return result.stderr.strip()


def closed_dsn() -> str:
    return "postgresql://shoal@127.0.0.1:1/nothing"  # nothing listens on port 1


def shard_config_file(folder: Path, name: str, dsn: str) -> Path:
    config = folder / "shoal.toml"
    config.write_text(
        f'data_dir = "data"\n[metadata]\n[[metadata.shards]]\nname = "{name}"\ndsn = "{dsn}"\n'
    )
    return config


# -- a data directory with no Shoal instance ---------------------------------------------------

VERBS_NEEDING_AN_INSTANCE = [
    ("db", "status"),
    ("status",),
    ("gc", "run"),
    ("account", "create", "someone"),
    ("pipeline", "gc"),
    ("pipeline", "history"),
    ("storage-node", "--dir", "blocks", "--port", "9", "--name", "n0"),
]


@pytest.mark.parametrize("verb", VERBS_NEEDING_AN_INSTANCE, ids=lambda verb: "-".join(verb[:2]))
def test_a_data_dir_without_an_instance_is_an_error_that_makes_nothing(
    tmp_path: Path, verb: tuple[str, ...]
) -> None:
    typo = tmp_path / "shoal-dta"
    line = one_line(shoal(*verb, "--data-dir", str(typo)))
    assert line == (
        f"shoal: error: no Shoal instance in {typo} "
        "(run `shoal serve` or `shoal db migrate` there first)"
    )
    assert not typo.exists()


# -- a stopped PostgreSQL ----------------------------------------------------------------------


@pytest.mark.parametrize("verb", [("gc", "run"), ("pipeline", "gc"), ("pipeline", "audit")])
def test_a_job_against_a_stopped_postgresql_names_the_shard(
    tmp_path: Path, verb: tuple[str, ...]
) -> None:
    config = shard_config_file(tmp_path, "meta7", closed_dsn())
    line = one_line(shoal(*verb, "--config", str(config)))
    assert "shard meta7" in line and "connect" in line


@pytest.mark.slow
def test_an_executor_error_reaches_the_user_as_its_own_last_line(spark: Any) -> None:
    """Spark wraps an executor's exception in pages of text that start with 'An exception was
    thrown from the Python worker'; the one line the user sees is the worker's own."""
    dsn = closed_dsn()
    rdd = spark.sparkContext.parallelize([1], 1).map(lambda _: connect("meta7", dsn) and 1)
    with pytest.raises(Exception) as raised:
        rdd.collect()
    line = failure_line(raised.value)
    assert line.startswith("shard meta7 is unreachable: connection failed: "), line
    frame = spark.createDataFrame(rdd.map(lambda x: (x,)), "x int")
    with pytest.raises(Exception) as raised:
        frame.count()
    assert failure_line(raised.value) == line


@pytest.mark.slow
def test_an_executor_that_dies_mid_job_is_one_line_saying_so(spark: Any, tmp_path: Path) -> None:
    """A Python worker killed under a task (OOM killer, kill -9): Spark's error starts 'An
    error occurred while calling o40.parquet'; the user's one line says a task failed, why."""

    def die(_: int) -> tuple[int]:
        os.kill(os.getpid(), signal.SIGKILL)
        return (1,)

    rdd = spark.sparkContext.parallelize([1], 1).map(die)
    with pytest.raises(Exception) as raised:
        spark.createDataFrame(rdd, "x int").write.parquet(str(tmp_path / "never"))
    line = failure_line(raised.value)
    assert (
        line == "a Spark task failed: SparkException: Python worker exited unexpectedly (crashed)."
    ), line


def test_an_arrow_reader_that_cannot_reach_its_shard_names_it(spark: Any) -> None:
    """The partition readers (ADBC, in executors) name the shard they cannot connect to,
    and that is the one line the user sees."""
    shards = [ShardConfig(name="meta7", dsn=closed_dsn())]
    rows = io.read_rows(
        spark, shards, initial_ring(["meta7"], 2), {"meta7": "0-1"}, io.LIVE_OBJECTS
    )
    with pytest.raises(Exception) as raised:
        rows.count()
    line = failure_line(raised.value)
    assert line.startswith("shard meta7 is unreachable: connection failed: "), line
    assert "Connection refused" in line and "[libpq]" not in line


@pytest.fixture
def one_object_in_vnode_0(admin_dsn: str, run: Callable[[Awaitable[Any]], Any]) -> ShardConfig:
    """A shard of 2 vnodes, one object in vnode 0."""
    shards = create_databases(admin_dsn, 1)
    run(migrate(shards, MetadataConfig(vnodes=2, partitions_ahead=1)))

    async def put() -> None:
        async with await MetadataStore.open(shards, 1) as store:
            account = await store.accounts.create("reader")
            bucket = await store.buckets.create(account.id, "read")
            name = next(
                f"o{i}"
                for i in range(1000)
                if store.ring.vnode_for_object(account.id, bucket.id, f"o{i}") == 0
            )
            await store.objects.put(account.id, "read", name, ObjectWrite(1, b"x" * 16))

    run(put())
    return shards[0]


def test_a_shard_that_stops_mid_read_is_named(
    one_object_in_vnode_0: ShardConfig,
) -> None:
    """A reader whose shard drops its connection between two vnodes (PostgreSQL stopping ends
    every backend as pg_terminate_backend does: admin_shutdown) says which shard."""
    shard = one_object_in_vnode_0
    watched = replace(shard, dsn=make_conninfo(shard.dsn, application_name="doomed-reader"))
    query = io.LIVE_OBJECTS.replace("{columns}", io.OBJECT_COLUMNS)
    with io.exported_snapshots([shard]) as snapshots:
        tasks = [
            io.ReadTask(shard.name, watched.dsn, snapshots[shard.name], v, query) for v in (0, 1)
        ]
        batches = io.read_batches(tasks)
        assert next(batches).num_rows == 1  # vnode 0 read; vnode 1 not yet
        assert terminated(shard.dsn, "application_name = 'doomed-reader'") == [(True,)]
        with pytest.raises(MetadataUnavailable) as raised:
            list(batches)
    assert str(raised.value).startswith(f"shard {shard.name} is unreachable: "), raised.value
    assert "terminating connection due to administrator command" in str(raised.value)


def test_a_reader_whose_snapshot_is_gone_says_to_run_the_job_again(
    one_object_in_vnode_0: ShardConfig,
) -> None:
    """The driver's transaction that exported the job's snapshot ends under it (PostgreSQL
    restarted mid-job ends them all): the readers say so, naming the shard, rather than
    PostgreSQL's bare 'snapshot does not exist'."""
    shard = one_object_in_vnode_0
    query = io.LIVE_OBJECTS.replace("{columns}", io.OBJECT_COLUMNS)
    with io.exported_snapshots([shard]) as snapshots:
        exporter = "query = 'SELECT pg_export_snapshot()' AND datname = current_database()"
        assert terminated(shard.dsn, exporter) == [(True,)]
        readers = [
            lambda: list(
                io.read_batches(
                    [io.ReadTask(shard.name, shard.dsn, snapshots[shard.name], 0, query)]
                )
            ),
            lambda: io.driver_rows([shard], initial_ring([shard.name], 2), snapshots, query),
        ]
        for read in readers:
            with pytest.raises(MetadataUnavailable) as raised:
                read()
            said = str(raised.value)
            assert said.startswith(f"shard {shard.name} lost the snapshot this job reads"), said
            assert said.endswith("run the job again")


def terminated(dsn: str, which: str) -> list[tuple[Any, ...]]:
    """pg_terminate_backend of the backends of pg_stat_activity `which` names."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        query = f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {which}"
        return conn.execute(query).fetchall()


# -- Java --------------------------------------------------------------------------------------


@pytest.fixture
def migrated_config(admin_dsn: str, run: Callable[[Awaitable[Any]], Any], tmp_path: Path) -> Path:
    shards = create_databases(admin_dsn, 1)
    run(migrate(shards, MetadataConfig(vnodes=2, partitions_ahead=1)))
    return shard_config_file(tmp_path, shards[0].name, shards[0].dsn)


def test_a_missing_or_old_java_is_one_line_saying_what_to_install(
    migrated_config: Path, tmp_path: Path
) -> None:
    hint = "needs Java 17 or newer"
    install = "apt install openjdk-17-jre-headless (or set JAVA_HOME)"
    nowhere = str(tmp_path / "no-java")
    line = one_line(
        shoal("pipeline", "meter", "--config", str(migrated_config), env={"JAVA_HOME": nowhere})
    )
    assert hint in line and f"JAVA_HOME={nowhere}" in line and line.endswith(install)
    # No JAVA_HOME and no java on PATH.
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    result = subprocess.run(
        [SHOAL, "pipeline", "meter", "--config", str(migrated_config)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "PATH": nowhere},
    )
    line = one_line(result)
    assert hint in line and "none found on PATH" in line and line.endswith(install)
    # A Java 8 (a script that answers as one does).
    old = tmp_path / "old-java"
    (old / "bin").mkdir(parents=True)
    java = old / "bin" / "java"
    java.write_text("#!/bin/sh\necho 'java version \"1.8.0_392\"' >&2\n")
    java.chmod(0o755)
    line = one_line(
        shoal("pipeline", "meter", "--config", str(migrated_config), env={"JAVA_HOME": str(old)})
    )
    assert hint in line and "is Java 8" in line and line.endswith(install)
