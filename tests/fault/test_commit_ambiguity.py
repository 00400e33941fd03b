"""A PUT whose metadata commit's outcome the gateway cannot know: the connection to PostgreSQL
is cut after the server received the write, and before its reply reached the gateway.

The gateway must answer 503 and keep the blocks it wrote: the row may have committed, and a
row whose blocks were dropped could never be read again. When the row did commit, the object
reads back whole; when it did not, its blocks are left for `shoal pipeline orphans`, which
finds exactly the blocks that no row names, and reclaims them.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest

from shoal.config import load_config
from shoal.pipeline import run_job
from tests.fault.proxy import CuttingProxy, cutting_proxy
from tests.fault.serving import block_versions, named_versions, own_serve
from tests.fixtures.postgres import create_databases
from tests.fixtures.serve import Served

pytestmark = pytest.mark.slow

BUCKET = "ambiguity"
SIZE = 200 * 1024  # past the inline limit: the object's bytes go to blocks on the nodes
NO_RETRIES = {"total_max_attempts": 1}  # each request's own answer


@pytest.fixture(scope="module")
def proxied(
    admin_dsn: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Served, CuttingProxy, str]]:
    """A `shoal serve` whose one shard is reached through a CuttingProxy."""
    [shard] = create_databases(admin_dsn, 1)
    with cutting_proxy(shard.dsn) as proxy:
        # No GC daemon: its transactions' COMMITs must not meet a proxy armed for another.
        config = (
            "[s3]\nworkers = 1\n\n[gc]\nenabled = false\n\n"
            f'[[metadata.shards]]\nname = "pg"\ndsn = "{proxy.dsn}"\n'
        )
        with own_serve(tmp_path_factory.mktemp("ambiguity"), config) as served:
            served.raw_client(served.root).create_bucket(Bucket=BUCKET)
            yield served, proxy, shard.dsn


def test_a_commit_whose_reply_is_lost_answers_503_and_the_object_reads_back(
    proxied: tuple[Served, CuttingProxy, str],
) -> None:
    served, proxy, _ = proxied
    client = served.raw_client(served.root, retries=NO_RETRIES)
    key, body = f"committed-{uuid.uuid4().hex}", os.urandom(SIZE)
    proxy.arm(key.encode(), forward=True)
    assert _put(client, key, body) == 503
    assert proxy.fired.is_set()
    status, found = _read_when_answered(client, key)
    assert status == 200 and found == body


def test_a_write_cut_before_its_commit_answers_503_and_leaves_its_blocks_to_orphans(
    proxied: tuple[Served, CuttingProxy, str],
) -> None:
    served, proxy, dsn = proxied
    client = served.raw_client(served.root, retries=NO_RETRIES)
    before = block_versions(served.data_dir)
    key = f"lost-{uuid.uuid4().hex}"
    proxy.arm(key.encode(), forward=False)
    assert _put(client, key, os.urandom(SIZE)) == 503
    assert proxy.fired.is_set()
    status, _ = _read_when_answered(client, key)
    assert status == 404
    unnamed = block_versions(served.data_dir) - before - named_versions(dsn)
    assert len(unnamed) == 1  # this write's blocks, which no row names: orphans'


def test_orphans_finds_exactly_the_blocks_a_cut_write_left_and_reclaims_them(
    proxied: tuple[Served, CuttingProxy, str], spark: Any, tmp_path: Path
) -> None:
    served, proxy, dsn = proxied
    client = served.raw_client(served.root, retries=NO_RETRIES)
    kept_key, kept = f"kept-{uuid.uuid4().hex}", os.urandom(SIZE)
    client.put_object(Bucket=BUCKET, Key=kept_key, Body=kept)
    before = block_versions(served.data_dir)
    leaked_key = f"leaked-{uuid.uuid4().hex}"
    proxy.arm(leaked_key.encode(), forward=False)
    assert _put(client, leaked_key, os.urandom(SIZE)) == 503
    leaked = block_versions(served.data_dir) - before
    assert len(leaked) == 1
    unnamed = block_versions(served.data_dir) - named_versions(dsn)
    assert leaked <= unnamed

    config = load_config(served.data_dir.parent / "shoal.toml", None)
    # No write is under way in the bucket: a leeway of none may delete (what [s3]
    # write_lifetime_seconds would allow, set that low).
    config = replace(config, s3=replace(config.s3, write_lifetime=timedelta(0)))

    def orphans(**options: Any) -> Any:
        return run_job(
            "orphans",
            config,
            list(config.metadata.shards),
            spark=spark,
            output=tmp_path,
            options={"leeway": timedelta(0), **options},
        )

    found = orphans()
    listed = spark.read.parquet(str(found.output / "orphans")).select("version").collect()
    assert {uuid.UUID(row.version) for row in listed} == unnamed
    reclaimed = orphans(delete=True)
    assert reclaimed.figures["deleted"] == found.figures["orphan blocks"] > 0
    assert not block_versions(served.data_dir) & unnamed
    assert client.get_object(Bucket=BUCKET, Key=kept_key)["Body"].read() == kept


def test_a_completion_whose_commit_reply_is_lost_answers_the_same_when_retried(
    proxied: tuple[Served, CuttingProxy, str],
) -> None:
    served, proxy, _ = proxied
    client = served.raw_client(served.root, retries=NO_RETRIES)
    key, body = f"completed-{uuid.uuid4().hex}", os.urandom(SIZE)
    upload = client.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    etag = client.upload_part(Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=1, Body=body)[
        "ETag"
    ]

    def complete() -> Any:
        parts = {"Parts": [{"PartNumber": 1, "ETag": etag}]}
        return client.complete_multipart_upload(
            Bucket=BUCKET, Key=key, UploadId=upload, MultipartUpload=parts
        )

    # The completion is one transaction: its COMMIT goes through, its reply is lost.
    proxy.arm(b"COMMIT", forward=True)
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        complete()
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert proxy.fired.is_set()
    # It did commit: the upload is gone (so the retry below takes the answer from the object).
    assert (
        _status_when_answered(lambda: client.list_parts(Bucket=BUCKET, Key=key, UploadId=upload))
        == 404
    )
    deadline = time.monotonic() + 5
    while True:  # the client retries, as it should after a 503
        try:
            answer = complete()
            break
        except botocore.exceptions.ClientError as exc:
            assert exc.response["ResponseMetadata"]["HTTPStatusCode"] == 503
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert answer["ETag"].endswith('-1"')
    assert client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == body


def _status_when_answered(call: Callable[[], Any], timeout: float = 5.0) -> int:
    """The status of `call`, tried again while it is a 503."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            call()
            return 200
        except botocore.exceptions.ClientError as exc:
            status = int(exc.response["ResponseMetadata"]["HTTPStatusCode"])
        if status != 503 or time.monotonic() > deadline:
            return status
        time.sleep(0.1)


def _put(client: Any, key: str, body: bytes) -> int | None:
    try:
        response = client.put_object(Bucket=BUCKET, Key=key, Body=body)
    except botocore.exceptions.ClientError as exc:
        return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])
    return int(response["ResponseMetadata"]["HTTPStatusCode"])


def _read_when_answered(client: Any, key: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET until it is not a 503 (the shard may be found down for a moment after the cut);
    never a 500."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return 200, client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        except botocore.exceptions.ClientError as exc:
            status = int(exc.response["ResponseMetadata"]["HTTPStatusCode"])
        assert status in (404, 503), status
        if status == 404 or time.monotonic() > deadline:
            return status, b""
        time.sleep(0.1)
