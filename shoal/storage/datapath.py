"""The data path: objects to replicated blocks and back, for the gateway and the pipeline.

write: splits a stream into blocks of `block_size`, writes each to every chosen replica at
once, a few blocks in flight at most (memory stays a few blocks whatever the object size),
and computes the digests on the way. A replica that fails is replaced by another node, which
then receives every block it missed, copied from a surviving replica; with no healthy node
left the write goes on with the replicas left when the number of copies is the default, and
fails with StorageUnavailable (retryable) when it was configured. Blocks are durable on every
replica when write returns; they become visible only when the caller commits the metadata row.

read: the bytes of a range, block by block; a block that is missing, unreadable or fails its
checksum on one replica is read from the next, and the bad replica is logged. When no replica
could be read and some could not be reached at all, the read fails with ReplicasUnreachable
(retryable); only when every replica answered and none had a good copy is it DataUnavailable.

A node that refuses or drops a connection is told to the directory (mark_unreachable), which
offers it no new blocks until it answers again; reads ask it last.

delete: every block of a version on every node that holds it (for GC).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import logging
import random
import uuid
from collections.abc import AsyncIterator, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from shoal.storage import placement
from shoal.storage.blockfile import block_name, checksum_of, in_thread
from shoal.storage.checksums import S3_CHECKSUMS, Digests
from shoal.storage.client import (
    SILENT_CHECKS_TO_GIVE_UP,
    BlockClient,
    NodeError,
    NodeUnreachable,
)
from shoal.storage.placement import Node

log = logging.getLogger("shoal.storage")

# The block size of versions whose row does not record one (written before rows did), and a
# DataPath's when none is given; `shoal serve` writes in `[storage] block_size` blocks.
DEFAULT_BLOCK_SIZE = 1024 * 1024
BLOCKS_IN_FLIGHT = 4
# Large blocks: fewer in flight, so that a write or a read holds at most about this much.
BYTES_IN_FLIGHT = 8 * 1024 * 1024
DELETE_BATCH = 1000
# Delete requests in flight per node: each overlaps its round trip with the node's unlinks of
# the others.
DELETES_IN_FLIGHT = 4
# How long a failed write waits for its blocks in flight before deleting what it wrote.
ABANDON_WAIT_SECONDS = 10
# Digest work below this size is cheaper in the event loop than a hop to a thread.
THREAD_THRESHOLD_BYTES = 64 * 1024
# How long a node marked unreachable is given to answer its /status before a delete.
STATUS_SECONDS = 1.0
# glibc's mallopt parameters (malloc.h), and how much freed memory a process may keep.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc's own ceiling on 64-bit
KEPT_FREE_BYTES = 64 * 1024 * 1024


def reuse_block_memory(block_size: int) -> bool:
    """Have malloc keep the memory of freed blocks for the next ones (glibc); whether it took.

    Every block a gateway receives or reads is a new buffer of block size, and the request
    bodies arrive as chunks of a few hundred KiB. glibc serves those from fresh mmaps and
    gives freed heap back to the kernel, so each MiB moved page-faulted again (about 160
    faults a MiB through a gateway); kept in the heap, they are reused
    (docs/decisions.md, "Block memory kept by malloc"; bench/cpu_split.py part).
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc: its own allocator decides
    threshold = min(max(2 * block_size, 1024 * 1024), _MMAP_THRESHOLD_MAX)
    return bool(
        mallopt(_M_MMAP_THRESHOLD, threshold)
        and mallopt(_M_TRIM_THRESHOLD, max(KEPT_FREE_BYTES, 2 * threshold))
    )


class StorageUnavailable(Exception):
    """Not enough healthy storage nodes for the request; retrying later may succeed."""


class DataUnavailable(Exception):
    """No replica of a block could be read."""


class ReplicasUnreachable(DataUnavailable):
    """No replica of a block could be read, and some could not be reached at all (refused,
    reset, timed out): the block may well be whole there, and retrying later may succeed."""


