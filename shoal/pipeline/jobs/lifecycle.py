"""`shoal pipeline lifecycle`: apply the buckets' lifecycle rules.

Expiration by prefix, tags and age (`Days`) or date (`Date`), and
AbortIncompleteMultipartUpload (by prefix alone: S3 allows no tags with it).
An expired object is deleted exactly as a user's DELETE would (a deletion record that GC
reclaims later), conditionally on the ETag the snapshot saw, so an object overwritten since is
left alone. Ages follow S3: creation time plus the days, rounded up to the next midnight UTC,
judged by the database clock.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, time, timedelta
from typing import Any

from shoal.lifecycle import problem_with
from shoal.metadata import BucketNotFound, ObjectNotFound, PreconditionFailed, UploadNotFound
from shoal.pipeline import io
from shoal.pipeline.context import JobContext, Summary

CONCURRENT_DELETES = 16
log = logging.getLogger("shoal.pipeline")


def run(ctx: JobContext) -> Summary:
    configured = ctx.with_store(lambda store: store.buckets.lifecycles())
    rules, skipped = _applicable(configured)
    now = io.database_time_minus(ctx.shards[0], 0)
    ctx.progress.begin("find expired objects")
    with io.exported_snapshots(ctx.shards) as snapshots:
        objects = io.read_rows(ctx.spark, ctx.shards, ctx.ring, snapshots, io.LIVE_OBJECTS)
        uploads = io.read_rows(ctx.spark, ctx.shards, ctx.ring, snapshots, io.OPEN_UPLOADS)
        expired = (
            objects.rdd.filter(lambda r: _expired(r, rules, now))
            .map(lambda r: (rules[r.bucket_id][0], rules[r.bucket_id][1], r.name, r.content_md5))
            .collect()
        )
        stale = (
            uploads.rdd.filter(lambda r: _abandoned(r, rules, now))
            .map(lambda r: (rules[r.bucket_id][0], rules[r.bucket_id][1], r.name, r.id))
            .collect()
        )
    phase = ctx.progress.begin("delete expired", total=len(expired) + len(stale), unit="items")
    deleted, aborted = ctx.with_store(
        lambda store: _apply(store, expired, stale, phase.advance),
        connections=CONCURRENT_DELETES + 1,
    )
    ctx.progress.begin("write output")
    ctx.spark.createDataFrame(
        [(o, b, k, "expired", k in deleted) for o, b, k, _ in expired]
        + [(o, b, k, "aborted upload", u in aborted) for o, b, k, u in stale],
        "owner string, bucket string, key string, action string, done boolean",
    ).write.mode("overwrite").parquet(str(ctx.output / "actions"))
    ctx.spark.createDataFrame(
        skipped or [], "owner string, bucket string, problem string"
    ).write.mode("overwrite").parquet(str(ctx.output / "skipped"))
    return Summary(
        "lifecycle",
        {
            "buckets with rules": len(rules) + len(skipped),
            "buckets skipped (rules cannot be applied)": len(skipped),
            "objects expired": len(deleted),
            "expired but changed since (kept)": len(expired) - len(deleted),
            "uploads aborted": len(aborted),
        },
        ctx.output,
        [
            f"bucket {bucket} (account {owner}) skipped: {problem}"
            for owner, bucket, problem in skipped
        ],
    )


def _applicable(
    configured: list[tuple[Any, Any, str, Any]],
) -> tuple[dict[str, tuple[str, str, Any]], list[tuple[str, str, str]]]:
    """The buckets whose stored rules can be applied, by bucket id; and (owner, bucket,
    problem) of the others, which the job skips so that one bucket's bad rule (stored before
    the gateway checked rules, or by hand) never stops the job for every account."""
    rules: dict[str, tuple[str, str, Any]] = {}
    skipped: list[tuple[str, str, str]] = []
    for bucket_id, owner, name, bucket_rules in configured:
        problem = problem_with(bucket_rules)
        if problem is None:
            rules[str(bucket_id)] = (str(owner), name, bucket_rules)
        else:
            log.warning("lifecycle: bucket %s skipped: %s", name, problem)
            skipped.append((str(owner), name, problem))
    return rules, skipped


def expires_at(created: datetime, days: int) -> datetime:
    """S3's rule: creation plus the days, rounded up to the next midnight UTC."""
    moment = created.astimezone(UTC) + timedelta(days=days)
    midnight = datetime.combine(moment.date(), time(0), tzinfo=UTC)
    return midnight if moment == midnight else midnight + timedelta(days=1)


def _matching(row: Any, rules: dict[str, Any], tagged: dict[str, str]) -> list[dict[str, Any]]:
    """The enabled rules of the row's bucket whose prefix the name has and whose tags (each
    key with its value) the row's tags all include."""
    if row.bucket_id not in rules:
        return []
    return [
        r
        for r in rules[row.bucket_id][2]
        if r["enabled"]
        and row.name.startswith(r["prefix"])
        and all(tagged.get(k) == v for k, v in r.get("tags", {}).items())
    ]


def object_tags(properties: str | None) -> dict[str, str]:
    """An object row's tags, from its properties as the readers give them (JSON text)."""
    if not properties:
        return {}
    found = json.loads(properties).get("tags")
    return found if isinstance(found, dict) else {}


def _expired(row: Any, rules: dict[str, Any], now: datetime) -> bool:
    for rule in _matching(row, rules, object_tags(row.properties)):
        if (
            rule["expiration_days"] is not None
            and expires_at(row.created, rule["expiration_days"]) <= now
        ):
            return True
        if (
            rule["expiration_date"] is not None
            and datetime.fromisoformat(rule["expiration_date"]) <= now
        ):
            return True
    return False


def _abandoned(row: Any, rules: dict[str, Any], now: datetime) -> bool:
    return any(
        rule["abort_days"] is not None and expires_at(row.created, rule["abort_days"]) <= now
        for rule in _matching(row, rules, {})
        if not rule.get("tags")
    )


async def _apply(
    store: Any, expired: list[Any], stale: list[Any], advance: Callable[[int], None]
) -> tuple[set[str], set[str]]:
    """Delete the expired versions and abort the stale uploads, `advance(1)` after each."""
    gate = asyncio.Semaphore(CONCURRENT_DELETES)
    deleted: set[str] = set()
    aborted: set[str] = set()

    async def expire(owner: str, bucket: str, key: str, md5: bytes) -> None:
        async with gate:
            try:
                gone = await store.objects.delete(uuid.UUID(owner), bucket, key, if_match=md5)
            except (PreconditionFailed, ObjectNotFound, BucketNotFound):
                return  # replaced or removed since the snapshot: not this version's turn
            finally:
                advance(1)
            if gone is not None:
                deleted.add(key)

    async def abort(owner: str, bucket: str, key: str, upload: str) -> None:
        async with gate:
            try:
                await store.uploads.abort(uuid.UUID(owner), bucket, key, uuid.UUID(upload))
                aborted.add(upload)
            except (UploadNotFound, BucketNotFound):
                return
            finally:
                advance(1)

    await asyncio.gather(*(expire(*e) for e in expired), *(abort(*s) for s in stale))
    return deleted, aborted
