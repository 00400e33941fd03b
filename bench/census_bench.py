"""The GC backlog as the census reads it, against the full count it replaces.

    .venv/bin/python bench/census_bench.py --quick    # 200,000 records
    .venv/bin/python bench/census_bench.py            # 2,000,000 records

Set-up: the embedded PostgreSQL 18 (127.0.0.1, a scratch database as the one shard, 16
vnodes, one-day windows). N deletion records are written with bulk SQL into the vnodes'
`manta_bucket_deleted_object` (sizes 0 to 2 MiB, uniform), deleted an hour ago; then the
statistics are flushed (no ANALYZE: what a live shard has is what inserts leave).

Measured, each `--rounds` times (median, in ms): the full count (the statement `gc status`
ran before: count, sum and min over every deleted table), `read_backlog` as the census runs
it (estimated past EXACT_BACKLOG_LIMIT records), and `read_backlog` made to count exactly.
Printed with the records and bytes each reported, and the estimate's error.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from benchlib import machine_summary, markdown_table, postgres_server, scratch_shard, source_digest
from psycopg import sql

from shoal.config import MetadataConfig
from shoal.metadata import migrate, queries
from shoal.metadata.garbage import read_backlog
from shoal.metadata.ring import vnode_schema
from shoal.metadata.shards import render_arms

VNODES = 16
RECORD_COLUMNS = (
    "id, name, owner, bucket_id, created, modified, content_length, content_type, sharks, "
    "deleted_at"
)


def write_records(dsn: str, total: int) -> float:
    """`total` deletion records spread over the vnodes; returns the seconds it took."""
    started = time.monotonic()
    deleted_at = datetime.now(UTC) - timedelta(hours=1)
    owner, bucket = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for vnode in range(VNODES):
            count = total // VNODES + (1 if vnode < total % VNODES else 0)
            table = sql.Identifier(vnode_schema(vnode), "manta_bucket_deleted_object")
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} ({}) SELECT uuidv7(), 'census/' || g, %(owner)s, "
                    "%(bucket)s, %(at)s, %(at)s, (random() * 2097152)::bigint, "
                    "'application/octet-stream', ARRAY['dc0:n0', 'dc0:n1'], %(at)s "
                    "FROM generate_series(1, %(count)s) g"
                ).format(table, sql.SQL(RECORD_COLUMNS)),
                {"owner": owner, "bucket": bucket, "at": deleted_at, "count": count},
            )
        conn.execute("SELECT pg_stat_force_next_flush()")
    time.sleep(1.5)  # the statistics are flushed when the session is idle
    return time.monotonic() - started


async def timed(
    dsn: str, rounds: int, read: Callable[[psycopg.AsyncConnection[Any]], Awaitable[Any]]
) -> tuple[float, Any]:
    """The median milliseconds of `read` on one connection, and what it last returned."""
    times = []
    result = None
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for _ in range(rounds):
            started = time.perf_counter()
            result = await read(conn)
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), result


async def full_count(conn: psycopg.AsyncConnection[Any]) -> tuple[int, int]:
    statement = render_arms(queries.GC_BACKLOG, queries.GC_BACKLOG_ARM, tuple(range(VNODES)))
    row = await (await conn.execute(statement)).fetchone()
    assert row is not None
    return row[0], row[1]


async def measure(dsn: str, rounds: int) -> list[list[object]]:
    vnodes = list(range(VNODES))
    counted_ms, (records, size) = await timed(dsn, rounds, full_count)
    census_ms, census = await timed(dsn, rounds, lambda c: read_backlog(c, "shard0", vnodes))
    exact_ms, exact = await timed(
        dsn, rounds, lambda c: read_backlog(c, "shard0", vnodes, exact_limit=sys.maxsize)
    )

    def error(value: int, truth: int) -> str:
        return f"{100 * (value - truth) / truth:+.2f} %" if truth else "-"

    how = "exact"
    if census.estimated:
        how = f"estimated: records {error(census.records, records)}, "
        how += f"bytes {error(census.bytes, size)}"

    return [
        ["full count (before)", f"{counted_ms:,.1f}", f"{records:,}", f"{size:,}", "exact"],
        [
            "census (read_backlog)",
            f"{census_ms:,.1f}",
            f"{census.records:,}",
            f"{census.bytes:,}",
            how,
        ],
        [
            "read_backlog, exact",
            f"{exact_ms:,.1f}",
            f"{exact.records:,}",
            f"{exact.bytes:,}",
            "exact",
        ],
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200,000 records")
    parser.add_argument("--records", type=int, help="deletion records (default 2,000,000)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dsn", help="an existing server's superuser DSN (default: embedded)")
    args = parser.parse_args()
    total = args.records or (200_000 if args.quick else 2_000_000)
    with postgres_server(args.dsn) as admin_dsn, scratch_shard(admin_dsn) as shard:
        asyncio.run(migrate([shard], MetadataConfig(vnodes=VNODES, partitions_ahead=1)))
        seconds = write_records(shard.dsn, total)
        print("\n".join(machine_summary(shard.dsn)))
        print(source_digest("shoal.metadata.garbage", "shoal.metadata.queries"))
        print(f"{total:,} deletion records over {VNODES} vnodes, written in {seconds:.1f} s")
        rows = asyncio.run(measure(shard.dsn, args.rounds))
        print(markdown_table(["reading", "median ms", "records", "bytes", "how"], rows))


if __name__ == "__main__":
    main()
