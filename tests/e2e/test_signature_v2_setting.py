"""`[s3] signature_v2` end to end: which SigV2 requests a real `shoal serve` lets in.

The session's `served` has the default ("presigned"); "all" and "off" get a serve each."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

from tests.fault.serving import own_serve
from tests.fixtures.postgres import unique
from tests.fixtures.serve import Served


def _client(served: Served, signature_version: str | None) -> Any:
    """A boto3 client signing with `signature_version` ("s3": SigV2 headers; None: boto3's
    default, whose presigned URLs are SigV2 in us-east-1)."""
    config = BotoConfig(retries={"total_max_attempts": 1}, s3={"addressing_style": "path"})
    if signature_version:
        config = config.merge(BotoConfig(signature_version=signature_version))
    client = boto3.client(
        "s3",
        endpoint_url=served.endpoint,
        region_name="us-east-1",
        aws_access_key_id=served.root.access_key_id,
        aws_secret_access_key=served.root.secret_access_key,
        config=config,
    )
    served.clients.append(client)
    return client


def _header_signed_put(served: Served, bucket: str) -> None:
    _client(served, "s3").put_object(Bucket=bucket, Key="v2", Body=b"signed in the header")


def _presigned_get(served: Served, bucket: str) -> tuple[int, bytes]:
    url = _client(served, None).generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "v2"}
    )
    assert "AWSAccessKeyId=" in url
    try:
        with urllib.request.urlopen(url) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, refused.read()


def _sigv4_bucket(served: Served) -> str:
    bucket = unique("v2")
    sigv4 = _client(served, "s3v4")
    sigv4.create_bucket(Bucket=bucket)
    sigv4.put_object(Bucket=bucket, Key="v2", Body=b"signed in the header")
    return bucket


def _assert_header_refused(served: Served, bucket: str) -> None:
    with pytest.raises(ClientError) as refused:
        _header_signed_put(served, bucket)
    error = refused.value.response
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert error["Error"]["Code"] == "InvalidRequest"
    assert "Signature Version 2 in the Authorization header is off" in error["Error"]["Message"]


def test_by_default_presigned_urls_pass_and_header_sigv2_is_refused(served: Served) -> None:
    bucket = _sigv4_bucket(served)
    assert _presigned_get(served, bucket) == (200, b"signed in the header")
    _assert_header_refused(served, bucket)


@pytest.mark.slow
def test_all_accepts_header_sigv2_and_presigned_urls(tmp_path: Path) -> None:
    with own_serve(tmp_path / "all", '[s3]\nsignature_v2 = "all"\n') as served:
        bucket = _sigv4_bucket(served)
        _header_signed_put(served, bucket)
        assert _presigned_get(served, bucket) == (200, b"signed in the header")


@pytest.mark.slow
def test_off_refuses_every_sigv2_request_and_serves_sigv4(tmp_path: Path) -> None:
    with own_serve(tmp_path / "off", '[s3]\nsignature_v2 = "off"\n') as served:
        bucket = _sigv4_bucket(served)  # SigV4 still works
        _assert_header_refused(served, bucket)
        status, body = _presigned_get(served, bucket)
        assert status == 400
        assert b"<Code>InvalidRequest</Code>" in body
        assert b"Signature Version 2 in presigned URLs is off" in body
