"""How a job puts an object into a bucket: from the driver, exactly as the gateway stores a
PutObject (the data path writes the blocks, or the row keeps a small object's bytes, then
store.objects commits the row), so what a job delivers is a normal object afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from shoal.metadata import CommitUnknown, MetadataError, MetadataStore, ObjectWrite
from shoal.s3 import payload
from shoal.storage import DataPath

CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Published:
    key: str
    size: int
    md5: str  # hex, the object's ETag


async def put_object(
    store: MetadataStore,
    data: DataPath,
    owner: uuid.UUID,
    bucket: str,
    key: str,
    body: Path | bytes,
    content_type: str,
    inline_limit: int,
) -> Published:
    """Store `body` (a file's contents, or bytes) as `bucket/key` of `owner`, replacing any
    object there. Blocks are dropped again when the row is known not to have committed."""
    size = body.stat().st_size if isinstance(body, Path) else len(body)
    stored = await payload.store_body(data, _chunks(body), {}, {}, size, [], inline_limit)
    write = ObjectWrite(
        id=stored.version_id,
        content_length=stored.result.size,
        content_md5=stored.result.md5,
        sharks=stored.result.sharks,
        content_type=content_type,
        properties=stored.properties(),
        data=stored.data,
        under_replicated=stored.result.under_replicated,
    )
    try:
        await store.objects.put(owner, bucket, key, write)
    except MetadataError as exc:
        if not isinstance(exc, CommitUnknown):
            await payload.discard(data, stored.version_id, stored.result)
        raise
    return Published(key, stored.result.size, stored.result.md5.hex())


async def _chunks(body: Path | bytes) -> AsyncIterator[bytes]:
    if isinstance(body, bytes):
        yield body
        return
    with body.open("rb") as source:
        while chunk := source.read(CHUNK_BYTES):
            yield chunk
