"""A storage node drained under load is emptied by `shoal pipeline rebalance` and removed; a
node that died has its copies made again from the others (docs/operations.md, "Draining and
replacing storage nodes"). Real `shoal serve`, storage-node processes and Spark."""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from shoal.config import load_config
from shoal.pipeline import run_job
from shoal.pipeline.jobs.rebalance import DEFAULT_GAP
from shoal.storage import block_runs
from tests.fault.load import MixedLoad, iter_failures, wait_until
from tests.fixtures.postgres import unique
from tests.fixtures.serve import Served, start_serve, stop_serve
from tests.fixtures.storage import (
    MakeStorage,
    StorageCluster,
    start_node,
    wait_until_registered,
)

SHOAL = str(Path(sys.executable).parent / "shoal")
KiB = 1024
MiB = 1024 * KiB
# How long re-replication may take after mark-dead (serve's daemon passes every 5 s).
RESTORE_SECONDS = 40


class ServeOnNodes:
    """`shoal serve` with no storage nodes of its own, on the cluster's shard and nodes; it
    reads the registry (states included) every 2 s, and runs no GC daemon (tests run it)."""

    def __init__(self, cluster: StorageCluster) -> None:
        root = cluster.config_file.parent
        shard = load_config(cluster.config_file, None).metadata.shards[0]
        self.config_file = root / "serve.toml"
        self.config_file.write_text(
            f'data_dir = "{root}"\n'
            f'[metadata]\n[[metadata.shards]]\nname = "{shard.name}"\ndsn = "{shard.dsn}"\n'
            "[storage]\nlocal_nodes = 0\nblock_size = 262144\n"
            # A deadline of five beats: a live node whose beats a loaded machine delays is
            # never taken for a dead one while the drain runs.
            "heartbeat_interval_seconds = 1\nheartbeat_deadline_seconds = 5\n"
            "[s3]\nworkers = 1\n[gc]\nenabled = false\n"
            "[pipeline]\nscheduled = false\n"  # no Spark job starts at its hour meanwhile
        )
        self.process, self.served = start_serve(self.config_file, root / "serve.log")

    def shoal(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SHOAL, *args, "--config", str(self.config_file)],
            capture_output=True,
            text=True,
            timeout=60,
        )

    def job(self, spark: Any, name: str, tmp_path: Path, **options: Any) -> Any:
        config = load_config(self.config_file, None)
        shards = list(config.metadata.shards)
        return run_job(name, config, shards, spark=spark, output=tmp_path / "out", options=options)


@pytest.fixture
def cluster(make_storage: MakeStorage) -> StorageCluster:
    return make_storage(nodes=4, datacenters=2)  # n0, n2 in dc0; n1, n3 in dc1


@pytest.fixture
def serve(cluster: StorageCluster) -> Iterator[ServeOnNodes]:
    served = ServeOnNodes(cluster)
    try:
        yield served
    finally:
        stop_serve(served.process)


@pytest.mark.slow
def test_a_node_drained_under_load_ends_empty_and_is_removed(
    cluster: StorageCluster, serve: ServeOnNodes, spark: Any, run: Any, tmp_path: Path
) -> None:
    drained = cluster.nodes[0]
    s3 = client(serve.served)
    bucket = unique("drain")
    s3.create_bucket(Bucket=bucket)
    fixed = write_fixed(s3, bucket)
    load = MixedLoad(
        lambda **config: serve.served.raw_client(serve.served.root, **config),
        bucket,
        threads=3,
        max_requests=50,
        max_seconds=20,
        keys_per_thread=8,
    )
    with load:
        load.wait_for_requests(40)
        assert drained.block_files(), "the load wrote nothing to the node to drain"
        refused = serve.shoal("node", "remove", drained.name)
        assert refused.returncode == 1 and "still named by" in refused.stderr
        assert refused.stderr.count("\n") == 1  # one line

        drain = serve.shoal("node", "drain", drained.name)
        assert drain.returncode == 0, drain.stderr
        assert "draining" in drain.stdout
        time.sleep(3)  # serve reads the registry every 2 s: no new block goes there since
        first = serve.job(spark, "rebalance", tmp_path)  # the load goes on till it ends
    print(first.table())
    assert not list(iter_failures(load))
    assert load.acknowledged_writes() > 20
    assert first.figures["copies moved"] > 0 and first.figures["copies waiting"] == 0
    # Writes that chose the node before serve saw the drain may have committed after the
    # first run's snapshot; a second run takes those.
    second = serve.job(spark, "rebalance", tmp_path)
    print(second.table())
    assert second.figures["copies waiting"] == 0 and not second.problems

    # Versions overwritten or deleted by the load still have blocks there until GC.
    collected = serve.shoal("gc", "run", "--leeway", "0s")
    assert collected.returncode == 0, collected.stderr
    assert drained.block_files() == []
    load.verify(s3)
    fixed.check(s3)
    assert_copies_in_two_datacenters(cluster, bucket, run)
    audit = serve.job(spark, "audit", tmp_path)
    assert audit.figures["versions under-replicated"] == 0
    assert audit.figures["blocks missing"] == 0 and audit.figures["blocks corrupt"] == 0
    assert audit.figures["blocks wrong size"] == 0

    listing = serve.shoal("node", "list", "--json")
    [row] = [r for r in json.loads(listing.stdout) if r["shark"] == drained.shark]
    assert (row["state"], row["blocks"]) == ("draining", 0)
    drained.kill()  # the operator stops it: a running node would register again
    removed = serve.shoal("node", "remove", drained.name)
    assert removed.returncode == 0, removed.stderr
    assert drained.shark not in serve.shoal("node", "list").stdout
    s3.close()


