"""`shoal pipeline rebalance`: move block copies off draining nodes, or from the fullest nodes
to the emptiest when none drains (docs/storage.md, "Node states").

1. The driver reads the registry: nodes, states, free space. With nodes draining, every copy
   they hold moves; without, copies move from nodes fuller than the average by more than
   half the `gap` (fill ratios) towards the nodes below it: from each, what it holds above
   the average, and at most `max_bytes` per run in all.
2. Live versions and parts (objects, open uploads' parts) are read from one snapshot per
   shard, one Spark task per vnode, and each run of blocks on a leaving node becomes a move.
3. Executors take the moves of some vnodes each. A move copies every block of the run from a
   good replica to a new node, with the re-replicator's own code (DataPath.add_copies,
   checksums verified on read and by the node on write; placement.copy_targets keeps copies
   in distinct datacenters), names the new node instead of the old in ONE conditional
   statement (queries.REPLACE_SHARK: only where the version is live and still names the old
   node), and only once that statement changed the row deletes the old copy.
4. If the row did not change (the version was replaced or deleted meanwhile: its deletion
   record names the old node, which GC reaches), the new copy is deleted again unless a
   live row names it, as the re-replicator does.

Every move can be repeated: a run killed anywhere leaves the old copy named (a crash after
the copy leaves an unnamed copy, for `shoal pipeline orphans`), or the new one named (a
crash before the old copy's delete leaves an unnamed old copy, and the drained node's
block count above zero: `shoal node remove` says so).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from shoal.config import ShardConfig
from shoal.metadata import MetadataStore
from shoal.metadata.nodes import ACTIVE, DRAINING
from shoal.metadata.replicas import Note
from shoal.pipeline import io, progress
from shoal.pipeline.context import JobContext, Summary
from shoal.storage import (
    BlockRun,
    ClientSettings,
    DataPath,
    DataUnavailable,
    Node,
    NodeError,
    StorageUnavailable,
    block_runs,
)

log = logging.getLogger("shoal.pipeline")

# Without drains: nodes whose fill ratios differ by more than this are evened out...
DEFAULT_GAP = 0.10
# ...by moving at most this much per run (a run is bounded; the next one goes on).
DEFAULT_MAX_BYTES = 8 * 1024**3
# Runs moved at once by one executor task: both ends stay busy without crowding out the
# gateway's own traffic to the nodes.
MOVES_IN_FLIGHT = 8
# Below this free space a node gets no copies (as cluster.MIN_FREE_BYTES for writes).
MIN_FREE_BYTES = 256 * 1024 * 1024
# A registry read that counts every node, whatever its last heartbeat.
EVERY_NODE = timedelta(days=3650)

# (vnode, owner, bucket_id, key, run id, size, block size, sharks, leaving shark)
Move = tuple[int, str, str, str, str, int, int, list[str], str]

OUTCOMES = ("moved", "old copy kept", "changed", "waiting")


@dataclass(frozen=True)
class Registry:
    """The nodes as the driver saw them: where each answers, and where copies may go."""

    urls: dict[str, str]
    targets: list[Node]  # alive, active, with room
    draining: list[str]
    fill: dict[str, float]  # active nodes' used share of their capacity
    capacity: dict[str, int] = field(default_factory=dict)  # active nodes' size, bytes


@dataclass(frozen=True)
class Setup:
    """What an executor needs, by value (it may run on a host without the configuration)."""

    shards: list[ShardConfig]
    access: ClientSettings
    urls: dict[str, str]
    targets: list[Node]


def run(ctx: JobContext) -> Summary:
    started = time.monotonic()
    registry = ctx.with_store(lambda store: _registry(store, ctx.config.storage.heartbeat_deadline))
    gap = float(ctx.options.get("gap") or DEFAULT_GAP)
    max_bytes = int(ctx.options.get("max_bytes") or DEFAULT_MAX_BYTES)
    leaving, targets, budget = _what_moves(registry, gap, max_bytes)
    figures: dict[str, Any] = {
        "nodes draining": len(registry.draining),
        "mode": "drain" if registry.draining else "even out",
    }
    if not leaving:
        return _summary(ctx, figures, {}, 0, started)
    if not targets:
        problem = "no active node is alive with room to take copies; nothing moved"
        return _summary(ctx, figures, {}, 0, started, [problem])
    # A task takes the moves of a few vnodes (a task costs more than a small vnode's moves).
    slices = max(1, min(ctx.ring.vnodes, ctx.spark.sparkContext.defaultParallelism * 2))
    ctx.progress.begin("find copies to move")
    with io.exported_snapshots(ctx.shards) as snapshots:
        live = io.read_rows(ctx.spark, ctx.shards, ctx.ring, snapshots, io.LIVE_OBJECTS)
        parts = io.read_rows(ctx.spark, ctx.shards, ctx.ring, snapshots, io.LIVE_PARTS)
        candidates = live.unionByName(parts).rdd.flatMap(lambda row: _moves_of(row, leaving))
        if registry.draining:
            moves = candidates.cache()
            found = moves.count()
        else:  # bounded: the driver picks up to each leaving node's share
            chosen = _within_budget(candidates, leaving, budget)
            found = len(chosen)
            moves = ctx.spark.sparkContext.parallelize(chosen, max(1, min(slices, len(chosen))))
    setup = Setup(list(ctx.shards), io.node_access(ctx.config), registry.urls, targets)
    phase = ctx.progress.begin("move copies", total=found, unit="copies")
    tally = ctx.progress.tally(phase)
    outcomes = (
        moves.map(lambda move: (move[0], move))
        .partitionBy(slices, lambda vnode: vnode % slices)
        .values()
        .mapPartitions(lambda part: _execute(progress.counting(part, tally), setup))
        .reduceByKey(lambda a, b: (a[0] + b[0], a[1] + b[1]))
        .collectAsMap()
    )
    figures["copies to move"] = found
    return _summary(ctx, figures, outcomes, found, started)


def _summary(
    ctx: JobContext,
    figures: dict[str, Any],
    outcomes: dict[str, tuple[int, int]],
    found: int,
    started: float,
    problems: list[str] | None = None,
) -> Summary:
    figures.setdefault("copies to move", found)
    for outcome in OUTCOMES:
        figures[f"copies {outcome}"] = outcomes.get(outcome, (0, 0))[0]
    moved_bytes = outcomes.get("moved", (0, 0))[1] + outcomes.get("old copy kept", (0, 0))[1]
    seconds = time.monotonic() - started
    figures["bytes moved"] = moved_bytes
    figures["seconds"] = round(seconds, 2)
    figures["MiB per second"] = round(moved_bytes / 1024**2 / max(seconds, 1e-9), 1)
    problems = list(problems or [])
    if outcomes.get("waiting", (0, 0))[0]:
        problems.append(
            f"{outcomes['waiting'][0]} copies could not move (no node to copy to, or no good "
            "replica to copy from); the log says which; run rebalance again"
        )
    if outcomes.get("old copy kept", (0, 0))[0]:
        problems.append(
            f"{outcomes['old copy kept'][0]} old copies could not be deleted from their node; "
            "`shoal pipeline orphans --delete` removes them"
        )
    ctx.output.mkdir(parents=True, exist_ok=True)
    (ctx.output / "summary.json").write_text(json.dumps(figures))
    return Summary("rebalance", figures, ctx.output, problems)


async def _registry(store: MetadataStore, deadline: timedelta) -> Registry:
    nodes = await store.nodes.list(deadline)
    states = await store.nodes.states()
    state = {n.shark: states.get(n.name, ACTIVE) for n in nodes}
    active = [n for n in nodes if state[n.shark] == ACTIVE]
    return Registry(
        urls={n.shark: n.url for n in nodes},
        targets=[
            Node(n.name, n.datacenter, n.url, n.free_bytes or 0)
            for n in active
            if n.alive and (n.free_bytes or 0) >= MIN_FREE_BYTES
        ],
        draining=sorted(n.shark for n in nodes if state[n.shark] == DRAINING),
        fill={
            n.shark: 1 - (n.free_bytes or 0) / n.capacity_bytes
            for n in active
            if n.alive and n.capacity_bytes
        },
        capacity={n.shark: n.capacity_bytes for n in active if n.alive and n.capacity_bytes},
    )


def _what_moves(
    registry: Registry, gap: float, max_bytes: int
) -> tuple[dict[str, int], list[Node], int]:
    """The nodes copies leave (with each one's byte budget; a draining node's: all), the
    nodes they may go to, and the run's whole budget."""
    if registry.draining:
        everything = 2**62
        return {s: everything for s in registry.draining}, registry.targets, everything
    fill = registry.fill
    if len(fill) < 2 or max(fill.values()) - min(fill.values()) <= gap:
        return {}, [], 0
    mean = sum(fill.values()) / len(fill)
    over = [s for s, f in fill.items() if f > mean + gap / 2]
    under = {s for s, f in fill.items() if f < mean}
    if not over:
        return {}, [], 0
    share = max_bytes // len(over)
    # No more than brings a node down to the average: moving past it would only make the
    # nodes below the average the fullest ones.
    excess = {
        s: int((fill[s] - mean) * registry.capacity[s]) if s in registry.capacity else share
        for s in over
    }
    return (
        {s: min(share, excess[s]) for s in over},
        [n for n in registry.targets if n.shark in under],
        max_bytes,
    )


