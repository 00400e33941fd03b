"""The pipeline jobs' DataFrame and RDD transforms on small inline rows: the session's local
Spark (tests/fixtures/spark.py), no database and no storage node."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from shoal.ids import uuid7_time
from shoal.pipeline.jobs import audit, orphans

pytestmark = pytest.mark.slow  # the first of them starts the session's Spark

EXPECTED = "shark string, name string, size long, owner string, bucket_id string, key string, "
EXPECTED += "version string"
INVENTORY = "shark string, name string, size long, checksum string, mtime double"


def made_at(ms: int) -> uuid.UUID:
    """A UUIDv7 of the given time (uuid7() never goes back in time within a process)."""
    random = uuid.uuid4().int
    value = (
        (ms << 80) | (0x7 << 76) | (random & (0xFFF << 64)) | (0b10 << 62) | (random & (2**62 - 1))
    )
    made = uuid.UUID(int=value)
    assert uuid7_time(made).timestamp() == ms / 1000
    return made


def test_audit_finds_missing_wrong_size_and_bad_blocks(spark: Any) -> None:
    expected = spark.createDataFrame(
        [
            (shark, name, 10, "o", "b", "k", "v")
            for shark, name in (("n1", "ok"), ("n1", "gone"), ("n1", "short"), ("n1", "rotten"))
        ]
        + [("n2", "ok", 10, "o", "b", "k", "v")],  # on n2 too, where it is missing
        EXPECTED,
    )
    listed = spark.createDataFrame(
        [
            ("n1", "ok", 10, "c", 0.0),
            ("n1", "short", 9, "c", 0.0),
            ("n1", "rotten", 10, "c", 0.0),
            ("n1", "stray", 10, "c", 0.0),  # no row names it: an orphan, not the audit's
        ],
        INVENTORY,
    )
    joined = audit.compared(expected, listed)
    verdicts = spark.createDataFrame(
        [("n1", "ok", "ok"), ("n1", "rotten", "corrupt")],
        "shark string, name string, verdict string",
    )
    found = {
        (r.shark, r.name): (r.found_size, r.problem)
        for r in audit.problems(joined, verdicts).collect()
    }
    assert found == {
        ("n1", "gone"): (None, "missing"),
        ("n2", "ok"): (None, "missing"),
        ("n1", "short"): (9, "wrong size"),
        ("n1", "rotten"): (10, "corrupt"),
    }


def test_orphans_are_unnamed_blocks_older_than_the_cutoff_by_id_and_by_file(spark: Any) -> None:
    cutoff = datetime(2024, 6, 1, tzinfo=UTC).timestamp()
    old, young = int(cutoff * 1000) - 60_000, int(cutoff * 1000) + 60_000
    named, unnamed, new_file, new_id = made_at(old), made_at(old), made_at(old), made_at(young)
    listed = spark.createDataFrame(
        [
            ("n1", f"{named}.0", 10, "c", cutoff - 60),
            ("n1", f"{unnamed}.0", 10, "c", cutoff - 60),
            ("n2", f"{unnamed}.1", 5, "c", cutoff - 60),
            ("n1", f"{new_id}.0", 10, "c", cutoff - 60),  # a write still in progress
            ("n1", f"{new_file}.0", 10, "c", cutoff + 60),  # a file written since
            ("n1", f"{uuid.uuid4()}.0", 10, "c", cutoff - 60),  # not a UUIDv7: never an orphan
        ],
        INVENTORY,
    )
    referenced = spark.createDataFrame([(str(named),)], "version string")
    found = orphans.orphan_blocks(listed, referenced, cutoff).collect()
    assert sorted((r.shark, r.name, r.version) for r in found) == [
        ("n1", f"{unnamed}.0", str(unnamed)),
        ("n2", f"{unnamed}.1", str(unnamed)),
    ]
