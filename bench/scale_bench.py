"""Flat as it grows: S3 operations on a bucket of N objects against one of 100,000.

    .venv/bin/python bench/scale_bench.py --objects 200000 --seconds 5 --rounds 1  # smoke
    .venv/bin/python bench/scale_bench.py --objects 1000000
    .venv/bin/python bench/scale_bench.py                                  # 10,000,000

Server: `shoal serve` (embedded PostgreSQL, 2 storage nodes, the gateway) started in a temp
dir as s3_bench.py starts it, and stopped at the end.

Build: two buckets made through S3, then filled through the metadata API (a MetadataStore
opened on the serve's shard, Objects.put: the gateway's own write path, group-committed by the
write batcher), `--build-in-flight` puts at once from each of `--build-processes` processes.
The rows are those of 16 KiB objects stored in blocks on both nodes (sharks, block_size,
MD5), but the blocks were never written: HEAD, DELETE and LIST read and write the rows only.
So that GET reads real data, `--get-keys` 4 KiB objects are PUT through S3 into each bucket
before the measured phases, under names spread over the whole key space; GET reads those.
After the build, VACUUM ANALYZE of the object tables (what autovacuum does to a bucket that
grew by inserts), timed apart. CPU per object of the build processes and of PostgreSQL.

Measured (the same in both buckets, interleaved op by op, `--rounds` rounds, the bucket that
goes first alternating): at `--clients` clients with the s3_bench load generator (aiohttp,
SigV4), each phase bounded by `--ops` and `--seconds`: PUT 4 KiB of new names at random
places, GET of the S3-written objects, HEAD of random built keys, DELETE of random built keys
(a tenth of the keys is kept for deletes, so no other phase meets a deleted key), and LIST
pages of 1000 keys from random start-after keys; with `--wal-compression METHOD`, PUT phases
with PostgreSQL's wal_compression set to it as well. Then a walk of each bucket in pages of
1000 following continuation tokens (`--walk-pages`, default all), its rate per tenth, and
EXPLAIN (ANALYZE, BUFFERS) of the statement of one page in each bucket.

Sizes: the vnode tables and indexes before and after each build (pg_total_relation_size and
pg_indexes_size over the manta_bucket_* schemas), per object built. Write amplification: WAL
written (pg_current_wal_lsn), full-page images in it (pg_stat_wal) and growth of
PostgreSQL's data directory, per object built, per 4 KiB PUT and per DELETE.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import hashlib
import itertools
import multiprocessing
import random
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import psycopg
from benchlib import (
    VnodeSizes,
    directory_bytes,
    exit_on_sigterm,
    load_average,
    markdown_table,
    percentile,
    serve_shards,
    vnode_sizes,
    wal_full_page_images,
    wal_position,
)
from s3_bench import (
    CORES,
    S3,
    CpuSample,
    Phase,
    Server,
    ServerProcesses,
    list_query,
    machine_lines,
    progress,
    run_phase,
    started_shoal,
    wait_until_writable,
    xml_value,
)

from shoal.config import ShardConfig
from shoal.ids import uuid7
from shoal.metadata import MetadataStore, ObjectWrite
from shoal.metadata.listing import key_range
from shoal.metadata.objects import Reading, listing_statement
from shoal.metadata.shards import positional

KiB = 1024
MiB = 1024 * KiB
SMALL_BUCKET_OBJECTS = 100_000
BUILT_OBJECT_BYTES = 16 * KiB  # above the gateway's inline limit: a row that names blocks
PUT_BYTES = 4 * KiB
PAGE_KEYS = 1000
# One key in this many is kept for the DELETE phases.
DELETE_STRIDE = 10
# Connections of one build process: its puts go out in batches on a few.
BUILD_POOL_SIZE = 8
OPS = ("PUT 4 KiB", "GET 4 KiB", "HEAD", "DELETE", "LIST 1000")
# A PUT phase run with the server's wal_compression set (--wal-compression): the op's name
# is this prefix and the method.
COMPRESSED_PUT = "PUT 4 KiB, wal_compression="


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--objects", type=int, default=10_000_000, help="the big bucket's")
    parser.add_argument("--small-objects", type=int, default=SMALL_BUCKET_OBJECTS)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0, help="bound of one phase")
    parser.add_argument("--ops", type=int, default=5000, help="bound of one phase")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--get-keys", type=int, default=2000, help="4 KiB objects for GET")
    parser.add_argument("--walk-pages", type=int, default=0, help="0: the whole big bucket")
    parser.add_argument("--build-in-flight", type=int, default=256, help="per process")
    parser.add_argument("--build-processes", type=int, default=2)
    parser.add_argument(
        "--wal-compression",
        default="",
        help="also PUT with PostgreSQL's wal_compression set to this (lz4, zstd, pglz)",
    )
    args = parser.parse_args(argv)
    if args.objects < args.small_objects or args.small_objects < DELETE_STRIDE * 100:
        parser.error("--objects must be >= --small-objects >= 1000")
    return args


# -- keys -----------------------------------------------------------------------------------


def built_key(index: int) -> str:
    return f"k/{index:010d}"


@dataclass
class Bucket:
    """A bucket of `count` built keys, and what the phases did to it."""

    label: str
    name: str
    count: int
    get_keys: list[str] = field(default_factory=list)
    deletes: int = 0  # built keys deleted so far
    puts: int = 0

    def kept_key(self, rng: random.Random) -> str:
        """A built key that no DELETE phase removes."""
        group = rng.randrange(self.count // DELETE_STRIDE)
        return built_key(group * DELETE_STRIDE + rng.randrange(DELETE_STRIDE - 1))

    @property
    def deletable(self) -> int:
        """Built keys kept for deletes and not deleted yet."""
        return self.count // DELETE_STRIDE - self.deletes

    def next_deleted_key(self) -> str:
        """A built key not deleted before, at a place that looks random: the groups taken in
        the order of a stride coprime with their number."""
        groups = self.count // DELETE_STRIDE
        group = self.deletes * _coprime_stride(groups) % groups
        self.deletes += 1
        return built_key(group * DELETE_STRIDE + DELETE_STRIDE - 1)


def _coprime_stride(n: int) -> int:
    stride = 7_919  # a prime: coprime with n unless it divides it
    while n % stride == 0:
        stride += 2
    return stride


# -- the build ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildSlice:
    """What one build process writes: keys [first, stop) of one bucket."""

    shard: ShardConfig
    owner: uuid.UUID
    bucket: str
    first: int
    stop: int
    sharks: tuple[str, ...]
    in_flight: int


def build_slice(work: BuildSlice) -> int:
    """Write the slice's object rows (in a process of its own); the count written."""
    return asyncio.run(_build_slice(work))


