"""Buckets: create (a new incarnation id), get, list per owner, delete.

A bucket row lives on the vnode of hash(owner, name). S3 bucket names are global, so the
catalog shard also records which owner holds each name (shoal.bucket_name).
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import time
import uuid
from typing import Any, NoReturn

from psycopg.types.json import Jsonb

from shoal.metadata import queries
from shoal.metadata.accounts import Accounts
from shoal.metadata.base import DELETING_MARK_SECONDS, Component
from shoal.metadata.errors import (
    BucketAlreadyExists,
    BucketAlreadyOwnedByYou,
    BucketNotEmpty,
    BucketNotFound,
    InvalidName,
    MetadataError,
    MetadataUnavailable,
)
from shoal.metadata.listing import key_range
from shoal.metadata.models import Bucket
from shoal.metadata.names import check_bucket_name, check_listing_text

log = logging.getLogger("shoal.metadata")

# S3's largest ListBuckets page and one more, for the gateway to tell whether another follows.
MAX_BUCKETS_PER_PAGE = 10_001
# How long a DeleteBucket may take from its mark to its last step: far inside the mark's
# lifetime, so that no write can find the mark lapsed while the delete still goes on.
DELETE_CHECK_SECONDS = DELETING_MARK_SECONDS / 12

# A bucket's lifecycle or CORS rules, as stored: JSON documents checked by the gateway.
Rules = list[dict[str, Any]]


class Buckets(Component):
    async def create(self, owner: uuid.UUID, name: str) -> Bucket:
        check_bucket_name(name)
        await Accounts(self.shards, self.window).get(owner)
        bucket_id = uuid.uuid4()
        vnode = self.shards.ring.vnode_for_bucket(owner, name)
        # Refused before the name is claimed when the row could not be written.
        self.shards.of_vnode(vnode).pool.check_writable()
        await self._claim_name(owner, name, bucket_id)
        self.forget_bucket(owner, name)
        params = {"id": bucket_id, "owner": owner, "name": name}
        try:
            created = await self.rows(vnode, queries.INSERT_BUCKET, params)
        except MetadataUnavailable:  # the row was not written: neither is the claim kept
            with contextlib.suppress(MetadataError):
                await self.release_name(owner, name, bucket_id)
            raise
        self.forget_bucket(owner, name)
        if not created:
            raise BucketAlreadyOwnedByYou(f"you already own bucket {name!r}")
        return Bucket(**created[0])

    async def get(self, owner: uuid.UUID, name: str) -> Bucket:
        return await self.bucket(owner, name)

    async def list(
        self, owner: uuid.UUID, prefix: str = "", after: str = "", limit: int = 1000
    ) -> list[Bucket]:
        """The owner's buckets in name order: names starting with `prefix`, after `after`."""
        check_listing_text(prefix, "prefix")
        check_listing_text(after, "marker")
        if not 0 <= limit <= MAX_BUCKETS_PER_PAGE:
            raise InvalidName(f"limit must be between 0 and {MAX_BUCKETS_PER_PAGE}")
        bounds = key_range(prefix, "", after)
        if bounds is None or limit == 0:
            return []
        lower, upper = bounds
        params = {"owner": owner, "lower": lower, "upper": upper, "limit": limit}
        pages = await self.every_shard(
            queries.LIST_BUCKETS_MERGE,
            queries.LIST_BUCKETS_ARM,
            params,
            upper_bound=upper is not None,
        )
        found = sorted((Bucket(**row) for page in pages for row in page), key=lambda b: b.name)
        return found[:limit]

    async def delete(self, owner: uuid.UUID, name: str, force: bool = False) -> Bucket:
        """Move the bucket to the deleted-bucket table and free its name.

        Refused while the bucket holds objects, unless forced. Open multipart uploads do not
        hold it (S3 deletes such a bucket): the statement that moves the bucket row makes
        them garbage of the dead incarnation, as a forced delete does with everything, so
        they are aborted in that same step: GC reclaims their parts, and a bucket created
        under the name later is a new incarnation that never sees them.
        """
        self.forget_bucket(owner, name)
        bucket = await self.bucket(owner, name)
        # Its last step releases the name on the catalog: refused before the first when that
        # step could not be taken, rather than deleted with its name left claimed.
        self.shards.catalog.pool.check_writable()
        vnode = self.shards.ring.vnode_for_bucket(owner, name)
        key = {
            "owner": owner,
            "name": name,
            "id": bucket.id,
            "token": uuid.uuid4(),  # this delete's mark, apart from any other's
            "mark_lifetime": f"{DELETING_MARK_SECONDS} seconds",
        }
        # Marked first: a write that commits from now on finds the mark and is not
        # acknowledged (check_bucket_takes_writes); one acknowledged committed before it,
        # and the emptiness check below sees it.
        marked = time.monotonic()
        if not await self.rows(vnode, queries.MARK_BUCKET_DELETING, key):
            raise BucketNotFound(f"no bucket {name!r} for owner {owner}")
        try:
            if not force and await self.has_objects(owner, bucket.id):
                raise BucketNotEmpty(f"bucket {name!r} is not empty")
            if time.monotonic() - marked > DELETE_CHECK_SECONDS:  # the mark must still hold
                raise MetadataUnavailable(f"deleting bucket {name!r} took too long; try again")
        except BaseException:
            with contextlib.suppress(MetadataError):  # else the mark lapses by itself
                await self.rows(vnode, queries.UNMARK_BUCKET_DELETING, key)
            raise
        gone = await self.rows(vnode, queries.DELETE_BUCKET, key)
        if not gone:  # gone meanwhile (another delete), or its mark lapsed: not deleted here
            with contextlib.suppress(MetadataError):
                await self.rows(vnode, queries.UNMARK_BUCKET_DELETING, key)
            await self._refuse_undeleted(owner, name, bucket.id)
        self.forget_bucket(owner, name)
        try:
            await self.release_name(owner, name, bucket.id)
        except MetadataError as exc:
            # The bucket is deleted: so is the answer. Its name stays claimed (a stale claim)
            # until `shoal db check --repair` releases it; its owner may create it again.
            log.warning("bucket %r deleted, its name not released: %s", name, exc)
        return bucket

    async def release_name(self, owner: uuid.UUID, name: str, bucket_id: uuid.UUID) -> bool:
        """Release the claim on `name` of incarnation `bucket_id`; False if it held none."""
        async with self.shards.catalog.pool.connection() as conn:
            cur = await conn.execute(
                queries.RELEASE_BUCKET_NAME, {"owner": owner, "name": name, "id": bucket_id}
            )
            row = await cur.fetchone()
        return row is not None and row[0]

    async def _refuse_undeleted(
        self, owner: uuid.UUID, name: str, bucket_id: uuid.UUID
    ) -> NoReturn:
        """Why a delete whose last step deleted nothing failed: its incarnation went meanwhile
        (BucketNotFound: another delete took it, even if a create made the name again since),
        or is still there and its mark lapsed (MetadataUnavailable)."""
        self.forget_bucket(owner, name)
        current = await self.bucket(owner, name)  # BucketNotFound if no incarnation is left
        if current.id != bucket_id:
            raise BucketNotFound(f"no bucket {name!r} for owner {owner}: deleted meanwhile")
        raise MetadataUnavailable(f"deleting bucket {name!r} took too long; try again")

    async def put_lifecycle(self, owner: uuid.UUID, name: str, rules: Rules) -> None:
        """Store a bucket's lifecycle rules (already validated by the caller)."""
        bucket = await self.bucket(owner, name)
        params = {"bucket_id": bucket.id, "owner": owner, "bucket": name, "rules": Jsonb(rules)}
        async with self.shards.catalog.pool.connection() as conn:
            await conn.execute(queries.PUT_LIFECYCLE, params)

    async def get_lifecycle(self, owner: uuid.UUID, name: str) -> Rules | None:
        bucket = await self.bucket(owner, name)
        async with self.shards.catalog.pool.reading() as conn:
            cur = await conn.execute(queries.GET_LIFECYCLE, {"bucket_id": bucket.id})
            row = await cur.fetchone()
        return None if row is None else list(row[0])

    async def delete_lifecycle(self, owner: uuid.UUID, name: str) -> None:
        bucket = await self.bucket(owner, name)
        async with self.shards.catalog.pool.connection() as conn:
            await conn.execute(queries.DELETE_LIFECYCLE, {"bucket_id": bucket.id})

    async def lifecycles(self) -> builtins.list[tuple[uuid.UUID, uuid.UUID, str, Rules]]:
        """(bucket id, owner, bucket name, rules) of every bucket with rules."""
        async with self.shards.catalog.pool.reading() as conn:
            rows = await (await conn.execute(queries.ALL_LIFECYCLES)).fetchall()
        return [(r[0], r[1], r[2], list(r[3])) for r in rows]

    async def put_cors(self, owner: uuid.UUID, name: str, rules: Rules) -> None:
        """Store a bucket's CORS rules (already validated by the caller)."""
        bucket = await self.bucket(owner, name)
        params = {"bucket_id": bucket.id, "owner": owner, "bucket": name, "rules": Jsonb(rules)}
        async with self.shards.catalog.pool.connection() as conn:
            await conn.execute(queries.PUT_CORS, params)

    async def get_cors(self, owner: uuid.UUID, name: str) -> Rules | None:
        """The bucket's CORS rules, None without a configuration."""
        return await self.cors_of(await self.bucket(owner, name))

    async def cors_of(self, bucket: Bucket) -> Rules | None:
        async with self.shards.catalog.pool.reading() as conn:
            cur = await conn.execute(queries.GET_CORS, {"bucket_id": bucket.id})
            row = await cur.fetchone()
        return None if row is None else list(row[0])

    async def delete_cors(self, owner: uuid.UUID, name: str) -> None:
        bucket = await self.bucket(owner, name)
        async with self.shards.catalog.pool.connection() as conn:
            await conn.execute(queries.DELETE_CORS, {"bucket_id": bucket.id})

    async def put_tags(self, owner: uuid.UUID, name: str, tags: dict[str, str]) -> None:
        """Replace a bucket's tags (already validated by the caller)."""
        bucket = await self.bucket(owner, name)
        async with self.shards.catalog.pool.connection() as conn:
            await conn.execute(
                queries.PUT_BUCKET_TAGS, {"bucket_id": bucket.id, "tags": Jsonb(tags)}
            )

    async def get_tags(self, owner: uuid.UUID, name: str) -> dict[str, str]:
        """A bucket's tags; none if it has none."""
        bucket = await self.bucket(owner, name)
        async with self.shards.catalog.pool.reading() as conn:
            cur = await conn.execute(queries.GET_BUCKET_TAGS, {"bucket_id": bucket.id})
            row = await cur.fetchone()
        return {} if row is None else dict(row[0])

    async def delete_tags(self, owner: uuid.UUID, name: str) -> None:
        bucket = await self.bucket(owner, name)
        async with self.shards.catalog.pool.connection() as conn:
            await conn.execute(queries.DELETE_BUCKET_TAGS, {"bucket_id": bucket.id})

    async def put_acl(self, owner: uuid.UUID, name: str, acl: str) -> None:
        """Set a bucket's canned ACL ("private" or "public-read", checked by the caller)."""
        await self.set_acl_of(await self.bucket(owner, name), acl)

    async def set_acl_of(self, bucket: Bucket, acl: str) -> None:
        query = queries.DELETE_BUCKET_ACL if acl == "private" else queries.PUT_BUCKET_ACL
        async with self.shards.catalog.pool.connection() as conn:
            await conn.execute(query, {"bucket_id": bucket.id, "acl": acl})

    async def acl_of(self, bucket: Bucket) -> str:
        """A bucket's canned ACL: "private" unless set otherwise."""
        async with self.shards.catalog.pool.reading() as conn:
            cur = await conn.execute(queries.GET_BUCKET_ACL, {"bucket_id": bucket.id})
            row = await cur.fetchone()
        return "private" if row is None else str(row[0])

    async def owner_of(self, name: str) -> uuid.UUID | None:
        """Who holds a bucket name across the ring (S3 names are global), if anyone (no one
        holds a name S3 does not allow)."""
        try:
            check_bucket_name(name)
        except InvalidName:
            return None
        async with self.shards.catalog.pool.reading() as conn:
            cur = await conn.execute(queries.SELECT_BUCKET_NAME, {"name": name})
            row = await cur.fetchone()
        return row[0] if row else None

    async def has_content(self, owner: uuid.UUID, bucket_id: uuid.UUID) -> bool:
        """Does any vnode hold an object, open upload or part of the incarnation?"""
        return await self._holds(owner, bucket_id, queries.BUCKET_HAS_CONTENT_ARM)

    async def has_objects(self, owner: uuid.UUID, bucket_id: uuid.UUID) -> bool:
        """Does any vnode hold an object of the incarnation? (what keeps a bucket from a
        delete)"""
        return await self._holds(owner, bucket_id, queries.BUCKET_HAS_OBJECTS_ARM)

    async def _holds(self, owner: uuid.UUID, bucket_id: uuid.UUID, arm: str) -> bool:
        params = {"owner": owner, "bucket_id": bucket_id}
        answers = await self.every_shard(queries.BUCKET_HAS_CONTENT, arm, params)
        return any(rows[0]["exists"] for rows in answers)

    async def _claim_name(self, owner: uuid.UUID, name: str, bucket_id: uuid.UUID) -> None:
        async with self.shards.catalog.pool.connection() as conn:
            claim = await conn.execute(
                queries.CLAIM_BUCKET_NAME, {"name": name, "owner": owner, "id": bucket_id}
            )
            if await claim.fetchone():
                return
            holder = await (
                await conn.execute(queries.SELECT_BUCKET_NAME, {"name": name})
            ).fetchone()
            if holder is None:  # released meanwhile: try once more
                return await self._claim_name(owner, name, bucket_id)
            holder_owner, holder_bucket = holder
            if holder_owner != owner:
                raise BucketAlreadyExists(f"bucket name {name!r} is taken")
            try:
                await self.bucket(owner, name)
            except BucketNotFound:
                # A create by this owner died between claiming the name and writing the row.
                await conn.execute(
                    queries.RECLAIM_BUCKET_NAME,
                    {"name": name, "owner": owner, "id": bucket_id, "old_id": holder_bucket},
                )
                return
            raise BucketAlreadyOwnedByYou(f"you already own bucket {name!r}")
