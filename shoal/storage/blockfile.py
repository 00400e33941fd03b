"""Blocks on a storage node's disk: named by (version id, block index), written once.

Each block is one file, `blocks/<fan-out>/<version id>.<index>`, that starts with a 32-byte
header (magic, data size, checksum of the data) so that a node can list its blocks with their
checksums without reading their data. A block is streamed to `tmp/`, verified against the
checksum its writer sent, fsynced, and linked into place; `link` fails if the name exists, so
a block is never overwritten.

Block files are written through the page cache, which then holds them for the reads that
follow soon after a write. With `direct_writes` (`[storage] direct_writes`), they are
written by O_DIRECT, where the file system takes it: the bytes go from the receive buffer to
the disk with no copy into the page cache, sparing the node that copy's CPU and memory; a
first read then comes from the disk (docs/storage.md, "Direct writes"). Reads go through the
page cache either way.

The checksum is XXH3-128: it guards against disks and wires that change bytes, not against an
adversary (requests to nodes are authenticated; block names do not come from content). It
hashes a MiB in a small fraction of what SHA-256, the checksum before, took even with the CPU's
SHA instructions, on the gateway and on every node for every byte written or read
(bench/token_bench.py measures both; docs/decisions.md, "XXH3-128 block checksums").
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import mmap
import os
import re
import shutil
import socket
import ssl
import struct
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol, TypeVar

import xxhash

from shoal.storage.metrics import metrics

T = TypeVar("T")

log = logging.getLogger("shoal.storage")

HEADER = struct.Struct(">8sQ16s")  # magic, data size, XXH3-128 of the data
# The HTTP header that carries a block's checksum (`checksum_of`, 32 hex digits) between a
# node and its clients: sent with a PUT, answered with a GET or HEAD.
CHECKSUM_HEADER = "X-Shoal-Checksum"
MAGIC = b"SHOALBK2"  # BK1, an earlier format, checksummed blocks with SHA-256
# Writes receive up to this much, then write it while the rest arrives: one 4 MiB write()
# before an fsync ran well below the speed of 256 KiB pieces (docs/decisions.md, "Block size
# and write pieces"; bench/storage_bench.py), and it bounds a request's memory whatever the
# block size.
WRITE_PIECE_BYTES = 256 * 1024
# By O_DIRECT each piece is a write the disk does before the next piece is received: larger
# pieces, fewer waits (bench/storage_bench.py --direct-writes).
DIRECT_PIECE_BYTES = 1024 * 1024
# O_DIRECT wants the file offset, the length and the memory of each write aligned: 4096
# covers the logical block sizes of common disks (512 and 4096).
DIRECT_ALIGN = 4096
_O_DIRECT = getattr(os, "O_DIRECT", 0)
# Refuse new blocks that would leave less than this free: a full disk must not corrupt what
# it holds.
RESERVED_FREE_BYTES = 64 * 1024 * 1024
MAX_BLOCK_BYTES = 64 * 1024 * 1024
# Empty temporary files a process keeps made ahead of the writes to come (see make_spare).
SPARE_FILES = 8
# A node's folders and block files are its own: no other local user reads objects from them.
PRIVATE_FOLDER = 0o700
PRIVATE_FILE = 0o600
# Over TLS a range is read and sent in pieces of this size (sendfile would bypass TLS).
TLS_SEND_BYTES = 256 * 1024
_BLOCK_NAME = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.(0|[1-9][0-9]{0,8})"
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


class OutOfSpace(BlockError):
    """Writing the block would leave less than the reserved free space."""


class BlockCorrupt(BlockError):
    """The file on disk does not hold what its header says."""


class DiskNotWritable(BlockError):
    """The disk takes no new file, or removes none, now: read-only (a file system with
    errors, a folder mounted read-only), out of inodes. `removed` are the sizes of the
    blocks a batch removed before the disk refused."""

    def __init__(self, message: str, removed: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.removed = list(removed)


def _refusal(exc: OSError, what: str) -> BlockError:
    """The block error for a disk that refused `what` ("writes", "deletes")."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return OutOfSpace("node is out of space")
    return DiskNotWritable(f"the disk does not take {what}: {exc.strerror or exc}")


