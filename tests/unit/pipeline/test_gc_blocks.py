"""The gc job works out a batch's block names on Arrow columns; they must be those of
block_runs, the rule `gc run` applies row by row, for every kind of row."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from shoal.gc.rules import may_remove
from shoal.metadata.partitions import window_name, window_start
from shoal.pipeline.jobs.gc import _Blocks, _Windows
from shoal.storage import block_runs, names_by_node
from tests.fixtures.arrow import batch_of

MiB = 1 << 20


def row(length: int | None, sharks: list[str] | None, properties: Any) -> dict[str, Any]:
    return {
        "shard": "s0",
        "vnode": 3,
        "kind": "record",
        "id": str(uuid.uuid4()),
        "owner": str(uuid.uuid4()),
        "bucket_id": str(uuid.uuid4()),
        "name": "key",
        "content_length": length,
        "sharks": sharks,
        "properties": None if properties is None else json.dumps(properties),
        "deleted_at": datetime(2026, 1, 2, 3, tzinfo=UTC),
    }


ROWS = [
    row(100, ["n1", "n2"], {"block_size": MiB, "checksums": ["x"]}),  # the common case
    row(MiB, ["n1"], {"block_size": MiB}),  # exactly one block
    row(3 * MiB + 1, ["n2"], {"block_size": MiB}),  # several blocks
    row(10, ["n1"], None),  # no properties: the default block size
    row(5, [], {"inline": True}),  # its bytes in its row
    row(0, ["n1"], {"block_size": MiB}),  # empty: no block, still names its node
    row(None, None, None),
    row(
        8,
        ["n1"],
        {"parts": [{"id": str(uuid.uuid4()), "size": 2 * MiB, "sharks": ["n3"]}]},
    ),  # multipart: its parts' blocks, on their nodes
]


def expected_runs(rows: list[dict[str, Any]]) -> list[Any]:
    return [
        block_runs(
            uuid.UUID(r["id"]),
            r["content_length"] or 0,
            r["sharks"] or [],
            json.loads(r["properties"]) if r["properties"] else {},
        )
        for r in rows
    ]


def test_block_names_per_node_are_block_runs() -> None:
    blocks = _Blocks.of(batch_of(ROWS))
    expected = names_by_node([run for runs in expected_runs(ROWS) for run in runs])
    assert {shark: sorted(names) for shark, names in blocks.names.items()} == {
        shark: sorted(names) for shark, names in expected.items()
    }


def test_a_row_may_go_when_none_of_its_nodes_failed() -> None:
    blocks = _Blocks.of(batch_of(ROWS))
    runs = expected_runs(ROWS)
    for failed in (set(), {"n1"}, {"n2"}, {"n3"}, {"n1", "n3"}):
        want = [may_remove(record_runs, failed) for record_runs in runs]
        assert blocks.may_go(failed).to_pylist() == want, failed


def test_windows_of_a_column_are_the_tables_names() -> None:
    width = timedelta(days=1)
    moments = [datetime(2026, 1, 2, 3, tzinfo=UTC), datetime(2026, 1, 3, 0, tzinfo=UTC)]
    column = pa.array(moments, pa.timestamp("us", "UTC"))
    assert _Windows(width).of_column(column).to_pylist() == [
        window_name("manta_bucket_deleted_object", window_start(moment, width))
        for moment in moments
    ]
