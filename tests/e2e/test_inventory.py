"""Bucket inventory configurations through the S3 API (Put/Get/List/Delete), with boto3
against `shoal serve`: what S3 validates, what Shoal refuses, and that they go with their
bucket. Delivery is tests/e2e/test_inventory_delivery.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.test_boto3 import error_code
from tests.fixtures.postgres import unique
from tests.fixtures.serve import Served, raw_request


@pytest.fixture
def bucket(s3: Any) -> Iterator[str]:
    """A fresh bucket, deleted after the test with its configurations: none stays behind for
    a later test's inventory job to deliver."""
    name = unique("inv")
    s3.create_bucket(Bucket=name)
    yield name
    s3.delete_bucket(Bucket=name)


def configuration(destination: str, config_id: str = "daily", **more: Any) -> dict[str, Any]:
    wanted: dict[str, Any] = {
        "Destination": {
            "S3BucketDestination": {
                "Bucket": f"arn:aws:s3:::{destination}",
                "Format": "CSV",
                "Prefix": "reports",
            }
        },
        "IsEnabled": True,
        "Id": config_id,
        "IncludedObjectVersions": "Current",
        "Schedule": {"Frequency": "Daily"},
    }
    wanted.update(more)
    return wanted


def test_put_get_list_delete(s3: Any, bucket: str) -> None:
    assert s3.list_bucket_inventory_configurations(Bucket=bucket)["IsTruncated"] is False
    full = configuration(
        bucket,
        "everything",
        Filter={"Prefix": "logs/"},
        IncludedObjectVersions="All",
        OptionalFields=["ObjectOwner", "Size", "ETag", "LastModifiedDate", "ChecksumAlgorithm"],
        Schedule={"Frequency": "Weekly"},
    )
    full["Destination"]["S3BucketDestination"]["Encryption"] = {"SSES3": {}}
    full["Destination"]["S3BucketDestination"]["Format"] = "Parquet"
    s3.put_bucket_inventory_configuration(
        Bucket=bucket, Id="everything", InventoryConfiguration=full
    )
    plain = configuration(bucket, "plain")
    s3.put_bucket_inventory_configuration(Bucket=bucket, Id="plain", InventoryConfiguration=plain)
    got = s3.get_bucket_inventory_configuration(Bucket=bucket, Id="everything")
    # Fields come back in the order a report has them.
    full["OptionalFields"] = [
        "Size",
        "LastModifiedDate",
        "ETag",
        "ChecksumAlgorithm",
        "ObjectOwner",
    ]
    assert got["InventoryConfiguration"] == full
    listed = s3.list_bucket_inventory_configurations(Bucket=bucket)
    assert listed["InventoryConfigurationList"] == [full, plain]
    # A put with the same id replaces the configuration.
    plain["IsEnabled"] = False
    s3.put_bucket_inventory_configuration(Bucket=bucket, Id="plain", InventoryConfiguration=plain)
    got = s3.get_bucket_inventory_configuration(Bucket=bucket, Id="plain")
    assert got["InventoryConfiguration"]["IsEnabled"] is False
    s3.delete_bucket_inventory_configuration(Bucket=bucket, Id="plain")
    missing = {"Bucket": bucket, "Id": "plain"}
    assert error_code(s3.get_bucket_inventory_configuration, **missing) == "NoSuchConfiguration"
    assert error_code(s3.delete_bucket_inventory_configuration, **missing) == "NoSuchConfiguration"
    gone = {"Bucket": bucket + "-none", "Id": "plain"}
    assert error_code(s3.get_bucket_inventory_configuration, **gone) == "NoSuchBucket"


def test_list_pages_with_a_continuation_token(s3: Any, bucket: str) -> None:
    ids = [f"c{n:03d}" for n in range(101)]
    for config_id in ids:
        s3.put_bucket_inventory_configuration(
            Bucket=bucket, Id=config_id, InventoryConfiguration=configuration(bucket, config_id)
        )
    first = s3.list_bucket_inventory_configurations(Bucket=bucket)
    assert first["IsTruncated"] is True
    token = first["NextContinuationToken"]
    second = s3.list_bucket_inventory_configurations(Bucket=bucket, ContinuationToken=token)
    assert second["IsTruncated"] is False and second["ContinuationToken"] == token
    listed = first["InventoryConfigurationList"] + second["InventoryConfigurationList"]
    assert [c["Id"] for c in listed] == ids


