"""Inventory reports delivered into buckets end to end: configurations put with boto3,
`shoal pipeline inventory` run on the session's Spark, then the reports read back through
the gateway as a tool that reads S3's inventories does: manifest.json, its checksum, then
every file it lists with pyarrow (Parquet; CSV through gzip and the manifest's fileSchema)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
from typing import Any
from urllib.parse import unquote_plus

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from pyarrow import fs

from shoal.config import load_config
from shoal.metadata.deployment import shard_configs
from shoal.pipeline import run_job
from tests.e2e.test_boto3 import error_code
from tests.e2e.test_inventory import configuration
from tests.fixtures.postgres import unique
from tests.fixtures.serve import Served

MiB = 1024 * 1024
CSV_FIELDS = [
    "Size",
    "LastModifiedDate",
    "ETag",
    "StorageClass",
    "IsMultipartUploaded",
    "ReplicationStatus",
    "EncryptionStatus",
    "ObjectLockRetainUntilDate",
    "ObjectLockMode",
    "ObjectLockLegalHoldStatus",
    "IntelligentTieringAccessTier",
    "BucketKeyStatus",
    "ChecksumAlgorithm",
    "ObjectAccessControlList",
    "ObjectOwner",
]


def _fill(s3: Any, bucket: str) -> None:
    """A few objects of each kind: inline, in blocks, tagged, public, multipart."""
    s3.put_object(Bucket=bucket, Key="small.txt", Body=b"hello")
    s3.put_object(Bucket=bucket, Key="dir/a b+c.bin", Body=os.urandom(2 * MiB + 5))
    s3.put_object(Bucket=bucket, Key="tagged", Body=b"t", Tagging="team=storage")
    s3.put_object(
        Bucket=bucket, Key="public", Body=b"p", ACL="public-read", ChecksumAlgorithm="SHA256"
    )
    upload = s3.create_multipart_upload(Bucket=bucket, Key="multi")["UploadId"]
    etags = [
        s3.upload_part(Bucket=bucket, Key="multi", UploadId=upload, PartNumber=n, Body=body)["ETag"]
        for n, body in ((1, os.urandom(5 * MiB)), (2, b"end"))
    ]
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key="multi",
        UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]},
    )


def _run(served: Served, spark: Any, **options: Any) -> Any:
    config = load_config(served.data_dir.parent / "shoal.toml", None)
    with shard_configs(config) as shards:
        return run_job("inventory", config, shards, spark=spark, options=options)


def _manifest(s3: Any, bucket: str, base: str) -> dict[str, Any]:
    """The newest delivery's manifest under `base`, its checksum checked."""
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=base + "/")["Contents"]]
    manifests = sorted(k for k in keys if k.endswith("/manifest.json"))
    body = s3.get_object(Bucket=bucket, Key=manifests[-1])["Body"].read()
    checksum_key = manifests[-1].replace("manifest.json", "manifest.checksum")
    checksum = s3.get_object(Bucket=bucket, Key=checksum_key)["Body"].read().decode().strip()
    assert checksum == hashlib.md5(body).hexdigest()
    manifest = json.loads(body)
    for listed in manifest["files"]:
        assert listed["key"] in keys and listed["key"].startswith(base + "/data/")
        head = s3.head_object(Bucket=bucket, Key=listed["key"])
        assert head["ContentLength"] == listed["size"]
        assert head["ETag"].strip('"') == listed["MD5checksum"]
    assert any(k.startswith(base + "/hive/dt=") and k.endswith("/symlink.txt") for k in keys)
    return manifest