class NodeDirectory(Protocol):
    """Which nodes exist: the node registry, seen from the data path."""

    async def writable_nodes(self) -> list[Node]:
        """Nodes alive (within their heartbeat deadline) with free space."""
        ...

    async def url_of(self, shark: str) -> str | None:
        """Where a node named in a row's sharks answers, if it is known."""
        ...

    async def registered_count(self) -> int:
        """How many nodes the registry knows, alive or not (placement.target_replicas)."""
        ...

    async def registered_urls(self) -> dict[str, str]:
        """Every node the registry knows, alive or not (shark: url)."""
        ...

    def mark_unreachable(self, shark: str) -> None:
        """A node refused or dropped a connection: offer it no new blocks until it answers."""
        ...

    def unreachable(self, shark: str) -> bool:
        """Whether a node is marked unreachable (reads ask it last)."""
        ...


@dataclass(frozen=True)
class WriteResult:
    sharks: list[str]
    size: int
    block_size: int
    md5: bytes
    checksums: dict[str, str]  # S3 form: base64 of the checksum bytes
    # The copies every version should have (placement.target_replicas) when it was written;
    # 0 for a body that went to no node (a small object kept in its row).
    wanted: int = 0

    @property
    def under_replicated(self) -> bool:
        """Fewer distinct nodes hold it than the target: re-replication must add copies."""
        return len(set(self.sharks)) < self.wanted


@dataclass(frozen=True)
class BlockRun:
    """A run of blocks named by one id: a version, or one part of a multipart object."""

    id: uuid.UUID
    size: int
    block_size: int
    sharks: list[str]

    @property
    def block_count(self) -> int:
        return -(-self.size // self.block_size)

    def block_names(self) -> list[str]:
        return [block_name(self.id, i) for i in range(self.block_count)]


def block_runs(
    version_id: uuid.UUID, size: int, sharks: Sequence[str], properties: dict[str, Any]
) -> list[BlockRun]:
    """The blocks of an object row: its own, or those of the parts its properties name; none
    for a small object whose row holds its bytes."""
    if properties.get("inline"):
        return []
    parts = properties.get("parts")
    if parts is None:
        block_size = int(properties.get("block_size", DEFAULT_BLOCK_SIZE))
        return [BlockRun(version_id, size, block_size, list(sharks))]
    return [
        BlockRun(
            uuid.UUID(p["id"]),
            int(p["size"]),
            int(p.get("block_size", DEFAULT_BLOCK_SIZE)),
            list(p["sharks"]),
        )
        for p in parts
    ]


def names_by_node(runs: Sequence[BlockRun]) -> dict[str, list[str]]:
    """The names of the runs' blocks, per node they are on: one delete batch per node."""
    grouped: dict[str, list[str]] = {}
    for run in runs:
        names = run.block_names()
        for shark in run.sharks:
            grouped.setdefault(shark, []).extend(names)
    return grouped


@dataclass
class DeleteOutcome:
    deleted: int = 0
    missing: int = 0
    failed_nodes: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)  # why each failed node failed

    @property
    def complete(self) -> bool:
        """Every block is gone from every node (a block already missing counts as gone)."""
        return not self.failed_nodes


