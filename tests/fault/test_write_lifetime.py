"""A write that takes longer than `[s3] write_lifetime_seconds` is refused at its commit and
drops its blocks: `shoal pipeline orphans --delete` (whose leeway is at least that long) may
have reclaimed them meanwhile, and a row naming them would answer every GET with an error."""

from __future__ import annotations

import http.client
import os
import time
from pathlib import Path
from urllib.parse import urlsplit

from tests.fault.serving import block_versions, own_serve

LIFETIME_SECONDS = 2
MiB = 1024 * 1024


def slow_put(url: str, body: bytes, seconds: float) -> tuple[int, bytes]:
    """PUT `body` to a presigned URL in four pieces spread over `seconds`."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.netloc, timeout=30)
    try:
        connection.putrequest("PUT", f"{parts.path}?{parts.query}", skip_accept_encoding=True)
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders()
        piece = len(body) // 4
        for n in range(4):
            connection.send(body[n * piece : (n + 1) * piece if n < 3 else len(body)])
            time.sleep(seconds / 4)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_a_write_older_than_its_lifetime_is_refused_and_drops_its_blocks(tmp_path: Path) -> None:
    config = f"[s3]\nwrite_lifetime_seconds = {LIFETIME_SECONDS}\n"
    with own_serve(tmp_path / "serve", config) as served:
        client = served.client()
        client.create_bucket(Bucket="slow")
        body = os.urandom(MiB)  # in blocks on the nodes, not in its row
        client.put_object(Bucket="slow", Key="quick", Body=body)  # well within its lifetime
        kept = block_versions(served.data_dir)
        assert len(kept) == 1

        put = client.generate_presigned_url(
            "put_object", Params={"Bucket": "slow", "Key": "late"}, ExpiresIn=60
        )
        status, answer = slow_put(put, body, LIFETIME_SECONDS + 1.5)
        assert status == 400 and b"<Code>RequestTimeout</Code>" in answer, answer
        upload = client.create_multipart_upload(Bucket="slow", Key="parts")["UploadId"]
        part = client.generate_presigned_url(
            "upload_part",
            Params={"Bucket": "slow", "Key": "parts", "UploadId": upload, "PartNumber": 1},
            ExpiresIn=60,
        )
        status, answer = slow_put(part, body, LIFETIME_SECONDS + 1.5)
        assert status == 400 and b"<Code>RequestTimeout</Code>" in answer, answer

        assert client.list_objects_v2(Bucket="slow")["KeyCount"] == 1
        assert "Parts" not in client.list_parts(Bucket="slow", Key="parts", UploadId=upload)
        assert block_versions(served.data_dir) == kept  # the late writes' blocks are gone
        assert client.get_object(Bucket="slow", Key="quick")["Body"].read() == body
