"""GET, HEAD and PUT's metadata statements through psycopg's internals, as Shoal runs them,
against the same statements through psycopg's public API.

    PYTHONPATH=. .venv/bin/python bench/psycopg_paths_bench.py            # about 2 minutes
    PYTHONPATH=. .venv/bin/python bench/psycopg_paths_bench.py --quick    # about 30 seconds

Both sides run the gateway's own calls on one shard of 64 vnodes, through two MetadataStores
opened on the same database (one pool each, as one gateway process has): `objects.get` with
the object's bytes (GET), without them (HEAD), and `objects.put` of a 4 KiB object kept in
its row (PUT, an overwrite of one of --keys existing keys), from --clients asyncio tasks.

  internals  today's code: shoal/metadata/batched.py's batches of statements prepared under
             Shoal's names and sent on the connection's libpq handle (prepared.py), results
             loaded by a Transformer kept per prepared statement
  public     the same batchers (same queue, same batch sizes, same connections), but each
             batch goes through psycopg's public API: `conn.pipeline()`, one AsyncRawCursor
             per statement with `execute(..., prepare=True, binary=True)`, `pipeline.sync()`,
             `fetchall()` with dict rows. Its error handling is simpler than batched.py's (a
             failed batch fails all its statements): that only costs on the error path, which
             this benchmark does not take.

Sides alternate within each round (op by op), so that other work on the machine falls on
both alike; each cell is the median over --rounds rounds of --seconds seconds. Printed per op:
ops/s of each side, public/internals, and the client CPU per op (this process: the
gateway's share of the work; PostgreSQL runs in its own processes).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from benchlib import (
    Rate,
    machine_summary,
    markdown_table,
    median,
    open_store,
    parsed_rounds,
    postgres_server,
    rate_for,
    rounds_parser,
    scratch_shard,
    source_digest,
)
from psycopg.rows import dict_row

import shoal.loop
from shoal.metadata import MetadataStore, ObjectWrite, metrics
from shoal.metadata.batched import ReadBatcher, WriteBatcher, _Batcher, _Queued

OPS = ("GET", "HEAD", "PUT")
SIDES = ("internals", "public")
BUCKET = "paths"
OBJECT_BYTES = 4096
VNODES = 64
MEASURED_CODE = ("shoal.metadata.prepared", "shoal.metadata.batched", "psycopg")

Op = Callable[[random.Random], Awaitable[object]]


async def send_public(
    batcher: _Batcher, conn: psycopg.AsyncConnection[Any], batch: list[_Queued]
) -> None:
    """One batch through psycopg's public pipeline: what batched.py's `_send` does below it."""
    if not batch:
        return
    metrics.metadata().batch_sent(metrics.WRITE if batcher.writes else metrics.READ, len(batch))
    cursors = []
    try:
        async with conn.pipeline() as pipeline:
            for queued in batch:
                cursor = psycopg.AsyncRawCursor(conn, row_factory=dict_row)
                await cursor.execute(queued.statement, queued.values, prepare=True, binary=True)
                cursors.append(cursor)
            for queued in batch:
                queued.synced = True
            await pipeline.sync()
            batcher.batches_sent += 1
            for queued, cursor in zip(batch, cursors, strict=True):
                rows = await cursor.fetchall()  # every statement measured returns rows
                if not queued.answer.done():
                    queued.answer.set_result(rows)
    except psycopg.Error as exc:
        if conn.closed:
            raise
        batcher._fail(batch, exc)


class PublicReads(ReadBatcher):
    async def _send(self, conn: psycopg.AsyncConnection[Any], batch: list[_Queued]) -> None:
        await send_public(self, conn, batch)


class PublicWrites(WriteBatcher):
    async def _send(self, conn: psycopg.AsyncConnection[Any], batch: list[_Queued]) -> None:
        await send_public(self, conn, batch)


async def use_public_api(store: MetadataStore) -> None:
    """Give every shard of `store` the public-API batchers."""
    for shard in store.shards.shards.values():
        await shard.reads.close()
        await shard.writes.close()
        shard.reads = PublicReads(shard.pool)
        shard.writes = PublicWrites(shard.pool)


@dataclass
class Cell:
    rates: list[Rate] = field(default_factory=list)

    @property
    def ops_per_second(self) -> float:
        return median([r.ops_per_second for r in self.rates])

    @property
    def cpu_us(self) -> float:
        return median([r.cpu_us_per_op for r in self.rates])


def small_write() -> ObjectWrite:
    """A 4 KiB object kept in its row, as the gateway writes it."""
    data = random.randbytes(OBJECT_BYTES)
    return ObjectWrite(
        content_length=OBJECT_BYTES,
        content_md5=hashlib.md5(data).digest(),
        content_type="application/octet-stream",
        headers={"x-amz-meta-bench": "1"},
        data=data,
    )


def ops_of(store: MetadataStore, owner: uuid.UUID, names: Sequence[str]) -> dict[str, Op]:
    async def get(rng: random.Random) -> object:
        return await store.objects.get(owner, BUCKET, rng.choice(names), with_data=True)

    async def head(rng: random.Random) -> object:
        return await store.objects.get(owner, BUCKET, rng.choice(names), with_data=False)

    async def put(rng: random.Random) -> object:
        return await store.objects.put(owner, BUCKET, rng.choice(names), small_write())

    return {"GET": get, "HEAD": head, "PUT": put}


async def benchmark(args: argparse.Namespace, dsn: str) -> dict[tuple[str, str], Cell]:
    with scratch_shard(dsn) as shard:
        internals = await open_store(shard, VNODES, pool_max_size=20)
        public = await MetadataStore.open([shard], 20)
        try:
            await use_public_api(public)
            account = await internals.accounts.create(f"bench-{uuid.uuid4().hex[:8]}")
            await internals.buckets.create(account.id, BUCKET)
            names = [f"key/{i:06d}" for i in range(args.keys)]
            sides = {
                "internals": ops_of(internals, account.id, names),
                "public": ops_of(public, account.id, names),
            }
            pending = iter(names)

            async def filler() -> None:
                for name in pending:
                    await internals.objects.put(account.id, BUCKET, name, small_write())

            await asyncio.gather(*(filler() for _ in range(args.clients)))
            for side in SIDES:  # every pooled connection prepares its statements
                for op in OPS:
                    await rate_for(sides[side][op], args.clients, 1.0)
            cells: dict[tuple[str, str], Cell] = {}
            for number in range(args.rounds):
                for op in OPS:
                    order = SIDES if number % 2 == 0 else tuple(reversed(SIDES))
                    for side in order:
                        rate = await rate_for(sides[side][op], args.clients, args.seconds)
                        cells.setdefault((op, side), Cell()).rates.append(rate)
                        print(f"round {number + 1} {op} {side}: {rate.line()}", flush=True)
            return cells
        finally:
            await public.close()
            await internals.close()


def report(cells: dict[tuple[str, str], Cell], clients: int) -> str:
    headers = [
        "op",
        "clients",
        "internals ops/s",
        "public ops/s",
        "public/internals",
        "per round",
        "internals CPU us/op",
        "public CPU us/op",
    ]
    rows = []
    for op in OPS:
        a, b = cells[(op, "internals")], cells[(op, "public")]
        rounds = " ".join(
            f"{y.ops_per_second / x.ops_per_second:.0%}"
            for x, y in zip(a.rates, b.rates, strict=True)
        )
        rows.append(
            [
                op,
                clients,
                f"{a.ops_per_second:,.0f}",
                f"{b.ops_per_second:,.0f}",
                f"{b.ops_per_second / a.ops_per_second:.0%}",
                rounds,
                f"{a.cpu_us:.0f}",
                f"{b.cpu_us:.0f}",
            ]
        )
    return markdown_table(headers, rows)


def main() -> None:
    parser = rounds_parser(__doc__.split("\n")[0], rounds=5, seconds=4.0, quick=(2, 2.0))
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--dsn", help="a superuser DSN of an existing server (default: embedded)")
    args = parsed_rounds(parser)
    if args.quick:
        args.keys = 500
    with postgres_server(args.dsn) as dsn:
        for line in machine_summary(dsn):
            print(line)
        print(source_digest(*MEASURED_CODE))
        print(f"psycopg {psycopg.__version__}, libpq {psycopg.pq.version()}, {psycopg.pq.__impl__}")
        cells = shoal.loop.run(benchmark(args, dsn))
        print()
        print(report(cells, args.clients))


if __name__ == "__main__":
    main()