class DataPath:
    def __init__(
        self,
        client: BlockClient,
        directory: NodeDirectory,
        block_size: int = DEFAULT_BLOCK_SIZE,
        replicas: int | None = None,
        blocks_in_flight: int | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.directory = directory
        self.block_size = block_size
        self.replicas = replicas
        self.blocks_in_flight = blocks_in_flight or window(block_size)
        self.rng = rng or random.Random()

    def node_silent(self, shark: str, url: str, *, checks: int) -> None:
        """A node did not answer `checks` health checks in a row (the gateway's readiness
        check asks every node's /status every second): from the first, it gets no new
        blocks and reads ask it last; from the second, the requests waiting on it are given
        up (NodeUnreachable), so that a write goes on with its other replicas and a read
        with another copy instead of waiting for a node that may be hung. One missed
        check alone, a node busy for a moment, costs nothing in flight."""
        self.directory.mark_unreachable(shark)
        if checks >= SILENT_CHECKS_TO_GIVE_UP:
            self.client.abandon(url, f"storage node {shark} did not answer {checks} checks")

    async def write(
        self,
        version_id: uuid.UUID,
        stream: AsyncIterator[bytes | bytearray],
        checksums: Iterable[str] = S3_CHECKSUMS,
    ) -> WriteResult:
        nodes = await self.directory.writable_nodes()
        wanted = self.replicas or placement.default_replicas(len(nodes))
        target = await self.target_replicas()
        replicas = placement.choose(nodes, wanted, self.rng)
        if len(replicas) < wanted:
            raise StorageUnavailable(f"{wanted} replicas wanted, {len(replicas)} nodes writable")
        writer = _VersionWriter(self, version_id, replicas, nodes)
        digests = Digests(checksums)
        size = 0
        # A large block's digests are computed in a thread while the block is sent to the
        # nodes and the next one arrives; one block at a time, in order. A small one's here.
        digesting: asyncio.Future[None] | None = None
        try:
            async for index, block in _numbered(_blocks(stream, self.block_size)):
                if digesting is not None:
                    await digesting
                    digesting = None
                if len(block) < THREAD_THRESHOLD_BYTES:
                    digests.update(block)
                else:
                    digesting = asyncio.ensure_future(in_thread(digests.update, block))
                size += len(block)
                await writer.submit(index, block)
            if digesting is not None:
                await digesting
            await writer.finish()
        except BaseException:
            if digesting is not None:  # a thread cannot be cancelled: let it finish its block
                await asyncio.wait([digesting])
            await writer.abandon()
            raise
        return WriteResult(
            sharks=[n.shark for n in writer.replicas],
            size=size,
            block_size=self.block_size,
            md5=digests.md5,
            checksums=digests.s3_values(),
            wanted=target,
        )

    async def target_replicas(self) -> int:
        """The copies every version should have (placement.target_replicas)."""
        return placement.target_replicas(self.replicas, await self.directory.registered_count())

    async def add_copies(
        self, run: BlockRun, count: int, leaving: Collection[str] = ()
    ) -> list[str]:
        """Copy every block of `run` from a good replica to `count` writable nodes that do not
        hold it (in datacenters without a copy first: placement.copy_targets, where the
        copies of `leaving` do not count); returns their sharks.

        Raises StorageUnavailable when too few such nodes are writable, DataUnavailable when
        a block has no good replica left; blocks copied before a failure are deleted again.
        """
        nodes = await self.directory.writable_nodes()
        targets = placement.copy_targets(nodes, run.sharks, count, self.rng, leaving)
        if len(targets) < count:
            raise StorageUnavailable(f"{count} more copies wanted, {len(targets)} nodes writable")
        try:
            for index in range(run.block_count):
                data = await self._fetch(run, index)  # size and checksum verified
                name = block_name(run.id, index)
                await asyncio.gather(*(self.client.put_block(n.url, name, data) for n in targets))
        except BaseException:
            names = run.block_names()
            for node in targets:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.client.delete_blocks(node.url, names), 10)
            raise
        return [n.shark for n in targets]

    async def read(
        self, runs: Sequence[BlockRun], start: int = 0, end: int | None = None
    ) -> AsyncIterator[bytes | bytearray]:
        """Bytes [start, end) of the object made of `runs`, streamed; a few blocks (`window`)
        are fetched ahead while the current one is sent (memory stays bounded)."""
        total = sum(r.size for r in runs)
        end = total if end is None else min(end, total)
        wanted = list(_blocks_overlapping(runs, start, end))
        if len(wanted) == 1:  # most objects are one block: no window, no task to fetch it
            run, index, lo, hi = wanted[0]
            yield _cut(await self._fetch(run, index), lo, hi)
            return
        ahead: collections.deque[asyncio.Future[bytearray]] = collections.deque()
        most = window(max(r.block_size for r in runs))
        try:
            for position, (_run, _index, lo, hi) in enumerate(wanted):
                # Keep the window full: the blocks are spread over the replicas, so several
                # nodes read and send at once while this loop hands data to the client.
                while len(ahead) < most and position + len(ahead) < len(wanted):
                    run, index, _, _ = wanted[position + len(ahead)]
                    ahead.append(asyncio.ensure_future(self._fetch(run, index)))
                yield _cut(await ahead.popleft(), lo, hi)
        finally:
            for fetch in ahead:
                fetch.cancel()
            for fetch in ahead:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await fetch

    async def delete(self, runs: Sequence[BlockRun]) -> DeleteOutcome:
        """Delete every block of `runs` from every node that holds it."""
        return await self.delete_names(names_by_node(runs))

    async def delete_names(self, names: Mapping[str, Sequence[str]]) -> DeleteOutcome:
        """Delete the named blocks from each node (node -> block names on it): all nodes at
        once, each in requests of DELETE_BATCH names, DELETES_IN_FLIGHT at a time. A node
        that fails a request is asked nothing more: its names wait for the next pass. While
        requests are out, the node is asked its /status every second, and those waiting on
        a node that missed two checks are given up (BlockClient.while_answering). One that
        did not answer is marked unreachable, and while it is, its /status is asked first
        (a second at most): a node that hangs costs a run about three seconds, then a
        second a call, never a request's time-out."""
        outcome = DeleteOutcome()
        await asyncio.gather(
            *(self._delete_on(shark, share, outcome) for shark, share in names.items())
        )
        return outcome

    async def _delete_on(self, shark: str, names: Sequence[str], outcome: DeleteOutcome) -> None:
        url = await self.directory.url_of(shark)
        if url is None:
            outcome.failed_nodes.append(shark)
            outcome.reasons[shark] = "the node is not in the registry"
            return
        silent = self.directory.unreachable(shark)
        if silent and await self.client.status_within(url, STATUS_SECONDS, shark) is None:
            outcome.failed_nodes.append(shark)
            outcome.reasons[shark] = "the node did not answer lately, nor its /status now"
            return
        gate = asyncio.Semaphore(DELETES_IN_FLIGHT)

        async def request(batch: Sequence[str]) -> None:
            async with gate:
                if shark in outcome.reasons:
                    return  # the node failed a batch: the rest wait for the next pass
                try:
                    deleted = await self.client.delete_blocks(url, batch)
                except NodeError as exc:
                    if isinstance(exc, NodeUnreachable):
                        self.directory.mark_unreachable(shark)
                    if shark not in outcome.reasons:
                        log.warning("block delete failed on %s: %s", shark, exc)
                        outcome.failed_nodes.append(shark)
                        outcome.reasons[shark] = str(exc) or type(exc).__name__
                    return
            outcome.deleted += deleted
            outcome.missing += len(batch) - deleted

        batches = [names[i : i + DELETE_BATCH] for i in range(0, len(names), DELETE_BATCH)]
        sending = asyncio.gather(*map(request, batches), return_exceptions=True)
        for answer in await self.client.while_answering(url, sending, shark):
            if isinstance(answer, BaseException):
                raise answer

    async def _fetch(self, run: BlockRun, index: int) -> bytearray:
        name = block_name(run.id, index)
        expected = min(run.block_size, run.size - index * run.block_size)
        # Start at a different replica per block so reads spread over the nodes; nodes
        # known to be unreachable last.
        order = run.sharks[index % len(run.sharks) :] + run.sharks[: index % len(run.sharks)]
        order.sort(key=self.directory.unreachable)
        unreachable = []
        for shark in order:
            url = await self.directory.url_of(shark)
            if url is None:
                log.warning("replica %s of block %s: node unknown", shark, name)
                continue
            try:
                data = await self.client.get_block(url, name)
            except NodeUnreachable as exc:
                log.warning("replica %s of block %s unreachable: %s", shark, name, exc)
                self.directory.mark_unreachable(shark)
                unreachable.append(shark)
                continue
            except NodeError as exc:
                log.warning("bad replica %s of block %s: %s", shark, name, exc)
                continue
            if len(data) != expected:
                log.warning(
                    "bad replica %s of block %s: %d bytes, expected %d",
                    shark,
                    name,
                    len(data),
                    expected,
                )
                continue
            return data
        found = await self._fetch_elsewhere(run, name, expected)
        if found is not None:
            return found
        if unreachable:
            raise ReplicasUnreachable(
                f"no replica of block {name} could be read; {unreachable} did not answer"
            )
        raise DataUnavailable(f"no replica of block {name} could be read (tried {order})")

    async def _fetch_elsewhere(self, run: BlockRun, name: str, expected: int) -> bytearray | None:
        """A good copy of a block on a node its row does not name, or None. Rows can name the
        wrong nodes after the metadata was restored from a backup taken before a drain or a
        rebalance moved the copies (docs/operations.md, "Backups, restores and failover");
        only a read that found no good copy where the row says asks the other nodes."""
        others = {
            shark: url
            for shark, url in (await self.directory.registered_urls()).items()
            if shark not in run.sharks and not self.directory.unreachable(shark)
        }
        for shark, url in others.items():
            try:
                data = await self.client.get_block(url, name)
            except NodeError:
                continue
            if len(data) == expected:
                log.warning(
                    "block %s is on node %s, which its row does not name: "
                    "`shoal pipeline audit --repair` names it again",
                    name,
                    shark,
                )
                return data
        return None


