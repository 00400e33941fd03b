"""Objects: put (with If-Match / If-None-Match), get, update metadata, delete, list.

An object row lives on the vnode of hash(owner, bucket id, name). Every write that replaces
or removes a version with blocks records it in manta_bucket_deleted_object exactly once
(queries.py); a small object's version, whose bytes go with its row, leaves no record.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import heapq
import logging
import operator
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from psycopg.types.json import Jsonb

from shoal.metadata import directory, queries
from shoal.metadata.base import MOVE_WAIT_SECONDS, Component, object_from_row, write_params
from shoal.metadata.errors import (
    InvalidName,
    MetadataError,
    ObjectNotFound,
    PreconditionFailed,
    VnodeMoved,
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
from shoal.metadata.shards import Shard, render, render_arms

MAX_KEYS = 1000

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PutResult:
    """What a put committed: the version as written (what its answer tells, whatever a later
    write of the key does), and the version it replaced."""

    id: uuid.UUID
    created: datetime
    modified: datetime
    replaced: uuid.UUID | None  # the version this put replaced, now a deletion record
    written: ObjectWrite


def put_result(write: ObjectWrite, row: dict[str, Any]) -> PutResult:
    """The PutResult of `write`, from the row its statement returned."""
    return PutResult(write.id, row["created"], row["modified"], row["old_id"], write)


class Objects(Component):
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
        rows = await self.write_object_row(vnode, statement, params, bucket)
        if not rows:
            if if_match is not None and not await self._exists(vnode, owner, bucket_id, name):
                raise ObjectNotFound(f"no object {name!r} in bucket {bucket!r}")
            raise PreconditionFailed(f"precondition failed for {name!r}")
        return put_result(write, rows[0])

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

    async def remove(
        self, owner: uuid.UUID, bucket: str, name: str, *, if_match: bytes | None = None
    ) -> uuid.UUID | None:
        """Delete the live version as `delete` does, returning only its id (None if there was
        none): what S3's DeleteObject needs, without the row sent back and decoded."""
        rows = await self._delete(owner, bucket, name, if_match, queries.DELETE_OBJECT_ID)
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
            if directory.serves(prefix, delimiter) and not directory.starts_inside_a_prefix(
                prefix, bounds[0]
            ):
                entries = await self.under_one_ring(
                    lambda: self._from_directory(owner, found.id, prefix, bounds, wanted)
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

    async def _from_directory(
        self,
        owner: uuid.UUID,
        bucket_id: uuid.UUID,
        prefix: str,
        bounds: tuple[str, str | None],
        wanted: int,
    ) -> builtins.list[ObjectSummary | CommonPrefix]:
        """The first `wanted` entries in `bounds` of a '/' listing of `prefix` (empty or
        ending in '/'), from the directory (directory.py): each shard gives its first
        `wanted`, and a common prefix several shards hold is listed once."""
        reads = [
            self._directory_of_shard(shard, owner, bucket_id, prefix, bounds, wanted)
            for shard in self.shards.placed()
        ]
        if len(reads) == 1:  # no task to make: a '/' page is a few hundred microseconds
            return await reads[0]
        answers = await asyncio.gather(*reads)
        return merge_sorted(answers, key_of=_entry_key, limit=wanted)

    async def _directory_of_shard(
        self,
        shard: Shard,
        owner: uuid.UUID,
        bucket_id: uuid.UUID,
        prefix: str,
        bounds: tuple[str, str | None],
        wanted: int,
    ) -> builtins.list[ObjectSummary | CommonPrefix]:
        """One shard's first `wanted` entries: its common prefixes from its directory rows,
        and the keys of the directory, when any of its vnodes holds some."""
        lower, upper = bounds
        params = {
            "owner": owner,
            "bucket_id": bucket_id,
            "prefix": prefix,
            "segment_lower": directory.segment_lower(prefix, lower),
            "lower": lower,
            "upper": upper,
            "limit": wanted,
            "vnodes": shard.vnodes,
        }
        (found,) = await self.shard_rows(
            shard, queries.LIST_DIRECTORY, params, template=queries.LIST_DIRECTORY
        )
        if found["held"] < len(shard.vnodes):
            # A vnode moved away: its rows here are no longer its own (queries.LIST_DIRECTORY).
            await self.shards.follow_ring(MOVE_WAIT_SECONDS)
            raise VnodeMoved(f"shard {shard.name} no longer holds every vnode the ring gave it")
        prefixes: builtins.list[ObjectSummary | CommonPrefix] = [
            CommonPrefix(prefix=prefix + segment) for segment in found["segments"]
        ]
        if not found["has_keys"]:
            return prefixes
        # Every vnode of the shard, not only those holding keys here: one statement a shard
        # to prepare, where each set of vnodes would be a statement of its own on every
        # connection.
        statement = directory.leaves_statement(tuple(shard.vnodes), upper is not None)
        leaves = await self.shard_rows(
            shard, statement, params, rows=_summaries, template=queries.LIST_LEAVES_ARM
        )
        return list(heapq.merge(prefixes, leaves, key=_entry_key))[:wanted]

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
        common prefix; then the rest comes from the directory if it serves the listing
        (directory.py: a listing that starts inside a common prefix), else the rounds
        skip-scan, `arm_limit` steps per vnode.
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
            elif directory.serves(prefix, delimiter):
                # Prefixes hold many keys, and the rest starts past `through`: from the
                # directory, which reads what it returns.
                rest = key_range(prefix, delimiter, marker)
                if rest is not None:
                    entries += await self._from_directory(owner, bucket_id, prefix, rest, missing)
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
