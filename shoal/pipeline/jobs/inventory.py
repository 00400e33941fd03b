"""`shoal pipeline inventory`: every live object of every bucket, like S3 Inventory.

Per bucket, Parquet and CSV: key, size, ETag, last modified, content type (as HEAD answers
it), storage nodes, tags (a JSON map of key to value; empty for an object without tags).
Read from one snapshot per shard, so a report is one consistent instant of each shard.
"""

from __future__ import annotations

from pyspark.sql import functions as F

from shoal.pipeline import io
from shoal.pipeline.context import JobContext, Summary
from shoal.s3.headers import DEFAULT_CONTENT_TYPE


def run(ctx: JobContext) -> Summary:
    with io.exported_snapshots(ctx.shards) as snapshots:
        objects = io.read_rows(ctx.spark, ctx.shards, ctx.ring, snapshots, io.LIVE_OBJECTS)
        buckets = io.driver_rows(ctx.shards, ctx.ring, snapshots, io.BUCKETS)
        report = inventory(
            objects,
            ctx.spark.createDataFrame(buckets, "bucket_id string, owner string, bucket string"),
        ).cache()
        count = report.count()
    report.write.mode("overwrite").partitionBy("bucket").parquet(str(ctx.output / "parquet"))
    report.write.mode("overwrite").partitionBy("bucket").option("header", True).csv(
        str(ctx.output / "csv")
    )
    totals = report.agg(
        F.countDistinct("bucket").alias("buckets"), F.sum("size").alias("bytes")
    ).first()
    return Summary(
        "inventory",
        {
            "buckets": int(totals["buckets"] or 0),
            "objects": count,
            "bytes": int(totals["bytes"] or 0),
        },
        ctx.output,
    )


def inventory(objects, buckets):  # type: ignore[no-untyped-def]
    """The report's rows: pure DataFrame work, testable on inline rows."""
    parts = F.json_array_length(F.get_json_object("properties", "$.parts"))
    etag = F.when(parts.isNull(), F.hex("content_md5")).otherwise(
        F.concat(F.hex("content_md5"), F.lit("-"), parts.cast("string"))
    )
    return objects.join(buckets, "bucket_id").select(
        F.col("bucket"),
        F.col("name").alias("key"),
        F.col("content_length").alias("size"),
        F.lower(etag).alias("etag"),
        F.col("created").alias("last_modified"),
        # What HEAD answers: an object stored without a type is binary/octet-stream.
        F.coalesce(
            F.when(F.col("content_type") != "", F.col("content_type")),
            F.lit(DEFAULT_CONTENT_TYPE),
        ).alias("content_type"),
        F.array_join("sharks", " ").alias("storage_nodes"),
        F.coalesce(F.get_json_object("properties", "$.tags"), F.lit("")).alias("tags"),
    )
