"""The values the metadata API takes and returns."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from shoal.ids import uuid7


@dataclass(frozen=True)
class Account:
    id: uuid.UUID
    name: str
    created: datetime


@dataclass(frozen=True)
class Bucket:
    id: uuid.UUID  # the incarnation: a re-created bucket gets a new id
    owner: uuid.UUID
    name: str
    created: datetime


@dataclass(frozen=True)
class ObjectWrite:
    """What a put records: the data path has already written the blocks named by `id`, or
    `data` holds the bytes of a small object, kept in the row itself (no blocks)."""

    content_length: int
    content_md5: bytes  # the S3 ETag's bytes: MD5 of the data, or MD5 of part MD5s
    sharks: list[str] = field(default_factory=list)
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)
    roles: list[uuid.UUID] = field(default_factory=list)
    creator: uuid.UUID | None = None
    id: uuid.UUID = field(default_factory=uuid7)
    data: bytes | None = None
    # Written to fewer nodes than the target number of copies: put notes the version for
    # re-replication before its row commits (metadata/replicas.py).
    under_replicated: bool = False

    @property
    def etag(self) -> str:
        parts = self.properties.get("parts")
        return etag(self.content_md5, None if parts is None else len(parts))


@dataclass(frozen=True)
class ObjectVersion:
    """A row of manta_bucket_object (or of manta_bucket_deleted_object, with deleted_at)."""

    id: uuid.UUID
    owner: uuid.UUID
    bucket_id: uuid.UUID
    name: str
    created: datetime
    modified: datetime
    creator: uuid.UUID | None
    content_length: int
    content_md5: bytes
    content_type: str | None
    headers: dict[str, str | None]
    roles: list[uuid.UUID]
    sharks: list[str]
    properties: dict[str, Any]
    data: bytes | None = None  # a small object's bytes, when its row holds them (no blocks)
    deleted_at: datetime | None = None

    @property
    def etag(self) -> str:
        parts = self.properties.get("parts")
        return etag(self.content_md5, None if parts is None else len(parts))


class ObjectSummary(NamedTuple):
    """One key of a listing (a named tuple: a page builds 1000 of them, and a frozen
    dataclass costs ~3x as much to construct)."""

    name: str
    last_modified: str  # as S3 listings show it, 2024-01-31T12:00:00.000Z (queries.py)
    content_length: int
    etag: str  # as S3 shows it, without quotes (queries.ETAG)


@dataclass(frozen=True)
class CommonPrefix:
    prefix: str


@dataclass(frozen=True)
class ListingPage:
    entries: list[ObjectSummary | CommonPrefix]
    is_truncated: bool
    # Pass as `marker` to get the next page (the last key or common prefix of this one).
    next_marker: str | None

    @property
    def objects(self) -> list[ObjectSummary]:
        return [e for e in self.entries if isinstance(e, ObjectSummary)]

    @property
    def common_prefixes(self) -> list[str]:
        return [e.prefix for e in self.entries if isinstance(e, CommonPrefix)]


@dataclass(frozen=True)
class Upload:
    id: uuid.UUID
    owner: uuid.UUID
    bucket_id: uuid.UUID
    name: str
    created: datetime
    content_type: str | None
    headers: dict[str, str | None]
    properties: dict[str, Any]


@dataclass(frozen=True)
class PartWrite:
    part_number: int
    content_length: int
    content_md5: bytes
    sharks: list[str] = field(default_factory=list)
    properties: dict[str, Any] = field(default_factory=dict)
    id: uuid.UUID = field(default_factory=uuid7)
    under_replicated: bool = False  # as ObjectWrite's: noted before the part row commits


@dataclass(frozen=True)
class Part:
    part_number: int
    id: uuid.UUID
    created: datetime
    content_length: int
    content_md5: bytes
    sharks: list[str]
    properties: dict[str, Any]

    @property
    def etag(self) -> str:
        return self.content_md5.hex()


@dataclass(frozen=True)
class DeletedBucket:
    id: uuid.UUID
    owner: uuid.UUID
    name: str
    created: datetime
    deleted_at: datetime


def etag(content_md5: bytes, parts_count: int | None) -> str:
    """S3's ETag: the MD5 hex, or for a multipart object the MD5 of part MD5s and `-N`."""
    return content_md5.hex() + (f"-{parts_count}" if parts_count is not None else "")