@pytest.mark.slow
def test_a_stopped_node_marked_dead_has_every_copy_made_again(
    cluster: StorageCluster, serve: ServeOnNodes, spark: Any, run: Any, tmp_path: Path
) -> None:
    dead = cluster.nodes[1]
    s3 = client(serve.served)
    bucket = unique("dead")
    s3.create_bucket(Bucket=bucket)
    objects = {f"k{n}": body(size, n) for n, size in enumerate((5 * KiB, 300 * KiB, 1 * MiB))}
    objects.update({f"more{n}": body(70 * KiB, 10 + n) for n in range(6)})
    for key, data in objects.items():
        s3.put_object(Bucket=bucket, Key=key, Body=data)
    assert dead.block_files()
    dead.kill()

    marked = serve.shoal("node", "mark-dead", dead.name)
    assert marked.returncode == 0, marked.stderr
    assert "noted for re-replication" in marked.stdout and "no other copy" not in marked.stdout
    owner = run(cluster.store.accounts.get_by_name("root")).id

    def restored() -> bool:
        return (
            run(cluster.store.under_replicated.count()) == 0
            and run(cluster.store.sharks.naming(dead.shark)).rows == 0
        )

    wait_until(restored, RESTORE_SECONDS, interval=0.5)
    for key, data in objects.items():
        assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data
        sharks = run(cluster.store.objects.get(owner, bucket, key)).sharks
        assert len(sharks) == 2, (key, sharks)
    assert_copies_in_two_datacenters(cluster, bucket, run)

    refused = serve.shoal("node", "undrain", dead.name)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    unknown = serve.shoal("node", "drain", "nosuch")
    assert unknown.returncode == 1
    assert unknown.stderr == "shoal: error: no storage node named 'nosuch' is registered\n"
    audit = serve.job(spark, "audit", tmp_path)  # asks nothing of the dead node
    assert audit.figures["versions under-replicated"] == 0
    assert audit.figures["blocks missing"] == 0
    removed = serve.shoal("node", "remove", dead.name)
    assert removed.returncode == 0, removed.stderr
    s3.close()


# Each node of the even-out test uses at most this much of the disk ([storage]
# capacity_bytes): every node of one test disk would report the same fill otherwise. Above
# the 256 MiB a node keeps free for new blocks (cluster.MIN_FREE_BYTES).
CAPACITY = 320 * MiB


