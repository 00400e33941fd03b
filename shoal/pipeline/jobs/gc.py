"""`shoal pipeline gc`: reclaim all garbage in parallel across shards and storage nodes.

One streaming pass, no shuffle: each task reads the rows of its vnodes from one snapshot per
shard (every deletion record older than the leeway, and every row of a bucket incarnation
deleted before it), a batch at a time, in the Python worker that reclaims them; works out
each batch's blocks per node on its Arrow columns; deletes them with the code path of
`shoal gc run` (shoal/gc/deletion.py: requests of 1,000 names, four in flight per node); and
removes the rows whose blocks are all gone. Deletion records are staged on the
shard and, once the task has seen all its rows, removed a window at a time: a window that
holds nothing else is truncated whole, others lose their rows by id and are vacuumed by the
driver afterwards, so no dead tuples are left. Then the driver drops deleted-bucket records
with nothing left, and every past window left empty. Each step is idempotent: run again after
a crash, the job converges.

A task's memory holds two batches of rows (BATCH_ROWS each: the one being deleted, the one
being read) and its driver receives one small summary per task: neither grows with the
number of records.

"Block replicas deleted" counts what the nodes report they removed (one block on one node),
as the daemon does; replicas already missing are counted apart.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import Accumulator, AccumulatorParam
from pyspark.sql import functions as F
from pyspark.sql import types as T

from shoal.gc.deletion import Deletion, delete_names
from shoal.gc.rules import may_remove
from shoal.metadata import MetadataStore
from shoal.metadata.garbage import GcRun, vacuum_windows
from shoal.metadata.partitions import window_name, window_start
from shoal.pipeline import io
from shoal.pipeline.context import JobContext, Summary
from shoal.pipeline.jobs.rebalance import FixedDirectory
from shoal.storage import DEFAULT_BLOCK_SIZE, BlockRun, DataPath, block_runs, names_by_node
from shoal.storage.client import ClientSettings

# Rows a task works on at once (its memory holds one such batch, as read).
BATCH_ROWS = 10_000


@dataclass(frozen=True)
class Setup:
    """What an executor needs, handed over by value (it may run without the configuration)."""

    urls: dict[str, str]  # shark -> URL of every node not marked dead
    access: ClientSettings
    dsns: dict[str, str]
    window: timedelta  # the width of the deleted tables' windows


@dataclass
class TaskSummary:
    """What one task did: the job's figures are the sums over its tasks (one per partition,
    so the driver receives a few of these, never a line per record)."""

    found: int = 0
    reclaimed_bytes: int = 0
    replicas_deleted: int = 0
    replicas_missing: int = 0
    replicas_kept: int = 0
    removed: int = 0
    truncated: int = 0
    to_vacuum: list[tuple[str, int, str]] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)  # node -> first reason


class Summaries(AccumulatorParam[list[TaskSummary]]):
    """The tasks' summaries, gathered on the driver through an accumulator."""

    def zero(self, value: list[TaskSummary]) -> list[TaskSummary]:
        return []

    def addInPlace(self, value1: list[TaskSummary], value2: list[TaskSummary]) -> list[TaskSummary]:
        value1.extend(value2)
        return value1


# What the output keeps of each row read: enough to find the record (its key and version,
# its nodes, when it was deleted), not its whole metadata; and whether it was reclaimed.
_REPORTED = [
    "shard",
    "vnode",
    "kind",
    "id",
    "owner",
    "bucket_id",
    "name",
    "content_length",
    "sharks",
    "deleted_at",
]
REPORT_SCHEMA = T.StructType(
    [
        *(io.RECORD_SCHEMA[name] for name in _REPORTED),
        T.StructField("reclaimed", T.BooleanType()),
    ]
)


