"""Object bodies: request bodies into blocks, verified (lengths, Content-MD5,
x-amz-checksum-*), and a version's bytes back out.

A body is written to the storage nodes before its metadata row commits; when a check fails
after the data is stored, the blocks are deleted again (the orphan job is the backstop).
A body no larger than the gateway's inline limit is not sent to the nodes at all: its bytes
go into the metadata row (docs/s3.md, "Small objects").
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from shoal.ids import uuid7, uuid7_time
from shoal.metadata import ObjectVersion
from shoal.s3 import headers as h
from shoal.s3.errors import (
    BadDigest,
    EntityTooLarge,
    IncompleteBody,
    InvalidRequest,
    MissingContentLength,
    RequestTimeout,
)
from shoal.storage import BlockRun, DataPath, WriteResult, block_runs
from shoal.storage.checksums import S3_CHECKSUMS, Digests, is_s3_value

log = logging.getLogger("shoal.s3")

MAX_PUT_BYTES = 5 * 1024**3  # S3's limit for one PUT (and one part)
CHECKSUM_PREFIX = "x-amz-checksum-"
# Headers named like a checksum's value that are not one.
NOT_CHECKSUM_VALUES = {"x-amz-checksum-algorithm", "x-amz-checksum-type", "x-amz-checksum-mode"}
# Headers that name the algorithm of the checksum a request sends.
ALGORITHM_HEADERS = ("x-amz-sdk-checksum-algorithm", "x-amz-checksum-algorithm")


@dataclass(frozen=True)
class Stored:
    version_id: uuid.UUID
    result: WriteResult
    checksums: dict[str, str]  # the ones the client asked for, S3 form
    data: bytes | None = None  # a small body, kept for the row instead of written to nodes

    def properties(self) -> dict[str, object]:
        """What the object row's properties record of how the data is stored."""
        if self.data is not None:
            return {"inline": True, "checksums": self.checksums}
        return {"block_size": self.result.block_size, "checksums": self.checksums}


def declared_length(headers: Mapping[str, str]) -> int:
    """The length of the object data (x-amz-decoded-content-length for aws-chunked bodies)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    value = lowered.get("x-amz-decoded-content-length", lowered.get("content-length"))
    # An aws-chunked body's Content-Length counts its chunk framing: the data's own length
    # must be told apart, as S3 requires.
    chunked = lowered.get("x-amz-content-sha256", "").startswith("STREAMING-")
    if value is None or (chunked and "x-amz-decoded-content-length" not in lowered):
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
    """The S3 checksum the client sent or asked for: an x-amz-checksum-* header, a trailer
    named in x-amz-trailer, or the SDK's algorithm header, checked as S3 does. One algorithm
    at most, a known one, the algorithm header naming the one sent, a header's value the
    base64 of that algorithm's size (InvalidRequest otherwise: S3's messages)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    values = {
        name.removeprefix(CHECKSUM_PREFIX): value
        for name, value in lowered.items()
        if name.startswith(CHECKSUM_PREFIX) and name not in NOT_CHECKSUM_VALUES
    }
    trailers = lowered.get("x-amz-trailer", "").split(",")
    named = {*values, *(t.strip().lower().removeprefix(CHECKSUM_PREFIX) for t in trailers)}
    named.discard("")
    if not named <= set(S3_CHECKSUMS):
        raise InvalidRequest(
            "The algorithm type you specified in x-amz-checksum- header is invalid."
        )
    if len(named) > 1:
        raise InvalidRequest(
            "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed."
        )
    for header in ALGORITHM_HEADERS:
        asked = lowered.get(header, "").strip().lower()
        if header in lowered and (asked not in S3_CHECKSUMS or named - {asked}):
            raise InvalidRequest(f"Value for {header} header is invalid.")
        named |= {asked} - {""}
    for name, value in values.items():
        if not is_s3_value(name, value):
            raise InvalidRequest(f"Value for {CHECKSUM_PREFIX}{name} header is invalid.")
    return sorted(named)


async def store_body(
    data: DataPath,
    body: AsyncIterator[bytes | bytearray],
    headers: Mapping[str, str],
    trailers: Mapping[str, str],
    length: int | None,
    checksums: list[str],
    inline_limit: int | None = None,
) -> Stored:
    """Write a request body as a new version id's blocks and verify it, or remove it again.

    A body of at most `inline_limit` bytes is read into memory instead (Stored.data).
    `length` None: a body whose length no header declares (a form's file, post.py), stored in
    blocks whatever its size."""
    version_id = uuid7()
    expected_md5 = h.content_md5(headers)
    if inline_limit is not None and length is not None and length <= inline_limit:
        kept, result = await _read_small(body, length, checksums)
    else:
        kept, result = None, await data.write(version_id, body, checksums)
    try:
        if length is not None and result.size != length:
            raise IncompleteBody()
        check_md5(expected_md5, result.md5)
        verify_checksums(result.checksums, {**dict(headers), **dict(trailers)})
    except BaseException:
        await discard(data, version_id, result)
        raise
    return Stored(version_id, result, {k: result.checksums[k] for k in checksums}, kept)