def window(block_size: int) -> int:
    """Blocks a write sends, or a read fetches ahead, at once: BLOCKS_IN_FLIGHT, fewer for
    blocks so large that they would hold more than BYTES_IN_FLIGHT, at least one."""
    return max(1, min(BLOCKS_IN_FLIGHT, BYTES_IN_FLIGHT // block_size))


def _cut(data: bytearray, lo: int, hi: int) -> bytearray:
    """Bytes [lo, hi) of a block: the block itself when that is all of it (a slice copies)."""
    return data if lo == 0 and hi == len(data) else data[lo:hi]


class _VersionWriter:
    """The replicas of one version being written, and which blocks each one holds."""

    def __init__(
        self, path: DataPath, version_id: uuid.UUID, replicas: list[Node], nodes: list[Node]
    ) -> None:
        self.path = path
        self.version_id = version_id
        self.replicas = replicas
        self.nodes = nodes
        self.holds: dict[str, set[int]] = {n.shark: set() for n in replicas}
        self.failed: set[str] = set()
        self.touched: dict[str, Node] = {n.shark: n for n in replicas}
        self.blocks = 0
        self.tasks: set[asyncio.Task[None]] = set()
        self.window = asyncio.Semaphore(path.blocks_in_flight)
        self.lock = asyncio.Lock()

    async def submit(self, index: int, block: bytes) -> None:
        """Start writing a block; waits while `blocks_in_flight` are already on their way."""
        await self.window.acquire()
        self._raise_finished_failures()
        task = asyncio.create_task(self._write_block(index, block))
        task.add_done_callback(lambda _: self.window.release())
        self.tasks.add(task)
        self.blocks = index + 1

    async def finish(self) -> None:
        await asyncio.gather(*self.tasks)
        self.tasks.clear()
        await self._fill_replacements()

    async def abandon(self) -> None:
        """The write failed: stop, and delete what was written (the orphan job is the backstop).

        Blocks in flight are let finish first (for a while): a request cancelled here still
        completes on its node, which would then keep a block stored after the delete."""
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=ABANDON_WAIT_SECONDS)
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        names = [block_name(self.version_id, i) for i in range(self.blocks)]
        for node in self.touched.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.path.client.delete_blocks(node.url, names), 10)

    def _raise_finished_failures(self) -> None:
        for task in [t for t in self.tasks if t.done()]:
            self.tasks.discard(task)
            task.result()

    async def _write_block(self, index: int, block: bytes) -> None:
        name = block_name(self.version_id, index)
        checksum = checksum_of(block)  # cheaper than a trip to a thread: bench/token_bench.py
        while True:
            targets = [n for n in self.replicas if index not in self.holds[n.shark]]
            if not targets:
                return
            results = await asyncio.gather(
                *(self.path.client.put_block(n.url, name, block, checksum) for n in targets),
                return_exceptions=True,
            )
            for node, result in zip(targets, results, strict=True):
                if isinstance(result, NodeError) and result.retryable:
                    log.warning("replica %s failed writing %s: %s", node.shark, name, result)
                    await self._replace(node, result)
                elif isinstance(result, BaseException):
                    raise result
                else:
                    self.holds[node.shark].add(index)

    async def _replace(self, failed: Node, error: NodeError) -> None:
        if isinstance(error, NodeUnreachable):
            self.path.directory.mark_unreachable(failed.shark)
        async with self.lock:
            if failed not in self.replicas:
                return  # another block already replaced it
            self.failed.add(failed.shark)
            exclude = self.failed | {n.shark for n in self.replicas}
            spare = placement.choose(self.nodes, 1, self.path.rng, exclude=exclude)
            if not spare:
                self._go_on_without(failed)
                return
            self.replicas[self.replicas.index(failed)] = spare[0]
            self.holds.setdefault(spare[0].shark, set())
            self.touched[spare[0].shark] = spare[0]

    def _go_on_without(self, failed: Node) -> None:
        """No spare node: with the default number of copies (what the nodes left allow) the
        write goes on with the replicas left; a configured number is a promise, so fail."""
        if self.path.replicas is not None or len(self.replicas) < 2:
            raise StorageUnavailable(
                f"replica {failed.shark} failed and no other healthy node is left"
            )
        self.replicas.remove(failed)
        log.warning(
            "replica %s failed and no other node is left: version %s goes on with %d replica(s)",
            failed.shark,
            self.version_id,
            len(self.replicas),
        )

    async def _fill_replacements(self) -> None:
        """Give each replacement node the blocks written before it joined."""
        for node in list(self.replicas):
            for index in range(self.blocks):
                while index not in self.holds[node.shark]:
                    source = self._holder_of(index)
                    name = block_name(self.version_id, index)
                    data = await self.path.client.get_block(source.url, name)
                    try:
                        await self.path.client.put_block(node.url, name, data)
                        self.holds[node.shark].add(index)
                    except NodeError as exc:
                        if not exc.retryable:
                            raise
                        await self._replace(node, exc)
                        return await self._fill_replacements()

    def _holder_of(self, index: int) -> Node:
        for node in self.touched.values():
            if index in self.holds[node.shark] and node.shark not in self.failed:
                return node
        raise StorageUnavailable(f"no healthy replica holds block {index} any more")


