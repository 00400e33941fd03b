"""Listing a large bucket through the API: what a page costs, and what it grows with.

    .venv/bin/python bench/listing_bench.py            # 1,000,000 objects, about 3.5 minutes
    .venv/bin/python bench/listing_bench.py --quick    # 100,000 objects, about 35 seconds

Three buckets on one shard of 64 vnodes:

  tree   N objects "dir%05d/file%05d": N/10 directories of 10 keys each
  flat   N/10 objects "dir%05d/file00000": as many directories, 1 key each
  dense  N objects in 100 directories of N/100 keys each

They are loaded in bulk: placement (ring.vnode_for_object, BLAKE2b of owner, bucket id and
name) is computed in Python, the names of each vnode are COPYed into a temporary table, and
an INSERT ... SELECT makes the rows in that vnode's manta_bucket_object, and another their
'/' directory rows; then VACUUM ANALYZE.
A sample of keys is read back through the API to prove the placement.

Then each listing is timed through the API (store.objects.list): first page (1000 keys), a
page deep in the bucket (marker near the end), and the delimiter '/' listing over N/10 common
prefixes, first and deep page. Each case runs `--warmup` times first (psycopg prepares a
statement on its 5th run, PostgreSQL settles on a plan after 5 more), then `--runs` times;
the table shows the median. Beside it, the listing's first round of reads run directly on a
connection (no API), to show what is PostgreSQL and what is Python. A second table gives
EXPLAIN ANALYZE of that statement: how many rows the 64 vnode arms hand to the merge, how the
merge sorts them, and planning and execution time. The arms are merged as a Merge Append,
which takes from each arm only the rows the page needs; with a delimiter, up to a budget of
rows (4 per entry wanted at first), one kept per entry, and objects.list reads again from the
last entry only if the page is not yet full (with skip scans if prefixes held many keys).

The claim under test: a page costs in proportion to the entries it returns, and at most
about the vnodes per shard times that, however many keys the common prefixes it rolls up
hold: a delimiter listing reads rows in order while prefixes hold few keys (tree, flat) and
skip-scans when they hold many (dense). Limits 10, 100 and 1000 should cost about 10x apart.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
from benchlib import (
    load_average,
    machine_summary,
    markdown_table,
    median,
    open_store,
    postgres_server,
    scratch_shard,
    source_digest,
)
from psycopg import sql

import shoal.loop
from shoal.config import ShardConfig
from shoal.metadata import Bucket, CommonPrefix, ListingPage, MetadataStore
from shoal.metadata.listing import first_arm_limit, first_row_budget, key_range
from shoal.metadata.objects import Reading, listing_statement
from shoal.metadata.ring import vnode_schema
from shoal.metadata.shards import render

KEYS_PER_DIRECTORY = 10
SAMPLE_GETS = 200
LIMITS = (10, 100, 1000)
COPY_BATCH = 50_000

# The modules whose code the figures measure (their digests are printed with the figures).
MEASURED_CODE = ("shoal.metadata.queries", "shoal.metadata.objects", "shoal.metadata.listing")


@dataclass(frozen=True)
class Layout:
    """A bucket of `directories` directories of `per_directory` keys each."""

    label: str
    bucket: Bucket
    directories: int
    per_directory: int

    @property
    def objects(self) -> int:
        return self.directories * self.per_directory

    def names(self) -> list[str]:
        return [
            f"dir{d:05d}/file{f:05d}"
            for d in range(self.directories)
            for f in range(self.per_directory)
        ]


@dataclass(frozen=True)
class Case:
    label: str
    layout: Layout
    prefix: str = ""
    delimiter: str = ""
    marker: str = ""
    limit: int = 1000


@dataclass(frozen=True)
class Plan:
    """What EXPLAIN ANALYZE says of one run of the statement."""

    rows_merged: int  # rows the vnode arms hand to the merge (Append)
    sort: str
    planning_ms: float
    execution_ms: float


@dataclass(frozen=True)
class Timing:
    case: Case
    entries: int
    api_ms: list[float]
    sql_ms: list[float]
    plan: Plan


# -- loading -----------------------------------------------------------------------------

INSERT_ROWS = """
INSERT INTO {schema}.manta_bucket_object (
    id, owner, bucket_id, name, content_length, content_md5, content_type, headers, roles,
    sharks, properties)
SELECT uuidv7(), %(owner)s, %(bucket_id)s, name, 1024 + length(name), decode(md5(name), 'hex'),
       'application/octet-stream', '', '{{}}', '{{shark-1.local,shark-2.local}}', '{{}}'
