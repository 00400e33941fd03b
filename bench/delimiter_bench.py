"""'/' listings of trees of P prefixes x K keys: the shard's directory against reading object rows.

    .venv/bin/python bench/delimiter_bench.py            # 10x1,000, 10x100,000, 10,000x3
    .venv/bin/python bench/delimiter_bench.py --large    # and 10 x 1,000,000 (~3 min more)

Each tree is a bucket of P directories "dDDDDD/" of K keys "dDDDDD/fFFFFFFF", on one shard
of 64 vnodes, loaded in bulk as bench/listing_bench.py loads (its `load`: rows INSERTed per
vnode from a COPY, and their directory rows beside them), then VACUUM ANALYZE.

Each listing goes through the API (store.objects.list), both ways in alternation, so that
the machine's load falls on all alike:

  directory  what objects.list does: the directory (directory.py)
  rows       the directory off: rows in order, then skip scans (what other delimiters do)

The cases:

  '/' page        the first page of 1000 of the root: the P common prefixes (P <= 1000)
  '/' walk        every page of the root, by next_marker (P > 1000): pages a second
  dir '/' page    the first page of 1000 of one directory's keys (K leaves)

The claim under test: from the directory, a '/' page costs in proportion to its entries, not
to the keys under its common prefixes (the same for K = 1,000 and K = 1,000,000).

What the directory costs writes (`--writes`): PUTs of new names two levels deep
("w/dN/kRI", 5 directories, so that after the first round the directories' rows exist, as
they do for most PUTs of a live bucket) through the API at 16 at once, into a shard with the
directory and one without it (its vnodes' triggers and leaf index dropped), in alternate
rounds; PUTs a second, and WAL bytes a PUT (the shards share one server, and rounds run one
at a time, so each round's WAL is its own). Then the sizes of the directory beside the
object table of the trees.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass

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
from listing_bench import Layout, load, vacuum

import shoal.loop
from shoal.config import ShardConfig
from shoal.metadata import MetadataStore, ObjectWrite, directory
from shoal.metadata.shards import render

MEASURED_CODE = (
    "shoal.metadata.queries",
    "shoal.metadata.objects",
    "shoal.metadata.directory",
    "shoal.metadata.schema",
)
WAYS = ("directory", "rows")


class Tree(Layout):
    """P directories of K keys, with names long enough for a million keys a directory."""

    def names(self) -> list[str]:
        return [
            f"d{d:05d}/f{f:08d}" for d in range(self.directories) for f in range(self.per_directory)
        ]


@dataclass(frozen=True)
class Case:
    label: str
    tree: Tree
    prefix: str
    walk: bool  # every page by next_marker, not only the first


@dataclass
class Figures:
    case: Case
    entries: int
    pages: int
    ms: dict[str, list[float]]  # per way: milliseconds of each run (of a whole walk)


async def walk(store: MetadataStore, case: Case) -> tuple[int, int, list[str]]:
    """Entries and pages listed, and the entries' keys (to compare the two ways)."""
    owner, bucket = case.tree.bucket.owner, case.tree.bucket.name
    marker, entries, pages, keys = "", 0, 0, []
    while True:
        page = await store.objects.list(
            owner, bucket, prefix=case.prefix, delimiter="/", marker=marker
        )
        pages += 1
        entries += len(page.entries)
        keys += page.common_prefixes + [o.name for o in page.objects]
        if not (case.walk and page.is_truncated):
            return entries, pages, keys
        marker = page.next_marker or ""


async def measure(store: MetadataStore, case: Case, args: argparse.Namespace) -> Figures:
    ms: dict[str, list[float]] = {way: [] for way in WAYS}
    listed: dict[str, list[str]] = {}
    entries = pages = 0
    for run in range(args.warmup + args.runs):
        for way in WAYS[run % len(WAYS) :] + WAYS[: run % len(WAYS)]:
            directory.ENABLED = way != "rows"
            started = time.perf_counter()
            entries, pages, keys = await walk(store, case)
            elapsed = (time.perf_counter() - started) * 1000
            listed[way] = keys
            if run >= args.warmup:
                ms[way].append(elapsed)
    directory.ENABLED = True
    if listed["directory"] != listed["rows"]:
        raise RuntimeError(f"{case.label}: the ways listed different entries")
    return Figures(case, entries, pages, ms)


