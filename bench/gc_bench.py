"""Garbage collection and the Spark audit/orphans jobs at volume, against real storage nodes.

    .venv/bin/python bench/gc_bench.py --quick    # 100,000 records, 20,000 blocks (3.5-4 min)
    .venv/bin/python bench/gc_bench.py            # 1,000,000 records, 1,000,000 blocks

Set-up: the embedded PostgreSQL 18 (127.0.0.1, a scratch database, `--vnodes` vnodes,
default 16, one day windows), two `shoal storage-node` processes on 127.0.0.1 registering in it.

1. Spark GC. N deletion records are written with bulk SQL straight into each vnode's
   `manta_bucket_deleted_object` (INSERT ... SELECT uuidv7() FROM generate_series), with
   deleted_at an hour back inside the current window. Each names one 100-byte block (block
   size 1 MiB) on both nodes. For a sample (1%) the blocks really exist: they are written
   first through BlockClient.put_block, and those records are COPYed with their UUIDv7 ids
   made in Python; the other blocks are already missing (which counts as gone). Then
   `run_job("gc", ...)` runs on a local[2] SparkSession with leeway 0: records and block
   replicas per second, the job's seconds per phase, and the dead tuples left in the deleted
   tables (exact, from pgstattuple on every window).
2. Daemon collector, on the same data: the same N records (and sample blocks) are written
   again and `Collector(store, datapath, timedelta(0)).run_once()` (the daemon's pass, with
   its default batches and workers) runs in-process, bounded by `--collector-seconds`; its
   records per second come from the rows it removed, and dead tuples are measured after.
3. Audit and orphans. M block files are made directly on each node's disk in the node's
   layout (`blocks/<fan-out>/<version>.<index>`, 48-byte header + 100 bytes), M/2 objects
   with both nodes as sharks, with their `manta_bucket_object` rows COPYed into the vnode the
   ring names, plus 1% orphan files that no row names. Both jobs read the inventories over
   HTTP; audit also reads every block over HTTP. Blocks checked per second.

Everything binds 127.0.0.1; nodes, Spark, PostgreSQL and the scratch folder are cleaned up
on exit, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from benchlib import (
    exit_on_sigterm,
    load_average,
    machine_summary,
    postgres_server,
    scratch_shard,
    source_digest,
)
from psycopg import sql
from psycopg.types.json import Jsonb
from storage_bench import NodeProcess, start_node, stop_nodes, wait_until_serving, write_node_config

from shoal.cluster import RegistryDirectory
from shoal.config import Config, MetadataConfig, ShardConfig, load_config
from shoal.gc import Collector
from shoal.ids import uuid7
from shoal.keyfiles import load_or_create_secret
from shoal.metadata import MetadataStore, migrate
from shoal.metadata.partitions import window_start
from shoal.metadata.ring import Ring, vnode_schema
from shoal.pipeline import run_job
from shoal.storage import BlockClient, DataPath
from shoal.storage.blockfile import HEADER, MAGIC, checksum_of

BLOCK_SIZE = 1 << 20
PAYLOAD = b"shoal-gc-bench:" + b"x" * 85  # 100 bytes: every block holds the same data
PAYLOAD_CHECKSUM = checksum_of(PAYLOAD)
NODE_NAMES = ("n0", "n1")
DATACENTER = "dc0"
SHARKS = [f"{DATACENTER}:{name}" for name in NODE_NAMES]
PROPERTIES = {"block_size": BLOCK_SIZE}
PUT_CONCURRENCY = 32
HEARTBEAT_DEADLINE = timedelta(seconds=30)
MEASURED_CODE = (
    "shoal.gc.collector",
    "shoal.metadata.garbage",
    "shoal.pipeline.io",
    "shoal.pipeline.jobs.gc",
    "shoal.pipeline.jobs.audit",
    "shoal.pipeline.jobs.orphans",
)
RECORD_COLUMNS = (
    "id, name, owner, bucket_id, created, modified, content_length, content_type, "
    "sharks, properties, deleted_at"
)


@dataclass(frozen=True)
class Bench:
    """What every phase needs: the shard, the configuration, the nodes, the ring."""

    shard: ShardConfig
    config: Config
    nodes: list[NodeProcess]
    secret: bytes
    ring: Ring
    scratch: Path
    owner: uuid.UUID
    bucket_id: uuid.UUID


# -- set-up ------------------------------------------------------------------------------------


def wait_until_registered(bench_shard: ShardConfig) -> None:
    """Until both nodes have heartbeated into the registry (the jobs read URLs from it)."""

    async def poll() -> None:
        async with await MetadataStore.open([bench_shard], 2) as store:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                alive = {n.name for n in await store.nodes.list(HEARTBEAT_DEADLINE) if n.alive}
                if set(NODE_NAMES) <= alive:
                    return
                await asyncio.sleep(0.2)
        raise TimeoutError("storage nodes did not register in time")

    asyncio.run(poll())


def read_ring(shard: ShardConfig) -> Ring:
    async def read() -> Ring:
        async with await MetadataStore.open([shard], 1) as store:
            return store.ring

    return asyncio.run(read())


def record_time(dsn: str) -> datetime:
    """An hour back, but inside the window holding the database's now (it exists)."""
    with psycopg.connect(dsn) as conn:
        now = conn.execute("SELECT current_timestamp").fetchone()[0]  # type: ignore[index]
    start = window_start(now, timedelta(days=1))
    return now - min(timedelta(hours=1), (now - start) / 2)


