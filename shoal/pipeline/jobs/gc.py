"""`shoal pipeline gc`: reclaim all garbage in parallel across shards and storage nodes.

Phases: (1) read, from one snapshot per shard, every deletion record older than the leeway
and every row of a bucket incarnation deleted before it; (2) expand each to its blocks and
delete them node by node, in batches; (3) remove the rows whose blocks are all gone: a window
of deletion records that holds nothing else is truncated whole, other windows lose their rows
by id and are vacuumed afterwards, so no dead tuples are left; (4) drop deleted-bucket records
with nothing left, and every past window left empty.
Each phase is idempotent: run again after a crash, the job converges.

"Block replicas deleted" counts what the nodes report they removed (one block on one node),
as the daemon does; replicas already missing are counted apart.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark import RDD
from pyspark.sql import Row
from pyspark.sql import functions as F
from pyspark.sql import types as T

from shoal.metadata import MetadataStore
from shoal.metadata.garbage import GcRun, vacuum_windows
from shoal.metadata.partitions import window_name, window_start
from shoal.pipeline import io
from shoal.pipeline.context import JobContext, Summary
from shoal.storage import block_runs


def run(ctx: JobContext) -> Summary:
    leeway: timedelta = ctx.options.get("leeway", ctx.config.gc.leeway)
    phases: dict[str, float] = {}
    clock = time.monotonic()
    cutoff = io.database_time_minus(ctx.shards[0], leeway.total_seconds())
    urls = ctx.node_urls()
    access = io.node_access(ctx.config)
    width = ctx.with_store(_window_width)

    ctx.progress.begin("read records")
    with io.exported_snapshots(ctx.shards) as snapshots:
        records = io.read_rows(
            ctx.spark, ctx.shards, ctx.ring, snapshots, io.DELETION_RECORDS, cutoff=cutoff
        )
        dead = _dead_buckets(ctx, snapshots, cutoff)
        garbage = records
        if dead:
            contents = io.read_rows(
                ctx.spark,
                ctx.shards,
                ctx.ring,
                snapshots,
                io.DEAD_BUCKET_CONTENTS,
                dead=[d[0] for d in dead],
            )
            garbage = records.unionByName(contents)
        garbage = garbage.cache()
        found = garbage.count()
    phases["read"] = _lap(clock)

    ctx.progress.begin("delete blocks")
    keyed = garbage.rdd.map(lambda r: ((r.shard, r.vnode, r.kind, r.id), r))
    blocks = keyed.flatMap(lambda kv: _blocks(kv[0], kv[1], urls))
    # One task per node (an explicit partitioner: hashing names could put two in one task).
    node_index = {shark: index for index, shark in enumerate(sorted(urls))}
    batches = (
        blocks.map(lambda b: (b[0], b))
        .partitionBy(max(1, len(node_index)), lambda shark: node_index.get(shark, 0))
        .values()
        .mapPartitions(lambda rows: io.delete_blocks(rows, access))
        .cache()
    )
    status = reclaim_status(keyed, batches).cache()
    status.count()
    sent, replicas_deleted, replicas_kept = batches.map(
        lambda b: (len(b[0]), b[2], 0 if b[1] else len(b[0]))
    ).fold((0, 0, 0), lambda x, y: (x[0] + y[0], x[1] + y[1], x[2] + y[2]))
    # One line per node that failed a batch, with the first reason it gave.
    node_failures = dict(
        batches.filter(lambda b: not b[1]).map(lambda b: (b[3], b[4])).reduceByKey(min).collect()
    )
    replicas_missing = sent - replicas_deleted - replicas_kept
    reclaimable = status.filter(lambda s: s[1]).map(lambda s: s[0])
    phases["delete blocks"] = _lap(clock, sum(phases.values()))

    ctx.progress.begin("remove records")
    dsns = ctx.dsns
    removals = (
        reclaimable.map(lambda r: ((r.shard, r.vnode), _removal(r, width)))
        .partitionBy(max(1, ctx.ring.vnodes))
        .values()
        .mapPartitions(lambda rows: io.remove_rows(rows, dsns))
        .collect()
    )
    removed = sum(r[0] for r in removals)
    truncated = sum(r[1] for r in removals)
    to_vacuum = [window for r in removals for window in r[2]]
    reclaimed_bytes = reclaimable.map(lambda r: r.content_length or 0).sum()
    phases["remove records"] = _lap(clock, sum(phases.values()))

    ctx.progress.begin("vacuum windows")
    # After every removal has committed, so that no transaction of this job still needs the
    # dead tuples and the vacuum can reclaim them all.
    for shard in ctx.shards:
        windows_here = [(vnode, name) for s, vnode, name in to_vacuum if s == shard.name]
        if windows_here:
            with io.connect(shard.name, shard.dsn) as conn:
                vacuum_windows(conn, windows_here)
    phases["vacuum"] = _lap(clock, sum(phases.values()))

    buckets_dropped, windows = ctx.with_store(lambda store: _finish(store, dead))
    phases["buckets and windows"] = _lap(clock, sum(phases.values()))

    report_schema = T.StructType(
        [*io.RECORD_SCHEMA.fields, T.StructField("reclaimed", T.BooleanType())]
    )
    report = ctx.spark.createDataFrame(status.map(lambda s: (*s[0], s[1])), report_schema)
    report.withColumn("run_started", F.lit(ctx.started)).write.mode("overwrite").parquet(
        str(ctx.output / "records")
    )
    failed = found - removed
    ctx.with_store(
        lambda store: store.gc_book.record_run(
            GcRun(
                kind="spark",
                leeway=leeway,
                started=ctx.started,
                finished=datetime.now(UTC),
                records_found=found,
                records_reclaimed=removed,
                records_failed=failed,
                blocks_deleted=replicas_deleted,
                bytes_reclaimed=int(reclaimed_bytes or 0),
                windows_dropped=windows,
            )
        )
    )
    figures: dict[str, Any] = {
        "records found": found,
        "records reclaimed": removed,
        "records kept (node down)": failed,
        "block replicas deleted": replicas_deleted,
        "block replicas already gone": replicas_missing,
        "block replicas kept (node down)": replicas_kept,
        "bytes reclaimed": int(reclaimed_bytes or 0),
        "deleted buckets finished": buckets_dropped,
        "windows truncated whole": truncated,
        "windows vacuumed": len(to_vacuum),
        "windows dropped": windows,
    }
    figures |= {f"seconds: {name}": round(seconds, 2) for name, seconds in phases.items()}
    figures["seconds: total"] = round(time.monotonic() - clock, 2)
    figures["records per second"] = round(found / max(time.monotonic() - clock, 1e-9))
    problems = [
        f"block delete failed on {shark}: {reason}; its records are kept for a later run"
        for shark, reason in sorted(node_failures.items())
    ]
    return Summary("gc", figures, ctx.output, problems)


def reclaim_status(keyed: RDD[Any], batches: RDD[Any]) -> RDD[Any]:
    """(record, whether it may go) for each ((shard, vnode, kind, id), record) of `keyed`,
    from the outcomes of the delete batches (record keys, succeeded, count): a record may go
    unless a batch holding one of its blocks failed. Pure RDD work, testable on inline rows."""
    outcomes = batches.flatMap(lambda b: [(key, b[1]) for key in b[0]]).reduceByKey(
        lambda a, b: a and b
    )
    # A record without blocks (an empty object) has nothing to wait for.
    return keyed.leftOuterJoin(outcomes).map(lambda kv: (kv[1][0], kv[1][1] is not False))


def _removal(row: Row, width: timedelta) -> tuple[Any, ...]:
    """What the remove phase needs of a row, with the window a deletion record lives in."""
    window = ""
    if row.kind == "record":
        # PySpark hands timestamps over as naive local times: astimezone reads them as such.
        deleted_at = row.deleted_at.astimezone(UTC)
        window = window_name("manta_bucket_deleted_object", window_start(deleted_at, width))
    return (row.shard, row.vnode, row.kind, row.id, row.owner, row.bucket_id, window)


async def _window_width(store: MetadataStore) -> timedelta:
    return store.gc_book.window


def _blocks(key: tuple[Any, ...], row: Row, urls: dict[str, str]) -> list[tuple[Any, ...]]:
    properties = json.loads(row.properties) if row.properties else {}
    runs = block_runs(uuid.UUID(row.id), row.content_length or 0, row.sharks or [], properties)
    return [
        (shark, urls.get(shark, ""), name, key)
        for run in runs
        for shark in run.sharks
        for name in run.block_names()
    ]


def _dead_buckets(
    ctx: JobContext, snapshots: dict[str, str], cutoff: Any
) -> list[tuple[str, str, str]]:
    """Deleted bucket incarnations older than the cutoff, read in each shard's snapshot."""
    rows = io.driver_rows(ctx.shards, ctx.ring, snapshots, io.DEAD_BUCKETS, cutoff=cutoff)
    return [(r[0], r[1], r[2]) for r in rows]


