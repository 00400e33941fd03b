"""Objects: put (with If-Match / If-None-Match), get, update metadata, delete, list.

An object row lives on the vnode of hash(owner, bucket id, name). Every write that replaces
or removes a version with blocks records it in manta_bucket_deleted_object exactly once
(queries.py); a small object's version, whose bytes go with its row, leaves no record.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import logging
import operator
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from psycopg.types.json import Jsonb

from shoal.metadata import prefix_index, queries
from shoal.metadata.base import Component, object_from_row, write_params
from shoal.metadata.errors import (
    InvalidName,
    MetadataError,
    ObjectNotFound,
    PreconditionFailed,
)
from shoal.metadata.listing import (
    first_arm_limit,
    first_keys,
    first_row_budget,
    key_range,
    merge_sorted,
    next_arm_limit,
    next_row_budget,
    prefer_skip_scan,
)
from shoal.metadata.models import (
    CommonPrefix,
    ListingPage,
    ObjectSummary,
    ObjectVersion,
    ObjectWrite,
)
from shoal.metadata.names import check_listing_text, check_object_name
from shoal.metadata.prepared import Row, RowMaker
from shoal.metadata.shards import Shard, ShardSet, render, render_arms

MAX_KEYS = 1000
# How long the removal of stale prefix index rows waits for its lock on a vnode's object
# table, during which that vnode's writes wait behind it (Objects._remove_stale_prefixes).
PREFIX_REPAIR_LOCK_WAIT = "50ms"
# After a removal failed, how long listings leave that vnode's stale rows of the bucket be
# (each try may hold its writes back for PREFIX_REPAIR_LOCK_WAIT).
PREFIX_REPAIR_BACKOFF_SECONDS = 10.0

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PutResult:
    id: uuid.UUID
    created: datetime
    replaced: uuid.UUID | None  # the version this put replaced, now a deletion record


class Objects(Component):
    def __init__(self, shards: ShardSet, window: timedelta) -> None:
        super().__init__(shards, window)
        # Removals of stale prefix index rows under way, by (vnode, bucket id): one at a time.
        self._repairs: dict[tuple[int, uuid.UUID], asyncio.Task[None]] = {}
        # When a removal that failed (its lock not had in time: a busy vnode) may be tried again.
        self._repairs_deferred: dict[tuple[int, uuid.UUID], float] = {}

    async def put(
        self,
        owner: uuid.UUID,
        bucket: str,
        name: str,
        write: ObjectWrite,
        *,
        if_match: WriteCondition = None,
        if_none_match: WriteCondition | bool = None,
    ) -> PutResult:
        """Make `write` the live version of `name`; the replaced version becomes a record.

        if_match: replace only a live version with these ETag bytes, or any live version
        (`ANY_VERSION`, If-Match: *); else PreconditionFailed, or ObjectNotFound when there is
        none. if_none_match: write unless the live version has these ETag bytes; with
        `ANY_VERSION` (or True), create only (If-None-Match: *). Each condition is checked by
        the statement that writes the row.
        """
        check_object_name(name)
        check_version_id(write.id)
        bucket_id, vnode, _ = await self.locate_object(owner, bucket, name)
        params = write_params(owner, bucket_id, name, write)
        statement = conditional_statement(params, if_match, if_none_match)
        if write.under_replicated:  # noted first: a crash before the row leaves a stale note
            await self.rows(vnode, queries.NOTE_UNDER_REPLICATED, params)
        rows = await self.write_row(vnode, statement, params)
        if not rows:
            if if_match is not None and not await self._exists(vnode, owner, bucket_id, name):
                raise ObjectNotFound(f"no object {name!r} in bucket {bucket!r}")
            raise PreconditionFailed(f"precondition failed for {name!r}")
        return PutResult(id=write.id, created=rows[0]["created"], replaced=rows[0]["old_id"])

    async def get(
        self, owner: uuid.UUID, bucket: str, name: str, *, with_data: bool = True
    ) -> ObjectVersion:
        """The live version of `name`; with_data=False leaves a small object's bytes out
        (`data` None: for a HEAD, which has no use for them)."""
        check_object_name(name)
        _, vnode, key = await self.locate_object(owner, bucket, name)
        statement = queries.SELECT_OBJECT_WITH_DATA if with_data else queries.SELECT_OBJECT
        rows = await self.read_rows(vnode, statement, key)
        if not rows:
            raise ObjectNotFound(f"no object {name!r} in bucket {bucket!r}")
        return object_from_row(rows[0])

    async def set_tags(
        self, owner: uuid.UUID, bucket: str, name: str, version_id: uuid.UUID, tags: dict[str, str]
    ) -> bool:
        """Set the tags of version `version_id` of `name` (none: remove them). False if that
        version is no longer live (deleted or replaced since it was read): then nothing is
        changed, and the version that replaced it keeps its own tags."""
        check_object_name(name)
        _, vnode, key = await self.locate_object(owner, bucket, name)
        params = {**key, "id": version_id, "tags": Jsonb(tags)}
        return bool(await self.write_row(vnode, queries.UPDATE_OBJECT_TAGS, params))

    async def set_acl(
        self, owner: uuid.UUID, bucket: str, name: str, version_id: uuid.UUID, acl: str
    ) -> bool:
        """Set the canned ACL of version `version_id` of `name` ("private" removes it). False,
        changing nothing, if that version is no longer live (as set_tags)."""
        check_object_name(name)
        _, vnode, key = await self.locate_object(owner, bucket, name)
        params = {**key, "id": version_id, "acl": acl}
        return bool(await self.write_row(vnode, queries.UPDATE_OBJECT_ACL, params))

    async def delete(
        self, owner: uuid.UUID, bucket: str, name: str, *, if_match: bytes | None = None
    ) -> ObjectVersion | None:
        """Delete the live version; returns it, or None if there was none (not an error in S3)."""
        rows = await self._delete(owner, bucket, name, if_match, queries.DELETE_OBJECT)
        return object_from_row(rows[0]) if rows else None

    async def remove(self, owner: uuid.UUID, bucket: str, name: str) -> uuid.UUID | None:
        """Delete the live version as `delete` does, returning only its id (None if there was
        none): what S3's DeleteObject needs, without the row sent back and decoded."""
        rows = await self._delete(owner, bucket, name, None, queries.DELETE_OBJECT_ID)
        return rows[0]["id"] if rows else None

    async def _delete(
        self, owner: uuid.UUID, bucket: str, name: str, if_match: bytes | None, statement: str
    ) -> builtins.list[Row]:
        check_object_name(name)
        bucket_id, vnode, key = await self.locate_object(owner, bucket, name)
        rows = await self.write_row(vnode, statement, {**key, "if_match": if_match})
        if not rows and if_match is not None and await self._exists(vnode, owner, bucket_id, name):
            raise PreconditionFailed(f"precondition failed for {name!r}")
        return rows

    async def delete_many(
        self, owner: uuid.UUID, bucket: str, names: Sequence[str]
    ) -> dict[str, MetadataError | None]:
        """Delete the live versions of `names` (DeleteObjects): one statement per vnode, the
        statements of a shard in one pipeline and one transaction, the shards at once.
        Returns, for each name, None (deleted, or there was none: not an error in S3) or what
        kept it (a bad name, a shard that failed)."""
        found = await self.bucket(owner, bucket)
        outcome: dict[str, MetadataError | None] = {}
        by_shard: dict[str, dict[int, list[str]]] = {}
        for name in dict.fromkeys(names):
            try:
                check_object_name(name)
            except InvalidName as exc:
                outcome[name] = exc
                continue
            vnode = self.shards.ring.vnode_for_object(owner, found.id, name)
            shard = self.shards.ring.shard_of(vnode)
            by_shard.setdefault(shard, {}).setdefault(vnode, []).append(name)
        shards = list(by_shard)
        failures = await asyncio.gather(
            *(self._delete_on_shard(owner, found.id, by_shard[shard]) for shard in shards)
        )
        for shard, failure in zip(shards, failures, strict=True):
            for batch in by_shard[shard].values():
                outcome.update(dict.fromkeys(batch, failure))
        return outcome

    async def _delete_on_shard(
        self, owner: uuid.UUID, bucket_id: uuid.UUID, by_vnode: dict[int, list[str]]
    ) -> MetadataError | None:
        """DELETE_OBJECTS on each vnode of one shard, in one transaction: one commit for all.
        The vnodes go in ascending order and each statement locks its rows in name order, the
        order of a group-committed batch (batched.py), so the two never deadlock."""
        vnodes = sorted(by_vnode)
        pool = self.shards.of_vnode(vnodes[0]).pool

        async def attempt() -> None:
            async with pool.transaction() as conn, conn.pipeline():
                for vnode in vnodes:
                    params = {"owner": owner, "bucket_id": bucket_id, "names": by_vnode[vnode]}
                    statement = render(queries.DELETE_OBJECTS, vnode)
                    await conn.execute(statement, params, prepare=True)  # kept per connection

        try:
            await self.retrying_window(vnodes[0], attempt, *vnodes[1:])
        except MetadataError as exc:
            return exc
        return None

    async def list(
        self,
        owner: uuid.UUID,
        bucket: str,
        *,
        prefix: str = "",
        delimiter: str = "",
        marker: str = "",
        limit: int = MAX_KEYS,
    ) -> ListingPage:
        """One page of S3 listing, merged across every vnode of every shard.

        Keys come in UTF-8 byte order; with a delimiter, keys that share a common prefix are
        one entry. `marker` is the last entry of the previous page (or S3's start-after).
        """
        for value, what in ((prefix, "prefix"), (delimiter, "delimiter"), (marker, "marker")):
            check_listing_text(value, what)
        if not 0 <= limit <= MAX_KEYS:
            raise InvalidName(f"limit must be between 0 and {MAX_KEYS}")
        found = await self.bucket(owner, bucket)
        wanted = limit + 1  # one more than the page says whether it is truncated
        bounds = key_range(prefix, delimiter, marker)
        entries: Sequence[ObjectSummary | CommonPrefix] = []
        if limit and bounds is not None:
            indexed = prefix_index.serves(prefix, delimiter)
            if (
                indexed
                and (found.id, prefix) in prefix_index.dense
                and not prefix_index.starts_inside_a_prefix(prefix, bounds[0])
            ):
                entries = await self.under_one_ring(
                    lambda: self._from_prefix_index(owner, found.id, prefix, bounds, wanted)
                )
            elif delimiter:
                entries = await self.under_one_ring(
                    lambda: self._rolled_up(owner, found.id, prefix, delimiter, marker, wanted)
                )
            else:
                entries = await self.under_one_ring(
                    lambda: self._keys(owner, found.id, bounds, wanted)
                )
        truncated = len(entries) > limit
        return ListingPage(
            entries=list(entries[:limit]),
            is_truncated=truncated,
            next_marker=_entry_key(entries[limit - 1]) if truncated else None,
        )

    async def _keys(
        self, owner: uuid.UUID, bucket_id: uuid.UUID, bounds: tuple[str, str | None], wanted: int
    ) -> builtins.list[ObjectSummary]:
        """The first `wanted` keys in `bounds`: each shard asked for its share of the page
        (listing.first_keys), not for all of it."""
        shards = self.shards.placed()
        lower, upper = bounds

        async def read(shard: int, start: str, limit: int) -> list[ObjectSummary]:
            reading = Reading("", "", (start, upper), rows=0, arm_limit=0, skip_scan=False)
            return await self._read_shard(
                shards[shard], owner, bucket_id, reading, limit, _summaries
            )

        shares = [len(shard.vnodes) / self.shards.ring.vnodes for shard in shards]
        return await first_keys(shares, read, lower, _name_of, wanted)

    async def _from_prefix_index(
        self,
        owner: uuid.UUID,
        bucket_id: uuid.UUID,
        prefix: str,
        bounds: tuple[str, str | None],
        wanted: int,
    ) -> builtins.list[ObjectSummary | CommonPrefix]:
        """The first `wanted` entries in `bounds` of a '/' listing of `prefix` (empty or
        ending in '/'), from the prefix index (prefix_index.py), each shard in one statement
        a round; a common prefix several shards hold is listed once. Index rows found stale
        are removed in the background (_remove_stale_prefixes).

        A shard's answer holds up to `limit` rows, entries and stale rows in key order: one
        that came back full is complete up to its last row, and when stale rows took places
        that entries needed, the next round reads on from the least such last row."""
        entries: list[ObjectSummary | CommonPrefix] = []
        shards = self.shards.placed()
        while True:
            lower, upper = bounds
            limit = wanted - len(entries)
            params = {
                "owner": owner,
                "bucket_id": bucket_id,
                "prefix": prefix,
                "segment_lower": prefix_index.segment_lower(prefix, lower),
                "lower": lower,
                "upper": upper,
                "limit": limit,
            }
            answers = await asyncio.gather(
                *(
                    self.shard_rows(
                        shard,
                        prefix_index.statement(tuple(shard.vnodes), upper is not None),
                        params,
                        rows=_indexed_rows,
                        template=queries.LIST_PREFIX_INDEX,
                    )
                    for shard in shards
                )
            )
            stale = [(arm, key) for answer in answers for key, _, arm in answer if arm is not None]
            if stale:
                self._remove_stale_prefixes(owner, bucket_id, prefix, stale)
            ends = [answer[-1][0] for answer in answers if len(answer) >= limit]
            through = min(ends) if ends else None
            usable = [
                [
                    entry
                    for key, entry, _ in answer
                    if entry is not None and (through is None or key <= through)
                ]
                for answer in answers
            ]
            entries += merge_sorted(usable, key_of=_entry_key, limit=limit)
            if through is None or len(entries) >= wanted:
                return entries
            rest = key_range(prefix, prefix_index.DELIMITER, through)
            if rest is None:
                return entries
            bounds = rest

    def _remove_stale_prefixes(
        self,
        owner: uuid.UUID,
        bucket_id: uuid.UUID,
        prefix: str,
        stale: builtins.list[tuple[int, str]],
    ) -> None:
        """Remove, in the background, index rows a listing found without keys under them.

        Each vnode's rows go in a transaction that holds its object table in SHARE mode, which
        waits for the writes of that vnode in flight and holds back new ones until it ends
        (queries.REMOVE_STALE_PREFIXES says why that makes it safe), so it waits for that lock
        for at most PREFIX_REPAIR_LOCK_WAIT and otherwise leaves the rows to a later listing.
        """
        by_vnode: dict[int, list[str]] = {}
        for vnode, child in stale:
            by_vnode.setdefault(vnode, []).append(child[len(prefix) :])
        now = time.monotonic()
        for vnode, segments in by_vnode.items():
            key = (vnode, bucket_id)
            if key not in self._repairs and self._repairs_deferred.get(key, now) <= now:
                self._repairs[key] = asyncio.create_task(
                    self._remove_stale_on_vnode(owner, bucket_id, vnode, prefix, segments)
                )

    async def _remove_stale_on_vnode(
        self,
        owner: uuid.UUID,
        bucket_id: uuid.UUID,
        vnode: int,
        prefix: str,
        segments: builtins.list[str],
    ) -> None:
        params = {"owner": owner, "bucket_id": bucket_id, "prefix": prefix, "segments": segments}
        try:
            async with self.shards.of_vnode(vnode).pool.transaction() as conn:
                await conn.execute(f"SET LOCAL lock_timeout = '{PREFIX_REPAIR_LOCK_WAIT}'")
                await conn.execute(render(queries.LOCK_OBJECTS, vnode))
                await conn.execute(render(queries.REMOVE_STALE_PREFIXES, vnode), params)
        except Exception as exc:  # a later listing finds the rows again
            log.debug("stale prefix rows of vnode %d left for now: %s", vnode, exc)
            deferred = time.monotonic() + PREFIX_REPAIR_BACKOFF_SECONDS
            self._repairs_deferred[vnode, bucket_id] = deferred
        else:
            self._repairs_deferred.pop((vnode, bucket_id), None)
        finally:
            del self._repairs[vnode, bucket_id]

    async def _rolled_up(
        self,
        owner: uuid.UUID,
        bucket_id: uuid.UUID,
        prefix: str,
        delimiter: str,
        marker: str,
        wanted: int,
    ) -> builtins.list[ObjectSummary | CommonPrefix]:
        """The first `wanted` entries after `marker`, keys that share a common prefix as one.

        Rows are read in order, up to a budget a round, until they prove to be many keys per
        common prefix; then the rest comes from the prefix index if it serves the listing
        (prefix_index.py), else the rounds skip-scan, `arm_limit` steps per vnode.
        """
        shards = self.shards.placed()
        arms_per_shard = max(len(shard.vnodes) for shard in shards)
        rows = first_row_budget(wanted)
        arm_limit = first_arm_limit(wanted, self.shards.ring.vnodes)
        skip_scan = False
        entries: list[ObjectSummary | CommonPrefix] = []
        while (bounds := key_range(prefix, delimiter, marker)) is not None:
            reading = Reading(prefix, delimiter, bounds, rows, arm_limit, skip_scan)
            pages = await self._read_arms(
                owner, bucket_id, reading, wanted - len(entries), _listed_rows
            )
            # Each shard's page is complete up to its `through` (on its last row, if on any);
            # all are up to the least.
            ends = [page[-1][1] for page in pages if page and page[-1][1]]
            through = min(ends) if ends else None
            usable = [
                [entry for key, _, entry in page if through is None or key <= through]
                for page in pages
            ]
            found_now = merge_sorted(usable, key_of=_entry_key, limit=wanted - len(entries))
            entries.extend(found_now)
            if through is None or len(entries) >= wanted:
                break
            # The next round starts after `through`, as a next page would after that marker.
            marker = through
            missing = wanted - len(entries)
            if skip_scan:
                arm_limit = next_arm_limit(arm_limit, len(found_now), missing, wanted)
            elif not prefer_skip_scan(rows * len(shards), len(found_now), arms_per_shard):
                rows = next_row_budget(rows, len(found_now), missing)
            elif prefix_index.serves(prefix, delimiter):
                # Prefixes hold many keys: the rest of the page, and the next pages, from the
                # index, which reads what they return.
                prefix_index.dense.add((bucket_id, prefix))
                rest = key_range(prefix, delimiter, marker)
                if rest is not None:
                    entries += await self._from_prefix_index(
                        owner, bucket_id, prefix, rest, missing
                    )
                break
            else:
                skip_scan = True  # steps, not rows: start from the even share
                arm_limit = first_arm_limit(missing, self.shards.ring.vnodes)
        return entries

    async def _read_arms(
        self,
        owner: uuid.UUID,
        bucket_id: uuid.UUID,
        reading: Reading,
        limit: int,
        rows: RowMaker,
    ) -> builtins.list[builtins.list[Any]]:
        """Per shard: up to `limit` entries in key order, as `reading` says to read them."""
        return await asyncio.gather(
            *(
                self._read_shard(shard, owner, bucket_id, reading, limit, rows)
                for shard in self.shards.placed()
            )
        )

    async def _read_shard(
        self,
        shard: Shard,
        owner: uuid.UUID,
        bucket_id: uuid.UUID,
        reading: Reading,
        limit: int,
        rows: RowMaker,
    ) -> builtins.list[Any]:
        """Up to `limit` entries of one shard in key order, as `reading` says to read them."""
        lower, upper = reading.bounds
        params = {
            "owner": owner,
            "bucket_id": bucket_id,
            "prefix": reading.prefix,
            "delimiter": reading.delimiter,
            "lower": lower,
            "upper": upper,
            "rows": reading.rows,
            "arm_limit": reading.arm_limit,
            "limit": limit,
        }
        statement = listing_statement(tuple(shard.vnodes), reading)
        merge, _ = listing_templates(reading)
        return await self.shard_rows(shard, statement, params, rows=rows, template=merge)

    async def _exists(self, vnode: int, owner: uuid.UUID, bucket_id: uuid.UUID, name: str) -> bool:
        params = {"owner": owner, "bucket_id": bucket_id, "name": name}
        return bool(await self.read_rows(vnode, queries.SELECT_OBJECT, params))


