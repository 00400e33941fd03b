"""Deleting the blocks of a batch of records: the one code path of `shoal gc run`, the daemon
and the Spark gc job's executors.

The batch's block names are grouped per node and each node's share is sent at once, in
requests of up to 1,000 names (a few in flight per node), all nodes in parallel. A record
may go when none of the nodes it names failed (rules.may_remove).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from shoal.gc.rules import may_remove
from shoal.storage import BlockRun, DataPath, DeleteOutcome, names_by_node


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
    names = names_by_node([run for record_runs in runs for run in record_runs])
    deletion = await delete_names(data, names, after_each_node)
    deletion.may_go = [may_remove(record_runs, deletion.failures) for record_runs in runs]
    return deletion


async def delete_names(
    data: DataPath,
    names: Mapping[str, Sequence[str]],
    after_each_node: Callable[[], None] | None = None,
) -> Deletion:
    """Delete the named blocks from each node (`names`: node -> block names on it); the
    Deletion's `may_go` is left for the caller, who knows which records name which nodes."""

    async def delete_on(shark: str, share: Sequence[str]) -> DeleteOutcome:
        outcome = await data.delete_names({shark: share})
        if after_each_node is not None:
            after_each_node()
        return outcome

    outcomes = await asyncio.gather(*(delete_on(shark, share) for shark, share in names.items()))
    deletion = Deletion(may_go=[])
    for (shark, share), outcome in zip(names.items(), outcomes, strict=True):
        deletion.deleted += outcome.deleted
        deletion.missing += outcome.missing
        if not outcome.complete:
            deletion.kept += len(share) - outcome.deleted - outcome.missing
            deletion.failures[shark] = outcome.reasons.get(shark, "delete failed")
    return deletion