async def _build_slice(work: BuildSlice) -> int:
    store = await MetadataStore.open([work.shard], BUILD_POOL_SIZE, poll_ring=False)
    md5 = hashlib.md5(b"built", usedforsecurity=False).digest()
    indexes = iter(range(work.first, work.stop))
    written = 0

    async def writer() -> None:
        nonlocal written
        for index in indexes:
            write = ObjectWrite(
                id=uuid7(),
                content_length=BUILT_OBJECT_BYTES,
                content_md5=md5,
                sharks=list(work.sharks),
                properties={"block_size": MiB, "checksums": {}},
            )
            await store.objects.put(work.owner, work.bucket, built_key(index), write)
            written += 1

    try:
        await asyncio.gather(*(writer() for _ in range(work.in_flight)))
    finally:
        await store.close()
    return written


@dataclass(frozen=True)
class Build:
    label: str
    objects: int
    seconds: float
    wal_bytes: int
    wal_full_pages: int
    data_dir_bytes: int
    before: VnodeSizes
    after: VnodeSizes
    vacuum_seconds: float
    cpu: CpuSample  # client: this process and the build processes

    @property
    def rate(self) -> float:
        return self.objects / self.seconds


def build_bucket(
    bucket: Bucket,
    server: Server,
    shard: ShardConfig,
    owner: uuid.UUID,
    sharks: tuple[str, ...],
    args: argparse.Namespace,
    processes: ServerProcesses,
) -> Build:
    """Fill `bucket` with its built keys, in chunks spread over the build processes; the
    rate printed every tenth."""
    assert server.data_dir is not None
    pg_data = server.data_dir / "postgres"
    before = vnode_sizes(shard.dsn)
    wal, disk = wal_position(shard.dsn), directory_bytes(pg_data)
    full_pages = wal_full_page_images(shard.dsn)
    cpu = processes.cpu()
    chunk = max(10_000, bucket.count // 100)
    slices = [
        BuildSlice(
            shard,
            owner,
            bucket.name,
            first,
            min(first + chunk, bucket.count),
            sharks,
            args.build_in_flight,
        )
        for first in range(0, bucket.count, chunk)
    ]
    started = time.perf_counter()
    done, tenth = 0, 1
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(args.build_processes, mp_context=context) as pool:
        try:
            for written in pool.map(build_slice, slices):
                done += written
                while done >= bucket.count * tenth // 10 and tenth <= 10:
                    elapsed = time.perf_counter() - started
                    progress(
                        f"build {bucket.label}: {done:,} objects in {elapsed:.0f} s, "
                        f"{done / elapsed:,.0f} objects/s"
                    )
                    tenth += 1
        except BaseException:
            pool.shutdown(cancel_futures=True)  # stop after the slices under way
            raise
    seconds = time.perf_counter() - started
    cpu = processes.cpu().since(cpu)  # the pool's processes, reaped, count as this one's
    wal_bytes = wal_position(shard.dsn) - wal
    wal_full_pages = wal_full_page_images(shard.dsn) - full_pages
    disk_bytes = directory_bytes(pg_data) - disk
    vacuum_seconds = vacuum_analyze(shard.dsn)
    return Build(
        bucket.label,
        done,
        seconds,
        wal_bytes,
        wal_full_pages,
        disk_bytes,
        before,
        vnode_sizes(shard.dsn),
        vacuum_seconds,
        cpu,
    )


def vacuum_analyze(dsn: str) -> float:
    """VACUUM ANALYZE of every vnode's object table; its seconds."""
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        schemas = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'manta\\_bucket\\_%'"
        ).fetchall()
        for (schema,) in schemas:
            table = psycopg.sql.Identifier(schema, "manta_bucket_object")
            conn.execute(psycopg.sql.SQL("VACUUM (ANALYZE) {}").format(table))
    seconds = time.perf_counter() - started
    progress(f"VACUUM ANALYZE of the object tables: {seconds:.1f} s")
    return seconds


