"""Deleting the blocks of a batch of records: the one code path of `shoal gc run`, the daemon
and the Spark gc job's executors.

The batch's blocks are grouped per node and each node's share is sent at once (DataPath
splits it into requests of 1,000 names), all nodes in parallel. A record may go when none of
the nodes it names failed (rules.may_remove).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from shoal.gc.rules import by_node, may_remove
from shoal.storage import BlockRun, DataPath, DeleteOutcome


@dataclass
class Deletion:
    """What deleting a batch's blocks did."""

    may_go: list[bool]  # per record of the batch, in its order
    deleted: int = 0  # block replicas the nodes removed (one block on one node)
    missing: int = 0  # block replicas that were already gone
    kept: int = 0  # block replicas left on nodes that failed
    failures: dict[str, str] = field(default_factory=dict)  # node -> why it failed


async def delete_blocks(
    data: DataPath,
    runs: Sequence[Sequence[BlockRun]],
    after_each_node: Callable[[], None] | None = None,
) -> Deletion:
    """Delete every block of a batch of records (`runs`: each record's block runs).
    `after_each_node` is called once per node's share sent (the fault-injection count)."""
    nodes = by_node([run for record_runs in runs for run in record_runs])

    async def delete_on(share: list[BlockRun]) -> DeleteOutcome:
        outcome = await data.delete(share)
        if after_each_node is not None:
            after_each_node()
        return outcome

    outcomes = await asyncio.gather(*(delete_on(share) for share in nodes.values()))
    deletion = Deletion(may_go=[])
    for shark, outcome in zip(nodes, outcomes, strict=True):
        deletion.deleted += outcome.deleted
        deletion.missing += outcome.missing
        if not outcome.complete:
            sent = sum(run.block_count for run in nodes[shark])
            deletion.kept += sent - outcome.deleted - outcome.missing
            deletion.failures[shark] = outcome.reasons.get(shark, "delete failed")
    deletion.may_go = [may_remove(record_runs, deletion.failures) for record_runs in runs]
    return deletion
