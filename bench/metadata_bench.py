"""Metadata API operations per second, against the pgbench ceiling of the same SQL.

    .venv/bin/python bench/metadata_bench.py            # about 6 minutes on 2 cores
    .venv/bin/python bench/metadata_bench.py --quick    # a smoke run, about 1.5 minutes

What is measured, on one shard of 64 vnodes (the default):

  put     overwrite one of N existing keys: the upsert whose replaced version becomes a
          deletion record in the same statement (queries.PUT_OBJECT)
  get     read one of the N keys (queries.SELECT_OBJECT)
  list    the first page of 1000 keys, no delimiter (LIST_NAMES_ARM, one arm per vnode)
  list /  the first page with delimiter '/' (its first round: LIST_PREFIXES_ARM, rows in order)

Each runs through the async API (asyncio tasks sharing one MetadataStore) at 1 and 16
concurrent callers for a fixed duration, after a warm-up at 16 callers that lets psycopg
prepare the statements on every pooled connection. Beside each, pgbench runs the exact
statement text the API runs (rendered by shoal.metadata.shards.render / render_arms) on the
same server and tables, `-M prepared`, `-c 1` and `-c 16 -j 2`, for the same duration: that is
the ceiling PostgreSQL allows for the statement, and API/pgbench is what the Python layer keeps
of it (target for put: >= 50%). A second pgbench column runs what one API call actually sends:
the bucket lookup (SELECT_BUCKET) and then the statement, so the gap splits into "one more
round trip" and "Python". The three sides alternate in `--rounds` slices (2 x 5 s by default),
so that load from other work on the machine falls on all of them alike.

pgbench cannot pick a ring-placed name at random (names hash to vnodes with BLAKE2b), so its
put/get run on a second bucket whose vnode v holds the keys "v*1000000 + k", as many per vnode
as the API bucket has: same statement, same tables, same rows per table, all overwrites. Its
listings read the API bucket itself. Parameter values are pgbench variables (so they are bound
parameters as with psycopg) except the constant ones (content type, headers, sharks, ...),
which are literals cast to their types, the new version id (uuidv7()), empty strings
(pgbench variables cannot be empty), and the owner and bucket id of the listings (pgbench
binds each use of a variable separately and allows 255 parameters a statement).

After the put phases: the HOT share of updates of manta_bucket_object (n_tup_hot_upd /
n_tup_upd over every vnode's table; target >= 90%), dead tuples, and the deletion records
written (one per overwrite).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import re
import resource
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg
from benchlib import (
    load_average,
    machine_summary,
    markdown_table,
    open_store,
    percentile,
    pg_tool,
    postgres_server,
    run_tool,
    scratch_shard,
    source_digest,
)

import shoal.loop
from shoal.config import ShardConfig
from shoal.metadata import Bucket, MetadataStore, ObjectWrite, queries
from shoal.metadata.listing import first_arm_limit, first_row_budget
from shoal.metadata.objects import Reading, listing_statement
from shoal.metadata.shards import render

OPS = ("put", "get", "list", "list /")
SIDES = ("API", "pgbench", "pgbench+lookup")
CLIENTS = (1, 16)
PGBENCH_THREADS = 2
LIST_LIMIT = 1000
API_BUCKET = "bench-api"
PGBENCH_BUCKET = "bench-pgbench"
STRIDE = 1_000_000  # pgbench's key k of vnode v is the name str(v * STRIDE + k)
MAX_LENGTH = 1 << 20
CONTENT_TYPE = "application/octet-stream"
HEADERS = {"x-amz-meta-bench": "1"}
SHARKS = ["shark-1.local", "shark-2.local"]
PARAMETER = re.compile(r"%\((\w+)\)s")
VARIABLE = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")  # pgbench's :name, not a ::cast
SET_VARIABLE = re.compile(r"^\\set (\w+)", re.MULTILINE)

# How the pgbench scripts spell each parameter of the statements.
PGBENCH_VALUES = {
    "id": "uuidv7()",
    "owner": ":owner",
    "bucket_id": ":bucket_id",
    "name": ":name",
    "creator": "NULL::uuid",
    "content_length": ":content_length",
    "content_md5": "'\\x" + hashlib.md5(b"pgbench").hexdigest() + "'::bytea",
    "content_type": f"'{CONTENT_TYPE}'",
    "headers": "'" + ", ".join(f'"{k}"=>"{v}"' for k, v in HEADERS.items()) + "'::hstore",
    "roles": "'{}'::uuid[]",
    "sharks": "'{" + ",".join(SHARKS) + "}'::text[]",
    "properties": "'{}'::jsonb",
    "prefix": "''",
    "lower": "''",
    "delimiter": ":delimiter",
    "rows": ":rows",
    "arm_limit": ":arm_limit",
    "limit": ":limit",
}

Op = Callable[[random.Random], Awaitable[object]]

# The modules whose code the figures measure (their digests are printed with the figures).
MEASURED_CODE = ("shoal.metadata.queries", "shoal.metadata.objects", "shoal.metadata.base")


@dataclass(frozen=True)
class Setup:
    store: MetadataStore
    dsn: str
    owner: uuid.UUID
    api_bucket: Bucket
    pgbench_bucket: Bucket
    keys: list[tuple[str, bytes]]  # the API bucket's names and their MD5s
    per_vnode: list[int]  # how many of those names each vnode holds


@dataclass(frozen=True)
class Measure:
    ops: int
    seconds: float
    latencies_ms: list[float]
    client_cpu: float  # CPU seconds the client used per second of wall time

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0

    @property
    def p50(self) -> float:
        return percentile(self.latencies_ms, 0.50)

    @property
    def p99(self) -> float:
        return percentile(self.latencies_ms, 0.99)


@dataclass(frozen=True)
class TableStats:
    updates: int
    hot_updates: int
    dead: int
    records: int  # rows inserted into the deleted-object windows

    def since(self, before: TableStats) -> TableStats:
        return TableStats(
            updates=self.updates - before.updates,
            hot_updates=self.hot_updates - before.hot_updates,
            dead=self.dead,
            records=self.records - before.records,
        )


@dataclass(frozen=True)
class PutRun:
    label: str
    puts: int
    stats: TableStats  # what the run changed; `dead` is the count after it

    def then(self, later: PutRun) -> PutRun:
        """This run and a later one with the same label, as one."""
        stats = TableStats(
            updates=self.stats.updates + later.stats.updates,
            hot_updates=self.stats.hot_updates + later.stats.hot_updates,
            dead=later.stats.dead,
            records=self.stats.records + later.stats.records,
        )
        return PutRun(self.label, self.puts + later.puts, stats)


def merged_runs(puts: list[PutRun]) -> list[PutRun]:
    """The runs of each label (the rounds of one side) merged, in order of first appearance."""
    merged: dict[str, PutRun] = {}
    for run in puts:
        merged[run.label] = merged[run.label].then(run) if run.label in merged else run
    return list(merged.values())


@dataclass(frozen=True)
class Row:
    kind: str
    clients: int
    api: Measure
    pgbench: Measure
    pgbench_lookup: Measure


# -- set-up ------------------------------------------------------------------------------


def key_names(count: int) -> list[str]:
    """Names with a '/' so that the delimiter listing has common prefixes (10 keys each)."""
    return [f"dir{i // 10:05d}/obj{i:06d}" for i in range(count)]


async def prepare(store: MetadataStore, dsn: str, count: int) -> Setup:
    account = await store.accounts.create(f"bench-{uuid.uuid4().hex[:8]}")
    api_bucket = await store.buckets.create(account.id, API_BUCKET)
    pgbench_bucket = await store.buckets.create(account.id, PGBENCH_BUCKET)
    keys = [(name, hashlib.md5(name.encode()).digest()) for name in key_names(count)]
    per_vnode = [0] * store.ring.vnodes
    for name, _ in keys:
        per_vnode[store.ring.vnode_for_object(account.id, api_bucket.id, name)] += 1
    setup = Setup(store, dsn, account.id, api_bucket, pgbench_bucket, keys, per_vnode)
    await load_api_keys(setup)
    await load_pgbench_keys(setup)
    return setup


async def load_api_keys(setup: Setup) -> None:
    """Create every key through the API, so that the put phase only overwrites."""
    pending = iter(setup.keys)

    async def loader() -> None:
        for name, md5 in pending:
            await setup.store.objects.put(
                setup.owner, setup.api_bucket.name, name, object_write(md5, 1024)
            )

    await asyncio.gather(*(loader() for _ in range(max(CLIENTS))))


async def load_pgbench_keys(setup: Setup) -> None:
    """pgbench's keys: vnode v holds the names v*STRIDE .. v*STRIDE + per_vnode[v] - 1."""
    statement = """
INSERT INTO {schema}.manta_bucket_object (
    id, owner, bucket_id, name, content_length, content_md5, content_type, headers, roles,
    sharks, properties)
SELECT uuidv7(), %(owner)s, %(bucket_id)s, g::text, 1024, %(md5)s, %(content_type)s,
       %(headers)s, '{{}}', %(sharks)s, '{{}}'
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g
"""
    async with await psycopg.AsyncConnection.connect(setup.dsn, autocommit=True) as conn:
        for vnode, count in enumerate(setup.per_vnode):
            params = {
                "owner": setup.owner,
                "bucket_id": setup.pgbench_bucket.id,
                "md5": hashlib.md5(b"pgbench").digest(),
                "content_type": CONTENT_TYPE,
                "headers": to_hstore(HEADERS),
                "sharks": SHARKS,
                "first": vnode * STRIDE,
                "last": vnode * STRIDE + count - 1,
            }
            await conn.execute(render(statement, vnode), params)  # type: ignore[arg-type]
        await conn.execute("VACUUM ANALYZE")


