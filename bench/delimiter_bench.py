"""'/' listings of trees of P prefixes x K keys: the prefix index against reading object rows.

    .venv/bin/python bench/delimiter_bench.py            # 10x1,000, 10x100,000, 10,000x3
    .venv/bin/python bench/delimiter_bench.py --large    # and 10 x 1,000,000 (~3 min more)

Each tree is a bucket of P directories "dDDDDD/" of K keys "dDDDDD/fFFFFFFF", on one shard
of 64 vnodes, loaded in bulk as bench/listing_bench.py loads (its `load`: rows INSERTed per
vnode from a COPY), then the prefix index filled from the rows (queries.FILL_PREFIX_INDEX, what
vnode migration 4 runs over existing rows) and VACUUM ANALYZE.

Each listing goes through the API (store.objects.list), both ways in alternation, so that
the machine's load falls on all alike:

  auto   what objects.list does: rows first, the index once prefixes prove to hold many
         keys, and from the first round for a (bucket, prefix) known to (prefix_index.dense)
  index  the index from the first round, always
  rows   no index: rows in order, then skip scans (what '/' listings did before the index,
         and what other delimiters do)

The cases:

  '/' page        the first page of 1000 of the root: the P common prefixes (P <= 1000)
  '/' walk        every page of the root, by next_marker (P > 1000): pages a second
  dir '/' page    the first page of 1000 of one directory's keys (K leaves)

The claim under test: with the index, a '/' page costs in proportion to its entries, not to
the keys under its common prefixes (the same few ms for K = 1,000 and K = 1,000,000).
"""

from __future__ import annotations

import argparse
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
from shoal.metadata import MetadataStore, prefix_index, queries
from shoal.metadata.shards import render

MEASURED_CODE = (
    "shoal.metadata.queries",
    "shoal.metadata.objects",
    "shoal.metadata.prefix_index",
)
WAYS = ("auto", "index", "rows")


class Everything:
    """As prefix_index.dense, but every listing is dense: the index from the first round."""

    def __contains__(self, listing: object) -> bool:
        return True

    def add(self, listing: object) -> None:
        pass


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


async def fill_prefix_index(dsn: str, vnodes: int) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for vnode in range(vnodes):
            await conn.execute(render(queries.FILL_PREFIX_INDEX, vnode))  # type: ignore[arg-type]


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
    remembered = prefix_index.dense
    listed: dict[str, list[str]] = {}
    entries = pages = 0
    for run in range(args.warmup + args.runs):
        for way in WAYS[run % len(WAYS) :] + WAYS[: run % len(WAYS)]:
            prefix_index.ENABLED = way != "rows"
            prefix_index.dense = Everything() if way == "index" else remembered  # type: ignore[assignment]
            started = time.perf_counter()
            entries, pages, keys = await walk(store, case)
            elapsed = (time.perf_counter() - started) * 1000
            listed[way] = keys
            if run >= args.warmup:
                ms[way].append(elapsed)
    prefix_index.ENABLED, prefix_index.dense = True, remembered
    if not listed["auto"] == listed["index"] == listed["rows"]:
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
        await fill_prefix_index(shard.dsn, args.vnodes)
        await vacuum(shard.dsn)
        print(f"prefix index and VACUUM in {time.perf_counter() - started:.1f} s", flush=True)
        figures = []
        for case in cases(trees):
            result = await measure(store, case, args)
            took = "  ".join(f"{way} {median(result.ms[way]):7.1f} ms" for way in WAYS)
            print(f"  {case.tree.label:<18} {case.label:<14} {took}", flush=True)
            figures.append(result)
        return figures
    finally:
        await store.close()


def table(figures: list[Figures]) -> str:
    headers = ["tree (P x K)", "listing", "entries", "pages"]
    headers += [f"{way} ms/page" for way in WAYS] + [f"{way} pages/s" for way in WAYS]
    headers.append("rows / auto")
    lines = []
    for f in figures:
        per_page = {way: median(f.ms[way]) / f.pages for way in WAYS}
        lines.append(
            [f.case.tree.label, f.case.label, f"{f.entries:,}", f.pages]
            + [f"{per_page[way]:.2f}" for way in WAYS]
            + [f"{1000 / per_page[way]:.0f}" for way in WAYS]
            + [f"{per_page['rows'] / per_page['auto']:.1f}x"]
        )
    return markdown_table(headers, lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large", action="store_true", help="add the 10 x 1,000,000 tree")
    parser.add_argument("--runs", type=int, default=7, help="timed runs of each way")
    parser.add_argument("--warmup", type=int, default=6, help="untimed runs first")
    parser.add_argument("--vnodes", type=int, default=64)
    parser.add_argument(
        "--dsn", help="superuser DSN of an existing PostgreSQL 18 (default: embedded)"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    with postgres_server(args.dsn) as admin, scratch_shard(admin) as shard:
        summary = machine_summary(shard.dsn)
        summary.append(source_digest(*MEASURED_CODE))
        print("\n".join(summary), flush=True)
        figures = shoal.loop.run(benchmark(shard, args))
    summary.append(load_average("at end"))
    print()
    print("\n".join(summary))
    print(f"vnodes={args.vnodes} warm-up={args.warmup} runs={args.runs} (API, medians)")
    print()
    print(table(figures))


if __name__ == "__main__":
    main()
