"""How fast the Spark pipeline reads the metadata: the ADBC Arrow readers against the psycopg
row readers of an earlier commit, on the same rows, interleaved.

    .venv/bin/python bench/pipeline_read_bench.py                   # 250,000 objects, 2 rounds
    .venv/bin/python bench/pipeline_read_bench.py --objects 20000 --rounds 1   # a quick look

Set-up: the embedded PostgreSQL 18 (127.0.0.1, a scratch database, 64 vnodes), one account,
`--buckets` buckets made through the metadata API, and N live objects COPYed into the vnode
the ring names for each (two sharks, a content type, a header and tags each), plus N/10
deletion records. The baseline is `--baseline` (a commit whose readers yield psycopg
tuples), unpacked with `git archive` into the scratch folder; the measured side is this
checkout.

Each round runs both sides, in alternating order, each in a child process of its own
(PYTHONPATH set to its tree) with a local[2] Spark session, and times, after a warm-up read:
- read: `io.read_rows(LIVE_OBJECTS)` written to Spark's `noop` sink (every row and column
  made, nothing written), in its own snapshot;
- inventory, meter: `run_job(job, spark=session)`, the whole job (reads, joins, outputs)
  without the Spark session's start, which is printed apart.
Rows per second are the live objects over the seconds (for meter: over the rows it reads,
objects + records). The ratio is Arrow over psycopg, from the median of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from benchlib import load_average, machine_summary, markdown_table, postgres_server, scratch_shard
from psycopg import sql
from psycopg.types.json import Jsonb

from shoal.config import ShardConfig
from shoal.metadata import MetadataStore, migrate
from shoal.metadata.ring import Ring, vnode_schema

ROOT = Path(__file__).resolve().parents[1]
VNODES = 64
# The last commit whose partition readers yield psycopg tuples.
BASELINE = "0df2b5e"
SHARKS = ["dc0:n0", "dc0:n1"]
OBJECT_COLUMNS = (
    "id, name, owner, bucket_id, created, modified, content_length, content_md5, "
    "content_type, headers, sharks, properties"
)
RECORD_COLUMNS = OBJECT_COLUMNS + ", deleted_at"
JOBS = ("inventory", "meter")


# -- set-up (parent) ---------------------------------------------------------------------------


async def make_buckets(shard: ShardConfig, buckets: int) -> tuple[uuid.UUID, list[uuid.UUID], Ring]:
    from shoal.config import MetadataConfig

    await migrate([shard], MetadataConfig(vnodes=VNODES, partitions_ahead=1))
    async with await MetadataStore.open([shard], 4) as store:
        account = await store.accounts.create("bench")
        ids = [(await store.buckets.create(account.id, f"bench-{i}")).id for i in range(buckets)]
        return account.id, ids, store.ring


def write_objects(
    shard: ShardConfig, owner: uuid.UUID, buckets: list[uuid.UUID], ring: Ring, total: int
) -> float:
    """`total` live objects and total/10 deletion records, COPYed vnode by vnode; seconds."""
    started = time.monotonic()
    now = datetime.now(UTC)
    by_vnode: dict[int, list[tuple[Any, ...]]] = {}
    for index in range(total):
        bucket = buckets[index % len(buckets)]
        name = f"objects/{index // 1000:04d}/object-{index:08d}.bin"
        row = (
            uuid.uuid4(),
            name,
            owner,
            bucket,
            now,
            now,
            1000 + index % 5000,
            index.to_bytes(16, "big"),
            "application/octet-stream",
            {"x-amz-meta-origin": "bench"},
            SHARKS,
            Jsonb({"tags": {"team": "bench"}}),
        )
        by_vnode.setdefault(ring.vnode_for_object(owner, bucket, name), []).append(row)
    with psycopg.connect(shard.dsn) as conn:
        from psycopg.types.hstore import register_hstore

        info = psycopg.types.TypeInfo.fetch(conn, "hstore")
        assert info is not None
        register_hstore(info, conn)
        for vnode, rows in by_vnode.items():
            table = sql.Identifier(vnode_schema(vnode), "manta_bucket_object")
            with conn.cursor().copy(
                sql.SQL("COPY {} ({}) FROM STDIN").format(table, sql.SQL(OBJECT_COLUMNS))
            ) as copy:
                for row in rows:
                    copy.write_row(row)
            records = sql.Identifier(vnode_schema(vnode), "manta_bucket_deleted_object")
            conn.execute(
                sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} WHERE name LIKE '%%0.bin'").format(
                    records,
                    sql.SQL(RECORD_COLUMNS),
                    sql.SQL(OBJECT_COLUMNS + ", current_timestamp"),
                    table,
                )
            )
    return time.monotonic() - started


def baseline_tree(commit: str, into: Path) -> Path:
    """The baseline's `shoal` package, unpacked from git (nothing in the repository changes)."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "shoal"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def run_side(tree: Path, config: Path, output: Path) -> dict[str, Any]:
    """One child: its figures as JSON on its last line of stdout."""
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{ROOT / 'bench'}"}
    child = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", str(config), str(output)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(tree),
        timeout=3600,
        check=False,
    )
    if child.returncode != 0:
        raise SystemExit(f"child in {tree} failed:\n{child.stderr[-4000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


# -- measuring (child) -------------------------------------------------------------------------


def child(config_file: Path, output: Path) -> None:
    """Time the read phase and the jobs with the `shoal` this process imports."""
    import shoal
    from shoal.config import load_config
    from shoal.pipeline import io, run_job
    from shoal.pipeline.session import spark_session

    config = load_config(config_file, None)
    shards = list(config.metadata.shards)

    async def ring() -> Ring:
        async with await MetadataStore.open(shards, 1) as store:
            return store.ring

    the_ring = asyncio.run(ring())
    started = time.monotonic()
    spark = spark_session("read-bench", "local[2]", output / "spark.log")
    figures: dict[str, Any] = {
        "shoal": str(Path(shoal.__file__).parent.parent),
        "session": time.monotonic() - started,
    }

    def read() -> float:
        began = time.monotonic()
        with io.exported_snapshots(shards) as snapshots:
            rows = io.read_rows(spark, shards, the_ring, snapshots, io.LIVE_OBJECTS)
            rows.write.format("noop").mode("overwrite").save()
        return time.monotonic() - began

    read()  # warm-up: Python workers started, classes loaded
    figures["read"] = read()
    for job in JOBS:
        began = time.monotonic()
        run_job(job, config, shards, spark=spark, output=output / "jobs")
        figures[job] = time.monotonic() - began
    spark.stop()
    print(json.dumps(figures))


# -- main --------------------------------------------------------------------------------------


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=250_000)
    parser.add_argument("--buckets", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--baseline", default=BASELINE, help="a commit with psycopg readers")
    parser.add_argument("--dsn", help="an existing server's superuser DSN (default: embedded)")
    args = parser.parse_args()
    with (
        postgres_server(args.dsn) as admin_dsn,
        scratch_shard(admin_dsn) as shard,
        tempfile.TemporaryDirectory(prefix="shoal-read-bench-") as scratch_name,
    ):
        scratch = Path(scratch_name)
        print("\n".join(machine_summary(admin_dsn)), flush=True)
        owner, buckets, ring = asyncio.run(make_buckets(shard, args.buckets))
        seconds = write_objects(shard, owner, buckets, ring, args.objects)
        with psycopg.connect(shard.dsn, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
        records = args.objects // 10
        print(f"{args.objects:,} objects, {records:,} records written in {seconds:.1f} s")
        config = scratch / "shoal.toml"
        config.write_text(
            f'data_dir = "{scratch / "data"}"\n[metadata]\nvnodes = {VNODES}\n'
            f'[[metadata.shards]]\nname = "{shard.name}"\ndsn = "{shard.dsn}"\n'
        )
        config.chmod(0o600)
        sides = {"psycopg": baseline_tree(args.baseline, scratch / "baseline"), "arrow": ROOT}
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
        print(load_average("before"), flush=True)
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            for name in order:
                figures = run_side(sides[name], config, scratch / f"out-{name}-{round_}")
                results[name].append(figures)
                print(f"round {round_ + 1} {name}: {json.dumps(figures)}", flush=True)
        print(load_average("after"), flush=True)
        report(results, args.objects, records)


def report(results: dict[str, list[dict[str, Any]]], objects: int, records: int) -> None:
    rows_read = {"read": objects, "inventory": objects, "meter": objects + records}
    table = []
    for phase, rows in rows_read.items():
        psycopg_s = statistics.median(r[phase] for r in results["psycopg"])
        arrow_s = statistics.median(r[phase] for r in results["arrow"])
        table.append(
            [
                phase,
                f"{psycopg_s:.1f} s",
                f"{rows / psycopg_s:,.0f}",
                f"{arrow_s:.1f} s",
                f"{rows / arrow_s:,.0f}",
                f"{psycopg_s / arrow_s:.2f}x",
            ]
        )
    session = {name: statistics.median(r["session"] for r in rs) for name, rs in results.items()}
    print(
        markdown_table(["phase", "psycopg", "rows/s", "arrow", "rows/s", "arrow / psycopg"], table)
    )
    print(
        f"Spark session start (not in the figures above): psycopg side "
        f"{session['psycopg']:.1f} s, arrow side {session['arrow']:.1f} s"
    )


if __name__ == "__main__":
    main()