# -- deletion records and their blocks ----------------------------------------------------------


def sample_ids(count: int) -> list[uuid.UUID]:
    return [uuid7() for _ in range(count)]


async def put_blocks(bench: Bench, ids: Sequence[uuid.UUID]) -> float:
    """Write block `<id>.0` on both nodes through the HTTP API; returns seconds."""
    started = time.monotonic()
    client = BlockClient(bench.secret)
    gate = asyncio.Semaphore(PUT_CONCURRENCY)

    async def put(url: str, version: uuid.UUID) -> None:
        async with gate:
            await client.put_block(url, f"{version}.0", PAYLOAD, PAYLOAD_CHECKSUM)

    try:
        await asyncio.gather(*(put(n.url, v) for n in bench.nodes for v in ids))
    finally:
        await client.close()
    return time.monotonic() - started


def insert_records(bench: Bench, total: int, sample: Sequence[uuid.UUID]) -> float:
    """`total` deletion records spread over the vnodes, the sample among them; seconds."""
    started = time.monotonic()
    deleted_at = record_time(bench.shard.dsn)
    created = deleted_at - timedelta(hours=1)
    vnodes = bench.ring.vnodes
    with psycopg.connect(bench.shard.dsn) as conn:
        for vnode in range(vnodes):
            table = sql.Identifier(vnode_schema(vnode), "manta_bucket_deleted_object")
            mine = sample[vnode::vnodes]
            with conn.cursor().copy(
                sql.SQL("COPY {} ({}) FROM STDIN").format(table, sql.SQL(RECORD_COLUMNS))
            ) as copy:
                for version in mine:
                    copy.write_row(record_row(bench, version, created, deleted_at))
            rest = total // vnodes + (1 if vnode < total % vnodes else 0) - len(mine)
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} ({}) SELECT uuidv7(), 'gc/' || g, %(owner)s, %(bucket)s, "
                    "%(created)s, %(created)s, 100, 'application/octet-stream', %(sharks)s, "
                    "%(properties)s, %(deleted_at)s FROM generate_series(1, %(rest)s) g"
                ).format(table, sql.SQL(RECORD_COLUMNS)),
                {
                    "owner": bench.owner,
                    "bucket": bench.bucket_id,
                    "created": created,
                    "sharks": SHARKS,
                    "properties": Jsonb(PROPERTIES),
                    "deleted_at": deleted_at,
                    "rest": max(0, rest),
                },
            )
    return time.monotonic() - started


def record_row(bench: Bench, version: uuid.UUID, created: datetime, deleted: datetime) -> tuple:
    return (
        version,
        f"sample/{version}",
        bench.owner,
        bench.bucket_id,
        created,
        created,
        len(PAYLOAD),
        "application/octet-stream",
        SHARKS,
        Jsonb(PROPERTIES),
        deleted,
    )


