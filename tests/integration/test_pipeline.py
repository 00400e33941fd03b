"""The Spark jobs on local[2], against real PostgreSQL and real storage nodes."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pyarrow.parquet as pq
import pytest
from psycopg.conninfo import conninfo_to_dict

from shoal.config import load_config
from shoal.metadata import ObjectWrite
from shoal.metadata.ring import vnode_schema
from shoal.pipeline import run_job
from shoal.pipeline.jobs.meter import SUMS_SCHEMA, meter
from tests.fixtures.garbage import block_ids, build_garbage, check_live, dead_tuples, garbage_files
from tests.fixtures.storage import MakeStorage, NodeProcess, StorageCluster

SHOAL = str(Path(sys.executable).parent / "shoal")
KiB = 1024


@pytest.fixture
def cluster(make_storage: MakeStorage) -> StorageCluster:
    return make_storage(nodes=3)


def job(
    cluster: StorageCluster,
    spark: Any,
    name: str,
    tmp_path: Path,
    *,
    write_lifetime: timedelta | None = None,
    **options: Any,
) -> Any:
    config = load_config(cluster.config_file, None)
    if write_lifetime is not None:  # what [s3] write_lifetime_seconds would set
        config = replace(config, s3=replace(config.s3, write_lifetime=write_lifetime))
    return run_job(
        name, config, _configs(cluster), spark=spark, output=tmp_path / "out", options=options
    )


def _configs(cluster: StorageCluster) -> list[Any]:
    return list(load_config(cluster.config_file, None).metadata.shards)


def test_gc_job_reclaims_exactly_the_garbage(
    cluster: StorageCluster, spark: Any, run: Any, tmp_path: Path
) -> None:
    path = cluster.data_path(replicas=2, block_size=16 * KiB)
    world = run(build_garbage(cluster.store, path))
    young = job(cluster, spark, "gc", tmp_path, leeway=timedelta(hours=1))
    assert young.figures["records found"] == 0 and world.garbage <= block_ids(cluster)

    replicas = garbage_files(cluster, world.garbage)
    done = job(cluster, spark, "gc", tmp_path, leeway=timedelta(0))
    assert done.figures["records found"] == 14
    assert done.figures["records reclaimed"] == 14
    assert done.figures["records kept (node down)"] == 0
    assert done.figures["deleted buckets finished"] == 1
    assert not world.garbage & block_ids(cluster)
    # Counted as the daemon counts: block replicas the nodes removed.
    assert done.figures["block replicas deleted"] == replicas
    assert done.figures["block replicas already gone"] == 0
    # The current window held only reclaimed records: truncated whole, no dead tuples.
    assert done.figures["windows truncated whole"] >= 1
    assert done.figures["windows vacuumed"] == 0
    assert dead_tuples(_configs(cluster)[0].dsn) == 0
    check_live(cluster.store, path, world, run)
    table = pq.read_table(str(done.output / "records"))
    assert table.num_rows == 14 and all(table.column("reclaimed").to_pylist())
    runs = run(cluster.store.gc_book.last_runs(1))
    assert runs[0].kind == "spark" and runs[0].records_reclaimed == 14
    again = job(cluster, spark, "gc", tmp_path, leeway=timedelta(0))
    assert again.figures["records found"] == 0


def test_gc_job_keeps_records_of_a_node_that_is_down(
    cluster: StorageCluster, spark: Any, run: Any, tmp_path: Path
) -> None:
    path = cluster.data_path(replicas=2, block_size=16 * KiB)
    world = run(build_garbage(cluster.store, path))
    down = node_splitting_a_window(cluster)
    down.kill()
    partial = job(cluster, spark, "gc", tmp_path, leeway=timedelta(0))
    assert partial.figures["records kept (node down)"] > 0
    # The job says which node it could not reach (and `shoal pipeline` exits 1).
    [problem] = partial.problems
    assert problem.startswith(f"block delete failed on {down.shark}: ")
    # The kept records share a window with removed ones: rows deleted, then vacuumed.
    assert partial.figures["windows vacuumed"] >= 1
    assert dead_tuples(_configs(cluster)[0].dsn) == 0
    cluster.restart(down, run)
    final = job(cluster, spark, "gc", tmp_path, leeway=timedelta(0))
    assert final.figures["records kept (node down)"] == 0 and final.problems == []
    assert not world.garbage & block_ids(cluster)
    check_live(cluster.store, path, world, run)


SHARKS_OF_RECORDS = "SELECT sharks FROM {schema}.manta_bucket_deleted_object"


def node_splitting_a_window(cluster: StorageCluster) -> NodeProcess:
    """A node that some, not all, deletion records of one vnode's window name: with it down,
    that window keeps some records and loses others, so the job must vacuum it. Placement is
    random: on a fixed node, every window was all-kept or all-removed in ~3% of runs."""
    with psycopg.connect(_configs(cluster)[0].dsn) as conn:
        windows = [
            [row[0] for row in conn.execute(SHARKS_OF_RECORDS.format(schema=vnode_schema(v)))]
            for v in range(cluster.store.ring.vnodes)
        ]
    for node in cluster.nodes:
        for sharks in windows:
            named = [node.shark in record for record in sharks]
            if any(named) and not all(named):
                return node
    raise AssertionError(f"every window's records name the same nodes: {windows}")


def test_killed_gc_job_converges(
    cluster: StorageCluster, spark: Any, run: Any, tmp_path: Path
) -> None:
    """`shoal pipeline gc` dies after its first batch; the next run, here on the session's
    Spark, reclaims the rest."""
    path = cluster.data_path(replicas=2, block_size=16 * KiB)
    world = run(build_garbage(cluster.store, path))
    command = [
        SHOAL,
        "pipeline",
        "gc",
        "--config",
        str(cluster.config_file),
        "--leeway",
        "0s",
        "--master",
        "local[2]",
    ]
    crashed = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "SHOAL_GC_FAULT_AFTER": "1"},
    )
    assert crashed.returncode == 1
    assert crashed.stderr.strip().splitlines()[-1].startswith("shoal: error: pipeline gc failed")
    assert world.garbage & block_ids(cluster)
    again = job(cluster, spark, "gc", tmp_path, leeway=timedelta(0))
    assert again.figures["records reclaimed"] > 0
    assert again.figures["records reclaimed"] == again.figures["records found"]
    assert not world.garbage & block_ids(cluster)
    check_live(cluster.store, path, world, run)


def test_inventory_lists_every_live_object(
    cluster: StorageCluster, spark: Any, run: Any, tmp_path: Path
) -> None:
    path = cluster.data_path(replicas=2, block_size=16 * KiB)
    world = run(build_garbage(cluster.store, path))
    tagged = run(cluster.store.objects.get(world.owner, world.bucket, "over0"))
    tags = {"team": "storage", "note": "a b"}
    run(cluster.store.objects.set_tags(world.owner, world.bucket, "over0", tagged.id, tags))
    typed = ObjectWrite(content_length=0, content_md5=bytes(16), content_type="text/csv")
    run(cluster.store.objects.put(world.owner, world.bucket, "typed", typed))
    world.live["typed"] = b""
    summary = job(cluster, spark, "inventory", tmp_path)
    rows = pq.read_table(str(summary.output / "parquet")).to_pylist()
    mine = {r["key"]: r for r in rows if r["bucket"] == world.bucket}
    assert set(mine) == set(world.live)
    assert mine["over0"]["size"] == 70 * KiB
    # The ETag S3 answers for each object, multipart ones ("-N") included.
    for key in mine:
        version = run(cluster.store.objects.get(world.owner, world.bucket, key))
        assert mine[key]["etag"] == version.etag, key
    assert mine["half"]["etag"].endswith("-1")
    assert len(mine["over0"]["storage_nodes"].split()) == 2
    assert mine["small"]["size"] == 3 * KiB and mine["small"]["storage_nodes"] == ""
    # The type HEAD answers: the stored one, else S3's default.
    assert mine["typed"]["content_type"] == "text/csv"
    assert mine["over0"]["content_type"] == "binary/octet-stream"
    assert json.loads(mine["over0"]["tags"]) == tags and mine["small"]["tags"] == ""
    csvs = list((summary.output / "csv").glob(f"bucket={world.bucket}/*.csv"))
    assert csvs and "key,size,etag" in csvs[0].read_text()


def test_meter_counts_usage_per_bucket(
    cluster: StorageCluster, spark: Any, run: Any, tmp_path: Path
) -> None:
    path = cluster.data_path(replicas=2, block_size=16 * KiB)
    world = run(build_garbage(cluster.store, path))
    run(cluster.store.uploads.create(world.owner, world.bucket, "open"))
    plot = tmp_path / "usage.png"
    summary = job(cluster, spark, "meter", tmp_path, plot=plot)
    line = next(v for k, v in summary.figures.items() if k.endswith(world.bucket))
    live_bytes = sum(len(d) for k, d in world.live.items() if k != "half") + 20 * KiB
    assert f"{len(world.live)} objects, {live_bytes:,} B logical" in line
    small = len(world.live["small"])  # held once, in its row; the rest on 2 nodes
    assert f"{2 * (live_bytes - small) + small:,} B stored" in line
    assert plot.exists() and plot.stat().st_size > 1000


def test_meter_transform_on_inline_rows(spark: Any) -> None:
    from pyspark.sql import Row

    def sums(bucket: str, objects: int, logical: int, stored: int, gc: int, parts: int) -> Row:
        return Row(
            owner="o1",
            bucket_id=bucket,
            objects=objects,
            logical_bytes=logical,
            stored_bytes=stored,
            gc_bytes=gc,
            multipart_bytes=parts,
        )

    # What the tasks hand on: a bucket's rows summed by each task that read some.
    tasks = spark.createDataFrame(
        [sums("b1", 2, 15, 25, 0, 0), sums("b1", 1, 4, 4, 3, 0), sums("b2", 1, 7, 14, 0, 100)],
        SUMS_SCHEMA,
    )
    names = spark.createDataFrame(
        [
            Row(bucket_id="b1", owner="o1", bucket="one", deleted=False),
            Row(bucket_id="b2", owner="o1", bucket="two", deleted=True),
            Row(bucket_id="b3", owner="o1", bucket="empty", deleted=False),
        ]
    )
    people = spark.createDataFrame([Row(owner="o1", account="alice")])
    rows = {r.bucket: r.asDict() for r in meter(tasks, names, people).collect()}
    assert rows["one"] == {
        "account": "alice",
        "bucket": "one",
        "objects": 3,
        "logical_bytes": 19,
        "stored_bytes": 29,
        "gc_bytes": 3,
        "multipart_bytes": 0,
    }
    # A deleted bucket's objects are waiting for GC, not in use.
    assert rows["two"]["objects"] == 0 and rows["two"]["gc_bytes"] == 7
    assert rows["two"]["multipart_bytes"] == 100
    # A live bucket without rows is metered, all zero.
    assert rows["empty"]["objects"] == 0 and rows["empty"]["stored_bytes"] == 0


def test_audit_finds_missing_and_corrupt_blocks_and_repairs_them(
    cluster: StorageCluster, spark: Any, run: Any, tmp_path: Path
) -> None:
    path = cluster.data_path(replicas=2, block_size=16 * KiB)
    world = run(build_garbage(cluster.store, path))
    version = run(cluster.store.objects.get(world.owner, world.bucket, "over0"))
    first, second = (cluster.node(s) for s in version.sharks)
    missing = next(f for f in first.block_files() if f.name == f"{version.id}.0")
    missing.unlink()
    corrupt = next(f for f in second.block_files() if f.name == f"{version.id}.1")
    with open(corrupt, "r+b") as handle:
        handle.seek(48 + 7)
        byte = handle.read(1)
        handle.seek(48 + 7)
        handle.write(bytes([byte[0] ^ 0x55]))
    # A replica cut short on disk: its node answers, with an error about the file.
    truncated = next(f for f in first.block_files() if f.name == f"{version.id}.2")
    os.truncate(truncated, truncated.stat().st_size - 100)

    # Exactly the three damaged replicas are found, of every block checked; after the
    # repair, none is.
    found = job(cluster, spark, "audit", tmp_path)
    assert found.figures["blocks checked"] > 3
    assert found.figures["blocks missing"] == 1 and found.figures["blocks corrupt"] == 1
    assert found.figures["blocks wrong size"] == 1 and found.figures["blocks unreachable"] == 0
    findings = pq.read_table(str(found.output / "findings")).to_pylist()
    assert {(f["shark"], f["name"], f["problem"]) for f in findings} == {
        (first.shark, f"{version.id}.0", "missing"),
        (second.shark, f"{version.id}.1", "corrupt"),
        (first.shark, f"{version.id}.2", "wrong size"),
    }
    # Data at risk is a problem line (`shoal pipeline audit` exits 1) until it is repaired.
    [problem] = found.problems
    assert problem.startswith("3 of the 3 bad block replicas found (1 missing, 1 wrong size, 1 ")

    repaired = job(cluster, spark, "audit", tmp_path, repair=True)
    assert repaired.figures["repaired"] == 3 and repaired.problems == []
    after = job(cluster, spark, "audit", tmp_path)
    assert after.problems == []
    assert after.figures["blocks missing"] == 0 and after.figures["blocks corrupt"] == 0
    assert after.figures["blocks wrong size"] == 0
    check_live(cluster.store, path, world, run)


def test_orphans_are_found_and_deleted(
    cluster: StorageCluster, spark: Any, run: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from shoal.ids import uuid7
    from tests.fixtures.garbage import once

    path = cluster.data_path(replicas=2, block_size=16 * KiB)
    world = run(build_garbage(cluster.store, path))
    leaked = uuid7()  # a write that died before its row committed
    run(path.write(leaked, once(os.urandom(40 * KiB))))
    young = job(cluster, spark, "orphans", tmp_path, leeway=timedelta(hours=1))
    assert young.figures["orphan blocks"] == 0

    dry = job(cluster, spark, "orphans", tmp_path, leeway=timedelta(0))
    assert dry.figures["orphan blocks"] == 6  # 3 blocks on 2 nodes; garbage is not orphaned
    assert leaked in block_ids(cluster)
    # A delete needs a leeway of at least the longest a write may take, which only a
    # configuration set for it brings down to none.
    with pytest.raises(ValueError, match="write_lifetime_seconds"):
        job(cluster, spark, "orphans", tmp_path, leeway=timedelta(hours=1), delete=True)
    assert leaked in block_ids(cluster)
    with caplog.at_level(logging.INFO, logger="shoal.pipeline"):
        done = job(
            cluster,
            spark,
            "orphans",
            tmp_path,
            write_lifetime=timedelta(0),
            leeway=timedelta(0),
            delete=True,
        )
    assert done.figures["deleted"] == 6
    # The executors' deletes count in the phase's progress, item by item.
    assert "orphans: delete orphans: done, 6 blocks, " in caplog.text
    assert leaked not in block_ids(cluster)
    assert world.garbage <= block_ids(cluster)  # records still name these: GC's, not orphans
    check_live(cluster.store, path, world, run)


def test_audit_and_orphans_go_on_without_a_node_that_is_down(
    cluster: StorageCluster, spark: Any, run: Any, tmp_path: Path
) -> None:
    """A node down and not marked dead: the jobs that read the nodes' inventories check the
    others, count what the down node holds as unreachable, and name it in a problem line,
    rather than fail whole until an operator marks it dead."""
    from shoal.ids import uuid7
    from tests.fixtures.garbage import once

    path = cluster.data_path(replicas=2, block_size=16 * KiB)
    run(build_garbage(cluster.store, path))
    leaked = uuid7()  # an orphan: 3 blocks on 2 nodes
    written = run(path.write(leaked, once(os.urandom(40 * KiB))))
    down, up = (cluster.node(shark) for shark in written.sharks)
    on_down = len(down.block_files())
    down.kill()

    audit = job(cluster, spark, "audit", tmp_path)
    assert audit.figures["blocks missing"] == 0 and audit.figures["blocks corrupt"] == 0
    # Every block of the down node's that a live row names, not read.
    assert 0 < audit.figures["blocks unreachable"] <= on_down
    assert audit.problems[0] == (
        f"{down.shark} did not answer: its {audit.figures['blocks unreachable']:,} block "
        "replicas were not checked"
    )
    orphans = job(cluster, spark, "orphans", tmp_path, leeway=timedelta(0))
    found = pq.read_table(str(orphans.output / "orphans")).to_pylist()
    assert {(o["shark"], o["name"]) for o in found} == {
        (up.shark, f"{leaked}.{index}") for index in range(3)
    }
    assert orphans.problems == [f"{down.shark} did not answer: its orphans were not looked for"]


def test_lifecycle_expires_and_aborts_by_rule(
    cluster: StorageCluster, spark: Any, run: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from shoal.metadata import ObjectWrite
    from shoal.metadata.ring import vnode_schema
    from tests.fixtures.postgres import unique

    store = cluster.store
    owner = run(store.accounts.create(unique("lc"))).id
    bucket = unique("lc")
    found = run(store.buckets.create(owner, bucket))
    for key in ("logs/a", "logs/b", "keep/c", "old/d", "old/e", "tagged/f", "tagged/g"):
        run(
            store.objects.put(
                owner, bucket, key, ObjectWrite(content_length=1, content_md5=bytes(16))
            )
        )
    tagged = run(store.objects.get(owner, bucket, "tagged/f"))
    run(store.objects.set_tags(owner, bucket, "tagged/f", tagged.id, {"temp": "yes", "x": "1"}))
    partly = run(store.objects.get(owner, bucket, "tagged/g"))
    run(store.objects.set_tags(owner, bucket, "tagged/g", partly.id, {"temp": "no"}))
    upload = run(store.uploads.create(owner, bucket, "big"))
    fresh_upload = run(store.uploads.create(owner, bucket, "fresh"))

    async def backdate(key: str, table: str, days: int) -> None:
        vnode = store.ring.vnode_for_object(owner, found.id, key)
        async with store.shards.of_vnode(vnode).pool.connection() as conn:
            await conn.execute(
                f"UPDATE {vnode_schema(vnode)}.{table} "
                "SET created = created - make_interval(days => %s) "
                "WHERE bucket_id = %s AND name = %s",
                (days, found.id, key),
            )

    run(backdate("old/d", "manta_bucket_object", 3))
    run(backdate("big", "manta_bucket_upload", 3))
    run(
        store.buckets.put_lifecycle(
            owner,
            bucket,
            [
                {
                    "id": "logs",
                    "enabled": True,
                    "prefix": "logs/",
                    "expiration_days": None,
                    "expiration_date": "2020-01-01T00:00:00+00:00",
                    "abort_days": None,
                },
                {
                    "id": "old",
                    "enabled": True,
                    "prefix": "old/",
                    "expiration_days": 2,
                    "expiration_date": None,
                    "abort_days": None,
                },
                {
                    "id": "temporary",
                    "enabled": True,
                    "prefix": "",
                    "tags": {"temp": "yes"},
                    "expiration_days": None,
                    "expiration_date": "2020-01-01T00:00:00+00:00",
                    "abort_days": None,
                },
                {
                    "id": "uploads",
                    "enabled": True,
                    "prefix": "",
                    "expiration_days": None,
                    "expiration_date": None,
                    "abort_days": 2,
                },
                {
                    "id": "off",
                    "enabled": False,
                    "prefix": "keep/",
                    "expiration_days": None,
                    "expiration_date": "2020-01-01T00:00:00+00:00",
                    "abort_days": None,
                },
            ],
        )
    )
    with caplog.at_level(logging.INFO, logger="shoal.pipeline"):
        summary = job(cluster, spark, "lifecycle", tmp_path)
    assert summary.figures["objects expired"] == 4
    items = summary.figures["objects expired"] + summary.figures["uploads aborted"]
    assert f"lifecycle: delete expired: done, {items} items in " in caplog.text
    left = [o.name for o in run(store.objects.list(owner, bucket)).objects]
    assert left == ["keep/c", "old/e", "tagged/g"]
    uploads = [u.id for u in run(store.uploads.list(owner, bucket))]
    assert uploads == [fresh_upload.id] and upload.id not in uploads
    assert run(store.objects.list(owner, bucket)).objects  # the rest stays readable


def test_lifecycle_skips_a_bucket_whose_rules_cannot_be_applied(
    cluster: StorageCluster, spark: Any, run: Any, tmp_path: Path
) -> None:
    """A rule the gateway now refuses (Days of 3,000,000 overflowed the date arithmetic and
    failed the job for every account), stored straight into the metadata: that bucket is
    skipped and reported, the others' rules are applied."""
    from shoal.metadata import ObjectWrite
    from tests.fixtures.postgres import unique

    store = cluster.store
    owner = run(store.accounts.create(unique("lc"))).id
    good, bad = unique("lcgood"), unique("lcbad")
    for bucket in (good, bad):
        run(store.buckets.create(owner, bucket))
        run(
            store.objects.put(
                owner, bucket, "old", ObjectWrite(content_length=1, content_md5=bytes(16))
            )
        )
    rule = {
        "id": "r",
        "enabled": True,
        "prefix": "",
        "expiration_days": None,
        "expiration_date": "2020-01-01T00:00:00+00:00",
        "abort_days": None,
    }
    run(store.buckets.put_lifecycle(owner, good, [rule]))
    run(
        store.buckets.put_lifecycle(
            owner, bad, [rule | {"expiration_days": 3_000_000, "expiration_date": None}]
        )
    )
    summary = job(cluster, spark, "lifecycle", tmp_path)
    assert summary.figures["objects expired"] == 1
    assert summary.figures["buckets skipped (rules cannot be applied)"] == 1
    assert len(summary.problems) == 1 and bad in summary.problems[0]
    assert "3000000" in summary.problems[0]
    assert not run(store.objects.list(owner, good)).objects
    assert [o.name for o in run(store.objects.list(owner, bad)).objects] == ["old"]
    skipped = pq.read_table(summary.output / "skipped").to_pylist()
    assert [(s["bucket"], s["owner"]) for s in skipped] == [(bad, str(owner))]


