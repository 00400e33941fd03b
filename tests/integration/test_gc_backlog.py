"""`shoal gc run` and `shoal pipeline gc` on a backlog of 100,000 deletion records, with the
default configuration (64 vnodes, 4 GC workers), as an operator runs them."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from shoal.config import DEFAULT_VNODES, load_config
from tests.fixtures.backlog import blocks_left, count_records, make_backlog
from tests.fixtures.storage import MakeStorage, StorageCluster

SHOAL = str(Path(sys.executable).parent / "shoal")
BACKLOG = 100_000
WITH_BLOCKS = 500  # records naming a real block on both nodes; the others are inline


def shoal(*args: str) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    result = subprocess.run([SHOAL, *args], capture_output=True, text=True, timeout=600)
    print(f"shoal {' '.join(args[:2])}: {time.monotonic() - started:.1f} s")
    return result


def last_gc_run(dsn: str) -> tuple[int, int, int, int]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT records_found, records_reclaimed, records_failed, blocks_deleted "
            "FROM shoal.gc_run ORDER BY id DESC LIMIT 1"
        ).fetchone()  # type: ignore[return-value]


@pytest.fixture
def cluster(make_storage: MakeStorage) -> StorageCluster:
    """Two nodes, and the default configuration's 64 vnodes (4 GC workers all busy)."""
    return make_storage(nodes=2, vnodes=DEFAULT_VNODES)


def shard_dsn(cluster: StorageCluster) -> str:
    return load_config(cluster.config_file, None).metadata.shards[0].dsn


@pytest.mark.slow
def test_gc_run_reclaims_a_large_backlog(cluster: StorageCluster) -> None:
    """Its pool once starved: every connection held by a worker's claim, the node registry's
    read waiting for one, and after the pool's wait a traceback and nothing reclaimed."""
    dsn, vnodes = shard_dsn(cluster), cluster.store.ring.vnodes
    backlog = make_backlog(cluster, dsn, BACKLOG, WITH_BLOCKS)
    assert count_records(dsn, vnodes) == BACKLOG
    assert blocks_left(cluster, backlog.blocks) == 2 * WITH_BLOCKS
    daemon = shoal("gc", "run", "--config", str(cluster.config_file), "--leeway", "0s")
    assert daemon.returncode == 0, daemon.stderr[-3000:]
    assert "Traceback" not in daemon.stderr
    assert daemon.stdout.startswith(f"reclaimed {BACKLOG} of {BACKLOG} records (0 failed), ")
    assert count_records(dsn, vnodes) == 0 and blocks_left(cluster, backlog.blocks) == 0
    assert last_gc_run(dsn) == (BACKLOG, BACKLOG, 0, 2 * WITH_BLOCKS)


@pytest.mark.slow
def test_pipeline_gc_with_a_node_down_names_it_and_exits_1(cluster: StorageCluster) -> None:
    """Every record naming the node is kept, every other one reclaimed; `gc run` then says
    the same of the node."""
    dsn, vnodes = shard_dsn(cluster), cluster.store.ring.vnodes
    where = ["--config", str(cluster.config_file), "--leeway", "0s"]
    backlog = make_backlog(cluster, dsn, BACKLOG, WITH_BLOCKS)
    down = cluster.nodes[1]
    down.kill()
    spark = shoal("pipeline", "gc", *where)
    assert spark.returncode == 1, spark.stderr[-3000:]
    print(spark.stdout)
    assert f"  problem: block delete failed on {down.shark}: " in spark.stdout
    assert count_records(dsn, vnodes) == WITH_BLOCKS
    assert last_gc_run(dsn) == (
        BACKLOG,
        BACKLOG - WITH_BLOCKS,
        WITH_BLOCKS,
        WITH_BLOCKS,
    )
    assert blocks_left(cluster, backlog.blocks) == WITH_BLOCKS  # the down node's replicas
    daemon = shoal("gc", "run", *where)
    assert daemon.returncode == 1
    assert f"block delete failed on {down.shark}: " in daemon.stderr
    assert count_records(dsn, vnodes) == WITH_BLOCKS
