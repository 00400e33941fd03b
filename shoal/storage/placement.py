"""Where a new version's blocks go: N distinct nodes, in distinct datacenters when possible,
chosen at random weighted by free space."""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Node:
    name: str
    datacenter: str
    url: str
    free_bytes: int

    @property
    def shark(self) -> str:
        return f"{self.datacenter}:{self.name}"


def default_replicas(available: int) -> int:
    """Two copies where at least two nodes exist, else one."""
    return 2 if available >= 2 else 1


def target_replicas(configured: int | None, registered: int) -> int:
    """How many copies every version should have: `[storage] replicas` when set, otherwise
    two once at least two nodes are registered (alive or not), else one.

    Judged by the nodes registered, not the nodes writable: a version written while a node
    is down is short of this target, and re-replication restores it once nodes come back.
    """
    return configured or default_replicas(registered)


def choose(
    nodes: Sequence[Node],
    count: int,
    rng: random.Random,
    exclude: Collection[str] = (),
    used_datacenters: Collection[str] = (),
) -> list[Node]:
    """`count` distinct nodes; each pick prefers a datacenter not used yet (by the picks before
    it, or by `used_datacenters`: where copies already are), then free space.

    Returns fewer than `count` if there are not enough candidates; the caller decides.
    """
    candidates = [n for n in nodes if n.shark not in exclude]
    chosen: list[Node] = []
    while candidates and len(chosen) < count:
        used = {n.datacenter for n in chosen} | set(used_datacenters)
        fresh = [n for n in candidates if n.datacenter not in used]
        pool = fresh or candidates
        pick = rng.choices(pool, weights=[max(n.free_bytes, 1) for n in pool])[0]
        chosen.append(pick)
        candidates.remove(pick)
    return chosen


def datacenter_of(shark: str) -> str:
    return shark.partition(":")[0]


def copy_targets(
    nodes: Sequence[Node],
    holders: Collection[str],
    count: int,
    rng: random.Random,
    leaving: Collection[str] = (),
) -> list[Node]:
    """Nodes for `count` more copies of blocks that `holders` hold: never a holder, and first
    in datacenters where no copy stays. `leaving`: holders whose copy is about to go (a
    draining node's), so their datacenters do not count as holding one (re-replication and
    `shoal pipeline rebalance` both choose here)."""
    staying = {datacenter_of(shark) for shark in holders if shark not in leaving}
    return choose(nodes, count, rng, exclude=holders, used_datacenters=staying)
