"""A large CopyObject or UploadPartCopy answers 200 at once and keeps its connection alive
with whitespace while it copies, then sends its XML result, or an Error document in the body
of the 200 (which boto3 raises as a ClientError), as S3 does."""

from __future__ import annotations

import contextlib
import http.client
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from shoal.s3.app import EARLY_ANSWER_BYTES
from shoal.s3.xml import DECLARATION
from tests.fixtures.postgres import unique
from tests.fixtures.serve import Served, signed_headers

SOURCE_BYTES = 2 * EARLY_ANSWER_BYTES


@pytest.fixture(scope="module")
def large_source(served: Served, s3: Any) -> tuple[str, set[Path]]:
    """A bucket holding `source` (SOURCE_BYTES), and the files its blocks were stored in
    (which the last test of the module removes)."""
    bucket = unique("large-copies")
    s3.create_bucket(Bucket=bucket)
    before = served.block_files()
    s3.put_object(Bucket=bucket, Key="source", Body=os.urandom(SOURCE_BYTES))
    return bucket, served.block_files() - before


@contextlib.contextmanager
def started_copy(served: Served, bucket: str, key: str) -> Iterator[Any]:
    """A raw CopyObject of `source` to `key`; its response once its head has arrived."""
    path = f"/{bucket}/{key}"
    headers = signed_headers(served, "PUT", path, {"x-amz-copy-source": f"/{bucket}/source"})
    connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
    try:
        connection.request("PUT", path, headers=headers)
        yield connection.getresponse()
    finally:
        connection.close()


@pytest.mark.slow
def test_large_copy_answers_before_it_is_done(
    served: Served, s3: Any, large_source: tuple[str, set[Path]]
) -> None:
    bucket, _ = large_source
    with started_copy(served, bucket, "copy") as response:
        # The head is here, and the copy is not done yet: its object does not exist.
        assert response.status == 200 and response.getheader("Transfer-Encoding") == "chunked"
        with pytest.raises(ClientError):
            s3.head_object(Bucket=bucket, Key="copy")
        # The XML declaration, then whitespace until the result, as S3 sends them.
        assert response.read(len(DECLARATION)) == DECLARATION.encode()
        assert response.read(1) == b" "
        body = response.read()
    assert re.fullmatch(rb"\s*<CopyObjectResult.*</CopyObjectResult>", body, re.S)
    assert s3.head_object(Bucket=bucket, Key="copy")["ContentLength"] == SOURCE_BYTES
    # boto3 reads such an answer as any other.
    copied = s3.copy_object(Bucket=bucket, Key="copy2", CopySource=f"{bucket}/source")
    assert copied["CopyObjectResult"]["ETag"] == s3.head_object(Bucket=bucket, Key="copy2")["ETag"]
    upload = s3.create_multipart_upload(Bucket=bucket, Key="parts")["UploadId"]
    part = s3.upload_part_copy(
        Bucket=bucket, Key="parts", UploadId=upload, PartNumber=1, CopySource=f"{bucket}/source"
    )
    assert part["CopyPartResult"]["ETag"]
    s3.abort_multipart_upload(Bucket=bucket, Key="parts", UploadId=upload)
    s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "copy"}, {"Key": "copy2"}]})


@pytest.mark.slow
def test_an_error_after_the_head_is_an_error_document_in_the_200(
    served: Served, s3: Any, large_source: tuple[str, set[Path]]
) -> None:
    bucket, files = large_source
    assert files, "the source's blocks were stored in files"
    for file in files:  # every copy of every block of the source: unreadable
        file.unlink(missing_ok=True)
    with started_copy(served, bucket, "broken") as response:
        assert response.status == 200
        body = response.read()
    assert body.startswith(DECLARATION.encode() + b" ")
    assert b"<Error><Code>" in body and b"CopyObjectResult" not in body
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="broken")
    with pytest.raises(ClientError) as refused:
        s3.copy_object(Bucket=bucket, Key="broken", CopySource=f"{bucket}/source")
    # botocore reads an Error in a 200 as a 500 with that error's code.
    code = re.search(rb"<Code>(\w+)</Code>", body)
    assert code and refused.value.response["Error"]["Code"] == code[1].decode()
    upload = s3.create_multipart_upload(Bucket=bucket, Key="parts")["UploadId"]
    with pytest.raises(ClientError):
        s3.upload_part_copy(
            Bucket=bucket, Key="parts", UploadId=upload, PartNumber=1, CopySource=f"{bucket}/source"
        )
    s3.abort_multipart_upload(Bucket=bucket, Key="parts", UploadId=upload)
    s3.delete_object(Bucket=bucket, Key="source")  # no object left without its blocks


def test_a_small_copy_keeps_a_plain_answer(served: Served, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="small", Body=b"x" * 1000)
    headers = signed_headers(
        served, "PUT", f"/{bucket}/dest", {"x-amz-copy-source": f"/{bucket}/small"}
    )
    connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
    try:
        connection.request("PUT", f"/{bucket}/dest", headers=headers)
        response = connection.getresponse()
        assert response.getheader("Content-Length") and response.read().startswith(b"<?xml")
        headers = signed_headers(
            served, "PUT", f"/{bucket}/dest", {"x-amz-copy-source": f"/{bucket}/missing"}
        )
        connection.request("PUT", f"/{bucket}/dest", headers=headers)
        response = connection.getresponse()
        assert response.status == 404 and b"NoSuchKey" in response.read()
    finally:
        connection.close()
