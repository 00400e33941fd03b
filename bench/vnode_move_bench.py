"""How long a vnode takes to move to another shard, per million object rows, how long its
writes pause, and what clients of that vnode see meanwhile.

    python bench/vnode_move_bench.py [--rows 1000000] [--clients 16] [--dsn DSN]

Two scratch databases of one PostgreSQL server are the shards (the embedded server, or the
one `--dsn` names): vnode 0 of the first gets `--rows` object rows (written in bulk by SQL),
the second is added with `add_shard`, and the vnode moves there (moves.Mover: logical
replication, its initial COPY, the fence, the switch) while `--clients` callers PUT and GET
objects of vnode 0 through the metadata API, which follows the ring to the new shard.

Printed: the move's copy time (and per million rows), the write pause the mover measured
(fence -> switch), the longest call the clients saw during the move, and their operations
per second before, during the copy, and after the switch.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import secrets
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import psycopg
from psycopg import sql

import shoal.loop
from bench.benchlib import machine_summary, postgres_server
from shoal.config import MetadataConfig, ShardConfig
from shoal.metadata import MetadataStore, ObjectWrite, migrate
from shoal.metadata.moves import Mover, add_shard

VNODES = 4
FILL = """
INSERT INTO manta_bucket_0.manta_bucket_object
    (id, name, owner, bucket_id, content_length, content_md5, content_type, headers, sharks)
SELECT gen_random_uuid(), 'filler/' || lpad(g::text, 9, '0'), %(owner)s, %(bucket_id)s,
       4096, decode(md5(g::text), 'hex'), 'application/octet-stream',
       'a=>1'::hstore, ARRAY['1.stor.local', '2.stor.local']
FROM generate_series(%(first)s, %(last)s) AS g
"""


@contextlib.contextmanager
def scratch_databases(admin_dsn: str, count: int) -> Iterator[list[ShardConfig]]:
    names = [f"shoal_bench_{uuid.uuid4().hex[:10]}" for _ in range(count)]
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield [
            ShardConfig(f"s{i}", psycopg.conninfo.make_conninfo(admin_dsn, dbname=name))
            for i, name in enumerate(names)
        ]
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            for name in names:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


class Clients:
    """Callers doing PUT and GET (one in two) on objects of vnode 0; each call's end time
    and duration."""

    def __init__(self, store: MetadataStore, owner: uuid.UUID, bucket: str, names: list[str]):
        self.store, self.owner, self.bucket, self.names = store, owner, bucket, names
        self.calls: list[tuple[float, float]] = []
        self.errors: list[str] = []
        self.stop = asyncio.Event()

    async def run(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            name = rng.choice(self.names)
            started = time.monotonic()
            try:
                if rng.random() < 0.5:
                    write = ObjectWrite(rng.randrange(1 << 20), secrets.token_bytes(16))
                    await self.store.objects.put(self.owner, self.bucket, name, write)
                else:
                    with contextlib.suppress(Exception):
                        await self.store.objects.get(self.owner, self.bucket, name)
            except Exception as exc:  # a 503 to a client: counted, and it tries again
                self.errors.append(type(exc).__name__)
            ended = time.monotonic()
            self.calls.append((ended, ended - started))

    def rate(self, start: float, end: float) -> float:
        done = sum(1 for ended, _ in self.calls if start <= ended < end)
        return done / max(end - start, 1e-9)

    def longest(self, start: float, end: float) -> float:
        return max((took for ended, took in self.calls if start <= ended < end), default=0.0)


async def bench(admin_dsn: str, rows: int, clients: int) -> None:
    with scratch_databases(admin_dsn, 2) as (first, second):
        config = MetadataConfig(vnodes=VNODES, partitions_ahead=1)
        await migrate([first], config)
        key = secrets.token_bytes(32)
        await add_shard(first, second, key, config)
        store = await MetadataStore.open([first], clients + 4, shard_key=key)
        try:
            account = await store.accounts.create("bench")
            bucket = await store.buckets.create(account.id, "moving")
            started = time.monotonic()
            async with await psycopg.AsyncConnection.connect(first.dsn, autocommit=True) as conn:
                for low in range(1, rows + 1, 100_000):
                    high = min(low + 99_999, rows)
                    await conn.execute(
                        FILL,
                        {"owner": account.id, "bucket_id": bucket.id, "first": low, "last": high},
                    )
                await conn.execute("VACUUM ANALYZE manta_bucket_0.manta_bucket_object")
            print(f"filled vnode 0 with {rows:,} rows in {time.monotonic() - started:.1f} s")
            ring = store.ring
            names = [
                name
                for name in (f"hot/{n:05d}" for n in range(4000))
                if ring.vnode_for_object(account.id, bucket.id, name) == 0
            ][:500]
            load = Clients(store, account.id, "moving", names)
            callers = [asyncio.create_task(load.run(seed)) for seed in range(clients)]
            await asyncio.sleep(3)
            move_started = time.monotonic()
            async with Mover([first, second], config, grace=timedelta(0)) as mover:
                result = await mover.move(0, second.name)
                switched = time.monotonic()
                await asyncio.sleep(3)
                load.stop.set()
                await asyncio.gather(*callers)
                await mover.finish(now=True)
            assert result is not None
            copy_end = move_started + result.copy_seconds
            print(
                f"copy {result.copy_seconds:.2f} s "
                f"({result.copy_seconds / max(rows, 1) * 1e6:.2f} s per million rows); "
                f"write pause {result.write_pause_seconds * 1000:.0f} ms (fence -> switch)"
            )
            print(
                f"clients ({clients}): longest call during the move "
                f"{load.longest(move_started, switched + 0.5) * 1000:.0f} ms; ops/s before "
                f"{load.rate(move_started - 3, move_started):,.0f}, during the copy "
                f"{load.rate(move_started, copy_end):,.0f}, after the switch "
                f"{load.rate(switched, switched + 3):,.0f}; errors {len(load.errors)}"
                + (f" ({', '.join(sorted(set(load.errors)))})" if load.errors else "")
            )
        finally:
            await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="object rows in the vnode")
    parser.add_argument("--clients", type=int, default=16, help="concurrent callers")
    parser.add_argument("--dsn", help="a superuser DSN of an existing server (wal_level=logical)")
    args = parser.parse_args()
    with postgres_server(args.dsn) as admin_dsn:
        print("\n".join(machine_summary(admin_dsn)))
        shoal.loop.run(bench(admin_dsn, args.rows, args.clients))


if __name__ == "__main__":
    main()