FROM load_names ORDER BY name
"""
# The loaded names' '/' directory rows, made in one statement, not by the vnode's triggers
# row by row (the load turns them off in its transaction; what vnode migration 5's fill does).
INSERT_DIRECTORY = """
INSERT INTO shoal.bucket_directory (owner, bucket_id, parent, segment, vnode)
SELECT DISTINCT %(owner)s::uuid, %(bucket_id)s::uuid, level.parent, level.segment, {vnode}
FROM load_names CROSS JOIN LATERAL shoal.directory_levels(load_names.name) AS level
ON CONFLICT DO NOTHING
"""
TRIGGERS = "ALTER TABLE {schema}.manta_bucket_object {switch} TRIGGER directory_add_name"


def placement(store: MetadataStore, layout: Layout) -> list[list[str]]:
    """The names of the layout, grouped by the vnode the ring gives each."""
    by_vnode: list[list[str]] = [[] for _ in range(store.ring.vnodes)]
    owner, bucket_id = layout.bucket.owner, layout.bucket.id
    for name in layout.names():
        by_vnode[store.ring.vnode_for_object(owner, bucket_id, name)].append(name)
    return by_vnode


async def load(store: MetadataStore, dsn: str, layout: Layout) -> None:
    """COPY each vnode's names into a temporary table; INSERT ... SELECT the rows from it."""
    by_vnode = placement(store, layout)
    params = {"owner": layout.bucket.owner, "bucket_id": layout.bucket.id}
    inserted = 0
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute('CREATE TEMPORARY TABLE load_names (name text COLLATE "C")')
        for vnode, names in enumerate(by_vnode):
            async with conn.transaction():
                await copy_names(conn, names)
                await conn.execute(triggers(vnode, "DISABLE"))
                cur = await conn.execute(render(INSERT_ROWS, vnode), params)
                inserted += cur.rowcount
                await conn.execute(triggers(vnode, "ENABLE ALWAYS"))
                await conn.execute(render(INSERT_DIRECTORY, vnode), params)
                await conn.execute("TRUNCATE load_names")
    if inserted != layout.objects:
        raise RuntimeError(f"{layout.label}: inserted {inserted} rows, not {layout.objects}")


def triggers(vnode: int, switch: str) -> sql.Composed:
    return sql.SQL(TRIGGERS).format(
        schema=sql.Identifier(vnode_schema(vnode)), switch=sql.SQL(switch)
    )


async def copy_names(conn: psycopg.AsyncConnection, names: list[str]) -> None:
    async with conn.cursor().copy("COPY load_names (name) FROM STDIN") as copy:
        for start in range(0, len(names), COPY_BATCH):
            await copy.write("".join(f"{n}\n" for n in names[start : start + COPY_BATCH]))