# -- the phases -----------------------------------------------------------------------------


@dataclass
class Measured:
    """One op on one bucket over all rounds, and the WAL and disk its phases wrote."""

    phases: list[Phase] = field(default_factory=list)
    wal_bytes: int = 0
    wal_full_pages: int = 0
    data_dir_bytes: int = 0

    @property
    def ops(self) -> int:
        return sum(p.ops for p in self.phases)

    @property
    def errors(self) -> int:
        return sum(len(p.errors) for p in self.phases)

    @property
    def rate(self) -> float:
        seconds = sum(p.seconds for p in self.phases)
        return self.ops / seconds if seconds else 0.0

    def ms(self, fraction: float) -> float:
        return percentile([t for p in self.phases for t in p.latencies], fraction) * 1000


async def put_get_keys(s3: S3, bucket: Bucket, count: int, clients: int) -> None:
    """PUT `count` 4 KiB objects through S3 next to random built keys: what GET reads."""
    rng = random.Random(1)
    bucket.get_keys = [bucket.kept_key(rng) + ".get" for _ in range(count)]
    body = random.Random(2).randbytes(PUT_BYTES)
    names = iter(dict.fromkeys(bucket.get_keys))

    async def putter() -> None:
        for name in names:
            await s3.call("PUT", bucket.name, name, data=body)

    await asyncio.gather(*(putter() for _ in range(clients)))
    bucket.get_keys = list(dict.fromkeys(bucket.get_keys))


async def run_op(
    op: str,
    s3: S3,
    bucket: Bucket,
    args: argparse.Namespace,
    processes: ServerProcesses,
    round_number: int,
) -> Phase:
    rng = random.Random(f"{op} {bucket.label} {round_number}")
    body = random.Random(2).randbytes(PUT_BYTES)

    async def put(n: int) -> float:
        name = f"{bucket.kept_key(rng)}.put{round_number}-{n}"
        await s3.call("PUT", bucket.name, name, data=body)
        bucket.puts += 1
        return PUT_BYTES

    async def get(n: int) -> float:
        got, _ = await s3.call("GET", bucket.name, rng.choice(bucket.get_keys))
        if len(got) != PUT_BYTES:
            raise RuntimeError(f"GET returned {len(got)} bytes")
        return len(got)

    async def head(n: int) -> float:
        await s3.call("HEAD", bucket.name, bucket.kept_key(rng))
        return 0

    async def delete(n: int) -> float:
        await s3.call("DELETE", bucket.name, bucket.next_deleted_key())
        return 0

    async def page(n: int) -> float:
        query = list_query(None, bucket.kept_key(rng))
        listed, _ = await s3.call("GET", bucket.name, query=query)
        return int(xml_value(listed, "KeyCount"))

    operation = dict(zip(OPS, (put, get, head, delete, page), strict=True)).get(op, put)
    max_ops = min(args.ops, bucket.deletable) if operation is delete else args.ops
    return await run_phase(
        f"{op} ({bucket.label})", args.clients, operation, max_ops, args.seconds, processes
    )