@dataclass(frozen=True)
class Reading:
    """How one round of a listing reads a shard."""

    prefix: str
    delimiter: str
    bounds: tuple[str, str | None]  # [lower, upper) of names (listing.key_range)
    rows: int  # a delimiter listing's budget of rows read in order
    arm_limit: int  # a skip-scanning listing's steps per vnode
    skip_scan: bool


def listing_statement(vnodes: tuple[int, ...], reading: Reading) -> str:
    """The statement a round of objects.list sends to the shard that holds `vnodes`: rows in
    name order without a delimiter; with one, rows in order keeping one per entry, or skip
    scans once prefixes proved to hold many keys."""
    merge, arm = listing_templates(reading)
    return render_arms(merge, arm, vnodes, reading.bounds[1] is not None)


def listing_templates(reading: Reading) -> tuple[str, str]:
    """The statements of queries.py that listing_statement joins: its merge and its arm."""
    if not reading.delimiter:
        return queries.LIST_NAMES_MERGE, queries.LIST_NAMES_ARM
    if reading.skip_scan:
        return queries.LIST_OBJECTS_MERGE, queries.LIST_OBJECTS_SKIP_SCAN_ARM
    return queries.LIST_PREFIXES_MERGE, queries.LIST_PREFIXES_ARM


# A write's condition: ETag bytes, or ANY_VERSION (`*`), or None (no condition).
ANY_VERSION: Final = "*"
WriteCondition = bytes | Literal["*"] | None


