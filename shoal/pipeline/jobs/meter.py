"""`shoal pipeline meter`: usage per account and per bucket, appended as a dated partition.

objects, logical bytes, stored bytes (bytes times copies), bytes waiting for GC (deletion
records and rows of deleted buckets), open multipart bytes. `--plot FILE.png` draws logical
bytes per account over every metered day.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from shoal.pipeline import io
from shoal.pipeline.context import JobContext, Summary

KEYS = ["owner", "bucket_id"]
SUMS = ["objects", "logical_bytes", "stored_bytes", "gc_bytes", "multipart_bytes"]

# What each Spark task hands on: its rows' usage summed per (owner, bucket), a few rows per
# bucket whatever the objects in it.
SUMS_SCHEMA = T.StructType(
    [T.StructField(key, T.StringType()) for key in KEYS]
    + [T.StructField(column, T.LongType()) for column in SUMS]
)
ARROW_SUMS_SCHEMA = pa.schema(
    [pa.field(key, pa.string()) for key in KEYS] + [pa.field(column, pa.int64()) for column in SUMS]
)


def run(ctx: JobContext) -> Summary:
    ctx.progress.begin("read metadata")
    with io.exported_snapshots(ctx.shards) as snapshots:
        # One pass over live objects, deletion records and open parts: each task sums the
        # rows it read, in the Python worker that read them, so that no row goes to the JVM.
        tasks = [
            task
            for template in (io.LIVE_OBJECTS, io.ALL_DELETION_RECORDS, io.OPEN_PARTS)
            for task in io.read_tasks(ctx.shards, ctx.ring, snapshots, template)
        ]
        sums = io.map_read(ctx.spark, tasks, usage_sums, SUMS_SCHEMA)
        buckets = io.driver_rows(ctx.shards, ctx.ring, snapshots, io.BUCKETS)
        dead = io.driver_rows(ctx.shards, ctx.ring, snapshots, io.ALL_DELETED_BUCKETS)
        accounts = io.catalog_rows(ctx.shards, io.ACCOUNTS)
        names = ctx.spark.createDataFrame(
            [(b, o, n, False) for b, o, n in buckets] + [(b, o, n, True) for b, o, n in dead],
            "bucket_id string, owner string, bucket string, deleted boolean",
        )
        people = ctx.spark.createDataFrame(accounts, "owner string, account string")
        usage = meter(sums, names, people).cache()
        usage.count()
    ctx.progress.begin("write history")
    day = datetime.now(UTC).date().isoformat()
    history = ctx.output.parent / "history"
    usage.withColumn("date", F.lit(day)).write.mode("overwrite").option(
        "partitionOverwriteMode", "dynamic"
    ).partitionBy("date").parquet(str(history))
    rows = usage.orderBy("account", "bucket").collect()
    if ctx.options.get("plot"):
        plot(ctx.spark.read.parquet(str(history)), Path(ctx.options["plot"]))
    figures: dict[str, Any] = {
        "date": day,
        "accounts": len({r.account for r in rows}),
        "buckets": len(rows),
    }
    for r in rows:
        figures[f"{r.account}/{r.bucket}"] = (
            f"{r.objects} objects, {r.logical_bytes:,} B logical, {r.stored_bytes:,} B stored, "
            f"{r.gc_bytes:,} B for GC, {r.multipart_bytes:,} B multipart"
        )
    return Summary("meter", figures, history)


# -- in each Spark task: rows to sums ---------------------------------------------------------


def usage_sums(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The usage of a task's rows (io.ARROW_RECORD_SCHEMA: live objects, deletion records,
    open parts) summed per (owner, bucket): one batch, worked out on Arrow's columns."""
    partial = [_summed(_usage_of(batch)) for batch in batches if batch.num_rows]
    if partial:
        yield from _summed(pa.concat_tables(partial)).to_batches()


def _usage_of(batch: pa.RecordBatch) -> pa.Table:
    """Per row, what it adds to each sum: a live object its count, bytes and stored bytes; a
    deletion record its bytes waiting for GC; an open part its bytes."""
    kind = batch.column("kind")
    length = pc.fill_null(batch.column("content_length"), 0)
    zero = pa.scalar(0, pa.int64())

    def only(which: str, values: pa.Array) -> pa.Array:
        return pc.if_else(pc.equal(kind, which), values, zero)

    is_object = pc.equal(kind, "object")
    return pa.table(
        {
            "owner": batch.column("owner"),
            "bucket_id": batch.column("bucket_id"),
            "objects": pc.cast(is_object, pa.int64()),
            "logical_bytes": only("object", length),
            "stored_bytes": only("object", stored_bytes(batch)),
            "gc_bytes": only("record", length),
            "multipart_bytes": only("part", length),
        }
    )