def to_hstore(values: dict[str, str]) -> str:
    return ", ".join(f'"{k}"=>"{v}"' for k, v in values.items())


def object_write(md5: bytes, length: int) -> ObjectWrite:
    return ObjectWrite(
        content_length=length,
        content_md5=md5,
        content_type=CONTENT_TYPE,
        headers=HEADERS,
        sharks=SHARKS,
    )


# -- the API side ------------------------------------------------------------------------


def api_op(kind: str, setup: Setup) -> Op:
    """One call of the API for `kind`, with a random key where it takes one."""
    objects, owner, bucket, keys = (
        setup.store.objects,
        setup.owner,
        setup.api_bucket.name,
        setup.keys,
    )

    async def put(rnd: random.Random) -> object:
        name, md5 = rnd.choice(keys)
        return await objects.put(owner, bucket, name, object_write(md5, rnd.randint(1, MAX_LENGTH)))

    async def get(rnd: random.Random) -> object:
        return await objects.get(owner, bucket, rnd.choice(keys)[0])

    async def listing(rnd: random.Random) -> object:
        return await objects.list(owner, bucket, limit=LIST_LIMIT)

    async def delimited(rnd: random.Random) -> object:
        return await objects.list(owner, bucket, delimiter="/", limit=LIST_LIMIT)

    return {"put": put, "get": get, "list": listing, "list /": delimited}[kind]