def conditional_statement(
    params: dict[str, Any], if_match: WriteCondition, if_none_match: WriteCondition | bool
) -> str:
    """The statement that writes an object's row under these conditions (If-Match,
    If-None-Match), with what it compares added to `params`."""
    if if_none_match is True:
        if_none_match = ANY_VERSION
    if if_match is not None and if_none_match not in (None, False):
        raise InvalidName("If-Match and If-None-Match cannot be combined on a write")
    if if_none_match == ANY_VERSION:
        return queries.CREATE_OBJECT
    if isinstance(if_none_match, bytes):
        params["if_none_match"] = if_none_match
        return queries.PUT_OBJECT_IF_NONE_MATCH
    if if_match is not None:
        params["if_match"] = None if if_match == ANY_VERSION else if_match
        return queries.REPLACE_OBJECT_IF_MATCH
    return queries.PUT_OBJECT


def check_version_id(version_id: uuid.UUID) -> None:
    if version_id.version != 7:
        raise InvalidName(f"version id {version_id} is not a UUIDv7")


# The columns of every delimiter listing's statement (listing_statement), in _listed_rows's
# order.
_LISTED_COLUMNS = "key through prefix last_modified content_length etag"


# A delimiter listing's row: (key, through, entry). `key` is the entry's name or common
# prefix, the order pages merge on; `through` says how far the shard's page is complete (the
# same on every row). A plain tuple: a named one costs a constructor call per row.
_ListedRow = tuple[str, str | None, ObjectSummary | CommonPrefix]