def run(ctx: JobContext) -> Summary:
    leeway: timedelta = ctx.options.get("leeway", ctx.config.gc.leeway)
    phases: dict[str, float] = {}
    clock = time.monotonic()
    cutoff = io.database_time_minus(ctx.shards[0], leeway.total_seconds())
    setup = Setup(
        ctx.node_urls(), io.node_access(ctx.config), ctx.dsns, ctx.with_store(_window_width)
    )
    summaries = ctx.spark.sparkContext.accumulator([], Summaries())

    # One phase: each task reads, deletes and removes its records as they stream.
    ctx.progress.begin("reclaim")
    with io.exported_snapshots(ctx.shards) as snapshots:
        tasks = io.read_tasks(ctx.shards, ctx.ring, snapshots, io.DELETION_RECORDS, cutoff=cutoff)
        dead = _dead_buckets(ctx, snapshots, cutoff)
        if dead:
            tasks += io.read_tasks(
                ctx.shards,
                ctx.ring,
                snapshots,
                io.DEAD_BUCKET_CONTENTS,
                dead=[d[0] for d in dead],
            )
        # One pass, no shuffle: each task reads its vnodes' rows, deletes their blocks and
        # removes them, streaming, in the Python worker that read them; the report is
        # written as it goes.
        report = io.map_read(
            ctx.spark,
            tasks,
            functools.partial(reclaim, setup=setup, summaries=summaries),
            REPORT_SCHEMA,
        )
        report.withColumn("run_started", F.lit(ctx.started)).write.mode("overwrite").parquet(
            str(ctx.output / "records")
        )
    phases["reclaim"] = _lap(clock)
    total = _added(summaries.value)

    ctx.progress.begin("vacuum windows")
    # After every removal has committed, so that no transaction of this job still needs the
    # dead tuples and the vacuum can reclaim them all.
    for shard in ctx.shards:
        windows_here = [(vnode, name) for s, vnode, name in total.to_vacuum if s == shard.name]
        if windows_here:
            with io.connect(shard.name, shard.dsn) as conn:
                vacuum_windows(conn, windows_here)
    phases["vacuum"] = _lap(clock, sum(phases.values()))

    buckets_dropped, windows = ctx.with_store(lambda store: _finish(store, dead))
    phases["buckets and windows"] = _lap(clock, sum(phases.values()))

    found, removed = total.found, total.removed
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
                blocks_deleted=total.replicas_deleted,
                bytes_reclaimed=total.reclaimed_bytes,
                windows_dropped=windows,
            )
        )
    )
    figures: dict[str, Any] = {
        "records found": found,
        "records reclaimed": removed,
        "records kept (node down)": failed,
        "block replicas deleted": total.replicas_deleted,
        "block replicas already gone": total.replicas_missing,
        "block replicas kept (node down)": total.replicas_kept,
        "bytes reclaimed": total.reclaimed_bytes,
        "deleted buckets finished": buckets_dropped,
        "windows truncated whole": total.truncated,
        "windows vacuumed": len(total.to_vacuum),
        "windows dropped": windows,
    }
    figures |= {f"seconds: {name}": round(seconds, 2) for name, seconds in phases.items()}
    figures["seconds: total"] = round(time.monotonic() - clock, 2)
    figures["records per second"] = round(found / max(time.monotonic() - clock, 1e-9))
    problems = [
        f"block delete failed on {shark}: {reason}; its records are kept for a later run"
        for shark, reason in sorted(total.failures.items())
    ]
    return Summary("gc", figures, ctx.output, problems)


# -- executors --------------------------------------------------------------------------------


def reclaim(
    batches: Iterator[pa.RecordBatch], setup: Setup, summaries: Accumulator[list[TaskSummary]]
) -> Iterator[pa.RecordBatch]:
    """One task: for each batch of rows (RECORD_SCHEMA), delete their blocks (shoal.gc's code
    path, as `gc run`), stage the rows that may go for removal, and yield the batch with
    `reclaimed`; then remove the staged rows, window by window.

    A batch's deletes and staging run on a thread of their own while the task reads and
    parses the next batch: the task waits on the nodes and the shard for one batch while it
    works on the next. Memory holds two batches."""
    summary = TaskSummary()
    with ThreadPoolExecutor(1, thread_name_prefix="gc-batch") as pool:
        effects = _Effects(setup, summary)
        try:
            pending: tuple[pa.RecordBatch, Future[pa.BooleanArray]] | None = None
            for batch in _sliced(batches):
                submitted = pool.submit(effects.reclaim, _Blocks.of(batch))
                if pending is not None:
                    yield _reported(*pending)
                pending = (batch, submitted)
            if pending is not None:
                yield _reported(*pending)
            pool.submit(effects.finish).result()
        finally:
            pool.submit(effects.close).result()
    summaries.add([summary])


