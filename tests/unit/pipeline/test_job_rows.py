"""The pipeline jobs' logic on one row at a time: plain Python, no Spark session, no database.

Rows are built as the readers give them (pyspark Rows of io.RECORD_SCHEMA's columns, the
properties as JSON text).
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import Row

from shoal.metadata.partitions import window_name, window_start
from shoal.pipeline import io
from shoal.pipeline.jobs import audit, gc, lifecycle, meter, orphans
from shoal.storage.blockfile import block_name
from tests.fixtures.arrow import batch_of

MiB = 1 << 20
OWNER, BUCKET = str(uuid.uuid4()), str(uuid.uuid4())
NOW = datetime(2024, 6, 10, 12, 0, tzinfo=UTC)


def row(
    size: int = 10,
    sharks: list[str] | None = None,
    properties: dict[str, Any] | None = None,
    **fields: Any,
) -> Row:
    values: dict[str, Any] = {
        "shard": "s1",
        "vnode": 3,
        "kind": "record",
        "id": str(uuid.uuid4()),
        "owner": OWNER,
        "bucket_id": BUCKET,
        "name": "k",
        "created": NOW,
        "content_length": size,
        "content_md5": bytes(16),
        "sharks": ["n1", "n2"] if sharks is None else sharks,
        "properties": json.dumps(properties) if properties is not None else None,
        "deleted_at": None,
    }
    values.update(fields)
    return Row(**values)


def parts(*specs: tuple[int, list[str]]) -> tuple[list[uuid.UUID], dict[str, Any]]:
    ids = [uuid.uuid4() for _ in specs]
    described = [
        {"id": str(i), "size": size, "sharks": sharks}
        for i, (size, sharks) in zip(ids, specs, strict=True)
    ]
    return ids, {"parts": described}


# gc


def batch(*rows: Row) -> pa.RecordBatch:
    """Rows as the gc job's executors get them: an Arrow batch of io.RECORD_SCHEMA."""
    from pyspark.sql.pandas.types import to_arrow_schema

    schema = to_arrow_schema(io.RECORD_SCHEMA, timezone="UTC")
    return pa.RecordBatch.from_pylist([r.asDict() for r in rows], schema=schema)


def test_gc_deletes_each_block_of_a_record_on_each_node_it_names() -> None:
    record = row(size=MiB + 1, sharks=["n1", "n2"])
    version = uuid.UUID(record.id)
    names = [block_name(version, 0), block_name(version, 1)]
    assert gc._Blocks.of(batch(record)).names == {"n1": names, "n2": names}


def test_gc_deletes_a_multipart_record_s_parts_and_none_of_an_inline_one() -> None:
    (first, second), described = parts((5, ["n1"]), (7, ["n3"]))
    multipart = row(size=12, sharks=[], properties=described)
    blocks = gc._Blocks.of(batch(multipart, row(properties={"inline": True})))
    assert blocks.names == {"n1": [block_name(first, 0)], "n3": [block_name(second, 0)]}
    assert blocks.may_go({"n3"}).to_pylist() == [False, True]


def test_gc_removes_a_deletion_record_from_the_window_it_was_deleted_in() -> None:
    deleted = datetime(2024, 6, 10, 11, 47, tzinfo=UTC)
    width = timedelta(hours=1)
    expected = window_name("manta_bucket_deleted_object", window_start(deleted, width))
    assert expected.endswith("_w20240610t1100")
    # Arrow hands the deletion time over as an instant, whatever the zone it is shown in.
    shown = deleted.astimezone(timezone(timedelta(hours=5)))
    column = batch(row(deleted_at=shown)).column("deleted_at")
    assert gc._Windows(width).of_column(column).to_pylist() == [expected]


def test_gc_adds_the_tasks_summaries_and_keeps_a_node_s_first_reason() -> None:
    one = gc.TaskSummary(found=3, removed=2, to_vacuum=[("s1", 1, "w")], failures={"n1": "a"})
    two = gc.TaskSummary(found=4, removed=4, truncated=1, failures={"n1": "b", "n2": "c"})
    total = gc._added(gc.Summaries().addInPlace([one], [two]))
    assert (total.found, total.removed, total.truncated) == (7, 6, 1)
    assert total.to_vacuum == [("s1", 1, "w")]
    assert total.failures == {"n1": "a", "n2": "c"}


# audit


def test_audit_expects_every_block_on_every_node_with_the_last_one_short() -> None:
    version = row(size=2 * MiB + 5, sharks=["n1", "n2"], name="photo.jpg")
    expected = audit._expected_blocks(version)
    vid = uuid.UUID(version.id)
    sizes = {0: MiB, 1: MiB, 2: 5}
    assert sorted(expected) == sorted(
        (shark, block_name(vid, i), size, OWNER, BUCKET, "photo.jpg", version.id)
        for shark in ("n1", "n2")
        for i, size in sizes.items()
    )