def cases(trees: list[Tree]) -> list[Case]:
    table = []
    for tree in trees:
        many = tree.directories > 1000
        table.append(Case("'/' walk" if many else "'/' page", tree, "", many))
        if tree.per_directory >= 1000:
            table.append(Case("dir '/' page", tree, "d00003/", False))
    return table


async def benchmark(shard: ShardConfig, args: argparse.Namespace) -> list[Figures]:
    store = await open_store(shard, args.vnodes, pool_max_size=4)
    try:
        account = await store.accounts.create("delimiter-bench")
        shapes = [(10, 1000), (10, 100_000), (10_000, 3)]
        if args.large:
            shapes.insert(2, (10, 1_000_000))
        trees = []
        for directories, keys in shapes:
            bucket = await store.buckets.create(account.id, f"tree-{directories}x{keys}")
            tree = Tree(f"{directories:,} x {keys:,}", bucket, directories, keys)
            started = time.perf_counter()
            await load(store, shard.dsn, tree)
            print(f"loaded {tree.label} in {time.perf_counter() - started:.1f} s", flush=True)
            trees.append(tree)
        started = time.perf_counter()
        await vacuum(shard.dsn)
        print(f"VACUUM in {time.perf_counter() - started:.1f} s", flush=True)
        figures = []
        for case in cases(trees):
            result = await measure(store, case, args)
            took = "  ".join(f"{way} {median(result.ms[way]):7.1f} ms" for way in WAYS)
            print(f"  {case.tree.label:<18} {case.label:<14} {took}", flush=True)
            figures.append(result)
        return figures
    finally:
        await store.close()


# -- what the directory costs writes -------------------------------------------------------

WRITERS = 16
DROP_DIRECTORY = """
DROP TRIGGER directory_add_name ON {schema}.manta_bucket_object;
DROP TRIGGER directory_remove_name ON {schema}.manta_bucket_object;
DROP TRIGGER directory_remove_names ON {schema}.manta_bucket_object;
DROP INDEX {schema}.manta_bucket_object_directory_idx;
"""


@dataclass
class WriteFigures:
    puts: int
    seconds: dict[str, list[float]]
    wal_bytes: dict[str, list[int]]


