"""The multi-machine layout on one machine: three PostgreSQL servers as shards, four storage
nodes in two datacenters, two gateways sharing one configuration file, and the pipeline's
jobs on a Spark standalone master with one worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pytest
from psycopg.conninfo import conninfo_to_dict

from shoal.config import load_config
from shoal.metadata.ring import vnode_schema
from shoal.storage import block_runs
from tests.fixtures.cluster import Layout
from tests.fixtures.garbage import (
    World,
    block_ids,
    build_garbage,
    check_live,
    garbage_files,
    put,
)
from tests.fixtures.postgres import unique
from tests.fixtures.storage import HEARTBEAT_DEADLINE

SHOAL = str(Path(sys.executable).parent / "shoal")
KiB = 1024

# Each job starts a driver and an executor JVM: minutes on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def pipeline(layout: Layout, job: str, output: Path, *options: str) -> dict[str, Any]:
    """`shoal pipeline JOB --json` as an operator runs it, on the layout's configuration."""
    done = subprocess.run(
        [
            *(SHOAL, "pipeline", job, "--config", str(layout.config_file)),
            *("--output", str(output), "--json", *options),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # It ran as an application of the standalone master, with executors of its worker.
    status = layout.spark.status()
    applications = status["activeapps"] + status["completedapps"]  # ending, or ended
    assert f"shoal-{job}" in {app["name"] for app in applications}, applications
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_layout_has_three_shards_four_nodes_in_two_datacenters(
    layout: Layout, run: Any
) -> None:
    ring = layout.storage.store.ring
    assert {ring.shard_of(v) for v in range(ring.vnodes)} == {"pg0", "pg1", "pg2"}
    ports = {conninfo_to_dict(s.dsn)["port"] for s in layout.shards}
    assert len(ports) == 3  # three servers, not three databases of one
    nodes = run(layout.storage.store.nodes.list(HEARTBEAT_DEADLINE))
    assert sorted(n.shark for n in nodes if n.alive) == [
        "dc0:n0",
        "dc0:n2",
        "dc1:n1",
        "dc1:n3",
    ]
    assert layout.spark.status()["aliveworkers"] == 1


def test_two_gateways_with_one_configuration_serve_the_same_buckets(layout: Layout) -> None:
    first, second = layout.gateways
    assert first.port != second.port
    writer, reader = first.client(), second.client()
    layout.clients += [writer, reader]
    bucket = unique("two-gateways")
    writer.create_bucket(Bucket=bucket)
    body = os.urandom(3 * 1024 * KiB)  # in blocks on the storage nodes, not inline
    writer.put_object(Bucket=bucket, Key="through-a", Body=body)
    assert reader.get_object(Bucket=bucket, Key="through-a")["Body"].read() == body
    reader.put_object(Bucket=bucket, Key="through-b", Body=b"small")
    listed = writer.list_objects_v2(Bucket=bucket)
    assert [o["Key"] for o in listed["Contents"]] == ["through-a", "through-b"]
    assert writer.get_object(Bucket=bucket, Key="through-b")["Body"].read() == b"small"


def test_gc_job_on_the_standalone_cluster_reclaims_exactly_the_garbage(
    layout: Layout, run: Any, tmp_path: Path
) -> None:
    cluster = layout.storage
    path = cluster.data_path(replicas=2, block_size=16 * KiB)
    world = run(build_garbage(cluster.store, path))
    replicas = garbage_files(cluster, world.garbage)
    assert replicas > 0

    done = pipeline(layout, "gc", tmp_path, "--leeway", "0s", "--master", layout.spark.master_url)
    assert done["records found"] == 14
    assert done["records reclaimed"] == 14
    assert done["records kept (node down)"] == 0
    assert done["deleted buckets finished"] == 1
    assert done["block replicas deleted"] == replicas
    assert done["block replicas already gone"] == 0
    assert not world.garbage & block_ids(cluster)
    assert deletion_records(layout) == 0
    check_live(cluster.store, path, world, run)
    records = pq.read_table(str(Path(done["output"]) / "records"))
    assert records.num_rows == 14 and all(records.column("reclaimed").to_pylist())
    assert run(cluster.store.gc_book.last_runs(1))[0].kind == "spark"

    # The worker logs each executor's whole command line: none holds a secret (they travel
    # inside the tasks), and neither do the master's and worker's own.
    config = load_config(layout.config_file, None)
    secrets = [conninfo_to_dict(shard.dsn)["password"] for shard in config.metadata.shards]
    secrets.append(config.secret_file.read_text().strip())
    launched = (layout.spark.root / "worker.log").read_text()
    assert "Launch command:" in launched
    commands = [launched, *(" ".join(map(str, p.args)) for p in layout.spark.processes)]
    assert not [secret for secret in secrets if any(secret in c for c in commands)]


def test_audit_job_on_the_standalone_cluster_finds_and_repairs_damage(
    layout: Layout, run: Any, tmp_path: Path
) -> None:
    """The master comes from `[pipeline] master` in the file, not from the command line."""
    cluster = layout.storage
    path = cluster.data_path(replicas=2, block_size=16 * KiB)
    owner = run(cluster.store.accounts.create(unique("audit"))).id
    world = World(owner=owner, bucket=unique("audit"))
    run(cluster.store.buckets.create(owner, world.bucket))
    for index in range(3):
        world.live[f"k{index}"] = os.urandom(40 * KiB)  # three blocks, on two nodes each
        run(put(cluster.store, path, world, f"k{index}", world.live[f"k{index}"]))
    version = run(cluster.store.objects.get(owner, world.bucket, "k0"))
    first, second = (cluster.node(shark) for shark in version.sharks)
    missing = next(f for f in first.block_files() if f.name == f"{version.id}.0")
    missing.unlink()
    corrupt = next(f for f in second.block_files() if f.name == f"{version.id}.1")
    with open(corrupt, "r+b") as handle:
        handle.seek(48 + 7)
        byte = handle.read(1)
        handle.seek(48 + 7)
        handle.write(bytes([byte[0] ^ 0x55]))

    done = pipeline(layout, "audit", tmp_path, "--repair")
    assert done["blocks checked"] == expected_block_replicas(layout)
    assert done["blocks missing"] == 1 and done["blocks corrupt"] == 1
    findings = pq.read_table(str(Path(done["output"]) / "findings")).to_pylist()
    assert {(f["shark"], f["name"], f["problem"]) for f in findings} == {
        (first.shark, f"{version.id}.0", "missing"),
        (second.shark, f"{version.id}.1", "corrupt"),
    }
    assert done["repaired"] == 2
    assert missing.exists()
    check_live(cluster.store, path, world, run)
    history = run(cluster.store.pipeline_runs.runs("audit", 1))
    assert history[0].outcome == "ok"


def deletion_records(layout: Layout) -> int:
    """Deletion records left on every vnode of every shard."""
    ring = layout.storage.store.ring
    dsns = {s.name: s.dsn for s in layout.shards}
    total = 0
    for vnode in range(ring.vnodes):
        with psycopg.connect(dsns[ring.shard_of(vnode)]) as conn:
            query = f'SELECT count(*) FROM "{vnode_schema(vnode)}".manta_bucket_deleted_object'
            total += conn.execute(query).fetchone()[0]  # type: ignore[index]
    return total


def expected_block_replicas(layout: Layout) -> int:
    """Block replicas (a block on a node) that live versions and open parts name, by SQL."""
    ring = layout.storage.store.ring
    dsns = {s.name: s.dsn for s in layout.shards}
    total = 0
    for vnode in range(ring.vnodes):
        schema = vnode_schema(vnode)
        with psycopg.connect(dsns[ring.shard_of(vnode)]) as conn:
            for table in ("manta_bucket_object", "manta_bucket_upload_part"):
                query = f'SELECT id, content_length, sharks, properties FROM "{schema}".{table}'
                for id_, length, sharks, properties in conn.execute(query):
                    runs = block_runs(id_, length or 0, sharks or [], properties or {})
                    total += sum(len(run.sharks) * len(run.block_names()) for run in runs)
    return total
