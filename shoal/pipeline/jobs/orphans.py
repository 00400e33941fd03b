"""`shoal pipeline orphans`: blocks no row names (Riak CS's block leak, Manta's cruft).

Inventory first, then metadata: a block that a row names is found in the snapshot taken after
the block was listed. A block is an orphan when no live row, deletion record, row of a deleted
bucket or open upload names its version id, and both its version id's time (UUIDv7) and its
file's mtime are older than the leeway, by the database clock. A write still under way is
younger than that: a gateway commits no write older than [s3] write_lifetime_seconds (it answers
RequestTimeout and drops its blocks), and `--delete` needs a leeway at least that long. Dry
run by default; `--delete` reclaims them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from shoal.ids import uuid7_time
from shoal.pipeline import io, progress
from shoal.pipeline.context import JobContext, Summary


def run(ctx: JobContext) -> Summary:
    started = time.monotonic()
    leeway: timedelta = ctx.options.get("leeway", ctx.config.gc.leeway)
    lifetime = ctx.config.s3.write_lifetime
    if ctx.options.get("delete") and leeway < lifetime:
        # A write under way has blocks no row names yet; it may commit until it is this old.
        raise ValueError(
            f"--delete needs a leeway of at least [s3] write_lifetime_seconds "
            f"({lifetime.total_seconds():g} s): a write under way for less than that "
            "may still commit the blocks it has sent (a dry run takes any leeway)"
        )
    access = io.node_access(ctx.config)
    urls, silent = io.answering_nodes(ctx.node_urls(), access)
    ctx.progress.begin("read inventories")
    inventory = io.read_inventories(ctx.spark, urls, access).cache()
    blocks = inventory.count()
    ctx.progress.begin("read metadata")
    cutoff = io.database_time_minus(ctx.shards[0], leeway.total_seconds())
    with io.exported_snapshots(ctx.shards) as snapshots:
        rows = [
            io.read_rows(ctx.spark, ctx.shards, ctx.ring, snapshots, template)
            for template in (io.LIVE_OBJECTS, io.ALL_DELETION_RECORDS, io.LIVE_PARTS)
        ]
        named = rows[0].unionByName(rows[1]).unionByName(rows[2]).rdd.flatMap(_named_ids)
        referenced = ctx.spark.createDataFrame(named.map(lambda v: (v,)), "version string")
        referenced = referenced.distinct().cache()
        referenced.count()
    ctx.progress.begin("find orphans")
    orphans = orphan_blocks(inventory, referenced, cutoff.timestamp()).cache()
    found = orphans.count()
    summed = orphans.agg(F.sum("size")).first()
    assert summed is not None  # an aggregate's one row
    found_bytes = summed[0] or 0
    deletes = Deletes()
    if ctx.options.get("delete") and found:
        phase = ctx.progress.begin("delete orphans", total=found, unit="blocks")
        tally = ctx.progress.tally(phase)
        outcomes = (
            orphans.rdd.map(lambda r: (r.shark, urls.get(r.shark, ""), r.name, r.name))
            .mapPartitions(lambda part: io.delete_blocks(progress.counting(part, tally), access))
            .collect()
        )
        deletes = Deletes.of(outcomes)
    orphans.write.mode("overwrite").parquet(str(ctx.output / "orphans"))
    seconds = time.monotonic() - started
    return Summary(
        "orphans",
        {
            "blocks listed": blocks,
            "orphan blocks": found,
            "orphan bytes": int(found_bytes),
            "deleted": deletes.deleted,
            "kept (node failed)": deletes.kept,
            "mode": "delete" if ctx.options.get("delete") else "dry run",
            "seconds": round(seconds, 2),
            "blocks per second": round(blocks / max(seconds, 1e-9)),
        },
        ctx.output,
        [f"{shark} did not answer: its orphans were not looked for" for shark in silent]
        + deletes.problems(),
    )


@dataclass
class Deletes:
    """What the delete requests did: block replicas the nodes removed (a block deleted
    meanwhile is not counted), those kept on a node that failed, and why each node failed."""

    deleted: int = 0
    kept: int = 0
    failures: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, outcomes: Iterable[io.BatchOutcome]) -> Deletes:
        deletes = cls()
        for keys, gone, removed, shark, reason in outcomes:
            deletes.deleted += removed
            if not gone:
                deletes.kept += len(keys)
                deletes.failures.setdefault(shark, reason)
        return deletes

    def problems(self) -> list[str]:
        return [
            f"block delete failed on {shark}: {reason}; its orphans are left for a later run"
            for shark, reason in sorted(self.failures.items())
        ]


def orphan_blocks(inventory: DataFrame, referenced: DataFrame, cutoff_seconds: float) -> DataFrame:
    """The blocks of `inventory` whose version id no row of `referenced` (version) names, made
    (by their UUIDv7) and written (mtime) before `cutoff_seconds`. Pure DataFrame work,
    testable on inline rows."""
    candidates = inventory.withColumn("version", F.split("name", r"\.").getItem(0))
    return (
        candidates.join(referenced, "version", "left_anti")
        .withColumn("made", _uuid_seconds("version"))
        .where((F.col("made") < cutoff_seconds) & (F.col("mtime") < cutoff_seconds))
    )


def _named_ids(row: Any) -> list[str]:
    """Every version id whose blocks a row names: its own, or its parts'."""
    properties = json.loads(row.properties) if row.properties else {}
    parts = properties.get("parts")
    return [p["id"] for p in parts] if parts else [row.id]


# Not annotated: pyspark reads a UDF's annotations to choose how to run it, and refuses
# (with a warning) ones that name plain Python types.
@F.udf(T.DoubleType())
def _uuid_seconds(version):
    """When a block's UUIDv7 version id was made (a name that is not one is never an orphan)."""
    try:
        return uuid7_time(uuid.UUID(version)).timestamp()
    except ValueError:
        return None