async def drive(op: Op, clients: int, seconds: float) -> Measure:
    """Run `op` from `clients` concurrent tasks until `seconds` have passed."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def caller(seed: int) -> None:
        rnd = random.Random(seed)
        while (start := time.perf_counter()) < deadline:
            await op(rnd)
            latencies.append((time.perf_counter() - start) * 1000)

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(caller(seed) for seed in range(clients)))
    wall = time.perf_counter() - wall
    return Measure(len(latencies), wall, latencies, (time.process_time() - cpu) / wall)


# -- the pgbench side --------------------------------------------------------------------


def pgbench_sql(statement: str, literals: dict[str, str] | None = None) -> str:
    """A rendered statement as a pgbench command: each %(param)s spelled as PGBENCH_VALUES.

    `literals` overrides some spellings: pgbench binds every occurrence of a variable as its
    own parameter (psycopg binds a name once), and allows at most 255 per statement.
    """
    if "%%" in statement:
        raise ValueError("a literal % would need unescaping")
    values = PGBENCH_VALUES | (literals or {})
    return PARAMETER.sub(lambda m: values[m.group(1)], statement).strip() + ";\n"


def bucket_lookup_sql(setup: Setup, bucket: Bucket) -> str:
    """The statement every API object call runs first (Component.bucket)."""
    vnode = setup.store.ring.vnode_for_bucket(setup.owner, bucket.name)
    return pgbench_sql(render(queries.SELECT_BUCKET, vnode), {"name": ":bucket"})


def pgbench_scripts(kind: str, setup: Setup, lookup: bool) -> list[tuple[str, int]]:
    """(script text, weight) pairs for pgbench; `lookup` adds the bucket lookup first."""
    if kind in ("put", "get"):
        template = queries.PUT_OBJECT if kind == "put" else queries.SELECT_OBJECT
        first = bucket_lookup_sql(setup, setup.pgbench_bucket) if lookup else ""
        scripts = []
        for vnode, count in enumerate(setup.per_vnode):
            if count == 0:
                continue
            head = f"\\set name {vnode * STRIDE} + random(0, {count - 1})\n"
            if kind == "put":
                head += f"\\set content_length random(1, {MAX_LENGTH})\n"
            scripts.append((head + first + pgbench_sql(render(template, vnode)), count))
        return scripts
    vnodes = tuple(setup.store.shards.placed()[0].vnodes)
    delimiter = "/" if kind == "list /" else ""
    reading = Reading("", delimiter, ("", None), rows=0, arm_limit=0, skip_scan=False)
    statement = listing_statement(vnodes, reading)  # a listing's first round
    first = bucket_lookup_sql(setup, setup.api_bucket) if lookup else ""
    # 64 arms x 4 uses of owner and bucket_id would pass pgbench's limit of 255 parameters.
    literals = {
        "owner": f"'{setup.owner}'::uuid",
        "bucket_id": f"'{setup.api_bucket.id}'::uuid",
    }
    return [(first + pgbench_sql(statement, literals), 1)]


def pgbench_variables(kind: str, setup: Setup) -> dict[str, str]:
    bucket = setup.pgbench_bucket if kind in ("put", "get") else setup.api_bucket
    return {
        "owner": str(setup.owner),
        "bucket_id": str(bucket.id),
        "bucket": bucket.name,
        "delimiter": "/",
        "rows": str(first_row_budget(LIST_LIMIT + 1)),
        "arm_limit": str(first_arm_limit(LIST_LIMIT + 1, setup.store.shards.ring.vnodes)),
        "limit": str(LIST_LIMIT + 1),
    }


async def pgbench(
    setup: Setup, kind: str, clients: int, seconds: int, lookup: bool, workdir: Path
) -> Measure:
    """Run pgbench with the scripts of `kind`; latencies from its per-transaction log."""
    run_dir = Path(tempfile.mkdtemp(dir=workdir))
    command = [
        pg_tool("pgbench"),
        "--no-vacuum",
        "--protocol=prepared",
        f"--client={clients}",
        f"--jobs={min(clients, PGBENCH_THREADS)}",
        f"--time={seconds}",
        "--log",
        f"--log-prefix={run_dir / 'txn'}",
    ]
    variables = pgbench_variables(kind, setup)
    for name, value in variables.items():
        command.append(f"--define={name}={value}")
    for index, (text, weight) in enumerate(pgbench_scripts(kind, setup, lookup)):
        check_variables(text, set(variables))
        path = run_dir / f"script{index}.sql"
        path.write_text(text)
        command.append(f"--file={path}@{weight}")
    command.append(setup.dsn)
    before = children_cpu()
    result = await asyncio.to_thread(run_tool, command)
    cpu = children_cpu() - before
    return pgbench_measure(result.stdout, run_dir, cpu)


def check_variables(script: str, defined: set[str]) -> None:
    """Every :variable of a script is --define'd or \\set: pgbench binds a missing one as NULL."""
    used = set(VARIABLE.findall(script))
    missing = used - defined - set(SET_VARIABLE.findall(script))
    if missing:
        raise ValueError(f"pgbench script uses undefined variables {sorted(missing)}")