@dataclass(frozen=True)
class BlockInfo:
    name: str
    size: int
    checksum: str  # XXH3-128 of the data, 32 hex digits
    mtime: float


def block_name(version_id: uuid.UUID, index: int) -> str:
    return f"{version_id}.{index}"


def parse_block_name(name: str) -> tuple[uuid.UUID, int]:
    check_block_name(name)
    version, index = name.split(".")
    return uuid.UUID(version), int(index)


def check_block_name(name: str) -> None:
    """Only `<uuid>.<index>`: no '/', '..', NUL or absolute paths can reach the disk."""
    if not isinstance(name, str) or not _BLOCK_NAME.fullmatch(name):
        raise InvalidBlockName(f"invalid block name {name[:80]!r}")


async def in_thread(function: Callable[..., T], *args: object) -> T:
    """The one way blocking disk work (writes, fsync, reads) leaves an event loop."""
    return await asyncio.to_thread(function, *args)


class Readable(Protocol):
    """Where a block's bytes come from: a request body, a file."""

    def readinto(self, buffer: memoryview, /) -> int | None: ...


class BlockStore:
    """The blocks under `root`, as one process of a node sees them.

    A node may run several processes on one folder (workers.py); each writes its temporary
    files in its own tmp/ folder, named by its worker number, so that clearing leftovers at
    start never removes a file another live process is writing.
    """

    def __init__(
        self,
        root: Path,
        worker: int = 0,
        reserved_free_bytes: int = RESERVED_FREE_BYTES,
        direct_writes: bool = False,
    ) -> None:
        self.root = root.absolute()
        self.reserved_free_bytes = reserved_free_bytes
        self.blocks = self.root / "blocks"
        self._blocks_text = os.fspath(self.blocks)
        self.tmp = self.root / "tmp" / f"w{worker}"
        self._spares: list[_TempBlock] = []
        self._spares_lock = threading.Lock()
        self.blocks.mkdir(mode=PRIVATE_FOLDER, parents=True, exist_ok=True)
        # Folders made before they were private: closing them closes every file inside.
        for folder in (self.root, self.blocks):
            folder.chmod(PRIVATE_FOLDER)
        self._make_fan_out_folders()
        # What an earlier run left half-written: the node process (worker 0) starts before
        # its workers and clears them all; a worker started again clears its own.
        shutil.rmtree(self.tmp.parent if worker == 0 else self.tmp, ignore_errors=True)
        self.tmp.parent.mkdir(mode=PRIVATE_FOLDER, exist_ok=True)
        self.tmp.mkdir(mode=PRIVATE_FOLDER, exist_ok=True)
        if direct_writes and not _takes_direct_writes(self.tmp):
            log.warning("%s refuses O_DIRECT: blocks are written through the page cache", root)
            direct_writes = False
        self.direct_writes = direct_writes  # as done here; the node's workers follow it
        self._buffers = _Buffers(DIRECT_PIECE_BYTES if direct_writes else WRITE_PIECE_BYTES)

    def path_of(self, name: str) -> Path:
        check_block_name(name)
        return Path(self._location(name))

    def _location(self, name: str) -> str:
        """Where a (checked) block's file is, as a string."""
        return f"{self._blocks_text}/{_fan_out(name)}/{name}"

    def write(self, name: str, body: Readable, size: int, checksum: str) -> bool:
        """Store the `size` bytes that `body` yields; True if new, False if an identical
        block was already there.

        The bytes arrive in pieces (WRITE_PIECE_BYTES; DIRECT_PIECE_BYTES by O_DIRECT) into
        one buffer (the first behind the header), hashed and written to a temporary file as
        they come; after the checksum matched, the file is fsynced and linked into place and
        its folder fsynced: only then is the block acknowledged.
        """
        final = self.path_of(name)
        if size > MAX_BLOCK_BYTES:
            raise BlockError(f"block of {size} bytes is over the {MAX_BLOCK_BYTES} limit")
        self._check_space(size)
        temp = self._take_spare() or self._new_temp()
        buffer = self._buffers.take()
        try:
            header = HEADER.pack(MAGIC, size, bytes.fromhex(checksum))
            buffer[: len(header)] = header
            held, remaining = len(header), size  # held: bytes in the buffer, not yet written
            digest = xxhash.xxh3_128()
            while remaining:
                wanted = min(remaining, len(buffer) - held)
                got = _read_exactly(body, buffer[held : held + wanted])
                if got < wanted:
                    received = size - remaining + got
                    raise ChecksumMismatch(f"block {name} has {received} bytes, expected {size}")
                digest.update(buffer[held : held + got])
                held, remaining = held + got, remaining - got
                if remaining:  # the buffer is full: a whole piece, a multiple of DIRECT_ALIGN
                    temp.write(buffer[:held])
                    held = 0
            if digest.hexdigest() != checksum:
                raise ChecksumMismatch(f"block {name} does not match its checksum")
            temp.write_last(buffer, held)
            temp.finish(len(header) + size)
            return self._link_into_place(temp, final, checksum)
        finally:
            temp.discard()
            self._buffers.give_back(buffer)

    def make_spare(self) -> None:
        """Make an empty temporary file for a write to come, unless SPARE_FILES wait already.

        Creating a file right after the last block's fsyncs waits for the metadata those
        fsyncs are writing out, a noticeable part of a 1 MiB block's write: a connection that
        has just answered a write makes the next one's file while its client sends the next
        request, and the write finds it made (docs/decisions.md, "Spare temporary files on
        the node"; `bench/storage_bench.py --block-kib 1024`).
        """
        with self._spares_lock:
            if len(self._spares) >= SPARE_FILES:
                return
        try:
            spare = _TempBlock(self.tmp / uuid.uuid4().hex, self.direct_writes)
        except OSError:
            return  # the disk takes no new file now (read-only, full): the next write says so
        with self._spares_lock:
            self._spares.append(spare)

    def close(self) -> None:
        """Remove the spare temporary files (a stopping node's)."""
        with self._spares_lock:
            spares, self._spares = self._spares, []
        for spare in spares:
            spare.discard()

    def info(self, name: str) -> BlockInfo:
        path = self.path_of(name)
        try:
            with open(path, "rb") as handle:
                raw = handle.read(HEADER.size)
                mtime = os.fstat(handle.fileno()).st_mtime
        except FileNotFoundError:
            raise BlockNotFound(name) from None
        return _parse_header(name, raw, mtime)

    def open(self, name: str, pick: Callable[[int], tuple[int, int]]) -> BlockReader:
        """A block open for the bytes [start, end) that `pick(size)` chooses."""
        return BlockReader.open(self.path_of(name), name, pick)

    def delete(self, name: str) -> bool:
        """Remove a block; False if it was not there (already deleted is fine)."""
        return self.remove(name) is not None

    def remove(self, name: str) -> int | None:
        """Remove a block; the bytes its file took, or None if it was not there."""
        return self.remove_many([name])[0]

    def remove_many(self, names: Sequence[str]) -> list[int | None]:
        """Remove blocks, every name checked before any is removed (a batch naming one
        invalid name removes nothing): the bytes each file took, None where it was not there.

        Paths are plain strings here, not Path objects: the GC sends names by the
        thousand, most of them already gone, and building Paths took about 40% of the
        nodes' CPU per record (bench/pipeline_gc_bench.py prints it)."""
        for name in names:
            check_block_name(name)
        sizes: list[int | None] = []
        for name in names:
            path = self._location(name)
            try:
                size: int | None = os.stat(path).st_size
                os.unlink(path)
            except FileNotFoundError:
                size = None
            except OSError as exc:
                removed = [size for size in sizes if size is not None]
                raise DiskNotWritable(
                    f"the disk does not take deletes: {exc.strerror or exc}", removed
                ) from None
            sizes.append(size)
        return sizes

    def stored_bytes(self) -> int:
        """The bytes of every block file (a scan of the whole folder)."""
        total = 0
        for directory in os.listdir(self.blocks):
            with os.scandir(self.blocks / directory) as entries:
                for entry in entries:
                    with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                        total += entry.stat().st_size
        return total

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

    def _new_temp(self) -> _TempBlock:
        try:
            return _TempBlock(self.tmp / uuid.uuid4().hex, self.direct_writes)
        except OSError as exc:
            raise _refusal(exc, "writes") from None

    def _take_spare(self) -> _TempBlock | None:
        with self._spares_lock:
            return self._spares.pop() if self._spares else None

    def _check_space(self, size: int) -> None:
        stats = os.statvfs(self.tmp)
        if stats.f_bavail * stats.f_frsize < size + self.reserved_free_bytes:
            raise OutOfSpace("node is out of space")

    def _make_fan_out_folders(self) -> None:
        """All 256 folders, made durable once: a write then links without a mkdir (a syscall
        per block), and no folder a block was acknowledged in can vanish in a crash."""
        for index in range(256):
            folder = self.blocks / f"{index:02x}"
            folder.mkdir(mode=PRIVATE_FOLDER, exist_ok=True)
            folder.chmod(PRIVATE_FOLDER)
        _fsync_directory(self.blocks)

    def _link_into_place(self, temp: _TempBlock, final: Path, checksum: str) -> bool:
        try:
            try:
                os.link(temp.path, final)
            except FileNotFoundError:  # a fan-out folder removed by hand: make them again
                self._make_fan_out_folders()
                os.link(temp.path, final)
        except FileExistsError:
            existing = self.info(final.name)
            if existing.checksum != checksum:
                raise BlockExists(f"block {final.name} exists with other content") from None
            return False
        except OSError as exc:  # the blocks folder read-only while tmp/ is not, say
            raise _refusal(exc, "writes") from None
        _fsync_directory(final.parent)
        return True


