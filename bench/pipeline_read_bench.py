"""How fast the Spark pipeline reads the metadata: the ADBC Arrow readers against the psycopg
row readers of an earlier commit, on the same rows, in one Spark session, interleaved.

    .venv/bin/python bench/pipeline_read_bench.py                   # 250,000 objects, 3 rounds
    .venv/bin/python bench/pipeline_read_bench.py --objects 20000 --rounds 1   # a quick look

Set-up: the embedded PostgreSQL 18 (127.0.0.1, a scratch database, 64 vnodes), one account,
`--buckets` buckets made through the metadata API, and N live objects COPYed into the vnode
the ring names for each (two sharks, a content type, a header and tags each), plus N/10
deletion records. The baseline is shoal/pipeline/io.py of `--baseline` (the last commit whose
partition readers yield psycopg tuples), taken with `git archive` into the scratch folder and
imported as a module of its own (the executors import it from there too); for the psycopg
side its `read_rows` and SQL templates take the place of this checkout's in
`shoal.pipeline.io`. The jobs' tasks now work on the Arrow batches themselves (meter sums
them, inventory makes its report's columns, where they are read), so the psycopg side runs
each job as it was when it read whole rows into Spark (its module at `--baseline-jobs`,
taken the same way): that side is the job as it was with psycopg tuples.

One local[2] Spark session. Each round runs both sides, in alternating order, and times,
after a warm-up read of each:
- read: `io.read_rows(LIVE_OBJECTS)` written to Spark's `noop` sink (every row and column
  made, nothing written), in its own snapshot;
- inventory, meter: `run_job(job, spark=session)`, the whole job (reads, joins, outputs),
  and its read phase as its progress line says (`read objects`, `read metadata`).
Rows per second are the rows read over the seconds (live objects; for meter objects and
records). The ratio is psycopg's seconds over Arrow's, from the medians of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
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
# The last commit whose meter and inventory jobs read whole rows into Spark.
BASELINE_JOBS = "25df7b9"
BASELINE_JOB_MODULES = ("meter", "inventory")
SHARKS = ["dc0:n0", "dc0:n1"]
OBJECT_COLUMNS = (
    "id, name, owner, bucket_id, created, modified, content_length, content_md5, "
    "content_type, headers, sharks, properties"
)
RECORD_COLUMNS = OBJECT_COLUMNS + ", deleted_at"
# Each job measured, and the phase in which it reads the metadata.
READ_PHASES = {"inventory": "read objects", "meter": "read metadata"}


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


def baseline_reader(baseline: str, jobs: str, into: Path) -> Path:
    """The baseline's shoal/pipeline/io.py (of a commit, or a file: for a run from a copy of
    the tree) as `baseline_io.py` in `into`, and BASELINE_JOB_MODULES of `jobs` as
    `baseline_<job>.py`; nothing in the repository changes."""
    into.mkdir(parents=True)
    if Path(baseline).is_file():
        source = Path(baseline).read_text()
    else:
        source = _show(baseline, "shoal/pipeline/io.py")
    (into / "baseline_io.py").write_text(source)
    for job in BASELINE_JOB_MODULES:
        (into / f"baseline_{job}.py").write_text(_show(jobs, f"shoal/pipeline/jobs/{job}.py"))
    return into


def _show(commit: str, path: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{commit}:{path}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


class PhaseLines(logging.Handler):
    """The jobs' final progress lines: seconds per (job, phase)."""

    FINAL = re.compile(r"^(?P<job>\w+): (?P<phase>[\w -]+): done, .* in (?P<seconds>[\d.]+) s$")

    def __init__(self) -> None:
        super().__init__()
        self.seconds: dict[tuple[str, str], float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        found = self.FINAL.match(record.getMessage())
        if found:
            self.seconds[(found["job"], found["phase"])] = float(found["seconds"])


@contextlib.contextmanager
def reader(side: str, baseline: Any) -> Iterator[None]:
    """`shoal.pipeline.io` with the baseline's read_rows and templates for "psycopg", and the
    baseline's modules of BASELINE_JOB_MODULES in place of today's."""
    import importlib

    from shoal.pipeline import io

    if side == "arrow":
        yield
        return
    names = ["read_rows"] + [
        n for n in vars(baseline) if n.isupper() and isinstance(getattr(io, n, None), str)
    ]
    saved = {n: getattr(io, n) for n in names}
    for name in names:
        setattr(io, name, getattr(baseline, name))
    modules = {f"shoal.pipeline.jobs.{job}": f"baseline_{job}" for job in BASELINE_JOB_MODULES}
    today = {name: importlib.import_module(name) for name in modules}
    for name, old in modules.items():
        sys.modules[name] = importlib.import_module(old)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(io, name, value)
        sys.modules.update(today)


def measure(config_file: Path, output: Path, rounds: int) -> dict[str, list[dict[str, float]]]:
    """Both sides, `rounds` times, alternating which goes first, in one Spark session."""
    import baseline_io

    from shoal.config import load_config
    from shoal.pipeline import io, run_job
    from shoal.pipeline.session import spark_session

    config = load_config(config_file, None)
    shards = list(config.metadata.shards)

    async def read_ring() -> Ring:
        async with await MetadataStore.open(shards, 1) as store:
            return store.ring

    ring = asyncio.run(read_ring())
    lines = PhaseLines()
    logging.getLogger("shoal.pipeline").addHandler(lines)
    logging.getLogger("shoal.pipeline").setLevel(logging.INFO)
    started = time.monotonic()
    spark = spark_session("read-bench", "local[2]", output / "spark.log")
    print(f"Spark session started in {time.monotonic() - started:.1f} s", flush=True)

    def read() -> float:
        began = time.monotonic()
        with io.exported_snapshots(shards) as snapshots:
            rows = io.read_rows(spark, shards, ring, snapshots, io.LIVE_OBJECTS)
            rows.write.format("noop").mode("overwrite").save()
        return time.monotonic() - began

    sides = ("psycopg", "arrow")
    for side in sides:  # warm-up: Python workers started, classes loaded
        with reader(side, baseline_io):
            read()
    results: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for round_ in range(rounds):
        for side in sides if round_ % 2 == 0 else reversed(sides):
            figures: dict[str, float] = {}
            with reader(side, baseline_io):
                figures["read"] = read()
                for job, phase in READ_PHASES.items():
                    began = time.monotonic()
                    run_job(job, config, shards, spark=spark, output=output / side)
                    figures[job] = time.monotonic() - began
                    figures[f"{job} read phase"] = lines.seconds[(job, phase)]
            results[side].append(figures)
            shown = ", ".join(f"{k} {v:.1f} s" for k, v in figures.items())
            print(f"round {round_ + 1} {side}: {shown}", flush=True)
    spark.stop()
    return results


# -- main --------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=250_000)
    parser.add_argument("--buckets", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--baseline", default=BASELINE, help="a commit with psycopg readers, or its io.py"
    )
    parser.add_argument(
        "--baseline-jobs",
        default=BASELINE_JOBS,
        help=f"the commit of the jobs that read rows into Spark: {', '.join(BASELINE_JOB_MODULES)}",
    )
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
        # The executors (Python workers the JVM starts) import the baseline from there too.
        baseline = baseline_reader(args.baseline, args.baseline_jobs, scratch / "baseline")
        sys.path.insert(0, str(baseline))
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(baseline), str(ROOT), os.environ.get("PYTHONPATH", "")]
        )
        print(load_average("before"), flush=True)
        results = measure(config, scratch / "out", args.rounds)
        print(load_average("after"), flush=True)
        report(results, args.objects, records)


def report(results: dict[str, list[dict[str, Any]]], objects: int, records: int) -> None:
    rows_read = {
        "read": objects,
        "inventory read phase": objects,
        "meter read phase": objects + records,
        "inventory": objects,
        "meter": objects + records,
    }
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
    print(
        markdown_table(["phase", "psycopg", "rows/s", "arrow", "rows/s", "arrow / psycopg"], table)
    )


if __name__ == "__main__":
    main()
