"""Multipart uploads: create, put part, list parts, list uploads, complete, abort.

An upload and its parts live on the vnode of the object they will become, so completing one
is a single transaction on one shard: the object row is written, the replaced version and
every unused part become deletion records, and the part rows go.
"""

from __future__ import annotations

import builtins
import hashlib
import itertools
import uuid
from typing import Any

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from shoal.ids import uuid7
from shoal.metadata import queries
from shoal.metadata.base import Component, object_from_row, write_params
from shoal.metadata.errors import (
    EntityTooSmall,
    InvalidName,
    InvalidPart,
    InvalidPartOrder,
    ObjectNotFound,
    PreconditionFailed,
    UploadNotFound,
)
from shoal.metadata.listing import common_prefix, successor
from shoal.metadata.models import (
    CommonPrefix,
    ObjectVersion,
    ObjectWrite,
    Part,
    PartWrite,
    Upload,
)
from shoal.metadata.names import check_listing_text, check_object_name
from shoal.metadata.objects import (
    PutResult,
    WriteCondition,
    check_version_id,
    conditional_statement,
    put_result,
)
from shoal.metadata.shards import render

MIN_PART_SIZE_BYTES = 5 * 1024 * 1024  # S3's minimum for every part but the last
MAX_PART_NUMBER = 10000
NIL_ID = uuid.UUID(int=0)
MAX_ID = uuid.UUID(int=(1 << 128) - 1)


