"""Small objects keep their bytes in their metadata row: through boto3 they behave as any
other object (ranges, checksums, copies, overwrites, deletes), and no block reaches a node."""

from __future__ import annotations

import base64
import hashlib
import os
import zlib
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from shoal.config import S3Config
from tests.e2e.conftest import complete_upload
from tests.fixtures.serve import Served

MiB = 1024 * 1024
LIMIT = S3Config.inline_max_bytes  # `served` runs with the default


def new_blocks(served: Served, before: set[Path]) -> int:
    return len(served.block_files() - before)


@pytest.mark.parametrize("size", [0, 1, LIMIT - 1, LIMIT])
def test_small_objects_round_trip_without_blocks(
    served: Served, s3: Any, bucket: str, size: int
) -> None:
    body = os.urandom(size)
    before = served.block_files()
    put = s3.put_object(Bucket=bucket, Key="k", Body=body, ChecksumAlgorithm="CRC32")
    assert new_blocks(served, before) == 0
    assert put["ETag"] == f'"{hashlib.md5(body).hexdigest()}"'
    crc32 = base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()
    assert put["ChecksumCRC32"] == crc32
    got = s3.get_object(Bucket=bucket, Key="k", ChecksumMode="ENABLED")
    assert got["Body"].read() == body
    assert got["ContentLength"] == size and got["ChecksumCRC32"] == crc32
    head = s3.head_object(Bucket=bucket, Key="k")
    assert head["ContentLength"] == size and head["ETag"] == put["ETag"]
    if size:
        for first, last in [(0, 0), (size - 1, size - 1), (0, size // 2), (size // 3, size - 1)]:
            part = s3.get_object(Bucket=bucket, Key="k", Range=f"bytes={first}-{last}")
            assert part["Body"].read() == body[first : last + 1]
            assert part["ContentRange"] == f"bytes {first}-{last}/{size}"
        suffix = s3.get_object(Bucket=bucket, Key="k", Range="bytes=-7")["Body"].read()
        assert suffix == body[-7:]
    listed = s3.list_objects_v2(Bucket=bucket)["Contents"]
    assert [(o["Key"], o["Size"], o["ETag"]) for o in listed] == [("k", size, put["ETag"])]


def test_one_byte_past_the_limit_goes_to_the_nodes(served: Served, s3: Any, bucket: str) -> None:
    body = os.urandom(LIMIT + 1)
    before = served.block_files()
    s3.put_object(Bucket=bucket, Key="k", Body=body)
    assert new_blocks(served, before) == 2  # one block, two replicas
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == body


def test_overwrites_between_row_and_blocks(s3: Any, bucket: str) -> None:
    small, large, smaller = os.urandom(100), os.urandom(2 * MiB + 5), os.urandom(10)
    for body in (small, large, smaller):
        s3.put_object(Bucket=bucket, Key="k", Body=body)
        assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == body
    s3.delete_object(Bucket=bucket, Key="k")
    with pytest.raises(ClientError) as raised:
        s3.get_object(Bucket=bucket, Key="k")
    assert raised.value.response["Error"]["Code"] == "NoSuchKey"


def test_bad_digest_of_a_small_body_stores_nothing(s3: Any, bucket: str) -> None:
    wrong = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    with pytest.raises(ClientError) as raised:
        s3.put_object(Bucket=bucket, Key="k", Body=b"small body", ContentMD5=wrong)
    assert raised.value.response["Error"]["Code"] == "BadDigest"
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket)


def test_copies_from_and_into_rows(served: Served, s3: Any, bucket: str) -> None:
    small = os.urandom(3000)
    s3.put_object(Bucket=bucket, Key="small", Body=small, Metadata={"m": "1"})
    before = served.block_files()
    s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": "small"})
    assert new_blocks(served, before) == 0
    copied = s3.get_object(Bucket=bucket, Key="copy")
    assert copied["Body"].read() == small and copied["Metadata"] == {"m": "1"}
    # (test_boto3's test_copy_object copies a small object with REPLACE, and across buckets.)

    # A multipart object made of a large part and a range of a small object's row.
    large = os.urandom(5 * MiB)
    upload = s3.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    first = s3.upload_part(Bucket=bucket, Key="mp", UploadId=upload, PartNumber=1, Body=large)
    second = s3.upload_part_copy(
        Bucket=bucket,
        Key="mp",
        UploadId=upload,
        PartNumber=2,
        CopySource={"Bucket": bucket, "Key": "small"},
        CopySourceRange="bytes=100-1099",
    )
    complete_upload(s3, bucket, "mp", upload, [first["ETag"], second["CopyPartResult"]["ETag"]])
    assert s3.get_object(Bucket=bucket, Key="mp")["Body"].read() == large + small[100:1100]
