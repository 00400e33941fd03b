"""What `shoal node` does: list the storage nodes, drain one, mark one dead, remove one.

A drained node takes no new blocks and `shoal pipeline rebalance` moves its copies away; a
dead node is asked for nothing, and the re-replicator makes its copies again from the other
replicas; a node is removed from the registry only once it holds nothing (docs/storage.md,
"Node states"; docs/operations.md, "Draining and replacing storage nodes").
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

from shoal.metadata import MetadataStore
from shoal.metadata.nodes import ACTIVE, DEAD, DRAINING, StorageNode
from shoal.storage import BlockClient
from shoal.units import byte_size

# How long `node list` and `node remove` wait for a node to say how many blocks it holds.
STATUS_SECONDS = 2.0


class NodeRefused(Exception):
    """The node cannot be changed so: one line for the operator."""


@dataclass(frozen=True)
class NodeReport:
    node: StorageNode
    state: str
    blocks: int | None  # None: the node did not answer


async def list_nodes(
    store: MetadataStore, client: BlockClient, deadline: timedelta
) -> list[NodeReport]:
    """Every registered node with its state, and its block count when it answers."""
    nodes = await store.nodes.list(deadline)
    states = await store.nodes.states()
    counts = await asyncio.gather(*(block_count(client, n) for n in nodes))
    return [
        NodeReport(node=n, state=states.get(n.name, ACTIVE), blocks=count)
        for n, count in zip(nodes, counts, strict=True)
    ]


async def block_count(client: BlockClient, node: StorageNode) -> int | None:
    """How many blocks the node says it holds; None when it does not answer in time."""
    status = await client.status_within(node.url, STATUS_SECONDS, node.shark)
    return None if status is None else status.block_count


async def find(store: MetadataStore, name: str, deadline: timedelta) -> StorageNode:
    """The node registered as `name` (or as the shark `datacenter:name`)."""
    for node in await store.nodes.list(deadline):
        if name in (node.name, node.shark):
            return node
    raise NodeRefused(f"no storage node named {name!r} is registered")


async def drain(store: MetadataStore, name: str, deadline: timedelta) -> StorageNode:
    node = await find(store, name, deadline)
    if (await store.nodes.states()).get(node.name) == DEAD:
        raise NodeRefused(f"node {node.name} is dead; only `shoal node remove` applies to it")
    await store.nodes.set_state(node.name, DRAINING)
    return node


async def undrain(store: MetadataStore, name: str, deadline: timedelta) -> StorageNode:
    node = await find(store, name, deadline)
    if (await store.nodes.states()).get(node.name) == DEAD:
        raise NodeRefused(
            f"node {node.name} is dead and its copies were made elsewhere; remove it, and a "
            "node started on an empty folder registers as a new one"
        )
    await store.nodes.set_state(node.name, ACTIVE)
    return node


@dataclass(frozen=True)
class DeadNode:
    node: StorageNode
    noted: int  # versions and parts taken off the node and noted for re-replication
    sole: int  # versions and parts that only the dead node held: they keep naming it


async def mark_dead(store: MetadataStore, name: str, deadline: timedelta) -> DeadNode:
    """Mark the node dead, take it out of every row that names it beside another node and
    note those for the re-replicator (`shoal serve`'s daemon, or `shoal pipeline audit
    --repair`), which copies them from a surviving replica. Running it again is harmless and
    catches rows written meanwhile."""
    node = await find(store, name, deadline)
    await store.nodes.set_state(node.name, DEAD)
    noted = await store.sharks.drop_dead(node.shark)
    naming = await store.sharks.naming(node.shark)
    return DeadNode(node=node, noted=noted, sole=naming.sole)


async def remove(
    store: MetadataStore, client: BlockClient, name: str, deadline: timedelta
) -> StorageNode:
    """Delete the node's registration, only when it holds nothing: no row names it (live
    versions, open uploads' parts, deletion records not yet collected) and, if it answers,
    it reports no blocks."""
    node = await find(store, name, deadline)
    naming = await store.sharks.naming(node.shark)
    if naming.rows:
        raise NodeRefused(
            f"node {node.name} is still named by {naming.rows} row(s) "
            f"({naming.sole} with no other copy); drain it and run `shoal pipeline rebalance`"
            " (and `shoal pipeline gc` for deleted versions) first"
        )
    blocks = await block_count(client, node)
    if blocks:
        raise NodeRefused(
            f"node {node.name} still holds {blocks} block(s) that no row names; "
            "`shoal pipeline orphans --delete` removes them"
        )
    await store.nodes.remove(node.name)
    return node


def format_nodes(reports: list[NodeReport]) -> str:
    lines = [f"{'node':<24} {'state':<9} {'alive':<5} {'heartbeat':<20} {'free':>10} {'blocks':>8}"]
    for report in reports:
        node = report.node
        heartbeat = node.heartbeat.strftime("%Y-%m-%d %H:%M:%S") if node.heartbeat else "never"
        free = byte_size(node.free_bytes) if node.free_bytes is not None else "?"
        blocks = "?" if report.blocks is None else f"{report.blocks:,}"
        lines.append(
            f"{node.shark:<24} {report.state:<9} {'yes' if node.alive else 'no':<5} "
            f"{heartbeat:<20} {free:>10} {blocks:>8}"
        )
    return "\n".join(lines)