def _summed(usage: pa.Table) -> pa.Table:
    summed = usage.group_by(KEYS).aggregate([(column, "sum") for column in SUMS])
    columns = [summed[key] for key in KEYS] + [summed[f"{column}_sum"] for column in SUMS]
    return pa.table(columns, schema=ARROW_SUMS_SCHEMA)


def stored_bytes(batch: pa.RecordBatch) -> pa.Array:
    """Bytes on disk per row: the object (or each of its parts) times the nodes that hold it;
    a small object kept in its metadata row counts once (its shard's copy). Rows without
    parts or inline bytes, nearly all, cost no Python object."""
    properties = batch.column("properties")
    length = pc.fill_null(batch.column("content_length"), 0)
    copies = pc.fill_null(pc.list_value_length(batch.column("sharks")), 0).cast(pa.int64())
    stored = pc.multiply(length, copies)
    special = pc.fill_null(pc.match_substring_regex(properties, io.PARTS_OR_INLINE), False)
    rows = pc.indices_nonzero(special).to_pylist()
    if not rows:
        return stored
    values = stored.to_pylist()
    sharks = batch.column("sharks")
    for row in rows:
        described = io.properties_of(properties[row].as_py())
        values[row] = _stored_of_row(length[row].as_py(), sharks[row].as_py() or [], described)
    return pa.array(values, pa.int64())


def _stored_of_row(length: int, sharks: list[str], properties: dict[str, Any]) -> int:
    if properties.get("inline"):
        return length
    parts = properties.get("parts")
    if parts:
        return sum(int(p["size"]) * len(p.get("sharks") or []) for p in parts)
    return length * len(sharks)


# -- on the driver: sums to usage -------------------------------------------------------------


def meter(sums: DataFrame, names: DataFrame, people: DataFrame) -> DataFrame:
    """Usage rows per (account, bucket) from the tasks' sums (SUMS_SCHEMA): pure DataFrame
    work, testable on inline rows."""
    totals = sums.groupBy(KEYS).agg(*(F.sum(c).alias(c) for c in SUMS))
    usage = (
        names.select("owner", "bucket_id", "bucket", "deleted")
        .join(totals, KEYS, "left")
        .join(people, "owner", "left")
    )
    zero = F.lit(0).cast("long")
    live_only = F.when(F.col("deleted"), zero)
    return (
        usage.select(
            F.coalesce("account", "owner").alias("account"),
            F.col("bucket"),
            F.coalesce(live_only.otherwise(F.col("objects")), zero).alias("objects"),
            F.coalesce(live_only.otherwise(F.col("logical_bytes")), zero).alias("logical_bytes"),
            F.coalesce(live_only.otherwise(F.col("stored_bytes")), zero).alias("stored_bytes"),
            # A deleted bucket's rows wait for GC: its objects' bytes (one read of the rows).
            (
                F.coalesce("gc_bytes", zero)
                + F.coalesce(F.when(F.col("deleted"), F.col("logical_bytes")), zero)
            ).alias("gc_bytes"),
            F.coalesce("multipart_bytes", zero).alias("multipart_bytes"),
            F.col("deleted"),
        )
        .where("objects > 0 OR gc_bytes > 0 OR multipart_bytes > 0 OR NOT deleted")
        .drop("deleted")
    )


def plot(history: DataFrame, target: Path) -> None:
    """Logical bytes per account over the metered days."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    daily = history.groupBy("date", "account").agg(F.sum("logical_bytes").alias("bytes"))
    frame = daily.orderBy("date").toPandas()
    figure, axes = plt.subplots(figsize=(8, 4))
    for account, rows in frame.groupby("account"):
        axes.plot(rows["date"], rows["bytes"], marker="o", label=account)
    axes.set_xlabel("date")
    axes.set_ylabel("logical bytes")
    axes.set_title("Shoal usage per account")
    axes.legend()
    figure.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target)
    plt.close(figure)
