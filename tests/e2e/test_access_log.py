"""One access line per request, with its operation (also one Shoal does not implement), its
status and the bytes that really came in and went out: also for requests refused before
routing or by authentication, bodies sent chunked, and clients that hang up mid-body."""

from __future__ import annotations

import http.client
import socket
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.fixtures.serve import Served, access_lines, raw_request, signed_headers


def only_line(served: Served, request_id: str) -> str:
    lines = access_lines(served, request_id)
    assert len(lines) == 1, lines
    return lines[0]


def test_a_not_implemented_operation_is_logged_by_its_name(
    served: Served, s3: Any, bucket: str
) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    with pytest.raises(ClientError) as refused:
        s3.put_object_retention(Bucket=bucket, Key="k", Retention={"Mode": "GOVERNANCE"})
    request_id = refused.value.response["ResponseMetadata"]["RequestId"]
    line = only_line(served, request_id)
    assert " op=PutObjectRetention status=501 " in line and "account=-" in line
    response = raw_request(served, "GET", f"/{bucket}?policy")
    line = only_line(served, response.headers["x-amz-request-id"])
    assert " op=GetBucketPolicy status=501 " in line


def test_an_authentication_failure_is_logged_with_its_operation(
    served: Served, bucket: str
) -> None:
    response = raw_request(served, "PUT", f"/{bucket}/k", b"12345", sign=False)
    line = only_line(served, response.headers["x-amz-request-id"])
    assert " op=PutObject status=403 " in line and " bytes_in=5 " in line
    assert " account=anonymous " in line


def test_a_chunked_body_is_counted(served: Served, bucket: str) -> None:
    path = f"/{bucket}/chunked"
    # The object's length in S3's header for bodies sent without Content-Length.
    declared = {"Transfer-Encoding": "chunked", "x-amz-decoded-content-length": "3345"}
    headers = signed_headers(served, "PUT", path, declared)
    connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    try:
        connection.request(
            "PUT", path, body=iter([b"a" * 1000, b"b" * 2345]), headers=headers, encode_chunked=True
        )
        response = connection.getresponse()
        response.read()
    finally:
        connection.close()
    assert response.status == 200
    line = only_line(served, response.getheader("x-amz-request-id"))
    assert " op=PutObject status=200 bytes_in=3345 bytes_out=0 " in line


def test_a_client_that_hangs_up_mid_body_is_logged(served: Served, bucket: str) -> None:
    path = f"/{bucket}/cut"
    headers = signed_headers(served, "PUT", path, {"Content-Length": "1000000"})
    head = f"PUT {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    served.client().put_object(Bucket=bucket, Key="k", Body=b"x")
    get = raw_get(served, f"/{bucket}/k")
    log_before = served.log.stat().st_size
    # Hung up at once; once the gateway reads the body; and behind a GET it had not
    # answered yet (pipelined), so that the PUT never reaches its handler.
    for before, pause in ((b"", 0.0), (b"", 0.5), (get, 0.0)):
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
            sock.sendall(before + head.encode() + b"\r\n")
            time.sleep(pause)
            sock.sendall(b"z" * 1234)
    deadline = time.monotonic() + 5
    while True:
        with open(served.log, "rb") as log:
            log.seek(log_before)
            new = log.read().decode()
        lines = [line for line in new.splitlines() if "bytes_in=1234 " in line]
        if len(lines) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(lines) == 3, new
    assert all(" op=PutObject " in line for line in lines)
    assert new.count(" op=GetObject status=200 ") == 1


def raw_get(served: Served, path: str) -> bytes:
    """A signed GET, as the bytes sent on the wire."""
    headers = signed_headers(served, "GET", path)
    head = f"GET {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode() + b"\r\n"
