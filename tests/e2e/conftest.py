"""Fixtures of the end-to-end tests: a boto3 client of the session's `shoal serve`, and a
fresh bucket per test."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fixtures.postgres import unique
from tests.fixtures.serve import Served


@pytest.fixture(scope="module")
def s3(served: Served) -> Any:
    return served.client()


@pytest.fixture
def bucket(s3: Any) -> str:
    name = unique("b3")
    s3.create_bucket(Bucket=name)
    return name


def complete_upload(s3: Any, bucket: str, key: str, upload: str, etags: list[str]) -> None:
    """CompleteMultipartUpload of parts 1..N with these ETags, in order."""
    parts = [{"PartNumber": n, "ETag": etag} for n, etag in enumerate(etags, start=1)]
    s3.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
    )