def _fan_out(name: str) -> str:
    # The last hex digits of a UUIDv7 are random; the first ones are time and would cluster.
    return name[34:36]


def _parse_header(name: str, raw: bytes, mtime: float) -> BlockInfo:
    if len(raw) != HEADER.size:
        raise BlockCorrupt(f"block {name} has a truncated header")
    magic, size, checksum = HEADER.unpack(raw)
    if magic != MAGIC:
        raise BlockCorrupt(f"block {name} has no block header")
    return BlockInfo(name=name, size=size, checksum=checksum.hex(), mtime=mtime)


class BlockReader:
    """A block open for reading a range of its data."""

    def __init__(self, handle: BinaryIO, info: BlockInfo, start: int, end: int) -> None:
        self.info = info
        self.start = start
        self.end = end
        self._handle = handle

    @classmethod
    def open(cls, path: Path, name: str, pick: Callable[[int], tuple[int, int]]) -> BlockReader:
        """Open, read the header, check the file holds all the data it announces, and choose
        the range: a short file is refused before any byte of it is sent."""
        try:
            handle = open(path, "rb", buffering=0)  # noqa: SIM115 - the reader closes it
        except FileNotFoundError:
            raise BlockNotFound(name) from None
        try:
            stat = os.fstat(handle.fileno())
            info = _parse_header(name, handle.read(HEADER.size), stat.st_mtime)
            if stat.st_size < HEADER.size + info.size:
                raise BlockCorrupt(f"block {name} is shorter than its header says")
            return cls(handle, info, *pick(info.size))
        except BaseException:
            handle.close()
            raise

    def send(self, out: socket.socket) -> None:
        """The range's bytes to a blocking socket, from the page cache by sendfile (no copy
        through Python); over TLS, read and sent in pieces."""
        offset, end = HEADER.size + self.start, HEADER.size + self.end
        if isinstance(out, ssl.SSLSocket):
            return self._send_in_pieces(out, offset, end)
        while offset < end:
            sent = os.sendfile(out.fileno(), self._handle.fileno(), offset, end - offset)
            if sent == 0:
                raise BlockCorrupt(f"block {self.info.name} is shorter than its header says")
            offset += sent

    def _send_in_pieces(self, out: socket.socket, offset: int, end: int) -> None:
        while offset < end:
            piece = os.pread(self._handle.fileno(), min(TLS_SEND_BYTES, end - offset), offset)
            if not piece:
                raise BlockCorrupt(f"block {self.info.name} is shorter than its header says")
            out.sendall(piece)
            offset += len(piece)

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> BlockReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _TempBlock:
    """A block's file in tmp/ while it is written; with `direct`, by O_DIRECT, in writes
    whose offsets and lengths are multiples of DIRECT_ALIGN, from page-aligned buffers."""

    def __init__(self, path: Path, direct: bool) -> None:
        self.path = path
        self.direct = direct
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (_O_DIRECT if direct else 0)
        self.fd = os.open(path, flags, PRIVATE_FILE)

    def write(self, piece: memoryview) -> None:
        """Write a piece (when direct, its length a multiple of DIRECT_ALIGN)."""
        while piece:
            piece = piece[os.write(self.fd, piece) :]

    def write_last(self, buffer: memoryview, held: int) -> None:
        """Write the last `held` bytes: when direct, zeros fill them up to DIRECT_ALIGN, and
        `finish` cuts the file back to its length."""
        if self.direct and held % DIRECT_ALIGN:
            padded = held + DIRECT_ALIGN - held % DIRECT_ALIGN
            buffer[held:padded] = bytes(padded - held)
            held = padded
        self.write(buffer[:held])

    def finish(self, length: int) -> None:
        """The file is `length` bytes long (the header and the data), on the disk."""
        if self.direct:
            os.ftruncate(self.fd, length)
        _fsync(self.fd)

    def discard(self) -> None:
        """Close and remove: after a link the block lives on under its final name."""
        os.close(self.fd)
        self.path.unlink(missing_ok=True)