async def wal_position(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        return int((await cur.fetchone())[0])  # type: ignore[index]


async def put_round(store: MetadataStore, owner: object, bucket: str, names: list[str]) -> None:
    queue = list(reversed(names))

    async def writer() -> None:
        while queue:
            name = queue.pop()
            await store.objects.put(owner, bucket, name, ObjectWrite(0, b"\0" * 16))  # type: ignore[arg-type]

    await asyncio.gather(*(writer() for _ in range(WRITERS)))


async def write_cost(
    with_index: ShardConfig, without: ShardConfig, args: argparse.Namespace
) -> WriteFigures:
    stores = {
        "directory": await open_store(with_index, args.vnodes, pool_max_size=8),
        "none": await open_store(without, args.vnodes, pool_max_size=8),
    }
    try:
        async with await psycopg.AsyncConnection.connect(without.dsn, autocommit=True) as conn:
            for vnode in range(args.vnodes):
                await conn.execute(render(DROP_DIRECTORY, vnode))
        buckets = {}
        for way, store in stores.items():
            account = await store.accounts.create("writer")
            await store.buckets.create(account.id, "writes")
            buckets[way] = account.id
        figures = WriteFigures(args.puts, {w: [] for w in stores}, {w: [] for w in stores})
        for run in range(args.write_rounds):
            for way in list(stores)[run % 2 :] + list(stores)[: run % 2]:
                names = [f"w/d{i % 5}/k{run:02d}{i:06d}" for i in range(args.puts)]
                wal = await wal_position(with_index.dsn)
                started = time.perf_counter()
                await put_round(stores[way], buckets[way], "writes", names)
                figures.seconds[way].append(time.perf_counter() - started)
                figures.wal_bytes[way].append(await wal_position(with_index.dsn) - wal)
            print(f"  write round {run + 1} of {args.write_rounds}", flush=True)
        return figures
    finally:
        for store in stores.values():
            await store.close()


def write_table(figures: WriteFigures) -> str:
    headers = ["schema", "PUTs a round", "PUT/s (median)", "PUT/s (each round)", "WAL bytes a PUT"]
    lines = []
    for way, seconds in figures.seconds.items():
        rates = [figures.puts / s for s in seconds]
        wal = median([b / figures.puts for b in figures.wal_bytes[way]])
        lines.append(
            [
                way,
                f"{figures.puts:,}",
                f"{median(rates):,.0f}",
                " / ".join(f"{r:,.0f}" for r in rates),
                f"{wal:,.0f}",
            ]
        )
    return markdown_table(headers, lines)


SIZES = """
SELECT sum(pg_table_size(format('%I.manta_bucket_object', s))),
       sum(pg_relation_size(format('%I.manta_bucket_object_pkey', s))),
       sum(pg_relation_size(format('%I.manta_bucket_object_directory_idx', s))),
       pg_total_relation_size('shoal.bucket_directory')
FROM (SELECT nspname AS s FROM pg_namespace WHERE nspname LIKE 'manta_bucket_%') AS vnodes
"""


async def sizes(dsn: str) -> str:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(SIZES)
        row = await cur.fetchone()
    labels = ("object table", "its primary key", "leaf index", "directory and its key")
    return ", ".join(
        f"{label} {int(size) / 2**20:.1f} MiB"
        for label, size in zip(labels, row or (), strict=True)
    )


def table(figures: list[Figures]) -> str:
    headers = ["tree (P x K)", "listing", "entries", "pages"]
    headers += [f"{way} ms/page" for way in WAYS] + [f"{way} pages/s" for way in WAYS]
    headers.append("rows / directory")
    lines = []
    for f in figures:
        per_page = {way: median(f.ms[way]) / f.pages for way in WAYS}
        lines.append(
            [f.case.tree.label, f.case.label, f"{f.entries:,}", f.pages]
            + [f"{per_page[way]:.2f}" for way in WAYS]
            + [f"{1000 / per_page[way]:.0f}" for way in WAYS]
            + [f"{per_page['rows'] / per_page['directory']:.1f}x"]
        )
    return markdown_table(headers, lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", action="store_true", help="add the 10 x 1,000,000 tree")
    parser.add_argument("--runs", type=int, default=7, help="timed runs of each way")
    parser.add_argument("--warmup", type=int, default=6, help="untimed runs first")
    parser.add_argument("--vnodes", type=int, default=64)
    parser.add_argument("--writes", action="store_true", help="and what the directory costs PUTs")
    parser.add_argument("--puts", type=int, default=3000, help="PUTs a write round")
    parser.add_argument("--write-rounds", type=int, default=6, help="write rounds, both ways")
    parser.add_argument("--no-lists", action="store_true", help="only the write cost")
    parser.add_argument(
        "--dsn", help="superuser DSN of an existing PostgreSQL 18 (default: embedded)"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    figures: list[Figures] = []
    writes = None
    stored = ""
    with postgres_server(args.dsn) as admin, scratch_shard(admin) as shard:
        summary = machine_summary(shard.dsn)
        summary.append(source_digest(*MEASURED_CODE))
        print("\n".join(summary), flush=True)
        if not args.no_lists:
            figures = shoal.loop.run(benchmark(shard, args))
            stored = shoal.loop.run(sizes(shard.dsn))
        if args.writes:
            with scratch_shard(admin) as with_index, scratch_shard(admin) as without:
                writes = shoal.loop.run(write_cost(with_index, without, args))
    summary.append(load_average("at end"))
    print()
    print("\n".join(summary))
    print(f"vnodes={args.vnodes} warm-up={args.warmup} runs={args.runs} (API, medians)")
    if figures:
        print()
        print(table(figures))
        print()
        print(f"sizes after VACUUM, all three trees: {stored}")
    if writes is not None:
        print()
        print(write_table(writes))


if __name__ == "__main__":
    main()