@pytest.mark.slow
def test_reports_are_delivered_and_read_back_through_the_manifest(
    served: Served, spark: Any
) -> None:
    s3 = served.client()
    source, target, doomed = unique("inv-src"), unique("inv-dst"), unique("inv-gone")
    for name in (source, target, doomed):
        s3.create_bucket(Bucket=name)
    _fill(s3, source)
    csv_config = configuration(target, "csv", OptionalFields=CSV_FIELDS)
    parquet_config = configuration(
        target,
        "parquet",
        OptionalFields=["Size", "ETag", "LastModifiedDate", "IsMultipartUploaded", "ObjectOwner"],
        Filter={"Prefix": "dir/"},
    )
    parquet_config["Destination"]["S3BucketDestination"].update(Format="Parquet", Prefix="pq/")
    gone_config = configuration(doomed, "gone")
    disabled = configuration(target, "disabled", IsEnabled=False)
    for wanted in (csv_config, parquet_config, gone_config, disabled):
        s3.put_bucket_inventory_configuration(
            Bucket=source, Id=wanted["Id"], InventoryConfiguration=wanted
        )
    s3.delete_bucket(Bucket=doomed)

    first = _run(served, spark, bucket=source)
    assert first.figures["reports delivered"] == 2
    assert first.problems == [
        f"inventory gone of bucket {source}: destination bucket {doomed} does not exist"
    ]
    listing = {o["Key"]: o for o in s3.list_objects_v2(Bucket=source)["Contents"]}
    filesystem = fs.S3FileSystem(
        access_key=served.root.access_key_id,
        secret_key=served.root.secret_access_key,
        endpoint_override=f"127.0.0.1:{served.port}",
        scheme="http",
        region="us-east-1",
    )

    manifest = _manifest(s3, target, f"reports/{source}/csv")
    assert manifest["sourceBucket"] == source and manifest["fileFormat"] == "CSV"
    assert manifest["destinationBucket"] == f"arn:aws:s3:::{target}"
    assert manifest["version"] == "2016-11-30" and manifest["creationTimestamp"].isdigit()
    names = manifest["fileSchema"].split(", ")
    assert names == ["Bucket", "Key", *CSV_FIELDS]
    rows = []
    for listed in manifest["files"]:
        with filesystem.open_input_stream(f"{target}/{listed['key']}") as stream:  # gunzips
            raw = stream.read()
        assert raw.startswith(b'"')  # no header; every value quoted
        options = pacsv.ConvertOptions(column_types={n: "string" for n in names})
        read = pacsv.read_csv(
            io.BytesIO(raw), pacsv.ReadOptions(column_names=names), convert_options=options
        )
        rows += read.to_pylist()
    by_key = {unquote_plus(r["Key"]): r for r in rows}
    assert set(by_key) == set(listing)
    for key, obj in listing.items():
        row = by_key[key]
        assert row["Bucket"] == source and int(row["Size"]) == obj["Size"]
        assert row["ETag"] == obj["ETag"].strip('"')
        modified = obj["LastModified"]
        assert row["LastModifiedDate"] == (
            f"{modified:%Y-%m-%dT%H:%M:%S}.{modified.microsecond // 1000:03d}Z"
        )
        assert row["StorageClass"] == "STANDARD" and row["EncryptionStatus"] == "NOT-SSE"
        assert row["IsMultipartUploaded"] == ("true" if key == "multi" else "false")
    assert by_key["public"]["ChecksumAlgorithm"] == "SHA256"
    assert by_key["small.txt"]["ObjectLockMode"] in ("", None)
    acl = json.loads(base64.b64decode(by_key["public"]["ObjectAccessControlList"]))
    assert {g["permission"] for g in acl["grants"]} == {"FULL_CONTROL", "READ"}

    manifest = _manifest(s3, target, f"pq/{source}/parquet")
    assert manifest["fileFormat"] == "Parquet"
    assert manifest["fileSchema"].startswith("message s3.inventory { required binary bucket")
    tables = [
        pq.read_table(f"{target}/{f['key']}", filesystem=filesystem) for f in manifest["files"]
    ]
    rows = [row for table in tables for row in table.to_pylist()]
    assert tables[0].column_names == [
        "bucket",
        "key",
        "size",
        "last_modified_date",
        "e_tag",
        "is_multipart_uploaded",
        "object_owner",
    ]
    assert {r["key"]: (r["size"], r["e_tag"]) for r in rows} == {
        k: (o["Size"], o["ETag"].strip('"')) for k, o in listing.items() if k.startswith("dir/")
    }
    assert rows[0]["last_modified_date"] == listing["dir/a b+c.bin"]["LastModified"]

    # Delivered objects are normal objects; the same day, nothing is due again.
    again = _run(served, spark, bucket=source)
    assert again.figures["reports delivered"] == 0 and again.figures["reports not due"] == 2
    assert again.problems == first.problems  # never delivered: still due, still a problem
    forced = _run(served, spark, bucket=source, force=True)
    assert forced.figures["reports delivered"] == 2 and len(forced.problems) == 1
    for config_id in ("gone", "csv", "parquet", "disabled"):  # none left for later runs
        s3.delete_bucket_inventory_configuration(Bucket=source, Id=config_id)
    for key in [o["Key"] for o in s3.list_objects_v2(Bucket=target)["Contents"]]:
        s3.delete_object(Bucket=target, Key=key)
    assert error_code(s3.get_object, Bucket=target, Key=manifest["files"][0]["key"]) == "NoSuchKey"
