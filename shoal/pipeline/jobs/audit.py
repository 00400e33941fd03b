"""`shoal pipeline audit`: every block that a live object or part names is on every node its
row names, with the right size and checksum, and every version and part has as many copies as
the target (placement.target_replicas). `--repair` copies a good replica over a bad one, and
gives under-replicated versions their copies the way the re-replication daemon does.

Metadata is read before the inventories, so a block written after the snapshot is never
missed by mistake; each finding is re-checked against the live row before it is reported,
so a version replaced (and collected) meanwhile is not a finding.
"""

from __future__ import annotations

import json
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from shoal.pipeline import io
from shoal.pipeline.context import JobContext, Summary
from shoal.replication.restorer import CONCURRENCY as RESTORES_AT_ONCE
from shoal.storage import ClientSettings, block_runs, placement


def run(ctx: JobContext) -> Summary:
    started = time.monotonic()
    registered = ctx.node_urls()
    access = io.node_access(ctx.config)
    target = placement.target_replicas(ctx.config.storage.replicas, len(registered))
    ctx.progress.begin("read metadata")
    with io.exported_snapshots(ctx.shards) as snapshots:
        live = io.read_rows(ctx.spark, ctx.shards, ctx.ring, snapshots, io.LIVE_OBJECTS)
        parts = io.read_rows(ctx.spark, ctx.shards, ctx.ring, snapshots, io.LIVE_PARTS)
        short = [
            r.asDict()
            for r in live.unionByName(parts)
            .rdd.flatMap(lambda row: _short_runs(row, target))
            .toDF(UNDER_REPLICATED_SCHEMA)
            .collect()
        ]
        expected = (
            live.unionByName(parts)
            .rdd.flatMap(_expected_blocks)
            .toDF(
                "shark string, name string, size long, owner string, bucket_id string, key string, "
                "version string"
            )
            .cache()
        )
        blocks_expected = expected.count()
    ctx.progress.begin("read inventories and check blocks")
    urls, silent = io.answering_nodes(registered, access)
    unchecked = _unchecked(expected, silent)
    if silent:
        expected = expected.where(~F.col("shark").isin(silent))
    blocks_checked = blocks_expected - sum(unchecked.values())
    inventory = io.read_inventories(ctx.spark, urls, access)
    joined = compared(expected, inventory)
    present = joined.where("found_size = size")
    # Executors read the blocks from the nodes directly: each node's blocks are spread over
    # a few tasks (by name), and each task keeps many reads in flight.
    per_node = max(1, ctx.spark.sparkContext.defaultParallelism // max(1, len(urls)))
    node_index = {shark: index for index, shark in enumerate(sorted(urls))}
    verdicts = (
        present.rdd.map(lambda r: ((r.shark, r.name), (r.shark, urls.get(r.shark, ""), r.name)))
        .partitionBy(
            max(1, len(node_index) * per_node),
            lambda key: node_index.get(key[0], 0) * per_node + _spread(key[1], per_node),
        )
        .values()
        .mapPartitions(lambda rows: io.verify_blocks(rows, access))
        .toDF("shark string, name string, verdict string")
    )
    findings = [r.asDict() for r in problems(joined, verdicts).collect()]
    ctx.progress.begin("re-check findings")
    confirmed = ctx.with_store(lambda store: _still_live(store, findings))
    repaired = restored = 0
    if ctx.options.get("repair") and confirmed:
        repaired = ctx.with_store(lambda store: _repair(store, confirmed, urls, access))
    if ctx.options.get("repair") and short:
        restored = ctx.with_store(
            lambda store: _rereplicate(store, ctx, short), connections=REREPLICATION_CONNECTIONS
        )
    ctx.progress.begin("write output")
    ctx.spark.createDataFrame(short, UNDER_REPLICATED_SCHEMA).write.mode("overwrite").parquet(
        str(ctx.output / "under_replicated")
    )
    ctx.spark.createDataFrame(
        confirmed or [],
        "shark string, name string, size long, owner string, bucket_id string, "
        "key string, version string, found_size long, problem string",
    ).write.mode("overwrite").parquet(str(ctx.output / "findings"))
    seconds = time.monotonic() - started
    counts = {
        p: sum(1 for f in confirmed if f["problem"] == p)
        for p in ("missing", "wrong size", "corrupt", "unreachable")
    }
    counts["unreachable"] += sum(unchecked.values())
    return Summary(
        "audit",
        {
            "blocks checked": blocks_checked,
            **{f"blocks {k}": v for k, v in counts.items()},
            "repaired": repaired,
            "copies wanted": target,
            "versions under-replicated": len(short),
            "versions re-replicated": restored,
            "seconds": round(seconds, 2),
            "blocks per second": round(blocks_checked / max(seconds, 1e-9)),
        },
        ctx.output,
        [
            f"{shark} did not answer: its {count:,} block replicas were not checked"
            for shark, count in sorted(unchecked.items())
        ]
        + _left_bad(counts, repaired, len(short), restored, ctx.output),
    )


def _unchecked(expected: DataFrame, silent: list[str]) -> dict[str, int]:
    """How many of the expected block replicas each silent node holds: counted unreachable,
    as no read of them was tried."""
    if not silent:
        return {}
    held = expected.where(F.col("shark").isin(silent)).groupBy("shark").count().collect()
    return {shark: 0 for shark in silent} | {row["shark"]: row["count"] for row in held}


def _left_bad(
    counts: dict[str, int], repaired: int, short: int, restored: int, output: Path
) -> list[str]:
    """What the audit found and did not put right, one line each: a job that found data at
    risk exits 1, so that whatever runs it (cron, a CI check, an operator) notices."""
    problems = []
    bad = sum(counts.values())
    if bad > repaired:
        kinds = ", ".join(f"{n:,} {kind}" for kind, n in counts.items() if n)
        problems.append(
            f"{bad - repaired:,} of the {bad:,} bad block replicas found ({kinds}) not "
            f"repaired: see {output / 'findings'}"
        )
    if short > restored:
        problems.append(
            f"{short - restored:,} versions under-replicated and not given their copies: "
            f"see {output / 'under_replicated'}"
        )
    return problems


def compared(expected: DataFrame, inventory: DataFrame) -> DataFrame:
    """Each expected block with the size its node's inventory lists (`found_size`, null for
    a block the node does not have)."""
    return expected.join(
        inventory.select("shark", "name", F.col("size").alias("found_size")),
        ["shark", "name"],
        "left",
    )


def problems(joined: DataFrame, verdicts: DataFrame) -> DataFrame:
    """The blocks of `compared` that are missing, of the wrong size, or that reading found
    bad (`verdicts` of the blocks present: shark, name, verdict), each with its `problem`.
    Pure DataFrame work, testable on inline rows."""
    present = joined.where("found_size = size")
    return (
        joined.where("found_size IS NULL")
        .withColumn("problem", F.lit("missing"))
        .unionByName(joined.where("found_size != size").withColumn("problem", F.lit("wrong size")))
        .unionByName(
            present.join(verdicts.where("verdict != 'ok'"), ["shark", "name"])
            .withColumn("problem", F.col("verdict"))
            .drop("verdict")
        )
    )


def _spread(name: str, ways: int) -> int:
    """A stable share for a block name (Python's str hash differs between processes)."""
    return zlib.crc32(name.encode()) % ways


def _expected_blocks(row: Any) -> list[tuple[Any, ...]]:
    properties = json.loads(row.properties) if row.properties else {}
    expected = []
    for run in block_runs(uuid.UUID(row.id), row.content_length or 0, row.sharks or [], properties):
        for index, name in enumerate(run.block_names()):
            size = min(run.block_size, run.size - index * run.block_size)
            for shark in run.sharks:
                expected.append((shark, name, size, row.owner, row.bucket_id, row.name, row.id))
    return expected


# A re-replication pass holds its claim's connection while its restores each make statements
# (replication/restorer.py, CONCURRENCY), and the node registry is read meanwhile.
REREPLICATION_CONNECTIONS = RESTORES_AT_ONCE + 2

# A version or part (by `id`) with fewer distinct nodes than the target.
UNDER_REPLICATED_SCHEMA = (
    "owner string, bucket_id string, key string, version string, id string, copies int"
)


def _short_runs(row: Any, target: int) -> list[tuple[Any, ...]]:
    """The runs of a row (its version, or each part) held by fewer nodes than `target`."""
    properties = json.loads(row.properties) if row.properties else {}
    runs = block_runs(uuid.UUID(row.id), row.content_length or 0, row.sharks or [], properties)
    return [
        (row.owner, row.bucket_id, row.name, row.id, str(run.id), len(set(run.sharks)))
        for run in runs
        if len(set(run.sharks)) < target
    ]


async def _rereplicate(store: Any, ctx: JobContext, short: list[dict[str, Any]]) -> int:
    """Note each under-replicated version (or part) and run one re-replication pass: the
    daemon's own code, so copies are added and named the same way. Returns how many got
    their copies."""
    from shoal.cluster import data_path
    from shoal.replication import Rereplicator

    for found in short:
        await store.under_replicated.note(
            uuid.UUID(found["owner"]),
            uuid.UUID(found["bucket_id"]),
            found["key"],
            uuid.UUID(found["id"]),
        )
    path = data_path(ctx.config, store)
    try:
        tally = await Rereplicator(store, path).run_once()
    finally:
        await path.client.close()
    return int(tally.restored)


async def _still_live(store: Any, findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keep the findings whose object (or open part) is still the version the snapshot saw."""
    from shoal.metadata import queries
    from shoal.metadata.shards import render

    confirmed = []
    for finding in findings:
        owner, bucket_id = uuid.UUID(finding["owner"]), uuid.UUID(finding["bucket_id"])
        vnode = store.ring.vnode_for_object(owner, bucket_id, finding["key"])
        params = {"owner": owner, "bucket_id": bucket_id, "name": finding["key"]}
        rows = await store.objects.rows(vnode, queries.SELECT_OBJECT, params)
        live_ids = {str(r["id"]) for r in rows}
        async with store.shards.of_vnode(vnode).pool.connection() as conn:
            cur = await conn.execute(
                render(queries.PART_IS_OPEN, vnode),
                {"owner": owner, "bucket_id": bucket_id, "id": uuid.UUID(finding["version"])},
            )
            open_part = await cur.fetchone() is not None
        if finding["version"] in live_ids or open_part:
            confirmed.append(finding)
    return confirmed


async def _repair(
    store: Any, findings: list[dict[str, Any]], urls: dict[str, str], access: ClientSettings
) -> int:
    """Copy a good replica onto each node that lacks a block or holds a bad one."""
    from shoal.storage import NodeError

    client = access.client()
    repaired = 0
    try:
        bad = {(f["shark"], f["name"]) for f in findings}
        for finding in findings:
            sources = [s for s in urls if (s, finding["name"]) not in bad and s != finding["shark"]]
            data = None
            for source in sources:
                try:
                    data = await client.get_block(urls[source], finding["name"])
                    break
                except NodeError:
                    continue
            target = urls.get(finding["shark"])
            if data is None or target is None:
                continue
            try:
                await client.delete_block(target, finding["name"])  # a bad copy goes first
                await client.put_block(target, finding["name"], data)
                repaired += 1
            except NodeError:
                continue
    finally:
        await client.close()
    return repaired