def _moves_of(row: Any, leaving: dict[str, int]) -> list[Move]:
    """A move for each run of blocks of a row (its version, or each part) on a leaving node."""
    properties = json.loads(row.properties) if row.properties else {}
    runs = block_runs(uuid.UUID(row.id), row.content_length or 0, row.sharks or [], properties)
    return [
        (
            row.vnode,
            row.owner,
            row.bucket_id,
            row.name,
            str(run.id),
            run.size,
            run.block_size,
            list(run.sharks),
            shark,
        )
        for run in runs
        if run.size
        for shark in run.sharks
        if shark in leaving
    ]


def _within_budget(candidates: Any, leaving: dict[str, int], budget: int) -> list[Move]:
    """Moves off each over-full node until its share of the budget is spent. A run is
    moved off one node at most."""
    chosen: list[Move] = []
    taken: set[str] = set()
    for shark, share in sorted(leaving.items()):
        spent = 0
        # Runs are at least a block each; a sample well above the share in blocks is plenty.
        for move in candidates.filter(lambda m, s=shark: m[8] == s).take(10_000):
            if spent >= share or spent >= budget:
                break
            if move[4] in taken:
                continue
            taken.add(move[4])
            chosen.append(move)
            spent += move[5]
        budget -= spent
    return chosen


