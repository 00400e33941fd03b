"""What is garbage and when it may go: the rules shared by the GC daemon and the Spark jobs.

- A deletion record (an overwritten or deleted version, an unused or aborted multipart part)
  is garbage once it is older than the leeway, judged by PostgreSQL's clock.
- Every object and part of a deleted bucket incarnation is garbage once the bucket's
  deletion record is older than the leeway.
- A record expands to its blocks from the row alone (block_runs): its own blocks, or the
  blocks of the parts a multipart object names.
- A record may go only when each of its blocks is gone from each node it names; a block
  already missing counts as gone. A node that cannot be reached keeps the record for later.
  Block deletes are sent per node in batches covering many records, so the rule is applied
  per record from the set of nodes whose batch failed.

The three hazards Riak CS documents cannot happen here: a slow reader has the whole leeway to
finish (blocks of a replaced version stay that long); clock skew between workers does not
matter because ages are computed by the database; and a deletion record can never name a
live version, because every write makes a new UUIDv7 version id that is never reused, so a
"resurrected" record deletes only blocks that nothing names.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from datetime import timedelta

from shoal.metadata import ObjectVersion
from shoal.storage import BlockRun, block_runs

# RFD 149 and Riak CS both wait 24 hours: long enough for any reader that started before the
# delete to finish streaming, and for an operator to notice a mistaken delete.
DEFAULT_LEEWAY = timedelta(hours=24)

_DURATION = re.compile(r"(\d+)(s|m|h|d)")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_leeway(text: str) -> timedelta:
    """`0s`, `90s`, `15m`, `24h`, `7d`."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        raise ValueError(f"leeway {text!r} is not a duration like 0s, 15m, 24h or 7d")
    return timedelta(**{_UNITS[match[2]]: int(match[1])})


def blocks_of(record: ObjectVersion) -> list[BlockRun]:
    """Every block a deletion record (or a row of a deleted bucket) names."""
    return block_runs(record.id, record.content_length or 0, record.sharks, record.properties)


def may_remove(runs: Sequence[BlockRun], failed_nodes: Collection[str]) -> bool:
    """A record may go once all its blocks are gone from every node it names: none of those
    nodes failed its delete batch (a node that answered deleted them or never had them)."""
    return not any(shark in failed_nodes for run in runs for shark in run.sharks)