async def _read_small(
    body: AsyncIterator[bytes | bytearray], length: int, checksums: list[str]
) -> tuple[bytes, WriteResult]:
    """A body of `length` bytes, whole, with its digests (reading stops past `length`: the
    size check then fails without holding more)."""
    received = bytearray()
    async for chunk in body:
        received += chunk
        if len(received) > length:
            break
    kept = bytes(received)
    digests = Digests(checksums)
    digests.update(kept)
    result = WriteResult(
        sharks=[], size=len(kept), block_size=0, md5=digests.md5, checksums=digests.s3_values()
    )
    return kept, result


def read_version(
    data: DataPath, version: ObjectVersion, start: int = 0, end: int | None = None
) -> AsyncIterator[bytes | bytearray]:
    """Bytes [start, end) of a version, from its row or from its blocks.

    Where they are is what the row's properties say, not whether `data` holds bytes: a
    gateway older than small objects overwrites a row without clearing `data`, so during a
    rolling upgrade a version in blocks can sit in a row that still holds stale bytes."""
    if version.properties.get("inline"):
        if version.data is None:
            raise ValueError(f"version {version.id} was read without its bytes (with_data)")
        return _from_row(version.data[start:end])
    runs = block_runs(version.id, version.content_length, version.sharks, version.properties)
    return data.read(runs, start, end)


async def _from_row(data: bytes) -> AsyncIterator[bytes]:
    yield data


def check_small_body(headers: Mapping[str, str], trailers: Mapping[str, str], body: bytes) -> None:
    """Content-MD5 and x-amz-checksum-* (header or trailer) of a small body (an XML
    document), checked before anything is done with it: BadDigest, InvalidDigest."""
    sent = _sent_digests(headers, trailers)
    expected_md5 = h.content_md5(sent)
    digests = Digests(requested_checksums(sent))
    digests.update(body)
    check_md5(expected_md5, digests.md5)
    verify_checksums(digests.s3_values(), sent)


def check_md5(expected: bytes | None, calculated: bytes) -> None:
    """BadDigest unless a body's MD5 is the one its Content-MD5 named (if it named one),
    with the two digests as S3 gives them: the expected one in hex, the one calculated in
    base64."""
    if expected is not None and expected != calculated:
        raise BadDigest(
            ExpectedDigest=expected.hex(),
            CalculatedDigest=base64.b64encode(calculated).decode(),
        )


def require_digest(headers: Mapping[str, str], trailers: Mapping[str, str]) -> None:
    """InvalidRequest, as S3 answers, unless a request carries a Content-MD5 or an
    x-amz-checksum-* (header or trailer) for its body: S3 asks for one on DeleteObjects,
    PutBucketCors and PutBucketLifecycleConfiguration (newer SDKs send a checksum instead)."""
    sent = _sent_digests(headers, trailers)
    if "content-md5" not in sent and not any(f"x-amz-checksum-{n}" in sent for n in S3_CHECKSUMS):
        raise InvalidRequest("Missing required header for this request: Content-MD5")


def _sent_digests(headers: Mapping[str, str], trailers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in (*headers.items(), *trailers.items())}


def verify_checksums(computed: Mapping[str, str], sent: Mapping[str, str]) -> None:
    lowered = {k.lower(): v for k, v in sent.items()}
    for name, value in computed.items():
        claimed = lowered.get(f"x-amz-checksum-{name}")
        if claimed is not None and claimed.strip() != value:
            raise BadDigest(
                f"The {name.upper()} you specified did not match the calculated checksum."
            )


async def check_lifetime(data: DataPath, stored: Stored, lifetime: timedelta) -> None:
    """Refuse to commit a write that began more than `lifetime` ago ([s3] write_lifetime_seconds),
    and drop its blocks: `shoal pipeline orphans --delete` reclaims blocks that no row names
    once they are older than its leeway, which is at least that long, so the row would name
    blocks that may be gone. Its version id is when it began (UUIDv7)."""
    if stored.result.sharks and datetime.now(UTC) - uuid7_time(stored.version_id) > lifetime:
        await discard(data, stored.version_id, stored.result)
        raise RequestTimeout(
            f"The write took longer than the {lifetime.total_seconds():g} seconds a write may "
            "take; send it again."
        )


async def discard(data: DataPath, version_id: uuid.UUID, result: WriteResult) -> None:
    """Best-effort removal of blocks that will never be named by a row."""
    if not result.sharks:
        return  # nothing was written to a node
    with contextlib.suppress(Exception):
        run = BlockRun(version_id, result.size, result.block_size, result.sharks)
        await asyncio.shield(data.delete([run]))
