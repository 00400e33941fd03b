"""The meter job's tasks sum their rows on Arrow columns (meter.usage_sums): per (owner,
bucket), live objects' count, bytes and bytes on disk, bytes waiting for GC, open parts."""

from __future__ import annotations

import json
import uuid
from typing import Any

from shoal.pipeline.jobs.meter import SUMS, usage_sums
from tests.fixtures.arrow import batch_of

OWNER = str(uuid.uuid4())
ONE, TWO = str(uuid.uuid4()), str(uuid.uuid4())


def row(
    kind: str, bucket: str, length: int | None, sharks: list[str] | None, properties: Any = None
) -> dict[str, Any]:
    return {
        "shard": "s0",
        "vnode": 0,
        "kind": kind,
        "id": str(uuid.uuid4()),
        "owner": OWNER,
        "bucket_id": bucket,
        "name": "key",
        "content_length": length,
        "sharks": sharks,
        "properties": None if properties is None else json.dumps(properties),
    }


def sums_of(*batches: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    [summed] = list(usage_sums(iter([batch_of(rows) for rows in batches])))
    table = summed.to_pydict()
    return {
        bucket: {column: table[column][i] for column in SUMS}
        for i, bucket in enumerate(table["bucket_id"])
        if table["owner"][i] == OWNER
    }


def test_each_kind_of_row_adds_to_its_own_sums() -> None:
    part = {"id": str(uuid.uuid4()), "size": 6, "sharks": ["a", "b", "c"]}
    sums = sums_of(
        [
            row("object", ONE, 10, ["a", "b"], {"block_size": 1 << 20}),  # on two nodes
            row("object", ONE, 5, ["a"]),  # no properties
            row("object", ONE, 4, [], {"inline": True}),  # held once, in its metadata row
            row("object", ONE, 0, ["a"], {"block_size": 1 << 20}),  # empty: counted, no bytes
            row("record", ONE, 3, ["a"]),  # waiting for GC
        ],
        [
            # multipart: each part times its own nodes, not the row's
            row("object", TWO, 8, ["x"], {"parts": [part, {**part, "size": 2}]}),
            row("object", TWO, None, None),  # a row without length or nodes
            row("part", TWO, 100, ["a", "b"]),  # a part of an open upload
        ],
    )
    assert sums[ONE] == {
        "objects": 4,
        "logical_bytes": 19,
        "stored_bytes": 10 * 2 + 5 + 4,
        "gc_bytes": 3,
        "multipart_bytes": 0,
    }
    assert sums[TWO] == {
        "objects": 2,
        "logical_bytes": 8,
        "stored_bytes": (6 + 2) * 3,
        "gc_bytes": 0,
        "multipart_bytes": 100,
    }


def test_a_bucket_in_several_batches_is_one_row() -> None:
    batches = [[row("object", ONE, n, ["a"])] for n in range(1, 5)]
    [summed] = list(usage_sums(iter([batch_of(rows) for rows in batches])))
    assert summed.num_rows == 1 and sums_of(*batches)[ONE]["logical_bytes"] == 10


def test_a_task_without_rows_hands_on_nothing() -> None:
    assert list(usage_sums(iter([]))) == []
