"""What is garbage and when it may go (shoal/gc/rules.py)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shoal.gc.rules import DEFAULT_LEEWAY, blocks_of, may_remove, parse_leeway
from shoal.metadata import ObjectVersion
from shoal.storage import BlockRun, names_by_node

MiB = 1 << 20
WHEN = datetime(2024, 1, 1, tzinfo=UTC)


def record(size: int, sharks: list[str], properties: dict[str, Any] | None = None) -> ObjectVersion:
    return ObjectVersion(
        id=uuid.uuid4(),
        owner=uuid.uuid4(),
        bucket_id=uuid.uuid4(),
        name="k",
        created=WHEN,
        modified=WHEN,
        creator=None,
        content_length=size,
        content_md5=bytes(16),
        content_type=None,
        headers={},
        roles=[],
        sharks=sharks,
        properties=properties or {},
        deleted_at=WHEN,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0s", timedelta(0)),
        ("90s", timedelta(seconds=90)),
        ("15m", timedelta(minutes=15)),
        ("24h", DEFAULT_LEEWAY),
        ("7d", timedelta(days=7)),
        (" 2h ", timedelta(hours=2)),
    ],
)
def test_leeways(text: str, expected: timedelta) -> None:
    assert parse_leeway(text) == expected


@pytest.mark.parametrize("text", ["", "24", "h", "-1h", "1.5h", "1w", "1 h", "1H", "1h30m"])
def test_a_leeway_that_is_not_a_duration_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_leeway(text)


def test_a_record_names_each_of_its_blocks_on_each_node() -> None:
    gone = record(2 * MiB + 1, ["n1", "n2"])
    [run] = blocks_of(gone)
    assert (run.id, run.size, run.block_count, run.sharks) == (
        gone.id,
        2 * MiB + 1,
        3,
        ["n1", "n2"],
    )


def test_a_multipart_record_names_its_parts_blocks_not_its_own() -> None:
    first, second = uuid.uuid4(), uuid.uuid4()
    parts = [
        {"id": str(first), "size": 5 * MiB, "sharks": ["n1", "n2"]},
        {"id": str(second), "size": 10, "sharks": ["n2", "n3"]},
    ]
    runs = blocks_of(record(5 * MiB + 10, ["n9"], {"parts": parts}))
    assert [(r.id, r.block_count, r.sharks) for r in runs] == [
        (first, 5, ["n1", "n2"]),
        (second, 1, ["n2", "n3"]),
    ]


def test_records_without_blocks() -> None:
    assert blocks_of(record(10, [], {"inline": True})) == []  # its bytes were in its row
    [empty] = blocks_of(record(0, ["n1"]))
    assert empty.block_names() == []


def test_deletes_are_batched_per_node() -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    runs = [BlockRun(a, 10, MiB, ["n1", "n2"]), BlockRun(b, 10, MiB, ["n2"])]
    assert names_by_node(runs) == {"n1": [f"{a}.0"], "n2": [f"{a}.0", f"{b}.0"]}


def test_a_record_goes_only_when_no_node_it_names_failed() -> None:
    runs = [BlockRun(uuid.uuid4(), 10, MiB, ["n1", "n2"]), BlockRun(uuid.uuid4(), 10, MiB, ["n3"])]
    assert may_remove(runs, failed_nodes=set())
    assert may_remove(runs, failed_nodes={"n4"})  # another record's node
    for failed in ("n1", "n2", "n3"):
        assert not may_remove(runs, failed_nodes={failed})
    assert may_remove([], failed_nodes={"n1"})  # nothing to wait for