# -- executors ----------------------------------------------------------------------------------


class FixedDirectory:
    """The registry as the driver read it, for an executor's DataPath: copies go to
    `targets` only; a node that does not answer gets none for the rest of the task."""

    def __init__(self, urls: dict[str, str], targets: list[Node]) -> None:
        self.urls = urls
        self.targets = targets
        self.failed: set[str] = set()

    async def writable_nodes(self) -> list[Node]:
        return [n for n in self.targets if n.shark not in self.failed]

    async def url_of(self, shark: str) -> str | None:
        return self.urls.get(shark)

    async def registered_count(self) -> int:
        return len(self.urls)

    async def registered_urls(self) -> dict[str, str]:
        return dict(self.urls)

    def mark_unreachable(self, shark: str) -> None:
        self.failed.add(shark)

    def unreachable(self, shark: str) -> bool:
        return shark in self.failed


def _execute(moves: Iterable[Move], setup: Setup) -> Iterator[tuple[str, tuple[int, int]]]:
    """(outcome, (copies, bytes)) for the moves of a task's vnodes."""
    batch = list(moves)
    if not batch:
        return
    tally = io.run_async(_move_all(batch, setup))
    yield from tally.items()


async def _move_all(moves: list[Move], setup: Setup) -> dict[str, tuple[int, int]]:
    tally: dict[str, tuple[int, int]] = {}
    gate = asyncio.Semaphore(MOVES_IN_FLIGHT)
    client = setup.access.client()
    path = DataPath(client, FixedDirectory(setup.urls, setup.targets))
    try:
        async with await MetadataStore.open(setup.shards, 2) as store:

            async def one(move: Move) -> None:
                async with gate:
                    outcome = await move_copy(store, path, move)
                copies, moved = tally.get(outcome, (0, 0))
                tally[outcome] = (copies + 1, moved + (move[5] if outcome != "changed" else 0))

            await asyncio.gather(*(one(m) for m in moves))
    finally:
        await client.close()
    return tally


async def move_copy(store: MetadataStore, path: DataPath, move: Move) -> str:
    """Move one run's copy off its leaving node; returns one of OUTCOMES."""
    _vnode, owner, bucket_id, key, run_id, size, block_size, sharks, old = move
    run = BlockRun(uuid.UUID(run_id), size, block_size, sharks)
    at = Note(uuid.UUID(owner), uuid.UUID(bucket_id), key, run.id)
    try:
        [new] = await path.add_copies(run, 1, leaving=[old])
    except (StorageUnavailable, DataUnavailable, NodeError) as exc:
        log.warning("rebalance: %s stays on %s for now: %s", run.id, old, exc)
        return "waiting"
    if await store.sharks.replace(at, old, new):
        gone = await path.delete([BlockRun(run.id, size, block_size, [old])])
        return "moved" if gone.complete else "old copy kept"
    # Replaced, deleted, or moved by someone else meanwhile: the copy is dropped again,
    # unless a live row names that node (another mover chose it too).
    live = await store.under_replicated.locate(at)
    if live is None or new not in live.sharks:
        with contextlib.suppress(Exception):
            await path.delete([BlockRun(run.id, size, block_size, [new])])
    return "changed"