class Uploads(Component):
    async def create(
        self,
        owner: uuid.UUID,
        bucket: str,
        name: str,
        *,
        content_type: str | None = None,
        headers: dict[str, str] | None = None,
        properties: dict[str, Any] | None = None,
        creator: uuid.UUID | None = None,
    ) -> Upload:
        check_object_name(name)
        _, vnode, key = await self.locate_object(owner, bucket, name)
        params = {
            **key,
            "id": uuid7(),
            "creator": creator,
            "content_type": content_type,
            "headers": dict(headers or {}),
            "roles": [],
            "properties": Jsonb(properties or {}),
        }
        rows = await self.rows(vnode, queries.INSERT_UPLOAD, params)
        return _upload(rows[0])

    async def get(self, owner: uuid.UUID, bucket: str, name: str, upload_id: uuid.UUID) -> Upload:
        check_object_name(name)
        _, vnode, key = await self.locate_object(owner, bucket, name)
        rows = await self.read_rows(vnode, queries.SELECT_UPLOAD, {**key, "upload_id": upload_id})
        if not rows:
            raise UploadNotFound(f"no upload {upload_id} for {name!r}")
        return _upload(rows[0])

    async def put_part(
        self, owner: uuid.UUID, bucket: str, name: str, upload_id: uuid.UUID, part: PartWrite
    ) -> Part:
        """Record a part; a part already under that number becomes a deletion record."""
        check_object_name(name)
        check_version_id(part.id)
        if not 1 <= part.part_number <= MAX_PART_NUMBER:
            raise InvalidName(f"part number must be between 1 and {MAX_PART_NUMBER}")
        _, vnode, key = await self.locate_object(owner, bucket, name)
        params = {
            **key,
            "upload_id": upload_id,
            "part_number": part.part_number,
            "id": part.id,
            "content_length": part.content_length,
            "content_md5": part.content_md5,
            "sharks": list(part.sharks),
            "properties": Jsonb(part.properties),
        }
        if part.under_replicated:  # noted first, as objects.put does
            await self.rows(vnode, queries.NOTE_UNDER_REPLICATED, params)
        rows = await self.rows(vnode, queries.PUT_PART, params)
        if not rows:
            raise UploadNotFound(f"no upload {upload_id} for {name!r}")
        return Part(
            part_number=part.part_number,
            id=part.id,
            created=rows[0]["created"],
            content_length=part.content_length,
            content_md5=part.content_md5,
            sharks=list(part.sharks),
            properties=dict(part.properties),
        )

    async def list_parts(
        self,
        owner: uuid.UUID,
        bucket: str,
        name: str,
        upload_id: uuid.UUID,
        *,
        after: int = 0,
        limit: int = 1000,
    ) -> list[Part]:
        await self.get(owner, bucket, name, upload_id)  # NoSuchUpload before an empty list
        _, vnode, key = await self.locate_object(owner, bucket, name)
        params = {**key, "upload_id": upload_id, "after": after, "limit": limit}
        return [_part(row) for row in await self.read_rows(vnode, queries.LIST_PARTS, params)]

    async def list(
        self,
        owner: uuid.UUID,
        bucket: str,
        *,
        prefix: str = "",
        key_marker: str = "",
        upload_id_marker: uuid.UUID | None = None,
        limit: int = 1000,
    ) -> list[Upload]:
        """Open uploads ordered by key, then by upload id (which is time-ordered)."""
        check_listing_text(prefix, "prefix")
        check_listing_text(key_marker, "key marker")
        found = await self.bucket(owner, bucket)
        lower, after_id = _start(prefix, key_marker, upload_id_marker)
        return await self._read(owner, found.id, (lower, after_id), _upper(prefix), limit)

    async def page(
        self,
        owner: uuid.UUID,
        bucket: str,
        *,
        prefix: str = "",
        delimiter: str = "",
        key_marker: str = "",
        upload_id_marker: uuid.UUID | None = None,
        limit: int = 1000,
    ) -> builtins.list[Upload | CommonPrefix]:
        """At most `limit` entries of S3's ListMultipartUploads: open uploads in `list`'s
        order, and with a `delimiter`, those whose key has it after `prefix` rolled up into
        their common prefix, one entry for all of them. A `key_marker` that is itself a common
        prefix (the last entry of a previous page) starts past every upload under it. Uploads
        are read `limit` at a time from every shard, so a page costs a read per `limit`
        uploads it passes, however many common prefixes they make."""
        for value, what in ((prefix, "prefix"), (delimiter, "delimiter"), (key_marker, "marker")):
            check_listing_text(value, what)
        found = await self.bucket(owner, bucket)
        upper = _upper(prefix)
        start: tuple[str, uuid.UUID] | None = _start(prefix, key_marker, upload_id_marker)
        if key_marker.startswith(prefix) and common_prefix(key_marker, prefix, delimiter) == (
            key_marker
        ):
            start = _past(key_marker)
        entries: builtins.list[Upload | CommonPrefix] = []
        while start is not None and len(entries) < limit and (upper is None or start[0] < upper):
            uploads = await self._read(owner, found.id, start, upper, limit)
            rolled = None
            for upload in uploads:
                # A common prefix's uploads come one after another: one entry for all of them.
                under = common_prefix(upload.name, prefix, delimiter)
                if under is None or under != rolled:
                    if len(entries) == limit:
                        return entries
                    entries.append(upload if under is None else CommonPrefix(under))
                rolled = under
            if len(uploads) < limit:
                break
            # Read on past the last upload, or past every upload under its common prefix.
            start = (uploads[-1].name, uploads[-1].id) if rolled is None else _past(rolled)
        return entries

    async def _read(
        self,
        owner: uuid.UUID,
        bucket_id: uuid.UUID,
        start: tuple[str, uuid.UUID],
        upper: str | None,
        limit: int,
    ) -> builtins.list[Upload]:
        """The first `limit` open uploads after (key, upload id) `start`, below `upper`."""
        params = {
            "owner": owner,
            "bucket_id": bucket_id,
            "lower": start[0],
            "after_id": start[1],
            "upper": upper,
            "limit": limit,
        }
        pages = await self.every_shard(
            queries.LIST_UPLOADS_MERGE,
            queries.LIST_UPLOADS_ARM,
            params,
            upper_bound=upper is not None,
        )
        uploads = sorted((_upload(r) for page in pages for r in page), key=lambda u: (u.name, u.id))
        return uploads[:limit]

    async def complete(
        self,
        owner: uuid.UUID,
        bucket: str,
        name: str,
        upload_id: uuid.UUID,
        chosen: builtins.list[tuple[int, bytes]],
        *,
        min_part_size: int = MIN_PART_SIZE_BYTES,
        if_match: WriteCondition = None,
        if_none_match: WriteCondition | bool = None,
        properties: dict[str, Any] | None = None,
    ) -> PutResult:
        """Make the chosen parts, (part number, MD5) in ascending order, the object's data.

        `properties` are kept with the object besides those of the upload (its checksums).

        Atomic: on any error (InvalidPart, InvalidPartOrder, EntityTooSmall, a failed
        precondition) nothing changes and the upload stays open.
        """
        check_object_name(name)
        bucket_id, vnode, key = await self.locate_object(owner, bucket, name)
        upload = await self.get(owner, bucket, name, upload_id)
        key["upload_id"] = upload_id

        async def attempt() -> PutResult:
            async with self.shards.of_vnode(vnode).pool.transaction() as conn:
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(render(queries.TAKE_UPLOAD, vnode), key)
                if not await cur.fetchall():
                    raise UploadNotFound(f"no upload {upload_id} for {name!r}")
                await cur.execute(render(queries.LOCK_PARTS, vnode), key)
                stored = {row["part_number"]: _part(row) for row in await cur.fetchall()}
                parts = _chosen_parts(chosen, stored, min_part_size)
                write = _assembled(upload, parts, properties or {})
                params = write_params(owner, bucket_id, name, write)
                statement = conditional_statement(params, if_match, if_none_match)
                await cur.execute(render(statement, vnode), params)
                put = await cur.fetchall()
                if not put:
                    if if_match is not None:  # If-Match on no object at all: as objects.put
                        await cur.execute(render(queries.SELECT_OBJECT, vnode), params)
                        if not await cur.fetchall():
                            raise ObjectNotFound(f"no object {name!r} in bucket {bucket!r}")
                    raise PreconditionFailed(f"precondition failed for {name!r}")
                keep = [p.part_number for p in parts]
                await cur.execute(render(queries.RETIRE_PARTS, vnode), {**key, "keep": keep})
                return put_result(write, put[0])

        completed = await self.retrying_window(vnode, attempt)
        await self.check_bucket_takes_writes(owner, bucket, bucket_id)
        return completed

    async def made_by(
        self,
        owner: uuid.UUID,
        bucket: str,
        name: str,
        upload_id: uuid.UUID,
        chosen: builtins.list[tuple[int, bytes]],
    ) -> ObjectVersion | None:
        """The live version of `name` if completing `upload_id` with the `chosen` parts made
        it (a Complete sent again: its answer was lost, or a client repeats it), else None:
        S3 answers such a Complete as the first, and one with other parts NoSuchUpload.

        A completion answered CommitUnknown because its bucket was being deleted may go
        with the bucket: the version is answered only while the bucket still takes writes
        (check_bucket_takes_writes; CommitUnknown again if not)."""
        check_object_name(name)
        bucket_id, vnode, key = await self.locate_object(owner, bucket, name)
        rows = await self.read_rows(vnode, queries.SELECT_OBJECT, key)
        if not rows:
            return None
        version = object_from_row(rows[0])
        if version.properties.get("upload_id") != str(upload_id):
            return None
        parts = [(p["part_number"], bytes.fromhex(p["md5"])) for p in version.properties["parts"]]
        if parts != chosen:
            return None
        await self.check_bucket_takes_writes(owner, bucket, bucket_id)
        return version

    async def abort(self, owner: uuid.UUID, bucket: str, name: str, upload_id: uuid.UUID) -> int:
        """End an upload; every part becomes a deletion record. Returns the number of parts."""
        check_object_name(name)
        _, vnode, key = await self.locate_object(owner, bucket, name)
        key["upload_id"] = upload_id

        async def attempt() -> int:
            async with self.shards.of_vnode(vnode).pool.transaction() as conn:
                cur = conn.cursor()
                await cur.execute(render(queries.TAKE_UPLOAD, vnode), key)
                if not await cur.fetchall():
                    raise UploadNotFound(f"no upload {upload_id} for {name!r}")
                await cur.execute(render(queries.RETIRE_PARTS, vnode), {**key, "keep": []})
                row = await cur.fetchone()
                return int(row[0]) if row else 0

        return await self.retrying_window(vnode, attempt)