async def _finish(store: Any, dead: list[tuple[str, str, str]]) -> tuple[int, int]:
    """Drop the records of dead buckets that have nothing left, then empty past windows."""
    finished = 0
    vnodes_with_removals = set()
    for bucket_id, owner, name in dead:
        owner_id, incarnation = uuid.UUID(owner), uuid.UUID(bucket_id)
        await store.garbage.remove_bucket_uploads(owner_id, incarnation)
        if await store.buckets.has_content(owner_id, incarnation):
            continue
        vnode = store.ring.vnode_for_bucket(owner_id, name)
        async with store.garbage.claim_deleted_buckets(vnode, timedelta(0), limit=10_000) as claim:
            for bucket in claim.buckets:
                if bucket.id == incarnation:
                    await claim.remove(bucket)
                    finished += 1
                    vnodes_with_removals.add(vnode)
    # Those bucket records were deleted as rows: vacuum them away.
    for vnode in sorted(vnodes_with_removals):
        await store.gc_book.vacuum_deleted_tables(vnode)
    windows = 0
    for shard in store.shards.placed():
        for vnode in shard.vnodes:
            windows += await store.gc_book.drop_empty_windows(vnode)
    return finished, windows


def _lap(start: float, before: float = 0.0) -> float:
    return time.monotonic() - start - before