def test_audit_expects_a_multipart_object_s_parts_under_the_object_s_version() -> None:
    (first, second), described = parts((MiB, ["n1"]), (3, ["n2"]))
    version = row(size=MiB + 3, sharks=[], properties=described)
    assert audit._expected_blocks(version) == [
        ("n1", block_name(first, 0), MiB, OWNER, BUCKET, "k", version.id),
        ("n2", block_name(second, 0), 3, OWNER, BUCKET, "k", version.id),
    ]
    assert audit._expected_blocks(row(properties={"inline": True})) == []


def test_audit_counts_distinct_nodes_per_run_against_the_target() -> None:
    (_, second), described = parts((5, ["n1", "n2"]), (5, ["n3", "n3"]))
    version = row(sharks=[], properties=described)
    assert audit._short_runs(version, target=2) == [
        (OWNER, BUCKET, "k", version.id, str(second), 1)  # two copies on one node are one
    ]
    assert audit._short_runs(version, target=1) == []
    whole = row(sharks=["n1"])
    assert audit._short_runs(whole, target=3) == [(OWNER, BUCKET, "k", whole.id, whole.id, 1)]


# orphans


def test_orphans_count_a_version_or_its_parts_as_naming_blocks() -> None:
    plain = row()
    assert orphans._named_ids(plain) == [plain.id]
    (first, second), described = parts((5, ["n1"]), (5, ["n2"]))
    assert orphans._named_ids(row(properties=described)) == [str(first), str(second)]


# meter


@pytest.mark.parametrize(
    ("length", "sharks", "properties", "stored"),
    [
        (100, ["n1", "n2", "n3"], None, 300),
        (100, [], None, 0),
        (100, None, None, 0),
        (None, ["n1"], None, 0),
        (100, ["n1", "n2"], {"inline": True}, 100),  # one copy, in its metadata row
        (15, [], {"parts": [{"size": 10, "sharks": ["a", "b"]}, {"size": 5, "sharks": ["a"]}]}, 25),
    ],
)
def test_meter_counts_stored_bytes_per_copy(
    length: int | None,
    sharks: list[str] | None,
    properties: dict[str, Any] | None,
    stored: int,
) -> None:
    text = json.dumps(properties) if properties is not None else None
    one = {"content_length": length, "sharks": sharks, "properties": text}
    plain = {"content_length": 7, "sharks": ["n1"], "properties": None}
    # Alone, and beside a plain row (the rows worked out in Python land in their place).
    assert meter.stored_bytes(batch_of([one])).to_pylist() == [stored]
    assert meter.stored_bytes(batch_of([plain, one, plain])).to_pylist() == [7, stored, 7]


# lifecycle


def rule(**fields: Any) -> dict[str, Any]:
    values = {
        "id": "r",
        "enabled": True,
        "prefix": "",
        "expiration_days": None,
        "expiration_date": None,
        "abort_days": None,
    }
    return values | fields


def rules_of(*rules: dict[str, Any]) -> dict[str, Any]:
    return {BUCKET: (OWNER, "bucket", list(rules))}


def aged(
    days: float, name: str = "k", tags: dict[str, str] | None = None, bucket_id: str = BUCKET
) -> Row:
    properties = {"tags": tags} if tags is not None else None
    created = NOW - timedelta(days=days)
    return row(name=name, created=created, properties=properties, bucket_id=bucket_id)


@pytest.mark.parametrize(
    ("created", "days", "expires"),
    [
        (datetime(2024, 3, 1, 0, 0, tzinfo=UTC), 1, datetime(2024, 3, 2, tzinfo=UTC)),
        (datetime(2024, 3, 1, 0, 0, 1, tzinfo=UTC), 1, datetime(2024, 3, 3, tzinfo=UTC)),
        (datetime(2024, 2, 28, 23, 0, tzinfo=UTC), 1, datetime(2024, 3, 1, tzinfo=UTC)),  # leap
        # A time in another zone counts from its UTC instant.
        (
            datetime(2024, 3, 1, 1, 0, tzinfo=UTC).astimezone(timezone(timedelta(hours=5))),
            1,
            datetime(2024, 3, 3, tzinfo=UTC),
        ),
    ],
)
def test_lifecycle_ages_round_up_to_midnight_utc(
    created: datetime, days: int, expires: datetime
) -> None:
    assert lifecycle.expires_at(created, days) == expires