def _chosen_parts(
    chosen: list[tuple[int, bytes]], stored: dict[int, Part], min_part_size: int
) -> list[Part]:
    if not chosen:
        raise InvalidPart("a multipart upload must be completed with at least one part")
    numbers = [number for number, _ in chosen]
    if any(b <= a for a, b in itertools.pairwise(numbers)):
        raise InvalidPartOrder("parts must be listed in ascending order of part number")
    parts = []
    for number, md5 in chosen:
        part = stored.get(number)
        if part is None or part.content_md5 != md5:
            raise InvalidPart(f"part {number} was not uploaded or its ETag does not match")
        parts.append(part)
    for part in parts[:-1]:
        if part.content_length < min_part_size:
            raise EntityTooSmall(part.part_number, part.content_length, min_part_size)
    return parts


def _start(
    prefix: str, key_marker: str, upload_id_marker: uuid.UUID | None
) -> tuple[str, uuid.UUID]:
    """Where a listing of uploads starts, as the (key, upload id) it reads after: past the
    marker's key (or past its upload id, when one is given), or at the prefix."""
    if key_marker and key_marker >= prefix:
        return key_marker, upload_id_marker or MAX_ID
    return prefix, NIL_ID


def _upper(prefix: str) -> str | None:
    return successor(prefix) if prefix else None


def _past(common: str) -> tuple[str, uuid.UUID] | None:
    """The start that reads on past every key under the common prefix `common`."""
    after = successor(common)
    return None if after is None else (after, NIL_ID)


def _assembled(upload: Upload, parts: list[Part], properties: dict[str, Any]) -> ObjectWrite:
    """The object a completed upload becomes: its properties name every part and its blocks."""
    digest = hashlib.md5(b"".join(p.content_md5 for p in parts), usedforsecurity=False)
    sharks = sorted({shark for p in parts for shark in p.sharks})
    return ObjectWrite(
        content_length=sum(p.content_length for p in parts),
        content_md5=digest.digest(),
        sharks=sharks,
        content_type=upload.content_type,
        headers={k: v for k, v in upload.headers.items() if v is not None},
        properties={
            **upload.properties,
            **properties,
            "upload_id": str(upload.id),
            "parts": [
                {
                    **p.properties,
                    "part_number": p.part_number,
                    "id": str(p.id),
                    "size": p.content_length,
                    "md5": p.content_md5.hex(),
                    "sharks": p.sharks,
                }
                for p in parts
            ],
        },
    )


def _upload(row: dict[str, Any]) -> Upload:
    return Upload(
        id=row["id"],
        owner=row["owner"],
        bucket_id=row["bucket_id"],
        name=row["name"],
        created=row["created"],
        content_type=row["content_type"],
        headers=row["headers"] or {},
        properties=row["properties"] or {},
    )


def _part(row: dict[str, Any]) -> Part:
    return Part(
        part_number=row["part_number"],
        id=row["id"],
        created=row["created"],
        content_length=row["content_length"],
        content_md5=bytes(row["content_md5"]),
        sharks=row["sharks"] or [],
        properties=row["properties"] or {},
    )
