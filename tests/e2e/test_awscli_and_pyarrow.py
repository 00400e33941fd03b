"""The aws cli and pyarrow's S3 filesystem, unmodified, against `shoal serve`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs

from tests.fixtures.postgres import unique
from tests.fixtures.serve import Served

AWS = str(Path(sys.executable).parent / "aws")


def aws(served: Served, *args: str) -> str:
    result = subprocess.run(
        [AWS, "--endpoint-url", served.endpoint, *args],
        capture_output=True,
        text=True,
        env={**os.environ, **served.env()},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_cp_sync_ls_rm(served: Served, tmp_path: Path) -> None:
    bucket = unique("cli")
    aws(served, "s3", "mb", f"s3://{bucket}")
    source = tmp_path / "source"
    for name, size in [
        ("a.txt", 10),
        ("dir/b.bin", 9 * 1024 * 1024),
        ("dir/sub/c", 0),
        ("sp ace/ü.txt", 3),
    ]:
        path = source / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    aws(served, "s3", "cp", str(source / "a.txt"), f"s3://{bucket}/single/a.txt")
    aws(served, "s3", "sync", str(source), f"s3://{bucket}/synced")
    listing = aws(served, "s3", "ls", "--recursive", f"s3://{bucket}")
    for key in [
        "single/a.txt",
        "synced/a.txt",
        "synced/dir/b.bin",
        "synced/dir/sub/c",
        "synced/sp ace/ü.txt",
    ]:
        assert key in listing
    back = tmp_path / "back"
    aws(served, "s3", "sync", f"s3://{bucket}/synced", str(back))
    assert tree(back) == tree(source)
    assert aws(served, "s3", "sync", str(source), f"s3://{bucket}/synced", "--dryrun") == ""
    aws(served, "s3", "rm", "--recursive", f"s3://{bucket}")
    assert aws(served, "s3", "ls", "--recursive", f"s3://{bucket}") == ""
    aws(served, "s3", "rb", f"s3://{bucket}")


def test_s3api_calls(served: Served, tmp_path: Path) -> None:
    bucket = unique("api")
    aws(served, "s3api", "create-bucket", "--bucket", bucket)
    body = tmp_path / "body"
    body.write_bytes(b"hello from s3api")
    aws(
        served,
        "s3api",
        "put-object",
        "--bucket",
        bucket,
        "--key",
        "k",
        "--body",
        str(body),
        "--metadata",
        "a=b",
    )
    head = json.loads(aws(served, "s3api", "head-object", "--bucket", bucket, "--key", "k"))
    assert head["ContentLength"] == 16 and head["Metadata"] == {"a": "b"}
    listed = json.loads(aws(served, "s3api", "list-objects-v2", "--bucket", bucket))
    assert [o["Key"] for o in listed["Contents"]] == ["k"]
    out = tmp_path / "out"
    aws(
        served,
        "s3api",
        "get-object",
        "--bucket",
        bucket,
        "--key",
        "k",
        "--range",
        "bytes=6-9",
        str(out),
    )
    assert out.read_bytes() == b"from"
    aws(served, "s3api", "delete-object", "--bucket", bucket, "--key", "k")
    aws(served, "s3api", "delete-bucket", "--bucket", bucket)


def test_pyarrow_writes_and_reads_parquet(served: Served) -> None:
    bucket = unique("arrow")
    served.client().create_bucket(Bucket=bucket)
    filesystem = fs.S3FileSystem(
        access_key=served.root.access_key_id,
        secret_key=served.root.secret_access_key,
        endpoint_override=f"127.0.0.1:{served.port}",
        scheme="http",
        region="us-east-1",
    )
    table = pa.table({"id": list(range(50_000)), "name": [f"row {i}" for i in range(50_000)]})
    pq.write_table(table, f"{bucket}/data/part-0.parquet", filesystem=filesystem)
    assert pq.read_table(f"{bucket}/data/part-0.parquet", filesystem=filesystem).equals(table)
    infos = filesystem.get_file_info(fs.FileSelector(f"{bucket}/data"))
    assert [i.path for i in infos] == [f"{bucket}/data/part-0.parquet"]