@pytest.mark.slow
def test_rebalance_evens_out_fill_after_nodes_join(
    make_storage: MakeStorage,
    spark: Any,
    run: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two nodes hold 60 MiB each of 320 MiB, two empty ones join: one `shoal pipeline
    rebalance` leaves every node's fill within the documented gap (10 points) of the others,
    every object reads back, copies stay in two datacenters, and audit finds nothing."""
    cluster = make_storage(nodes=2, datacenters=2, capacity_bytes=CAPACITY)
    serve = ServeOnNodes(cluster)
    try:
        s3 = client(serve.served)
        bucket = unique("even")
        s3.create_bucket(Bucket=bucket)
        objects = {f"k{n:02d}": body(2 * MiB, n) for n in range(30)}
        for key, data in objects.items():
            s3.put_object(Bucket=bucket, Key=key, Body=data)
        root = cluster.config_file.parent
        for name, datacenter in (("n2", "dc0"), ("n3", "dc1")):
            cluster.nodes.append(start_node(cluster, name, datacenter, root))
        wait_until_registered(cluster, run)
        assert [round(f, 2) for f in fills(cluster)] == [0.19, 0.19, 0.0, 0.0]

        def registry_has_the_fill() -> bool:  # the full nodes' heartbeats since the writes
            nodes = {n.name: n for n in run(cluster.store.nodes.list(timedelta(seconds=30)))}
            return all(
                (nodes[n].free_bytes or 0) < CAPACITY - 50 * MiB for n in ("n0", "n1")
            ) and all(nodes[n].capacity_bytes == CAPACITY for n in ("n2", "n3"))

        wait_until(registry_has_the_fill, 20, interval=0.2)
        with caplog.at_level(logging.INFO, logger="shoal.pipeline"):
            done = serve.job(spark, "rebalance", tmp_path)
        print(done.table(), [f"{f:.3f}" for f in fills(cluster)])
        assert done.figures["mode"] == "even out" and done.figures["copies moved"] > 0
        moves = done.figures["copies to move"]
        assert f"rebalance: move copies: done, {moves:,} copies, " in caplog.text
        assert not done.problems
        assert max(fills(cluster)) - min(fills(cluster)) <= DEFAULT_GAP
        for key, data in objects.items():
            assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == data, key
        assert_copies_in_two_datacenters(cluster, bucket, run)
        audit = serve.job(spark, "audit", tmp_path)
        assert audit.figures["versions under-replicated"] == 0
        assert audit.figures["blocks missing"] == 0 and audit.figures["blocks corrupt"] == 0
        s3.close()
    finally:
        stop_serve(serve.process)


# -- helpers ------------------------------------------------------------------------------------


def fills(cluster: StorageCluster) -> list[float]:
    """Each node's share of CAPACITY its block files take, in the order of cluster.nodes."""
    return [sum(f.stat().st_size for f in n.block_files()) / CAPACITY for n in cluster.nodes]


class Fixed:
    """Objects written before the load (some of them multi-block), a completed multipart
    object and an open upload's part: each kind of row a drain moves copies of."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        self.objects: dict[str, bytes] = {}
        self.open_upload = ""
        self.open_part = b""

    def check(self, s3: Any) -> None:
        for key, data in self.objects.items():
            assert s3.get_object(Bucket=self.bucket, Key=key)["Body"].read() == data, key
        etag = hashlib.md5(self.open_part).hexdigest()
        s3.complete_multipart_upload(
            Bucket=self.bucket,
            Key="open",
            UploadId=self.open_upload,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": f'"{etag}"'}]},
        )
        assert s3.get_object(Bucket=self.bucket, Key="open")["Body"].read() == self.open_part


def write_fixed(s3: Any, bucket: str) -> Fixed:
    fixed = Fixed(bucket)
    for n in range(6):
        fixed.objects[f"fixed-{n}"] = body(300 * KiB + n, n)
        s3.put_object(Bucket=bucket, Key=f"fixed-{n}", Body=fixed.objects[f"fixed-{n}"])
    parts = [body(5 * MiB, 50), body(100 * KiB, 51)]
    upload = s3.create_multipart_upload(Bucket=bucket, Key="multipart")["UploadId"]
    etags = [
        s3.upload_part(Bucket=bucket, Key="multipart", UploadId=upload, PartNumber=n, Body=d)[
            "ETag"
        ]
        for n, d in enumerate(parts, start=1)
    ]
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key="multipart",
        UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]},
    )
    fixed.objects["multipart"] = b"".join(parts)
    fixed.open_upload = s3.create_multipart_upload(Bucket=bucket, Key="open")["UploadId"]
    fixed.open_part = body(100 * KiB, 52)
    s3.upload_part(
        Bucket=bucket, Key="open", UploadId=fixed.open_upload, PartNumber=1, Body=fixed.open_part
    )
    return fixed


def client(served: Served) -> Any:
    return served.raw_client(served.root)


def body(size: int, seed: int) -> bytes:
    pattern = hashlib.sha256(f"{seed}".encode()).digest()
    return (pattern * (size // len(pattern) + 1))[:size]


def assert_copies_in_two_datacenters(cluster: StorageCluster, bucket: str, run: Any) -> None:
    """Every version (or part) of the bucket with blocks has its two copies in dc0 and dc1."""
    owner = run(cluster.store.accounts.get_by_name("root")).id
    listing = run(cluster.store.objects.list(owner, bucket, limit=1000))
    for entry in listing.objects:
        v = run(cluster.store.objects.get(owner, bucket, entry.name))
        for blocks in block_runs(v.id, v.content_length, v.sharks, v.properties):
            datacenters = sorted(s.partition(":")[0] for s in blocks.sharks)
            assert datacenters == ["dc0", "dc1"], (entry.name, blocks)