async def vacuum(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("VACUUM (ANALYZE)")


async def check_placement(store: MetadataStore, layout: Layout) -> None:
    """Read a sample of names back through the API: each must be where the ring says."""
    rnd = random.Random(7)
    owner, bucket = layout.bucket.owner, layout.bucket.name
    for _ in range(SAMPLE_GETS):
        d, f = rnd.randrange(layout.directories), rnd.randrange(layout.per_directory)
        name = f"dir{d:05d}/file{f:05d}"
        found = await store.objects.get(owner, bucket, name)
        if found.content_md5 != hashlib.md5(name.encode()).digest():
            raise RuntimeError(f"{name} came back with the wrong row")


# -- timing ------------------------------------------------------------------------------


def statement_and_params(store: MetadataStore, case: Case) -> tuple[str, dict[str, Any]]:
    """What Objects.list sends first for `case` (one shard): its arms and their parameters.

    Most pages need only this first round of reads; a page that needs more (few distinct
    entries per vnode) sends it again from where the first round's merge stopped, and the API
    timing includes those rounds."""
    bounds = key_range(case.prefix, case.delimiter, case.marker)
    if bounds is None:
        raise ValueError(f"{case.label}: empty key range")
    lower, upper = bounds
    vnodes = tuple(store.shards.placed()[0].vnodes)
    wanted = case.limit + 1
    reading = Reading(
        case.prefix,
        case.delimiter,
        bounds,
        rows=first_row_budget(wanted),
        arm_limit=first_arm_limit(wanted, len(vnodes)),
        skip_scan=False,  # every listing's first round reads rows in order
    )
    statement = listing_statement(vnodes, reading)
    params = {
        "owner": case.layout.bucket.owner,
        "bucket_id": case.layout.bucket.id,
        "prefix": case.prefix,
        "delimiter": case.delimiter,
        "lower": lower,
        "upper": upper,
        "rows": reading.rows,
        "arm_limit": reading.arm_limit,
        "limit": wanted,
    }
    return statement, params


async def timed(
    call: Callable[[], Awaitable[Any]], warmup: int, runs: int
) -> tuple[list[float], Any]:
    """Milliseconds of each of `runs` awaited calls after `warmup` untimed ones; the last result."""
    result = None
    for _ in range(warmup):
        result = await call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = await call()
        times.append((time.perf_counter() - start) * 1000)
    return times, result


async def time_case(
    store: MetadataStore, conn: psycopg.AsyncConnection, case: Case, args: argparse.Namespace
) -> Timing:
    owner, bucket = case.layout.bucket.owner, case.layout.bucket.name

    def api() -> Awaitable[ListingPage]:
        return store.objects.list(
            owner,
            bucket,
            prefix=case.prefix,
            delimiter=case.delimiter,
            marker=case.marker,
            limit=case.limit,
        )

    statement, params = statement_and_params(store, case)

    async def direct() -> list[Any]:
        cur = await conn.execute(statement, params, prepare=True)
        return await cur.fetchall()

    api_ms, page = await timed(api, args.warmup, args.runs)
    sql_ms, _ = await timed(direct, args.warmup, args.runs)
    check_page(case, page)
    plan = await explain(conn, statement, params)
    return Timing(case, len(page.entries), api_ms, sql_ms, plan)


async def explain(conn: psycopg.AsyncConnection, statement: str, params: dict[str, Any]) -> Plan:
    cur = await conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params)
    document = (await cur.fetchone())[0][0]  # type: ignore[index]
    nodes = list(plan_nodes(document["Plan"]))
    append = next(n for n in nodes if n["Node Type"] in ("Append", "Merge Append"))
    sort = next((n for n in nodes if n["Node Type"] == "Sort"), None)
    sorted_how = "merge append, no sort" if append["Node Type"] == "Merge Append" else "-"
    if sort is not None:
        space = f"{sort['Sort Space Used']} kB {sort['Sort Space Type'].lower()}"
        sorted_how = f"{sort['Sort Method']}, {space}"
    return Plan(
        rows_merged=round(append["Actual Rows"]),
        sort=sorted_how,
        planning_ms=document["Planning Time"],
        execution_ms=document["Execution Time"],
    )


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def check_page(case: Case, page: ListingPage) -> None:
    """The page starts where it should and holds what it should."""
    if not page.entries:
        raise RuntimeError(f"{case.label}: empty page")
    first = page.entries[0]
    key = first.prefix if isinstance(first, CommonPrefix) else first.name
    if case.marker and key <= case.marker:
        raise RuntimeError(f"{case.label}: page starts at {key!r}, not after the marker")
    if case.delimiter and not case.prefix and not isinstance(first, CommonPrefix):
        raise RuntimeError(f"{case.label}: expected common prefixes, got {key!r}")


def cases(tree: Layout, flat: Layout, dense: Layout) -> list[Case]:
    """First pages at each limit, a deep page, and prefix listings, for each bucket."""
    # 90% of the way in: past 900,000 keys (1M objects), with enough after it that every
    # vnode still fills its share of the page, as on the first page.
    deep = tree.directories * 9 // 10
    deep_key = f"dir{deep:05d}/file00004"
    deep_prefix = f"dir{deep:05d}/"
    middle = f"dir{tree.directories // 2:05d}"
    table = [Case("first page", tree, limit=limit) for limit in LIMITS]
    table.append(Case("deep page (90%)", tree, marker=deep_key))
    for layout in (tree, flat):
        table += [Case("'/' first page", layout, delimiter="/", limit=limit) for limit in LIMITS]
        table.append(Case("'/' deep page (90%)", layout, delimiter="/", marker=deep_prefix))
    table.append(Case("prefix dirNNNNN/ '/'", tree, prefix=f"{middle}/", delimiter="/"))
    table.append(Case("prefix dirNNN '/'", tree, prefix=middle[:-2], delimiter="/"))
    table.append(Case("'/' all prefixes", dense, delimiter="/"))
    return table


# -- the run -----------------------------------------------------------------------------


DENSE_DIRECTORIES = 100