def count_records(dsn: str, vnodes: int) -> int:
    """Deletion records left in every vnode's table."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return sum(
            conn.execute(
                sql.SQL("SELECT count(*) FROM {}").format(
                    sql.Identifier(vnode_schema(v), "manta_bucket_deleted_object")
                )
            ).fetchone()[0]  # type: ignore[index]
            for v in range(vnodes)
        )


def scalar(dsn: str, query: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(query).fetchone()[0]  # type: ignore[index]


def count_windows(dsn: str) -> int:
    return scalar(
        dsn,
        "SELECT count(*) FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent "
        "WHERE p.relname = 'manta_bucket_deleted_object'",
    )


def dead_tuples(dsn: str) -> tuple[int, int, int]:
    """(exact dead tuples by pgstattuple, n_dead_tup of the statistics, live rows)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        exact, live = conn.execute(
            "SELECT coalesce(sum((pgstattuple(c.oid)).dead_tuple_count), 0)::bigint, "
            "coalesce(sum((pgstattuple(c.oid)).tuple_count), 0)::bigint FROM pg_class c "
            "WHERE c.relkind = 'r' AND c.relname LIKE 'manta_bucket_deleted_object%'"
        ).fetchone()  # type: ignore[misc]
        time.sleep(1.0)  # backends flush their statistics about once a second
        conn.execute("SELECT pg_stat_clear_snapshot()")
        stats = conn.execute(
            "SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables "
            "WHERE relname LIKE 'manta_bucket_deleted_object%'"
        ).fetchone()[0]  # type: ignore[index]
    return exact, stats, live


def autovacuumed(dsn: str) -> int:
    return scalar(
        dsn,
        "SELECT count(*) FROM pg_stat_user_tables WHERE relname LIKE "
        "'manta_bucket_deleted_object%' AND last_autovacuum IS NOT NULL",
    )


def files_on_nodes(bench: Bench, names: Sequence[str]) -> int:
    return sum(
        (node.root / "blocks" / name[34:36] / name).exists()
        for node in bench.nodes
        for name in names
    )


# -- phase 1 and 2: GC -------------------------------------------------------------------------


def spark_gc(bench: Bench, spark: Any, records: int, sample_size: int) -> dict[str, Any]:
    sample = sample_ids(sample_size)
    put_seconds = asyncio.run(put_blocks(bench, sample))
    insert_seconds = insert_records(bench, records, sample)
    found = count_records(bench.shard.dsn, bench.ring.vnodes)
    print(
        f"spark gc: {found:,} records ({len(sample):,} with real blocks, put in "
        f"{put_seconds:.1f} s; rows inserted in {insert_seconds:.1f} s)",
        flush=True,
    )
    started = time.monotonic()
    summary = run_job(
        "gc",
        bench.config,
        [bench.shard],
        spark=spark,
        output=bench.scratch / "out",
        options={"leeway": timedelta(0)},
    )
    seconds = time.monotonic() - started
    left = count_files_and_rows(bench, sample)
    exact, stats, live = dead_tuples(bench.shard.dsn)
    return {
        "figures": summary.figures,
        "seconds": seconds,
        "left": left,
        "dead exact": exact,
        "dead stats": stats,
        "live": live,
        "autovacuumed": autovacuumed(bench.shard.dsn),
        "windows": count_windows(bench.shard.dsn),
        "sample": sample,
    }


def count_files_and_rows(bench: Bench, sample: Sequence[uuid.UUID]) -> tuple[int, int]:
    """(sample block files still on the nodes, deletion records still in the tables)."""
    return files_on_nodes(bench, [f"{v}.0" for v in sample]), count_records(
        bench.shard.dsn, bench.ring.vnodes
    )


