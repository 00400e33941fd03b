"""Deleting the blocks of a batch of records: the one code path of `shoal gc run`, the daemon
and the Spark gc job's executors.

The batch's block names are grouped per node and each node's share is sent at once, in
requests of up to 1,000 names (a few in flight per node), all nodes in parallel. A record
may go when none of the nodes it names failed (rules.may_remove).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from shoal.gc.rules import may_remove, names_by_node
from shoal.storage import BlockRun, DataPath, NodeError
from shoal.storage.datapath import DELETE_BATCH

log = logging.getLogger("shoal.gc")

# Delete requests in flight per node: each overlaps its round trip and JSON with the node's
# unlinks of the others.
REQUESTS_IN_FLIGHT = 4


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
    deletion = Deletion(may_go=[])

    async def delete_on(shark: str, share: Sequence[str]) -> None:
        await _delete_share(data, shark, share, deletion)
        if after_each_node is not None:
            after_each_node()

    await asyncio.gather(*(delete_on(shark, share) for shark, share in names.items()))
    return deletion


async def _delete_share(
    data: DataPath, shark: str, share: Sequence[str], deletion: Deletion
) -> None:
    """Send one node's share, in requests of DELETE_BATCH names, and count what it did."""
    url = await data.directory.url_of(shark)
    if url is None:
        deletion.kept += len(share)
        deletion.failures[shark] = "the node is not in the registry"
        return
    gate = asyncio.Semaphore(REQUESTS_IN_FLIGHT)

    async def request(batch: Sequence[str]) -> int:
        async with gate:
            return await data.client.delete_blocks(url, batch)

    batches = [share[first : first + DELETE_BATCH] for first in range(0, len(share), DELETE_BATCH)]
    answers = await asyncio.gather(*(request(batch) for batch in batches), return_exceptions=True)
    for batch, answer in zip(batches, answers, strict=True):
        if isinstance(answer, NodeError):
            deletion.kept += len(batch)
            if shark not in deletion.failures:
                log.warning("block delete failed on %s: %s", shark, answer)
                deletion.failures[shark] = str(answer) or type(answer).__name__
        elif isinstance(answer, BaseException):
            raise answer
        else:
            deletion.deleted += answer
            deletion.missing += len(batch) - answer