def _sliced(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The batches in slices of at most BATCH_ROWS rows (views, no copy)."""
    for batch in batches:
        for first in range(0, batch.num_rows, BATCH_ROWS):
            yield batch.slice(first, BATCH_ROWS)


def _reported(batch: pa.RecordBatch, may_go: Future[pa.BooleanArray]) -> pa.RecordBatch:
    """A batch of REPORT_SCHEMA, once its blocks are deleted and its rows staged."""
    return batch.select(_REPORTED).append_column("reclaimed", may_go.result())


class _Effects:
    """What a task does to the nodes and the shards, on its one thread (which runs its event
    loop and uses its connections)."""

    def __init__(self, setup: Setup, summary: TaskSummary) -> None:
        self.summary = summary
        self.loop = asyncio.new_event_loop()
        self.client = setup.access.client()
        self.data = DataPath(self.client, FixedDirectory(setup.urls, []))
        self.remover = io.Remover(setup.dsns)
        self.windows = _Windows(setup.window)
        self.count_request = _fault_injection()

    def reclaim(self, blocks: _Blocks) -> pa.BooleanArray:
        """Delete a batch's blocks and stage (or remove) its rows that may go."""
        deletion = self.loop.run_until_complete(
            delete_names(self.data, blocks.names, self.count_request)
        )
        may_go = blocks.may_go(deletion.failures)
        _tally(self.summary, blocks.batch, deletion, may_go)
        _remove(self.remover, blocks.batch.filter(may_go), self.windows)
        return may_go

    def finish(self) -> None:
        self.summary.truncated, self.summary.to_vacuum = self.remover.finish()
        self.summary.removed = self.remover.removed

    def close(self) -> None:
        self.remover.close()
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


@dataclass(frozen=True)
class _Blocks:
    """The blocks a batch's rows name, per node, worked out on Arrow's columns: a row of one
    block (or none) per node, as most are, costs no Python object; the others (parts of a
    multipart object, blocks in their row, several blocks) go through rules' block_runs."""

    batch: pa.RecordBatch
    names: dict[str, list[str]]  # node -> names of the batch's blocks on it
    runs: dict[int, list[BlockRun]]  # row -> its block runs, for the rows worked out in Python

    @classmethod
    def of(cls, batch: pa.RecordBatch) -> _Blocks:
        properties = batch.column("properties")
        length = pc.fill_null(batch.column("content_length"), 0)
        block_size = pc.fill_null(
            pc.struct_field(pc.extract_regex(properties, _BLOCK_SIZE), [0]).cast(pa.int64()),
            DEFAULT_BLOCK_SIZE,
        )
        in_python = pc.fill_null(
            pc.or_kleene(
                pc.match_substring_regex(properties, io.PARTS_OR_INLINE),
                pc.or_kleene(pc.less_equal(block_size, 0), pc.greater(length, block_size)),
            ),
            False,
        )
        names: dict[str, list[str]] = {}
        one_block = pc.and_(pc.invert(in_python), pc.greater(length, 0))
        sharks = pc.filter(batch.column("sharks"), one_block)
        block = pc.binary_join_element_wise(pc.filter(batch.column("id"), one_block), ".0", "")
        on = pc.list_flatten(sharks)
        named = pc.take(block, pc.list_parent_indices(sharks))
        for shark in pc.unique(on).to_pylist():
            names[shark] = pc.filter(named, pc.equal(on, shark)).to_pylist()
        runs = {}
        for row in pc.indices_nonzero(in_python).to_pylist():
            runs[row] = record_runs = block_runs(
                uuid.UUID(batch.column("id")[row].as_py()),
                length[row].as_py(),
                batch.column("sharks")[row].as_py() or [],
                io.properties_of(properties[row].as_py()),
            )
            for shark, more in names_by_node(record_runs).items():
                names.setdefault(shark, []).extend(more)
        return cls(batch, names, runs)

    def may_go(self, failures: Collection[str]) -> pa.BooleanArray:
        """Per row: whether all its blocks are gone (none of the nodes it names failed)."""
        if not failures:
            return pa.repeat(pa.scalar(True), self.batch.num_rows)
        sharks = self.batch.column("sharks").to_pylist()
        return pa.array(
            [
                may_remove(self.runs[row], failures)
                if row in self.runs
                else not any(shark in failures for shark in sharks[row] or [])
                for row in range(self.batch.num_rows)
            ],
            pa.bool_(),
        )


# A row's block size, in its properties (jsonb as text).
_BLOCK_SIZE = r'"block_size": (?P<size>-?\d+)'


def _tally(
    summary: TaskSummary, batch: pa.RecordBatch, deletion: Deletion, may_go: pa.BooleanArray
) -> None:
    summary.found += batch.num_rows
    summary.replicas_deleted += deletion.deleted
    summary.replicas_missing += deletion.missing
    summary.replicas_kept += deletion.kept
    for shark, reason in deletion.failures.items():
        summary.failures.setdefault(shark, reason)
    reclaimed = pc.sum(pc.filter(batch.column("content_length"), may_go)).as_py()
    summary.reclaimed_bytes += reclaimed or 0


def _remove(remover: io.Remover, gone: pa.RecordBatch, windows: _Windows) -> None:
    """Stage the deletion records of `gone` (rows whose blocks are all gone); delete its
    deleted buckets' rows."""
    kind = gone.column("kind")
    records = gone.filter(pc.equal(kind, "record"))
    if records.num_rows:
        window = windows.of_column(records.column("deleted_at"))
        shard = records.column("shard")
        for name in pc.unique(shard).to_pylist():
            here = pc.equal(shard, name)
            remover.records(
                name,
                list(
                    zip(
                        pc.filter(records.column("vnode"), here).to_pylist(),
                        pc.filter(window, here).to_pylist(),
                        pc.filter(records.column("id"), here).to_pylist(),
                        strict=True,
                    )
                ),
            )
    bucket_rows: dict[tuple[str, int, str, str, str], list[str]] = {}
    others = gone.filter(pc.not_equal(kind, "record"))
    for row in others.select(["shard", "vnode", "kind", "owner", "bucket_id", "id"]).to_pylist():
        key = (row["shard"], row["vnode"], row["kind"], row["owner"], row["bucket_id"])
        bucket_rows.setdefault(key, []).append(row["id"])
    for (shard, vnode, kind_, owner, bucket_id), ids in bucket_rows.items():
        remover.bucket_rows(shard, vnode, kind_, owner, bucket_id, ids)


class _Windows:
    """The window of the deleted-object table a record lives in, from its deletion time;
    each window's name is made once."""

    def __init__(self, width: timedelta) -> None:
        self.width = width
        self.width_us = width // timedelta(microseconds=1)
        self.names: dict[int, str] = {}

    def of_column(self, deleted_at: pa.Array) -> pa.Array:
        """The window (its table's name) of each deletion time of a column."""
        if deleted_at.type.unit == "us":  # Spark's: read the instants as they are stored
            micros = deleted_at.view(pa.int64())
        else:
            micros = deleted_at.cast(pa.timestamp("us", "UTC")).cast(pa.int64())
        starts, which = np.unique(
            micros.to_numpy(zero_copy_only=False) // self.width_us, return_inverse=True
        )
        names = pa.array([self.of(int(start) * self.width_us) for start in starts], pa.string())
        return names.take(pa.array(which.ravel()))

    def of(self, deleted_us: int) -> str:
        start = deleted_us - deleted_us % self.width_us
        name = self.names.get(start)
        if name is None:
            moment = datetime.fromtimestamp(start / 1e6, UTC)
            name = window_name("manta_bucket_deleted_object", window_start(moment, self.width))
            self.names[start] = name
        return name


def _fault_injection() -> Callable[[], None]:
    """Counts the task's node delete batches (one per node per batch of rows); the test hook
    SHOAL_GC_FAULT_AFTER=K makes the task exit with status 3 at the K-th."""
    after = io.fault_after_requests()
    calls = 0

    def count() -> None:
        nonlocal calls
        calls += 1
        if after is not None and calls >= after:
            os._exit(3)

    return count


def _added(summaries: list[TaskSummary]) -> TaskSummary:
    total = TaskSummary()
    for part in summaries:
        total.found += part.found
        total.reclaimed_bytes += part.reclaimed_bytes
        total.replicas_deleted += part.replicas_deleted
        total.replicas_missing += part.replicas_missing
        total.replicas_kept += part.replicas_kept
        total.removed += part.removed
        total.truncated += part.truncated
        total.to_vacuum.extend(part.to_vacuum)
        for shark, reason in part.failures.items():
            total.failures.setdefault(shark, reason)
    return total


async def _window_width(store: MetadataStore) -> timedelta:
    return store.gc_book.window


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