async def measure(
    server: Server,
    buckets: Sequence[Bucket],
    args: argparse.Namespace,
    processes: ServerProcesses,
    dsn: str,
    pg_data: Path,
) -> dict[tuple[str, str], Measured]:
    """Every op on every bucket, interleaved, `args.rounds` times."""
    results = {(op, b.label): Measured() for op in measured_ops(args) for b in buckets}
    async with S3(server, args.clients) as s3:
        for round_number in range(args.rounds):
            order = buckets if round_number % 2 == 0 else list(reversed(buckets))
            for op in measured_ops(args):
                for bucket in order:
                    measured = results[(op, bucket.label)]
                    if op.startswith(COMPRESSED_PUT):
                        set_wal_compression(dsn, args.wal_compression)
                    wal, disk = wal_position(dsn), directory_bytes(pg_data)
                    full_pages = wal_full_page_images(dsn)
                    phase = await run_op(op, s3, bucket, args, processes, round_number)
                    measured.phases.append(phase)
                    measured.wal_bytes += wal_position(dsn) - wal
                    measured.wal_full_pages += wal_full_page_images(dsn) - full_pages
                    measured.data_dir_bytes += directory_bytes(pg_data) - disk
                    if op.startswith(COMPRESSED_PUT):
                        set_wal_compression(dsn, "off")
    return results


def measured_ops(args: argparse.Namespace) -> list[str]:
    ops = list(OPS)
    if args.wal_compression:
        ops.insert(1, COMPRESSED_PUT + args.wal_compression)
    return ops