def _with_destination(bucket: str, **changes: Any) -> dict[str, Any]:
    wanted = configuration(bucket)
    wanted["Destination"]["S3BucketDestination"].update(changes)
    return wanted


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (lambda b: _with_destination(b, Format="ORC"), "NotImplemented"),
        (lambda b: _with_destination(b, Encryption={"SSEKMS": {"KeyId": "k"}}), "NotImplemented"),
        (lambda b: _with_destination(b, Bucket=f"arn:aws:s3:::{b}-none"), "InvalidArgument"),
        (lambda b: _with_destination(b, Bucket=b), "InvalidS3DestinationBucket"),
        (lambda b: _with_destination(b, Format="JSON"), "MalformedXML"),
        (lambda b: _with_destination(b, AccountId="123456789012"), "AccessDenied"),
        (
            lambda b: configuration(b, OptionalFields=["LifecycleExpirationDate"]),
            "NotImplemented",
        ),
        (lambda b: configuration(b, OptionalFields=["Colour"]), "MalformedXML"),
        (lambda b: configuration(b, Schedule={"Frequency": "Hourly"}), "MalformedXML"),
        (lambda b: configuration(b, "other"), "IdMismatch"),  # not the id asked for
        (lambda b: configuration(b, "bad id!"), "InvalidArgument"),
    ],
)
def test_refused_configurations(s3: Any, bucket: str, change: Any, code: str) -> None:
    put = s3.put_bucket_inventory_configuration
    wanted = change(bucket)
    config_id = "daily" if wanted["Id"] == "other" else wanted["Id"]
    assert error_code(put, Bucket=bucket, Id=config_id, InventoryConfiguration=wanted) == code
    assert (
        s3.list_bucket_inventory_configurations(Bucket=bucket).get("InventoryConfigurationList", [])
        == []
    )


def test_bad_xml_and_a_missing_id(served: Served, s3: Any, bucket: str) -> None:
    assert raw_request(served, "PUT", f"/{bucket}?inventory&id=a", b"<Inventory").status == 400
    no_id = (
        b"<InventoryConfiguration><IsEnabled>true</IsEnabled>"
        b"<Destination><S3BucketDestination><Bucket>arn:aws:s3:::" + bucket.encode() + b"</Bucket>"
        b"<Format>CSV</Format></S3BucketDestination></Destination>"
        b"<IncludedObjectVersions>Current</IncludedObjectVersions>"
        b"<Schedule><Frequency>Daily</Frequency></Schedule></InventoryConfiguration>"
    )
    answer = raw_request(served, "PUT", f"/{bucket}?inventory&id=a", no_id)
    assert answer.status == 400 and b"<Code>MalformedXML</Code>" in answer.body
    with_id = no_id.replace(b"<IsEnabled>", b"<Id>a</Id><IsEnabled>")
    # A repeated or unknown element is refused, never read past (S3's schema).
    for extra in (
        b"<IsEnabled>false</IsEnabled>",
        b"<Foo>bar</Foo>",
        b"<Destination><S3BucketDestination/></Destination>",
    ):
        broken = with_id.replace(b"</InventoryConfiguration>", extra + b"</InventoryConfiguration>")
        answer = raw_request(served, "PUT", f"/{bucket}?inventory&id=a", broken)
        assert answer.status == 400 and b"<Code>MalformedXML</Code>" in answer.body, extra
    assert raw_request(served, "PUT", f"/{bucket}?inventory&id=a", with_id).status == 204
    answer = raw_request(served, "PUT", f"/{bucket}?inventory", with_id)  # no id parameter
    assert answer.status == 400 and b"<Code>InvalidArgument</Code>" in answer.body
    answer = raw_request(served, "DELETE", f"/{bucket}?inventory")
    assert answer.status == 400 and b"<Code>InvalidArgument</Code>" in answer.body
    answer = raw_request(served, "GET", f"/{bucket}/key?inventory")
    assert answer.status == 501  # objects have no inventory configurations


def test_another_accounts_bucket_is_no_destination(served: Served, s3: Any, bucket: str) -> None:
    theirs = unique("theirs")
    other = served.client(served.other)
    other.create_bucket(Bucket=theirs)
    wanted = configuration(theirs)
    put = s3.put_bucket_inventory_configuration
    assert error_code(put, Bucket=bucket, Id="daily", InventoryConfiguration=wanted) == (
        "AccessDenied"
    )
    # Nor may another account configure a bucket it does not own.
    mine = configuration(bucket)
    assert error_code(
        other.put_bucket_inventory_configuration,
        Bucket=bucket,
        Id="daily",
        InventoryConfiguration=mine,
    ) in ("AccessDenied", "NoSuchBucket")
    other.delete_bucket(Bucket=theirs)


def test_configurations_go_with_their_bucket(s3: Any) -> None:
    name = unique("inv")
    s3.create_bucket(Bucket=name)
    s3.put_bucket_inventory_configuration(
        Bucket=name, Id="daily", InventoryConfiguration=configuration(name)
    )
    s3.delete_bucket(Bucket=name)
    s3.create_bucket(Bucket=name)
    listed = s3.list_bucket_inventory_configurations(Bucket=name)
    assert listed.get("InventoryConfigurationList", []) == []
    assert error_code(s3.get_bucket_inventory_configuration, Bucket=name, Id="daily") == (
        "NoSuchConfiguration"
    )
    s3.delete_bucket(Bucket=name)