def daemon_gc(bench: Bench, records: int, sample: Sequence[uuid.UUID], cap: float) -> dict:
    asyncio.run(put_blocks(bench, sample))
    insert_records(bench, records, sample)
    before = count_records(bench.shard.dsn, bench.ring.vnodes)
    print(f"collector: {before:,} records, bounded to {cap:.0f} s", flush=True)
    started = time.monotonic()
    run, finished = asyncio.run(collect(bench, cap))
    seconds = time.monotonic() - started
    files, after = count_files_and_rows(bench, sample)
    exact, stats, live = dead_tuples(bench.shard.dsn)
    return {
        "before": before,
        "removed": before - after,
        "seconds": seconds,
        "finished": finished,
        "run": run,
        "files left": files,
        "dead exact": exact,
        "dead stats": stats,
        "live": live,
    }


async def collect(bench: Bench, cap: float) -> tuple[Any, bool]:
    """One Collector pass, cancelled after `cap` seconds (claims roll back, nothing is lost)."""
    async with await MetadataStore.open([bench.shard], 10) as store:
        client = BlockClient(bench.secret)
        try:
            data = DataPath(client, RegistryDirectory(store, HEARTBEAT_DEADLINE, client))
            collector = Collector(store, data, timedelta(0))
            try:
                return await asyncio.wait_for(collector.run_once(), cap), True
            except TimeoutError:
                return None, False
        finally:
            await client.close()


def clear_records(dsn: str, vnodes: int) -> None:
    with psycopg.connect(dsn) as conn:
        for vnode in range(vnodes):
            table = sql.Identifier(vnode_schema(vnode), "manta_bucket_deleted_object")
            conn.execute(sql.SQL("TRUNCATE {}").format(table))


# -- phase 3: audit and orphans ------------------------------------------------------------------