def set_wal_compression(dsn: str, method: str) -> None:
    """Set the server's wal_compression (full-page images compressed in WAL) for every
    session, the gateway's included (they read it again at their next statement)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        setting = psycopg.sql.SQL("ALTER SYSTEM SET wal_compression = {}")
        conn.execute(setting.format(psycopg.sql.Literal(method)))
        conn.execute("SELECT pg_reload_conf()")


# -- the walk -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Walk:
    label: str
    pages: list[float]  # seconds of each page
    keys: int

    def tenths(self) -> list[float]:
        """Pages per second over each tenth of the pages."""
        n = len(self.pages)
        bounds = [n * i // 10 for i in range(11)]
        return [
            (bounds[i + 1] - bounds[i]) / sum(self.pages[bounds[i] : bounds[i + 1]])
            for i in range(10)
            if bounds[i + 1] > bounds[i]
        ]


async def walk(server: Server, bucket: Bucket, max_pages: int) -> Walk:
    """List the bucket from its start in pages of 1000, following continuation tokens."""
    times: list[float] = []
    keys, token = 0, None
    async with S3(server, 1) as s3:
        while len(times) < max_pages:
            started = time.perf_counter()
            listed, _ = await s3.call("GET", bucket.name, query=list_query(token, None))
            times.append(time.perf_counter() - started)
            keys += int(xml_value(listed, "KeyCount"))
            if len(times) % max(1, min(max_pages, bucket.count // PAGE_KEYS) // 10) == 0:
                progress(f"walk {bucket.label}: {len(times):,} pages, {keys:,} keys")
            if b"<IsTruncated>true</IsTruncated>" not in listed:
                break
            token = xml_value(listed, "NextContinuationToken")
    return Walk(bucket.label, times, keys)


# -- where a listing page's cost goes -------------------------------------------------------


async def explain_listing(
    shard: ShardConfig, owner: uuid.UUID, bucket: Bucket, start_after: str
) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of the statement a LIST page of 1000 sends to the shard
    (Objects._keys' first round, as the gateway prepares it: a generic plan), from
    `start_after`: its first lines and its execution time."""
    async with await MetadataStore.open([shard], 2, poll_ring=False) as store:
        found = await store.buckets.get(owner, bucket.name)
        vnodes = tuple(store.shards.placed()[0].vnodes)
    bounds = key_range("", "", start_after)
    assert bounds is not None
    reading = Reading("", "", bounds, rows=0, arm_limit=0, skip_scan=False)
    text, names = positional(listing_statement(vnodes, reading))
    params = {"owner": owner, "bucket_id": found.id, "lower": bounds[0]}
    params["limit"] = PAGE_KEYS + 1
    values = psycopg.sql.SQL(", ").join(psycopg.sql.Literal(params[n]) for n in names)
    with psycopg.connect(shard.dsn, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(b"PREPARE page AS " + text)
        explain = psycopg.sql.SQL("EXPLAIN (ANALYZE, BUFFERS) EXECUTE page({})").format(values)
        plan = [row[0] for row in conn.execute(explain).fetchall()]
    timing = [line for line in plan if "Execution Time" in line or "Planning Time" in line]
    return [f"{bucket.label}, after {start_after}:", *plan[:6], "  ...", *timing]


# -- the report -----------------------------------------------------------------------------


def ratio(big: float, small: float) -> str:
    return f"{big / small:.2f}" if small else "-"


def ops_table(
    results: dict[tuple[str, str], Measured], ops: Sequence[str], small: str, big: str
) -> str:
    rows = []
    for op in ops:
        a, b = results[(op, small)], results[(op, big)]
        rows.append(
            [
                op,
                f"{a.rate:,.0f}",
                f"{b.rate:,.0f}",
                ratio(b.rate, a.rate),
                f"{a.ms(0.5):.1f} / {b.ms(0.5):.1f}",
                f"{a.ms(0.99):.1f}",
                f"{b.ms(0.99):.1f}",
                ratio(b.ms(0.99), a.ms(0.99)),
                f"{a.ops:,} / {b.ops:,}",
                f"{a.errors} / {b.errors}",
            ]
        )
    headers = [
        "op",
        f"ops/s {small}",
        f"ops/s {big}",
        "rate ratio",
        "p50 ms",
        f"p99 ms {small}",
        f"p99 ms {big}",
        "p99 ratio",
        "ops",
        "errors",
    ]
    return markdown_table(headers, rows)


def build_table(builds: Sequence[Build]) -> str:
    rows = []
    for b in builds:
        grown_tables = b.after.tables - b.before.tables
        grown_indexes = b.after.indexes - b.before.indexes
        rows.append(
            [
                b.label,
                f"{b.objects:,}",
                f"{b.seconds:,.0f}",
                f"{b.rate:,.0f}",
                f"{b.vacuum_seconds:,.0f}",
                f"{b.cpu.client * 1e6 / b.objects:,.0f} / {b.cpu.postgres * 1e6 / b.objects:,.0f}",
                b.cpu.cores(b.seconds),
                f"{b.wal_bytes / b.objects:,.0f}",
                f"{b.wal_full_pages / b.objects:.3f}",
                f"{b.data_dir_bytes / b.objects:,.0f}",
                f"{grown_tables / b.objects:,.0f}",
                f"{grown_indexes / b.objects:,.0f}",
            ]
        )
    headers = ["bucket", "objects", "build s", "objects/s", "VACUUM ANALYZE s"]
    headers += ["CPU us/object: build / postgres", CORES]
    headers += [
        "WAL B/object",
        "full-page images/object",
        "data dir B/object",
        "tables B/object",
        "indexes B/object",
    ]
    return markdown_table(headers, rows)


def sizes_line(sizes: VnodeSizes, objects: int) -> str:
    return (
        f"vnode tables {sizes.tables / MiB:,.0f} MiB + indexes {sizes.indexes / MiB:,.0f} MiB "
        f"(object tables {sizes.object_tables / MiB:,.0f} MiB + indexes "
        f"{sizes.object_indexes / MiB:,.0f} MiB) for {objects:,} built objects: "
        f"{(sizes.tables + sizes.indexes) / objects:,.0f} B/object"
    )


def write_table(
    results: dict[tuple[str, str], Measured], ops: Sequence[str], labels: Sequence[str]
) -> str:
    rows = []
    writes = [op for op in ops if op.startswith("PUT") or op == "DELETE"]
    for op, label in itertools.product(writes, labels):
        m = results[(op, label)]
        rows.append(
            [
                f"{op} in {label}",
                f"{m.ops:,}",
                f"{m.wal_bytes / m.ops:,.0f}" if m.ops else "-",
                f"{m.wal_full_pages / m.ops:.2f}" if m.ops else "-",
                f"{m.data_dir_bytes / m.ops:,.0f}" if m.ops else "-",
            ]
        )
    return markdown_table(
        ["op in bucket", "ops", "WAL B/op", "full-page images/op", "data dir B/op"], rows
    )


def walk_table(walks: Sequence[Walk]) -> str:
    rows = []
    for w in walks:
        seconds = sum(w.pages)
        tenths = w.tenths()
        rows.append(
            [
                w.label,
                f"{len(w.pages):,}",
                f"{w.keys:,}",
                f"{seconds:,.1f}",
                f"{len(w.pages) / seconds:,.1f}",
                " ".join(f"{t:,.0f}" for t in tenths),
                ratio(min(tenths), max(tenths)),
                f"{percentile(w.pages, 0.99) * 1000:.1f}",
            ]
        )
    headers = ["walk of", "pages", "keys", "s", "pages/s", "pages/s per tenth"]
    headers += ["min/max tenth", "p99 ms"]
    return markdown_table(headers, rows)


# -- the run --------------------------------------------------------------------------------


@contextlib.contextmanager
def opened_server() -> Iterator[tuple[Server, ShardConfig, ServerProcesses]]:
    with exit_on_sigterm(), started_shoal("shoal-scale-bench-") as server:
        assert server.data_dir is not None
        yield server, serve_shards(server.data_dir)[0], ServerProcesses.find(server.gateway_pid)


async def account_and_nodes(shard: ShardConfig, bucket: str) -> tuple[uuid.UUID, tuple[str, ...]]:
    """The owner of `bucket` (the serve's root account) and the storage nodes' names."""
    async with await MetadataStore.open([shard], 2, poll_ring=False) as store:
        owner = await store.buckets.owner_of(bucket)
        nodes = await store.nodes.list(timedelta(minutes=5))
    if owner is None:
        raise RuntimeError(f"bucket {bucket} has no owner")
    return owner, tuple(sorted(node.name for node in nodes))


async def prepare(server: Server, buckets: Sequence[Bucket], args: argparse.Namespace) -> None:
    async with S3(server, args.clients) as s3:
        for bucket in buckets:
            await s3.call("PUT", bucket.name)
        waited, refused = await wait_until_writable(s3, buckets[0].name)
        await s3.call("DELETE", buckets[0].name, "probe")
    print(f"first PUT accepted after {waited:.1f} s ({refused} refused before)", flush=True)


async def put_all_get_keys(
    server: Server, buckets: Sequence[Bucket], args: argparse.Namespace
) -> None:
    async with S3(server, args.clients) as s3:
        for bucket in buckets:
            started = time.perf_counter()
            await put_get_keys(s3, bucket, args.get_keys, args.clients)
            progress(
                f"{len(bucket.get_keys):,} objects of 4 KiB PUT through S3 into "
                f"{bucket.label} for GET: {time.perf_counter() - started:.1f} s"
            )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print(load_average("at start"), flush=True)
    suffix = f"{int(time.time())}"
    small = Bucket(f"{args.small_objects:,}", f"scale-small-{suffix}", args.small_objects)
    big = Bucket(f"{args.objects:,}", f"scale-big-{suffix}", args.objects)
    with opened_server() as (server, shard, processes):
        assert server.data_dir is not None
        pg_data = server.data_dir / "postgres"
        print("\n".join(machine_lines(server, processes)), flush=True)
        print(f"settings: {vars(args)}\n", flush=True)
        asyncio.run(prepare(server, [small, big], args))
        owner, sharks = asyncio.run(account_and_nodes(shard, small.name))
        builds = [
            build_bucket(b, server, shard, owner, sharks, args, processes) for b in (small, big)
        ]
        print(
            f"\nBuild (through MetadataStore.objects.put, {args.build_processes} processes x "
            f"{args.build_in_flight} in flight)\n\n{build_table(builds)}\n",
            flush=True,
        )
        print(sizes_line(vnode_sizes(shard.dsn), small.count + big.count) + "\n", flush=True)
        asyncio.run(put_all_get_keys(server, [small, big], args))
        results = asyncio.run(measure(server, [small, big], args, processes, shard.dsn, pg_data))
        print(
            f"\nS3 at {args.clients} clients, {args.rounds} rounds, phases of at most "
            f"{args.ops:,} ops or {args.seconds:g} s; ratios: big / small\n",
            flush=True,
        )
        print(ops_table(results, measured_ops(args), small.label, big.label) + "\n", flush=True)
        print(write_table(results, measured_ops(args), [small.label, big.label]) + "\n", flush=True)
        walks = [asyncio.run(walk(server, b, args.walk_pages or sys.maxsize)) for b in (small, big)]
        print(walk_table(walks) + "\n", flush=True)
        for bucket in (small, big):
            start = bucket.kept_key(random.Random(3))
            plan = asyncio.run(explain_listing(shard, owner, bucket, start))
            print("\n".join(plan) + "\n", flush=True)
    print(load_average("at end"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