def _listed_rows(columns: tuple[str, ...]) -> Callable[[Sequence[Any]], _ListedRow]:
    """Listing rows made straight into entries: a page is up to 1000 rows a shard, and a dict
    per row, then an entry from the dict, cost twice as much."""
    key, through, prefix, last_modified, length, etag = map(columns.index, _LISTED_COLUMNS.split())

    def make(values: Sequence[Any]) -> _ListedRow:
        if values[prefix] is not None:
            return values[key], values[through], CommonPrefix(prefix=values[prefix])
        # An object's entry key is its name. tuple.__new__ skips the named tuple's
        # constructor, a Python function call per row.
        fields = (values[key], values[last_modified], values[length], values[etag])
        return values[key], values[through], _new_tuple(ObjectSummary, fields)

    return make


# The columns of queries.LIST_PREFIX_INDEX, in _indexed_rows's order.
_INDEXED_COLUMNS = "key prefix last_modified content_length etag stale_arm"

# A row of a listing from the prefix index: (key, entry or None, the vnode whose index row
# of this common prefix is stale, or None). No entry: a stale row whose prefix holds no key.
_IndexedRow = tuple[str, ObjectSummary | CommonPrefix | None, int | None]


def _indexed_rows(columns: tuple[str, ...]) -> Callable[[Sequence[Any]], _IndexedRow]:
    """Rows of queries.LIST_PREFIX_INDEX made into entries, as _listed_rows makes others."""
    key, prefix, last_modified, length, etag, stale = map(columns.index, _INDEXED_COLUMNS.split())

    def make(values: Sequence[Any]) -> _IndexedRow:
        if values[prefix] is not None:
            return values[key], CommonPrefix(prefix=values[prefix]), values[stale]
        if values[etag] is None:
            return values[key], None, values[stale]
        fields = (values[key], values[last_modified], values[length], values[etag])
        return values[key], _new_tuple(ObjectSummary, fields), None

    return make


def _summaries(columns: tuple[str, ...]) -> Callable[[Sequence[Any]], ObjectSummary]:
    """The rows of a listing without a delimiter, which are ObjectSummary's fields in order,
    made into ObjectSummary by psycopg's row loop with no Python function per row, which
    costs a page about a third less than _listed_rows's maker (docs/decisions.md, "The
    listing strategy"; `bench/gateway_instructions.py list`)."""
    if columns != ObjectSummary._fields:
        raise ValueError(f"a listing returned {columns}, not {ObjectSummary._fields}")
    return functools.partial(_new_tuple, ObjectSummary)


_new_tuple = tuple.__new__
_name_of = operator.attrgetter("name")


def _entry_key(entry: ObjectSummary | CommonPrefix) -> str:
    return entry.prefix if isinstance(entry, CommonPrefix) else entry.name
