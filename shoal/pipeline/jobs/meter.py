"""`shoal pipeline meter`: usage per account and per bucket, appended as a dated partition.

objects, logical bytes, stored bytes (bytes times copies), bytes waiting for GC (deletion
records and rows of deleted buckets), open multipart bytes. `--plot FILE.png` draws logical
bytes per account over every metered day.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from shoal.pipeline import io
from shoal.pipeline.context import JobContext, Summary

# The parts of a multipart object, as its properties list them.
PARTS_TYPE = "array<struct<size:bigint,sharks:array<string>>>"


def stored_bytes(length: Column, sharks: Column, properties: Column) -> Column:
    """Bytes on disk: each part (or the object) times the nodes that hold it; a small object
    kept in its metadata row counts once (its shard's copy). Spark's own expressions (no
    Python UDF), so the rows never leave the JVM."""
    zero = F.lit(0).cast("long")
    nothing = F.array().cast("array<string>")
    size = F.coalesce(length, zero)
    parts = F.from_json(F.get_json_object(properties, "$.parts"), PARTS_TYPE)
    per_part = F.aggregate(
        parts,
        zero,
        lambda total, part: total + part.size * F.size(F.coalesce(part.sharks, nothing)),
    )
    return (
        F.when(F.get_json_object(properties, "$.inline") == "true", size)
        .when(F.coalesce(F.size(parts), F.lit(0)) > 0, per_part)
        .otherwise(size * F.size(F.coalesce(sharks, nothing)))
    )


def run(ctx: JobContext) -> Summary:
    ctx.progress.begin("read metadata")
    with io.exported_snapshots(ctx.shards) as snapshots:
        live = io.read_rows(ctx.spark, ctx.shards, ctx.ring, snapshots, io.LIVE_OBJECTS)
        waiting = io.read_rows(ctx.spark, ctx.shards, ctx.ring, snapshots, io.ALL_DELETION_RECORDS)
        parts = io.read_rows(ctx.spark, ctx.shards, ctx.ring, snapshots, io.OPEN_PARTS)
        buckets = io.driver_rows(ctx.shards, ctx.ring, snapshots, io.BUCKETS)
        dead = io.driver_rows(ctx.shards, ctx.ring, snapshots, io.ALL_DELETED_BUCKETS)
        accounts = io.catalog_rows(ctx.shards, io.ACCOUNTS)
        names = ctx.spark.createDataFrame(
            [(b, o, n, False) for b, o, n in buckets] + [(b, o, n, True) for b, o, n in dead],
            "bucket_id string, owner string, bucket string, deleted boolean",
        )
        people = ctx.spark.createDataFrame(accounts, "owner string, account string")
        usage = meter(live, waiting, parts, names, people).cache()
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


def meter(
    live: DataFrame, waiting: DataFrame, parts: DataFrame, names: DataFrame, people: DataFrame
) -> DataFrame:
    """Usage rows per (account, bucket): pure DataFrame work, testable on inline rows."""
    keys = ["owner", "bucket_id"]
    objects = live.groupBy(keys).agg(
        F.count("*").alias("objects"),
        F.sum("content_length").alias("logical_bytes"),
        F.sum(stored_bytes(F.col("content_length"), F.col("sharks"), F.col("properties"))).alias(
            "stored_bytes"
        ),
    )
    garbage = waiting.groupBy(keys).agg(F.sum("content_length").alias("gc_bytes"))
    open_parts = parts.groupBy(keys).agg(F.sum("content_length").alias("multipart_bytes"))
    usage = (
        names.select("owner", "bucket_id", "bucket", "deleted")
        .join(objects, keys, "left")
        .join(garbage, keys, "left")
        .join(open_parts, keys, "left")
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
