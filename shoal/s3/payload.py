"""Request bodies into blocks: lengths, Content-MD5 and x-amz-checksum-* verified.

A body is written to the storage nodes before its metadata row commits; when a check fails
after the data is stored, the blocks are deleted again (the orphan job is the backstop).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from shoal.ids import uuid7
from shoal.s3 import headers as h
from shoal.s3.errors import (
    BadDigest,
    EntityTooLarge,
    IncompleteBody,
    InvalidRequest,
    MissingContentLength,
)
from shoal.storage import BlockRun, DataPath, WriteResult
from shoal.storage.checksums import S3_CHECKSUMS

log = logging.getLogger("shoal.s3")

MAX_PUT_BYTES = 5 * 1024**3  # S3's limit for one PUT (and one part)


@dataclass(frozen=True)
class Stored:
    version_id: uuid.UUID
    result: WriteResult
    checksums: dict[str, str]  # the ones the client asked for, S3 form


def declared_length(headers: Mapping[str, str]) -> int:
    """The length of the object data (x-amz-decoded-content-length for aws-chunked bodies)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    value = lowered.get("x-amz-decoded-content-length", lowered.get("content-length"))
    if value is None:
        raise MissingContentLength()
    try:
        length = int(value)
    except ValueError:
        raise InvalidRequest("Content-Length must be a number") from None
    if length < 0:
        raise InvalidRequest("Content-Length must not be negative")
    if length > MAX_PUT_BYTES:
        raise EntityTooLarge()
    return length


def requested_checksums(headers: Mapping[str, str]) -> list[str]:
    """The S3 checksums the client sent or asked for (header, trailer or SDK algorithm)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    wanted = {name for name in S3_CHECKSUMS if f"x-amz-checksum-{name}" in lowered}
    for header in ("x-amz-sdk-checksum-algorithm", "x-amz-checksum-algorithm"):
        if header in lowered:
            wanted.add(lowered[header].lower())
    for trailer in lowered.get("x-amz-trailer", "").split(","):
        name = trailer.strip().lower().removeprefix("x-amz-checksum-")
        if name:
            wanted.add(name)
    unknown = wanted - set(S3_CHECKSUMS)
    if unknown:
        raise InvalidRequest(f"checksum algorithm {sorted(unknown)[0]} is not supported")
    return sorted(wanted)


async def store_body(
    data: DataPath,
    body: AsyncIterator[bytes],
    headers: Mapping[str, str],
    trailers: Mapping[str, str],
    length: int,
    checksums: list[str],
) -> Stored:
    """Write a request body as a new version id's blocks and verify it, or remove it again."""
    version_id = uuid7()
    expected_md5 = h.content_md5(headers)
    result = await data.write(version_id, body, checksums)
    try:
        if result.size != length:
            raise IncompleteBody()
        if expected_md5 is not None and expected_md5 != result.md5:
            raise BadDigest()
        verify_checksums(result.checksums, {**dict(headers), **dict(trailers)})
    except BaseException:
        await discard(data, version_id, result)
        raise
    return Stored(version_id, result, {k: result.checksums[k] for k in checksums})


def verify_checksums(computed: Mapping[str, str], sent: Mapping[str, str]) -> None:
    lowered = {k.lower(): v for k, v in sent.items()}
    for name, value in computed.items():
        claimed = lowered.get(f"x-amz-checksum-{name}")
        if claimed is not None and claimed.strip() != value:
            raise BadDigest(
                f"The {name.upper()} you specified did not match the calculated checksum."
            )


async def discard(data: DataPath, version_id: uuid.UUID, result: WriteResult) -> None:
    """Best-effort removal of blocks that will never be named by a row."""
    with contextlib.suppress(Exception):
        run = BlockRun(version_id, result.size, result.block_size, result.sharks)
        await asyncio.shield(data.delete([run]))


def b64_md5(raw: bytes) -> str:
    return base64.b64encode(raw).decode()
