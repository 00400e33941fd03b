"""Blocks on a storage node's disk: named by (version id, block index), written once.

Each block is one file, `blocks/<fan-out>/<version id>.<index>`, that starts with a 48-byte
header (magic, data size, SHA-256 of the data) so that a node can list its blocks with their
checksums without reading their data. A block is streamed to `tmp/`, verified against the
checksum its writer sent, fsynced, and linked into place; `link` fails if the name exists, so
a block is never overwritten.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import struct
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

HEADER = struct.Struct(">8sQ32s")  # magic, data size, sha256 of the data
MAGIC = b"SHOALBK1"
# Reads hand the disk thread 1 MiB at a time: one hop per default-sized block.
READ_CHUNK_BYTES = 1024 * 1024
WRITE_BATCH_BYTES = 256 * 1024
MAX_BLOCK_BYTES = 64 * 1024 * 1024
_BLOCK_NAME = re.compile(
    r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.(0|[1-9][0-9]{0,8})$"
)


class BlockError(Exception):
    """Base of the block store's refusals."""


class InvalidBlockName(BlockError):
    pass


class BlockNotFound(BlockError):
    pass


class BlockExists(BlockError):
    """A different block already has this name (blocks are never overwritten)."""


class ChecksumMismatch(BlockError):
    pass


class BlockCorrupt(BlockError):
    """The file on disk does not hold what its header says."""


@dataclass(frozen=True)
class BlockInfo:
    name: str
    size: int
    sha256: str
    mtime: float


def block_name(version_id: uuid.UUID, index: int) -> str:
    return f"{version_id}.{index}"


def parse_block_name(name: str) -> tuple[uuid.UUID, int]:
    check_block_name(name)
    version, index = name.split(".")
    return uuid.UUID(version), int(index)


def check_block_name(name: str) -> None:
    """Only `<uuid>.<index>`: no '/', '..', NUL or absolute paths can reach the disk."""
    if not isinstance(name, str) or not _BLOCK_NAME.match(name):
        raise InvalidBlockName(f"invalid block name {name[:80]!r}")


async def in_thread(function: Callable[..., T], *args: object) -> T:
    """The one way blocking disk work (writes, fsync, reads) leaves the event loop."""
    return await asyncio.to_thread(function, *args)