def test_lifecycle_expires_by_days_by_prefix() -> None:
    rules = rules_of(rule(prefix="logs/", expiration_days=3))
    assert lifecycle._expired(aged(4, "logs/a"), rules, NOW)
    assert not lifecycle._expired(aged(2, "logs/a"), rules, NOW)  # not old enough
    assert not lifecycle._expired(aged(40, "data/a"), rules, NOW)  # another prefix
    assert not lifecycle._expired(aged(40, "logs/a", bucket_id="other"), rules, NOW)  # no rules


def test_lifecycle_expires_by_date_once_it_has_come() -> None:
    rules = rules_of(rule(expiration_date="2024-06-10T00:00:00+00:00"))
    assert lifecycle._expired(aged(0), rules, NOW)
    assert not lifecycle._expired(aged(0), rules, datetime(2024, 6, 9, 23, 59, tzinfo=UTC))


def test_lifecycle_rules_that_are_disabled_do_nothing() -> None:
    rules = rules_of(rule(enabled=False, expiration_days=1, abort_days=1))
    assert not lifecycle._expired(aged(30), rules, NOW)
    assert not lifecycle._abandoned(aged(30), rules, NOW)


def test_lifecycle_tag_filters_need_every_tag_with_its_value() -> None:
    rules = rules_of(rule(expiration_days=1, tags={"tier": "tmp", "team": "a"}))
    assert lifecycle._expired(aged(5, tags={"tier": "tmp", "team": "a", "x": "y"}), rules, NOW)
    assert not lifecycle._expired(aged(5, tags={"tier": "tmp"}), rules, NOW)
    assert not lifecycle._expired(aged(5, tags={"tier": "tmp", "team": "b"}), rules, NOW)
    assert not lifecycle._expired(aged(5), rules, NOW)


def test_lifecycle_any_matching_rule_expires() -> None:
    rules = rules_of(rule(prefix="a", expiration_days=100), rule(prefix="ab", expiration_days=1))
    assert lifecycle._expired(aged(5, "abc"), rules, NOW)
    assert not lifecycle._expired(aged(5, "ax"), rules, NOW)


def test_lifecycle_aborts_uploads_by_prefix_and_age_never_by_a_tagged_rule() -> None:
    rules = rules_of(rule(prefix="up/", abort_days=2))
    assert lifecycle._abandoned(aged(3, "up/big"), rules, NOW)
    assert not lifecycle._abandoned(aged(1, "up/big"), rules, NOW)
    assert not lifecycle._abandoned(aged(3, "other"), rules, NOW)
    assert not lifecycle._expired(aged(30, "up/big"), rules, NOW)  # no expiration in it
    tagged = rules_of(rule(abort_days=1, tags={"a": "b"}))
    assert not lifecycle._abandoned(aged(30), tagged, NOW)


@pytest.mark.parametrize(
    ("properties", "tags"),
    [
        (None, {}),
        ("", {}),
        ("{}", {}),
        ('{"tags": {"a": "1"}}', {"a": "1"}),
        ('{"tags": ["a"]}', {}),  # not a map: no tags
    ],
)
def test_lifecycle_reads_an_object_s_tags(properties: str | None, tags: dict[str, str]) -> None:
    assert lifecycle.object_tags(properties) == tags


def test_lifecycle_skips_only_the_buckets_whose_rules_cannot_be_applied() -> None:
    good, bad, empty = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    owner = uuid.uuid4()
    configured = [
        (good, owner, "good", [rule(expiration_days=1)]),
        (bad, owner, "bad", [rule(expiration_days=0)]),
        (empty, owner, "empty", []),
    ]
    rules, skipped = lifecycle._applicable(configured)
    assert rules == {str(good): (str(owner), "good", [rule(expiration_days=1)])}
    assert [(o, name) for o, name, _ in skipped] == [(str(owner), "bad"), (str(owner), "empty")]
    assert "expiration_days 0" in skipped[0][2]


def test_orphan_deletes_count_what_each_node_did_and_name_each_node_that_failed() -> None:
    deletes = orphans.Deletes.of(
        [
            (["a", "b", "c"], True, 2, "dc:n0", ""),  # one of the three was gone already
            (["d", "e"], False, 0, "dc:n1", "POST /blocks/delete: 500 internal error"),
            (["f"], False, 0, "dc:n1", "not sent, after an earlier failure"),
        ]
    )
    assert (deletes.deleted, deletes.kept) == (2, 3)
    assert deletes.problems() == [
        "block delete failed on dc:n1: POST /blocks/delete: 500 internal error; "
        "its orphans are left for a later run"
    ]
    assert orphans.Deletes.of([(["a"], True, 1, "dc:n0", "")]).problems() == []