def test_expiry_rounds_up_to_midnight_utc() -> None:
    from datetime import UTC, datetime

    from shoal.pipeline.jobs.lifecycle import expires_at

    created = datetime(2024, 3, 1, 15, 30, tzinfo=UTC)
    assert expires_at(created, 1) == datetime(2024, 3, 3, tzinfo=UTC)
    assert expires_at(datetime(2024, 3, 1, tzinfo=UTC), 1) == datetime(2024, 3, 2, tzinfo=UTC)


@pytest.mark.slow
def test_no_secret_is_on_the_command_line_of_any_spark_process(
    cluster: StorageCluster, spark: Any, tmp_path: Path
) -> None:
    """Spark's JVM gets its settings as `--conf` arguments (visible in `ps`): none of them
    is a secret. DSNs and the cluster secret reach executors inside their tasks."""
    job(cluster, spark, "meter", tmp_path)  # the JVM and its Python workers have run a job
    config = load_config(cluster.config_file, None)
    secrets = [conninfo_to_dict(shard.dsn)["password"] for shard in config.metadata.shards]
    secrets.append(config.secret_file.read_text().strip())
    assert all(secrets)
    commands = []
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            commands.append(" ".join(process.cmdline()))
    assert any("org.apache.spark" in command for command in commands), commands
    for command in commands:
        assert not [secret for secret in secrets if secret in command], command