async def _blocks(stream: AsyncIterator[bytes | bytearray], size: int) -> AsyncIterator[bytes]:
    """Exactly `size` bytes per block, the last one shorter; nothing for an empty stream.

    A block is joined once from views of the chunks received: one copy per byte, where
    appending to a buffer and copying the block out of it made two. Views are held of bytes
    only, which cannot change under them; a mutable chunk is copied first.
    """
    pieces: list[memoryview] = []
    held = 0
    async for chunk in stream:
        view = memoryview(chunk if isinstance(chunk, bytes) else bytes(chunk))
        while held + len(view) >= size:
            cut = size - held
            pieces.append(view[:cut])
            yield b"".join(pieces)
            pieces, held, view = [], 0, view[cut:]
        if view:
            pieces.append(view)
            held += len(view)
    if held:
        yield b"".join(pieces)


async def _numbered(blocks: AsyncIterator[bytes]) -> AsyncIterator[tuple[int, bytes]]:
    index = 0
    async for block in blocks:
        yield index, block
        index += 1


def _blocks_overlapping(
    runs: Sequence[BlockRun], start: int, end: int
) -> Iterable[tuple[BlockRun, int, int, int]]:
    """(run, block index, slice start, slice end) for each block that holds bytes in range."""
    offset = 0
    for run in runs:
        run_start, run_end = offset, offset + run.size
        offset = run_end
        if run_end <= start or run_start >= end:
            continue
        first = max(start, run_start) - run_start
        last = min(end, run_end) - run_start  # exclusive
        for index in range(first // run.block_size, -(-last // run.block_size)):
            block_start = index * run.block_size
            lo = max(first, block_start) - block_start
            hi = min(last, block_start + run.block_size) - block_start
            yield run, index, lo, hi