def pgbench_measure(output: str, run_dir: Path, cpu: float) -> Measure:
    tps = float(re.search(r"tps = ([\d.]+)", output).group(1))  # type: ignore[union-attr]
    ops = int(re.search(r"actually processed: (\d+)", output).group(1))  # type: ignore[union-attr]
    latencies = [
        int(line.split()[2]) / 1000
        for log in run_dir.glob("txn.*")
        for line in log.read_text().splitlines()
    ]
    seconds = ops / tps if tps else 0.0
    return Measure(ops, seconds, latencies, cpu / seconds if seconds else 0.0)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# -- table statistics --------------------------------------------------------------------

STATS = """
SELECT
    coalesce(sum(n_tup_upd) FILTER (WHERE relname = 'manta_bucket_object'), 0),
    coalesce(sum(n_tup_hot_upd) FILTER (WHERE relname = 'manta_bucket_object'), 0),
    coalesce(sum(n_dead_tup) FILTER (WHERE relname = 'manta_bucket_object'), 0),
    coalesce(sum(n_tup_ins) FILTER (WHERE relname LIKE 'manta\\_bucket\\_deleted\\_object\\_w%'), 0)
FROM pg_stat_user_tables
"""


async def table_stats(dsn: str) -> TableStats:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        row = await (await conn.execute(STATS)).fetchone()
    return TableStats(*(int(v) for v in row))  # type: ignore[union-attr]


