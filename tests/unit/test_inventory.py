"""S3 Inventory as Shoal produces it (shoal/inventory.py): columns, CSV values, the Parquet
schema a manifest names, and when a configuration is due."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shoal import inventory

ITEM = inventory.InventoryObject(
    bucket="src",
    key="dir/a b+c/ü.txt",
    size=5,
    last_modified=datetime(2024, 1, 31, 12, 0, 1, 250_000, tzinfo=UTC),
    etag="0123-2",
    multipart=True,
    checksum_algorithm="",
    public_read=False,
    owner="acct",
)


def _configuration(fields: list[str], versions: str = "Current") -> dict[str, object]:
    return {"fields": fields, "versions": versions}


def test_columns_follow_s3s_order_whatever_the_order_asked() -> None:
    chosen = inventory.columns(_configuration(["ETag", "Size"], "All"))
    assert [c.name for c in chosen] == [
        "Bucket",
        "Key",
        "VersionId",
        "IsLatest",
        "IsDeleteMarker",
        "Size",
        "ETag",
    ]


def test_csv_values_as_s3_writes_them() -> None:
    by_name = {c.name: c for c in inventory.columns(_configuration(list(inventory.FIELDS)))}
    value = {name: inventory.csv_value(column, ITEM) for name, column in by_name.items()}
    assert value["Key"] == "dir%2Fa+b%2Bc%2F%C3%BC.txt"  # form-encoded, as S3's CSV
    assert value["LastModifiedDate"] == "2024-01-31T12:00:01.250Z"
    assert value["IsMultipartUploaded"] == "true"
    assert value["ReplicationStatus"] == "" and value["ObjectLockMode"] == ""
    assert value["StorageClass"] == "STANDARD" and value["EncryptionStatus"] == "NOT-SSE"


def test_the_parquet_schema_as_a_manifest_names_it() -> None:
    chosen = inventory.columns(_configuration(["Size", "LastModifiedDate", "IsMultipartUploaded"]))
    assert inventory.parquet_schema_text(chosen) == (
        "message s3.inventory { required binary bucket (UTF8); required binary key (UTF8); "
        "optional int64 size; optional int64 last_modified_date (TIMESTAMP_MILLIS); "
        "optional boolean is_multipart_uploaded; }"
    )


NOON = datetime(2024, 3, 10, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("frequency", "delivered", "due"),
    [
        ("Daily", None, True),
        ("Daily", NOON - timedelta(hours=11), False),  # earlier the same UTC day
        ("Daily", NOON - timedelta(hours=13), True),  # the day before
        ("Weekly", None, True),
        ("Weekly", NOON - timedelta(days=6, hours=23), False),
        ("Weekly", NOON - timedelta(days=7), True),
    ],
)
def test_when_a_report_is_due(frequency: str, delivered: datetime | None, due: bool) -> None:
    assert inventory.is_due(frequency, delivered, NOON) is due