class _Buffers:
    """Receive buffers of one piece, kept for the next writes: a fresh buffer costs its page
    faults again (a sixth of a node's CPU per block when measured), a reused one does not. At
    most KEPT_BUFFERS are kept, whatever the number of connections. Each is an anonymous
    mmap: page-aligned, as O_DIRECT writes need."""

    KEPT_BUFFERS = 8

    def __init__(self, piece_bytes: int) -> None:
        self.piece_bytes = piece_bytes
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()

    def take(self) -> memoryview:
        with self._lock:
            buffer = self._free.pop() if self._free else None
        return memoryview(buffer or mmap.mmap(-1, self.piece_bytes))

    def give_back(self, view: memoryview) -> None:
        buffer = view.obj
        assert isinstance(buffer, mmap.mmap)
        view.release()
        with self._lock:
            if len(self._free) < self.KEPT_BUFFERS:
                self._free.append(buffer)
                return
        buffer.close()


def _takes_direct_writes(folder: Path) -> bool:
    """Whether the file system under `folder` takes O_DIRECT writes (tmpfs, some network and
    FUSE file systems refuse them), tried with a file of one aligned write."""
    if not _O_DIRECT:
        return False  # not Linux
    path = folder / f"direct-{uuid.uuid4().hex}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_DIRECT, PRIVATE_FILE)
    except OSError:
        return False  # refused, or a disk that takes no file now: page-cache writes then
    try:
        with mmap.mmap(-1, DIRECT_ALIGN) as aligned:
            os.write(fd, aligned)
        return True
    except OSError as exc:
        # EINVAL: the file system refuses direct writes. Anything else (a full disk) is not
        # about them: the writes to come will say it.
        return exc.errno != errno.EINVAL
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def _read_exactly(body: Readable, buffer: memoryview) -> int:
    """Fill `buffer` from `body`; fewer bytes only if the body ended."""
    filled = 0
    while filled < len(buffer):
        count = body.readinto(buffer[filled:])
        if not count:
            break
        filled += count
    return filled


def checksum_of(data: bytes | bytearray) -> str:
    """A block's checksum (see the module's docstring), as 32 hex digits."""
    return xxhash.xxh3_128_hexdigest(data)


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _fsync(fd)
    finally:
        os.close(fd)


def _fsync(fd: int) -> None:
    """fsync, timed: its latency is the disk's under the node (shoal_node_fsync_duration)."""
    started = time.perf_counter()
    os.fsync(fd)
    metrics().fsync_seconds.observe(time.perf_counter() - started)