def make_blocks(bench: Bench, blocks: int) -> tuple[int, int, float]:
    """blocks/2 objects on both nodes plus 1% orphans, on disk and in the object tables.

    Returns (objects, orphan files per node, seconds).
    """
    started = time.monotonic()
    objects = blocks // len(bench.nodes)
    orphans = max(1, objects // 100)
    ids = sample_ids(objects + orphans)
    header = HEADER.pack(MAGIC, len(PAYLOAD), bytes.fromhex(PAYLOAD_CHECKSUM)) + PAYLOAD
    for node in bench.nodes:
        write_block_files(node.root / "blocks", ids, header)
    insert_objects(bench, ids[:objects])
    return objects, orphans, time.monotonic() - started


def write_block_files(root: Path, ids: Sequence[uuid.UUID], content: bytes) -> None:
    """Block files as BlockStore lays them out (no fsync: set-up, not the measured part)."""
    for fan_out in {f"{i:02x}" for i in range(256)}:
        (root / fan_out).mkdir(parents=True, exist_ok=True)
    for version in ids:
        name = f"{version}.0"
        with open(root / name[34:36] / name, "wb") as handle:
            handle.write(content)


def insert_objects(bench: Bench, ids: Sequence[uuid.UUID]) -> None:
    by_vnode: dict[int, list[tuple[uuid.UUID, str]]] = {}
    for version in ids:
        name = f"audit/{version}"
        vnode = bench.ring.vnode_for_object(bench.owner, bench.bucket_id, name)
        by_vnode.setdefault(vnode, []).append((version, name))
    md5 = hashlib.md5(PAYLOAD).digest()
    with psycopg.connect(bench.shard.dsn) as conn:
        for vnode, rows in by_vnode.items():
            table = sql.Identifier(vnode_schema(vnode), "manta_bucket_object")
            columns = "id, name, owner, bucket_id, content_length, content_md5, sharks, properties"
            with conn.cursor().copy(
                sql.SQL("COPY {} ({}) FROM STDIN").format(table, sql.SQL(columns))
            ) as copy:
                for version, name in rows:
                    copy.write_row(
                        (
                            version,
                            name,
                            bench.owner,
                            bench.bucket_id,
                            len(PAYLOAD),
                            md5,
                            SHARKS,
                            Jsonb(PROPERTIES),
                        )
                    )
        conn.execute("ANALYZE")


def run_timed(bench: Bench, spark: Any, job: str, **options: Any) -> tuple[Any, float]:
    started = time.monotonic()
    summary = run_job(
        job, bench.config, [bench.shard], spark=spark, output=bench.scratch / "out", options=options
    )
    return summary, time.monotonic() - started


# -- report ------------------------------------------------------------------------------------


def per_second(count: float, seconds: float) -> str:
    return f"{count / seconds:,.0f}/s" if seconds > 0 else "-"


def report_spark(result: dict[str, Any]) -> list[str]:
    figures, seconds = result["figures"], result["seconds"]
    files, rows = result["left"]
    lines = [
        f"spark gc (run_job wall {seconds:.1f} s): "
        + ", ".join(f"{k}={v}" for k, v in figures.items())
    ]
    handled = figures["block replicas deleted"] + figures["block replicas already gone"]
    lines.append(
        f"  records reclaimed {per_second(figures['records reclaimed'], seconds)}, "
        f"block replicas deleted or found gone {per_second(handled, seconds)} "
        "(over run_job wall time)"
    )
    lines.append(
        f"  after: {rows:,} records left, {files} sample block files left on the nodes, "
        f"{result['windows']} windows of manta_bucket_deleted_object remain"
    )
    lines.append(
        f"  dead tuples in the deleted tables: {result['dead exact']:,} (pgstattuple), "
        f"{result['dead stats']:,} (n_dead_tup); live {result['live']:,}; "
        f"tables autovacuumed so far: {result['autovacuumed']}"
    )
    return lines


def report_daemon(result: dict[str, Any]) -> list[str]:
    seconds, removed = result["seconds"], result["removed"]
    state = "finished" if result["finished"] else "cancelled at the cap"
    lines = [
        f"daemon collector ({state}, {seconds:.1f} s): removed {removed:,} of "
        f"{result['before']:,} records, {per_second(removed, seconds)}; "
        f"sample block files left {result['files left']}"
    ]
    if result["run"] is not None:
        run = result["run"]
        lines.append(
            f"  block replicas deleted {run.blocks_deleted:,} "
            f"({per_second(run.blocks_deleted, seconds)}); GcRun: {run}"
        )
    lines.append(
        f"  dead tuples: {result['dead exact']:,} (pgstattuple), {result['dead stats']:,} "
        f"(n_dead_tup); live {result['live']:,}"
    )
    return lines


def report_job(name: str, summary: Any, seconds: float, key: str) -> str:
    figures = ", ".join(f"{k}={v}" for k, v in summary.figures.items())
    return (
        f"{name} (run_job wall {seconds:.1f} s): {figures}; "
        f"{per_second(summary.figures[key], seconds)} over wall time"
    )


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


# -- main --------------------------------------------------------------------------------------


@contextlib.contextmanager
def storage_nodes(config_file: Path, root: Path) -> Iterator[list[NodeProcess]]:
    nodes: list[NodeProcess] = []
    try:
        for name in NODE_NAMES:
            nodes.append(start_node(config_file, root, name, DATACENTER))
        yield nodes
    finally:
        stop_nodes(nodes)


@contextlib.contextmanager
def spark_session_for(scratch: Path) -> Iterator[Any]:
    from shoal.pipeline.session import spark_session

    # The gc job caches every record in the driver JVM (local mode): give it room.
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", "--driver-memory 4g pyspark-shell")
    session = spark_session("bench", "local[2]", scratch / "spark.log")
    try:
        yield session
    finally:
        session.stop()


@contextlib.contextmanager
def bench_world(admin_dsn: str, scratch: Path, vnodes: int) -> Iterator[tuple[Bench, Path]]:
    """A scratch shard of `vnodes` vnodes, migrated, and storage nodes serving and registered
    (its machine summary printed first): the Bench over them and the nodes' config file."""
    with scratch_shard(admin_dsn) as shard:
        print("\n".join(machine_summary(shard.dsn)), flush=True)
        asyncio.run(migrate([shard], MetadataConfig(vnodes=vnodes, partitions_ahead=1)))
        config_file = write_node_config(scratch, shard)
        with storage_nodes(config_file, scratch) as nodes:
            secret = load_or_create_secret(scratch / "cluster.secret")

            async def serving() -> None:
                client = BlockClient(secret)
                try:
                    await wait_until_serving(client, nodes)
                finally:
                    await client.close()

            asyncio.run(serving())
            wait_until_registered(shard)
            yield (
                Bench(
                    shard=shard,
                    config=load_config(config_file, None),
                    nodes=nodes,
                    secret=secret,
                    ring=read_ring(shard),
                    scratch=scratch,
                    owner=uuid.uuid4(),
                    bucket_id=uuid.uuid4(),
                ),
                config_file,
            )


def run(args: argparse.Namespace, admin_dsn: str, scratch: Path) -> None:
    with bench_world(admin_dsn, scratch, args.vnodes) as (bench, _):
        print(source_digest(*MEASURED_CODE), flush=True)
        with spark_session_for(scratch) as spark:
            in_worker_thread(lambda: measure(args, bench, spark))


def in_worker_thread(work: Callable[[], None]) -> None:
    """Run `work` in a thread while the main thread waits, ready for signals.

    A Spark action blocks the main thread in a socket read that a signal does not interrupt,
    so SIGTERM or Ctrl-C would wait for the action to end; from here they raise at once, and
    the `finally` blocks stop Spark (cancelling its jobs), the nodes and PostgreSQL.
    """
    failure: list[BaseException] = []

    def target() -> None:
        try:
            work()
        except BaseException as exc:  # re-raised in the main thread
            failure.append(exc)

    worker = threading.Thread(target=target, name="gc-bench", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.5)
    if failure:
        raise failure[0]


def measure(args: argparse.Namespace, bench: Bench, spark: Any) -> None:
    if not args.skip_gc:
        sample_size = max(1, args.records // 100)
        result = spark_gc(bench, spark, args.records, sample_size)
        print("\n".join(report_spark(result)), flush=True)
        print(load_average("after spark gc"), flush=True)
        clear_records(bench.shard.dsn, bench.ring.vnodes)
        daemon = daemon_gc(bench, args.records, result["sample"], args.collector_seconds)
        print("\n".join(report_daemon(daemon)), flush=True)
        print(load_average("after collector"), flush=True)
        clear_records(bench.shard.dsn, bench.ring.vnodes)
    objects, orphans, made = make_blocks(bench, args.blocks)
    print(
        f"audit/orphans set-up: {objects:,} objects x {len(bench.nodes)} nodes = "
        f"{objects * len(bench.nodes):,} blocks + {orphans:,} orphan files per node, "
        f"made on disk and COPYed in {made:.1f} s",
        flush=True,
    )
    audit, audit_seconds = run_timed(bench, spark, "audit")
    print(report_job("audit", audit, audit_seconds, "blocks checked"), flush=True)
    orphan, orphan_seconds = run_timed(bench, spark, "orphans", leeway=timedelta(0))
    print(report_job("orphans", orphan, orphan_seconds, "blocks listed"), flush=True)
    print(load_average("at end"), flush=True)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k records, 20k blocks")
    parser.add_argument("--skip-gc", action="store_true", help="only audit and orphans")
    parser.add_argument("--records", type=int, help="deletion records (default 1M, quick 100k)")
    parser.add_argument("--blocks", type=int, help="blocks for audit/orphans")
    parser.add_argument("--vnodes", type=int, default=16)
    parser.add_argument("--collector-seconds", type=float, help="cap on the collector pass")
    parser.add_argument("--dsn", help="an existing PostgreSQL superuser DSN (default: embedded)")
    parser.add_argument("--scratch", type=Path, help="parent folder of the scratch folder")
    args = parser.parse_args(argv)
    args.records = args.records or (100_000 if args.quick else 1_000_000)
    args.blocks = args.blocks or (20_000 if args.quick else 1_000_000)
    args.collector_seconds = args.collector_seconds or (60.0 if args.quick else 300.0)
    return args


def main(argv: Sequence[str]) -> None:
    import tempfile

    args = parse_args(argv)
    print(f"uptime before: {uptime()}", flush=True)
    started = time.monotonic()
    with (
        exit_on_sigterm(),
        tempfile.TemporaryDirectory(prefix="shoal-gc-bench-", dir=args.scratch) as scratch,
        postgres_server(args.dsn) as admin_dsn,
    ):
        run(args, admin_dsn, Path(scratch))
    print(f"uptime after: {uptime()}; total {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