async def setup_layouts(store: MetadataStore, dsn: str, objects: int) -> list[Layout]:
    account = await store.accounts.create(f"bench-{uuid.uuid4().hex[:8]}")
    directories = objects // KEYS_PER_DIRECTORY
    tree = Layout(
        "tree", await store.buckets.create(account.id, "tree"), directories, KEYS_PER_DIRECTORY
    )
    flat = Layout("flat", await store.buckets.create(account.id, "flat"), directories, 1)
    dense = Layout(
        "dense",
        await store.buckets.create(account.id, "dense"),
        DENSE_DIRECTORIES,
        objects // DENSE_DIRECTORIES,
    )
    layouts = [tree, flat, dense]
    for layout in layouts:
        started = time.perf_counter()
        await load(store, dsn, layout)
        print(
            f"loaded {layout.objects:,} objects into {layout.label} in "
            f"{time.perf_counter() - started:.1f} s",
            flush=True,
        )
    started = time.perf_counter()
    await vacuum(dsn)
    print(f"VACUUM ANALYZE in {time.perf_counter() - started:.1f} s", flush=True)
    for layout in layouts:
        await check_placement(store, layout)
    return layouts


async def benchmark(shard: ShardConfig, args: argparse.Namespace) -> list[Timing]:
    store = await open_store(shard, args.vnodes, pool_max_size=4)
    try:
        layouts = await setup_layouts(store, shard.dsn, args.objects)
        timings = []
        async with await psycopg.AsyncConnection.connect(shard.dsn, autocommit=True) as conn:
            await conn.execute("SET plan_cache_mode = force_generic_plan")  # as the store's
            for case in cases(*layouts):
                timing = await time_case(store, conn, case, args)
                print(
                    f"  {case.layout.label:<4} {case.label:<28} {median(timing.api_ms):8.1f} ms",
                    flush=True,
                )
                timings.append(timing)
        return timings
    finally:
        await store.close()


def bucket_label(case: Case) -> str:
    return f"{case.layout.label} ({case.layout.objects:,})"


def timing_table(timings: list[Timing]) -> str:
    headers = [
        "bucket",
        "listing",
        "limit",
        "entries",
        "API median ms",
        "API min-max ms",
        "SQL only median ms",
        "API us/entry",
    ]
    rows = [
        [
            bucket_label(t.case),
            t.case.label,
            t.case.limit,
            t.entries,
            f"{median(t.api_ms):.1f}",
            f"{min(t.api_ms):.1f}-{max(t.api_ms):.1f}",
            f"{median(t.sql_ms):.1f}",
            f"{median(t.api_ms) * 1000 / t.entries:.0f}",
        ]
        for t in timings
    ]
    return markdown_table(headers, rows)


def plan_table(timings: list[Timing]) -> str:
    headers = [
        "bucket",
        "listing",
        "limit",
        "entries",
        "rows from vnode arms",
        "merge sort",
        "planning ms",
        "execution ms",
    ]
    rows = [
        [
            bucket_label(t.case),
            t.case.label,
            t.case.limit,
            t.entries,
            f"{t.plan.rows_merged:,}",
            t.plan.sort,
            f"{t.plan.planning_ms:.1f}",
            f"{t.plan.execution_ms:.1f}",
        ]
        for t in timings
    ]
    return markdown_table(headers, rows)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 objects")
    parser.add_argument("--objects", type=int, help="objects in the tree (default 1,000,000)")
    parser.add_argument("--runs", type=int, default=7, help="timed runs of each listing")
    parser.add_argument("--warmup", type=int, default=10, help="untimed runs first")
    parser.add_argument("--vnodes", type=int, default=64)
    parser.add_argument(
        "--dsn", help="superuser DSN of an existing PostgreSQL 18 (default: embedded)"
    )
    args = parser.parse_args()
    args.objects = args.objects or (100_000 if args.quick else 1_000_000)
    return args


def main() -> None:
    args = parse_args()
    with postgres_server(args.dsn) as admin, scratch_shard(admin) as shard:
        summary = machine_summary(shard.dsn)
        summary.append(source_digest(*MEASURED_CODE))
        print("\n".join(summary), flush=True)
        timings = shoal.loop.run(benchmark(shard, args))
    summary.append(load_average("at end"))
    print()
    print("\n".join(summary))
    print(f"objects={args.objects:,} vnodes={args.vnodes} warm-up={args.warmup} runs={args.runs}")
    print()
    print(timing_table(timings))
    print()
    print("EXPLAIN ANALYZE of one run of each statement (parameters bound, so a custom plan):")
    print()
    print(plan_table(timings))


if __name__ == "__main__":
    main()
