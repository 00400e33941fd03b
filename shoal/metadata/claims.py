"""Bucket names against bucket rows: what `shoal db check` finds and repairs.

A bucket lives in two places: its row on the vnode of hash(owner, name), and the claim on
its name in the catalog (shoal.bucket_name), which keeps S3's names global. Every write
keeps them in step: a create claims the name before it writes the row, a delete removes the
row before it releases the name. Shards restored from backups taken at different points
(docs/operations.md, "Backups, restores and failover") can leave them apart:

- a **stale claim**: the catalog holds a name whose bucket its vnode deleted (the catalog is
  from before the DeleteBucket, or refused the DeleteBucket's last step). Nobody else can
  create a bucket of that name, and a bucket made of it since is unclaimed (below). Repair:
  the name is released.
- a **lost bucket**: the catalog holds a name, and no vnode holds its bucket or a record of
  its deletion (the vnode's shard is from before the bucket was made). Its owner gets
  NoSuchBucket, though its objects' rows may well be on other shards. Repair: its row is
  made again from the claim, with the same id, and its objects show again.
- an **unclaimed bucket**: a bucket row whose name the catalog does not hold (the catalog is
  from before the bucket was made). Another account could create a bucket of that name.
  Repair: the name is claimed for it.
- a **name held by another**: a bucket row whose name the catalog gives to another bucket
  (another owner, or another incarnation of the same owner's). Not repaired: which of the
  two to keep is the operator's choice.
- a **name of two buckets**: bucket rows of two owners with one name, neither claimed. Not
  repaired either, for the same reason.

A lost bucket is also what a bucket deleted so long ago that its deletion record was
reclaimed looks like: its repair brings it back empty, with what the catalog still holds
of it (its ACL, CORS rules, inventory configurations).

A create or a delete under way has a claim without its row for a moment, so a check reads
everything twice, `settle` seconds apart, and reports only what it found both times. The
differences come in the order a repair takes them: stale claims first, so that the names
they release can then be claimed for the buckets made of them since.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from shoal.metadata import queries
from shoal.metadata.base import Component
from shoal.metadata.buckets import Buckets

STALE_CLAIM = "stale claim"
LOST_BUCKET = "lost bucket"
UNCLAIMED_BUCKET = "unclaimed bucket"
HELD_BY_ANOTHER = "name held by another"
TWO_BUCKETS = "name of two buckets"
KINDS = (STALE_CLAIM, LOST_BUCKET, UNCLAIMED_BUCKET, HELD_BY_ANOTHER, TWO_BUCKETS)

# What each kind of difference means and what `--repair` does about it.
EXPLANATIONS = {
    STALE_CLAIM: "the catalog holds the name of a bucket its vnode deleted; repair releases it",
    LOST_BUCKET: "no vnode holds the bucket the catalog names; repair makes its row again",
    UNCLAIMED_BUCKET: "the catalog does not hold this bucket's name; repair claims it",
    HELD_BY_ANOTHER: "the catalog gives this bucket's name to another bucket; not repaired",
    TWO_BUCKETS: "buckets of two owners have this name, neither claimed; not repaired",
}
# How long a check waits between its two readings: longer than a create or a delete takes
# between its two steps.
SETTLE_SECONDS = 2.0


@dataclass(frozen=True)
class Difference:
    """One bucket whose claim and row disagree. For HELD_BY_ANOTHER, `holder` is the
    claim's (owner, bucket id)."""

    kind: str
    name: str
    owner: uuid.UUID
    bucket_id: uuid.UUID
    holder: tuple[uuid.UUID, uuid.UUID] | None = None


@dataclass(frozen=True)
class Check:
    """What a check read (claims and bucket rows) and the differences it found."""

    claims: int
    buckets: int
    differences: list[Difference]


class BucketClaims(Component):
    async def check(self, settle: float = SETTLE_SECONDS) -> Check:
        """Read the catalog's claims and every vnode's bucket rows, twice, `settle` seconds
        apart; the differences found both times."""
        first = set((await self.read_once()).differences)
        await asyncio.sleep(settle)
        second = await self.read_once()
        lasting = [d for d in second.differences if d in first]
        return Check(second.claims, second.buckets, lasting)

    async def repair(self, difference: Difference) -> bool:
        """Bring a difference's claim and row back in step (see the module's docstring);
        False when it was not repaired: a name held by another or of two buckets, or a claim
        or row that changed meanwhile."""
        params = {"name": difference.name, "owner": difference.owner, "id": difference.bucket_id}
        if difference.kind == STALE_CLAIM:
            buckets = Buckets(self.shards, self.window)
            return await buckets.release_name(
                difference.owner, difference.name, difference.bucket_id
            )
        if difference.kind == LOST_BUCKET:
            vnode = self.shards.ring.vnode_for_bucket(difference.owner, difference.name)
            made = await self.rows(vnode, queries.INSERT_BUCKET, params)
            self.forget_bucket(difference.owner, difference.name)
            return bool(made)
        if difference.kind == UNCLAIMED_BUCKET:
            async with self.shards.catalog.pool.connection() as conn:
                claimed = await conn.execute(queries.CLAIM_BUCKET_NAME, params)
                return await claimed.fetchone() is not None
        return False

    async def read_once(self) -> Check:
        """The differences of one reading (check() reads twice)."""
        async with self.shards.catalog.pool.reading() as conn:
            cur = await conn.execute(queries.ALL_BUCKET_CLAIMS)
            claims = {name: (owner, bucket_id) for name, owner, bucket_id in await cur.fetchall()}
        buckets = await self._all_buckets()
        backed = {(row["name"], row["owner"], row["id"]) for row in buckets}
        unbacked = {name: claim for name, claim in claims.items() if (name, *claim) not in backed}
        deleted = await self._deleted([bucket_id for _, bucket_id in unbacked.values()])
        rows_named = Counter(row["name"] for row in buckets)
        found: list[Difference] = []
        for row in buckets:
            holder = claims.get(row["name"])
            if holder == (row["owner"], row["id"]):
                continue
            if holder is None or holder[1] in deleted:  # unclaimed, or once the stale claim goes
                kind = UNCLAIMED_BUCKET if rows_named[row["name"]] == 1 else TWO_BUCKETS
                found.append(Difference(kind, row["name"], row["owner"], row["id"]))
            else:
                found.append(
                    Difference(HELD_BY_ANOTHER, row["name"], row["owner"], row["id"], holder)
                )
        for name, (owner, bucket_id) in unbacked.items():
            if bucket_id in deleted:
                found.append(Difference(STALE_CLAIM, name, owner, bucket_id))
            elif name not in rows_named:  # else a name held by another, found above
                found.append(Difference(LOST_BUCKET, name, owner, bucket_id))
        # In the order a repair takes them: a stale claim goes before its name is claimed.
        found.sort(key=lambda d: (KINDS.index(d.kind), d.name, str(d.owner)))
        return Check(len(claims), len(buckets), found)

    async def _deleted(self, ids: list[uuid.UUID]) -> set[uuid.UUID]:
        """Which of the incarnations `ids` some vnode recorded as deleted."""
        if not ids:
            return set()
        pages = await self.every_shard(
            queries.DELETED_BUCKETS_MERGE, queries.DELETED_BUCKETS_ARM, {"ids": ids}
        )
        return {row["id"] for page in pages for row in page}

    async def _all_buckets(self) -> list[dict[str, Any]]:
        pages = await self.every_shard(queries.ALL_BUCKETS_MERGE, queries.ALL_BUCKETS_ARM, {})
        return [row for page in pages for row in page]