async def settled_stats(dsn: str, before: TableStats, updates: int) -> TableStats:
    """The statistics once `updates` more updates are reported (backends flush them lazily)."""
    for _ in range(60):
        now = await table_stats(dsn)
        if now.updates - before.updates >= updates:
            break
        await asyncio.sleep(0.5)
    return now.since(before)


async def observed(
    setup: Setup, kind: str, label: str, run: Awaitable[Measure], puts: list[PutRun]
) -> Measure:
    """Await one run; for put, record what it did to manta_bucket_object in `puts`."""
    before = await table_stats(setup.dsn) if kind == "put" else None
    measure = await run
    if before is not None:
        stats = await settled_stats(setup.dsn, before, measure.ops)
        puts.append(PutRun(label, measure.ops, stats))
    return measure


# -- the run -----------------------------------------------------------------------------


def side_run(
    setup: Setup, kind: str, side: str, clients: int, seconds: int, workdir: Path
) -> Awaitable[Measure]:
    if side == "API":
        return drive(api_op(kind, setup), clients, seconds)
    return pgbench(setup, kind, clients, seconds, side == "pgbench+lookup", workdir)


async def measure_kind(
    setup: Setup, kind: str, args: argparse.Namespace, workdir: Path, puts: list[PutRun]
) -> list[Row]:
    """One operation: a warm-up at the highest concurrency (so that every pooled connection
    has prepared its statements), then at each concurrency `rounds` alternations of API,
    pgbench and pgbench+lookup, so that all three see the same background load."""
    warm = drive(api_op(kind, setup), max(CLIENTS), args.warmup)
    await observed(setup, kind, f"API warm-up c={max(CLIENTS)}", warm, puts)
    seconds = max(1, args.seconds // args.rounds)
    rows = []
    for clients in CLIENTS:
        slices: dict[str, list[Measure]] = {side: [] for side in SIDES}
        for _ in range(args.rounds):
            for side in SIDES:
                run = side_run(setup, kind, side, clients, seconds, workdir)
                slices[side].append(await observed(setup, kind, f"{side} c={clients}", run, puts))
        api, plain, lookup = (combined(slices[side]) for side in SIDES)
        print(
            f"  {kind:<6} c={clients:<2} API {api.rate:8.0f} ops/s, pgbench {plain.rate:8.0f} "
            f"tps, pgbench+lookup {lookup.rate:8.0f} tps",
            flush=True,
        )
        rows.append(Row(kind, clients, api, plain, lookup))
    return rows


def combined(measures: list[Measure]) -> Measure:
    """Several runs of one side as one: total operations over total time."""
    seconds = sum(m.seconds for m in measures)
    return Measure(
        ops=sum(m.ops for m in measures),
        seconds=seconds,
        latencies_ms=[latency for m in measures for latency in m.latencies_ms],
        client_cpu=sum(m.client_cpu * m.seconds for m in measures) / seconds if seconds else 0.0,
    )


async def benchmark(shard: ShardConfig, args: argparse.Namespace) -> tuple[list[Row], list[PutRun]]:
    store = await open_store(shard, args.vnodes, pool_max_size=max(CLIENTS) + 4)
    try:
        started = time.perf_counter()
        setup = await prepare(store, shard.dsn, args.keys)
        print(f"loaded {args.keys} keys in {time.perf_counter() - started:.1f} s", flush=True)
        check_listing(await setup.store.objects.list(setup.owner, API_BUCKET), args.keys)
        rows: list[Row] = []
        puts: list[PutRun] = []
        with tempfile.TemporaryDirectory(prefix="pgbench-") as workdir:
            for kind in OPS:
                rows += await measure_kind(setup, kind, args, Path(workdir), puts)
        return rows, puts
    finally:
        await store.close()


def check_listing(page: object, keys: int) -> None:
    entries = getattr(page, "entries", [])
    if len(entries) != min(keys, LIST_LIMIT):
        raise RuntimeError(f"the first page lists {len(entries)} keys, not {LIST_LIMIT}")


# -- the report --------------------------------------------------------------------------


def ops_table(rows: list[Row]) -> str:
    headers = [
        "op",
        "clients",
        "API ops/s",
        "API p50 ms",
        "API p99 ms",
        "API client CPU",
        "pgbench tps",
        "pgbench p50 ms",
        "pgbench p99 ms",
        "API/pgbench",
        "pgbench +lookup tps",
        "API/(+lookup)",
    ]
    body = [
        [
            row.kind,
            row.clients,
            f"{row.api.rate:,.0f}",
            f"{row.api.p50:.2f}",
            f"{row.api.p99:.2f}",
            f"{row.api.client_cpu:.0%}",
            f"{row.pgbench.rate:,.0f}",
            f"{row.pgbench.p50:.2f}",
            f"{row.pgbench.p99:.2f}",
            f"{row.api.rate / row.pgbench.rate:.0%}",
            f"{row.pgbench_lookup.rate:,.0f}",
            f"{row.api.rate / row.pgbench_lookup.rate:.0%}",
        ]
        for row in rows
    ]
    return markdown_table(headers, body)


def hot_table(puts: list[PutRun]) -> str:
    headers = [
        "put run",
        "puts",
        "updates",
        "HOT updates",
        "HOT ratio",
        "deletion records",
        "dead tuples after",
    ]
    body = [
        [
            run.label,
            f"{run.puts:,}",
            f"{run.stats.updates:,}",
            f"{run.stats.hot_updates:,}",
            f"{run.stats.hot_updates / run.stats.updates:.1%}" if run.stats.updates else "-",
            f"{run.stats.records:,}",
            f"{run.stats.dead:,}",
        ]
        for run in merged_runs(puts)
    ]
    return markdown_table(headers, body)


def verdict(rows: list[Row], puts: list[PutRun]) -> list[str]:
    lines = []
    for row in rows:
        if row.kind == "put":
            share = row.api.rate / row.pgbench.rate
            met = "met" if share >= 0.5 else "NOT met"
            lines.append(f"put c={row.clients}: API is {share:.0%} of pgbench (>= 50%: {met})")
    api = [run.stats for run in puts if run.label.startswith("API")]
    updates = sum(s.updates for s in api)
    hot = sum(s.hot_updates for s in api) / updates if updates else 0.0
    lines.append(f"HOT ratio of API puts: {hot:.1%} (>= 90%: {'met' if hot >= 0.9 else 'NOT met'})")
    return lines


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 keys, 3 s runs")
    parser.add_argument("--keys", type=int, help="keys overwritten by put (default 10,000)")
    parser.add_argument(
        "--seconds", type=int, help="time each side runs at each concurrency (default 10)"
    )
    parser.add_argument(
        "--rounds", type=int, help="alternations of API and pgbench sharing it (default 2)"
    )
    parser.add_argument(
        "--warmup", type=float, help="API warm-up at 16 clients before each operation (default 5)"
    )
    parser.add_argument("--vnodes", type=int, default=64)
    parser.add_argument(
        "--dsn", help="superuser DSN of an existing PostgreSQL 18 (default: embedded)"
    )
    args = parser.parse_args()
    args.keys = args.keys or (2_000 if args.quick else 10_000)
    args.seconds = args.seconds or (3 if args.quick else 10)
    args.rounds = args.rounds or (1 if args.quick else 2)
    args.warmup = args.warmup if args.warmup is not None else (2.0 if args.quick else 5.0)
    return args


def main() -> None:
    args = parse_args()
    with postgres_server(args.dsn) as admin, scratch_shard(admin) as shard:
        summary = machine_summary(shard.dsn)
        summary.append(
            source_digest("shoal.metadata.queries", "shoal.metadata.objects", "shoal.metadata.base")
        )
        print("\n".join(summary), flush=True)
        rows, puts = shoal.loop.run(benchmark(shard, args))
    summary.append(load_average("at end"))
    print()
    print("\n".join(summary))
    print(
        f"keys={args.keys:,} vnodes={args.vnodes} run={args.seconds}s in {args.rounds} rounds "
        f"warm-up={args.warmup}s "
        f"pgbench -M prepared -j {PGBENCH_THREADS} (1 with -c 1)"
    )
    print()
    print(ops_table(rows))
    print()
    print(hot_table(puts))
    print()
    print("\n".join(verdict(rows, puts)))


if __name__ == "__main__":
    main()