class BlockStore:
    def __init__(self, root: Path) -> None:
        self.root = root.absolute()
        self.blocks = self.root / "blocks"
        self.tmp = self.root / "tmp"
        self.blocks.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self._clear_tmp()

    def path_of(self, name: str) -> Path:
        check_block_name(name)
        return self.blocks / _fan_out(name) / name

    async def write(self, name: str, chunks: AsyncIterator[bytes], size: int, sha256: str) -> bool:
        """Store a block; True if new, False if an identical block was already there."""
        final = self.path_of(name)
        if size > MAX_BLOCK_BYTES:
            raise BlockError(f"block of {size} bytes is over the {MAX_BLOCK_BYTES} limit")
        tmp = self.tmp / f"{name}.{uuid.uuid4().hex}"
        handle = await in_thread(_open_new, tmp)
        try:
            digest = hashlib.sha256()
            written = 0
            await in_thread(handle.write, HEADER.pack(MAGIC, size, bytes.fromhex(sha256)))
            async for chunk in _batched(chunks, WRITE_BATCH_BYTES):
                written += len(chunk)
                if written > size:
                    raise ChecksumMismatch(f"block {name} is longer than {size} bytes")
                await in_thread(_write_and_hash, handle, digest, chunk)
            if written != size:
                raise ChecksumMismatch(f"block {name} has {written} bytes, expected {size}")
            if digest.hexdigest() != sha256:
                raise ChecksumMismatch(f"block {name} does not match its SHA-256")
            await in_thread(_sync_and_close, handle)
            return await in_thread(self._link_into_place, tmp, final, sha256)
        finally:
            if not handle.closed:
                handle.close()
            await in_thread(tmp.unlink, True)

    def info(self, name: str) -> BlockInfo:
        path = self.path_of(name)
        try:
            with open(path, "rb") as handle:
                raw = handle.read(HEADER.size)
                mtime = os.fstat(handle.fileno()).st_mtime
        except FileNotFoundError:
            raise BlockNotFound(name) from None
        return _parse_header(name, raw, mtime)

    async def read(self, name: str, start: int, end: int) -> AsyncIterator[bytes]:
        """Bytes [start, end) of a block's data, a chunk at a time."""
        path = self.path_of(name)
        try:
            handle = await in_thread(open, path, "rb")
        except FileNotFoundError:
            raise BlockNotFound(name) from None
        try:
            await in_thread(handle.seek, HEADER.size + start)
            remaining = end - start
            while remaining > 0:
                chunk = await in_thread(handle.read, min(READ_CHUNK_BYTES, remaining))
                if not chunk:
                    raise BlockCorrupt(f"block {name} is shorter than its header says")
                remaining -= len(chunk)
                yield chunk
        finally:
            handle.close()

    def delete(self, name: str) -> bool:
        """Remove a block; False if it was not there (already deleted is fine)."""
        try:
            self.path_of(name).unlink()
        except FileNotFoundError:
            return False
        return True

    def inventory(self, after: str = "", limit: int = 1000) -> list[BlockInfo]:
        """Up to `limit` blocks in (fan-out, name) order, after the block named `after`."""
        if after:
            check_block_name(after)
        start_dir = _fan_out(after) if after else ""
        found: list[BlockInfo] = []
        for directory in sorted(d for d in os.listdir(self.blocks) if d >= start_dir):
            names = sorted(os.listdir(self.blocks / directory))
            if directory == start_dir and after:
                names = [n for n in names if n > after]
            for name in names:
                try:
                    found.append(self.info(name))
                except (BlockNotFound, BlockCorrupt, InvalidBlockName):
                    continue  # deleted meanwhile, or not ours: the audit reports what matters
                if len(found) >= limit:
                    return found
        return found

    def count(self) -> int:
        return sum(len(os.listdir(self.blocks / d)) for d in os.listdir(self.blocks))

    def usage(self) -> tuple[int, int]:
        """(capacity, free) bytes of the file system holding the blocks."""
        stats = os.statvfs(self.blocks)
        return stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize

    def _link_into_place(self, tmp: Path, final: Path, sha256: str) -> bool:
        final.parent.mkdir(exist_ok=True)
        try:
            os.link(tmp, final)
        except FileExistsError:
            existing = self.info(final.name)
            if existing.sha256 != sha256:
                raise BlockExists(f"block {final.name} exists with other content") from None
            return False
        _fsync_directory(final.parent)
        return True

    def _clear_tmp(self) -> None:
        for leftover in self.tmp.iterdir():
            leftover.unlink(missing_ok=True)


def _fan_out(name: str) -> str:
    # The last hex digits of a UUIDv7 are random; the first ones are time and would cluster.
    return name[34:36]


def _parse_header(name: str, raw: bytes, mtime: float) -> BlockInfo:
    if len(raw) != HEADER.size:
        raise BlockCorrupt(f"block {name} has a truncated header")
    magic, size, sha256 = HEADER.unpack(raw)
    if magic != MAGIC:
        raise BlockCorrupt(f"block {name} has no block header")
    return BlockInfo(name=name, size=size, sha256=sha256.hex(), mtime=mtime)


def _open_new(path: Path):  # type: ignore[no-untyped-def]
    return open(path, "xb")


def _write_and_hash(handle, digest, chunk: bytes) -> None:  # type: ignore[no-untyped-def]
    digest.update(chunk)
    handle.write(chunk)


def _sync_and_close(handle) -> None:  # type: ignore[no-untyped-def]
    handle.flush()
    os.fsync(handle.fileno())
    handle.close()


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def _batched(chunks: AsyncIterator[bytes], size: int) -> AsyncIterator[bytes]:
    """Regroup a stream into pieces of about `size` bytes (fewer trips to the disk thread)."""
    pending = bytearray()
    async for chunk in chunks:
        pending += chunk
        if len(pending) >= size:
            yield bytes(pending)
            pending.clear()
    if pending:
        yield bytes(pending)
