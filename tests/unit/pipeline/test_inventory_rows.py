"""The whole-store inventory's rows, made by each task on Arrow columns
(inventory.report_rows) from what io.INVENTORY_OBJECTS reads."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pytest

from shoal.pipeline.jobs.inventory import hex_of, report_rows

CREATED = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)
MD5 = bytes.fromhex("00ff" * 8)

# The columns of io.INVENTORY_OBJECTS, as ADBC reads them.
READ = pa.schema(
    [
        ("bucket_id", pa.string()),
        ("name", pa.string()),
        ("content_length", pa.int64()),
        ("content_md5", pa.binary()),
        ("created", pa.timestamp("us", tz="UTC")),
        ("content_type", pa.string()),
        ("sharks", pa.list_(pa.string())),
        ("tags", pa.string()),
        ("parts", pa.int32()),
    ]
)


def obj(bucket_id: str, name: str, **fields: Any) -> dict[str, Any]:
    values = {
        "bucket_id": bucket_id,
        "name": name,
        "content_length": 10,
        "content_md5": MD5,
        "created": CREATED,
        "content_type": "text/plain",
        "sharks": ["n1", "n2"],
        "tags": None,
        "parts": None,
    }
    return values | fields


def report(*rows: dict[str, Any], names: dict[str, str]) -> dict[str, dict[str, Any]]:
    batch = pa.RecordBatch.from_pylist(list(rows), schema=READ)
    out = [row for b in report_rows(iter([batch]), names=names) for row in b.to_pylist()]
    return {row["key"]: row for row in out}


def test_each_live_object_of_a_known_bucket_is_reported_as_head_answers() -> None:
    found = report(
        obj("b1", "plain.txt", tags='{"team": "a"}'),
        obj("b1", "big.bin", content_length=20, content_type=None, sharks=None, parts=2),
        obj("b1", "untyped", content_type=""),
        obj("gone", "lost"),  # its bucket is not among the job's buckets
        names={"b1": "photos", "b2": "other"},
    )
    assert set(found) == {"plain.txt", "big.bin", "untyped"}
    assert found["plain.txt"] == {
        "bucket": "photos",
        "key": "plain.txt",
        "size": 10,
        "etag": "00ff" * 8,
        "last_modified": CREATED,
        "content_type": "text/plain",
        "storage_nodes": "n1 n2",
        "tags": '{"team": "a"}',
    }
    # A multipart object's ETag counts its parts; no nodes and no tags are empty strings.
    assert found["big.bin"]["etag"] == "00ff" * 8 + "-2"
    assert found["big.bin"]["storage_nodes"] == "" and found["big.bin"]["tags"] == ""
    # What HEAD answers for an object stored without a type.
    assert found["big.bin"]["content_type"] == "binary/octet-stream"
    assert found["untyped"]["content_type"] == "binary/octet-stream"


def test_no_known_bucket_reports_nothing() -> None:
    assert report(obj("b1", "k"), names={}) == {}


@pytest.mark.parametrize(
    "values",
    [
        [hashlib.md5(bytes([i])).digest() for i in range(5)],
        [MD5, None, b"", bytes(range(256)), None],
        [],
    ],
)
def test_hex_of_is_bytes_hex_for_any_values(values: list[bytes | None]) -> None:
    array = pa.array(values, pa.binary())
    expected = [None if v is None else v.hex() for v in values]
    assert hex_of(array).to_pylist() == expected
    # A slice (as a batch of a larger array is) starts at its own first value.
    if len(values) > 2:
        assert hex_of(array.slice(1, 3)).to_pylist() == expected[1:4]
