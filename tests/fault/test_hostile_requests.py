"""Hostile S3 requests against a real `shoal serve`: each one gets S3's 4xx error, never a
500, a hang or a traceback in the gateway's log; and a fuzzer of request heads and XML
bodies that holds the gateway to that (docs/durability.md, "Hostile requests")."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import socket
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import quote
from xml.etree import ElementTree

import pytest
import uvloop
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.s3 import http
from tests.fixtures.postgres import unique
from tests.fixtures.serve import RawResponse, Served, access_lines, raw_request

MiB = 1024 * 1024


def code_of(response: RawResponse) -> str:
    """The <Code> of an S3 error body (which must be well-formed XML)."""
    root = ElementTree.fromstring(response.body)
    assert root.tag == "Error", response.body
    code = root.findtext("Code")
    assert code and root.findtext("Message") and root.findtext("RequestId"), response.body
    return code


def md5_header(body: bytes) -> dict[str, str]:
    return {"Content-MD5": base64.b64encode(hashlib.md5(body).digest()).decode()}


def delete_body(*keys: str) -> bytes:
    objects = "".join(f"<Object><Key>{key}</Key></Object>" for key in keys)
    return f"<Delete>{objects}</Delete>".encode()


def logged_failure(served: Served, response: RawResponse) -> bool:
    """Whether the gateway logged the request as failed (an unexpected error: traceback)."""
    request_id = response.headers.get("x-amz-request-id", "?")
    return f"request {request_id} failed" in served.log.read_text(errors="replace")


@pytest.fixture
def bucket(served: Served) -> str:
    name = unique("hostile")
    served.client().create_bucket(Bucket=name)
    return name


# -- raw sockets, for broken framing ---------------------------------------------------------


class _PayloadAsGiven(S3SigV4Auth):
    """botocore's S3 signer, with x-amz-content-sha256 as given (it would hash the body)."""

    def __init__(self, credentials: Credentials, payload: str) -> None:
        super().__init__(credentials, "s3", "us-east-1")
        self._payload = payload

    def payload(self, request: AWSRequest) -> str:
        return self._payload


def signed_head(
    served: Served,
    method: str,
    path: str,
    headers: dict[str, str],
    payload: str = "UNSIGNED-PAYLOAD",
) -> bytes:
    """A request head signed (payload: its x-amz-content-sha256), as bytes for a raw socket."""
    keys = served.root
    host = f"127.0.0.1:{served.port}"
    request = AWSRequest(method=method, url=f"http://{host}{path}", data=b"", headers=headers)
    signer = _PayloadAsGiven(Credentials(keys.access_key_id, keys.secret_access_key), payload)
    signer.add_auth(request)
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{k}: {v}" for k, v in request.headers.items() if k.lower() != "host"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_answer(sock: socket.socket) -> RawResponse:
    """One response read from a raw socket: status, headers and the body its length says."""
    received = b""
    while b"\r\n\r\n" not in received or received.startswith(b"HTTP/1.1 100 "):
        if received.startswith(b"HTTP/1.1 100 ") and b"\r\n\r\n" in received:
            received = received.partition(b"\r\n\r\n")[2]  # Expect: 100-continue's
            continue
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before an answer: {received!r}"
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {n.strip().lower(): v.strip() for n, _, v in (line.partition(":") for line in lines)}
    while len(body) < int(headers.get("content-length", "0")):
        chunk = sock.recv(65536)
        assert chunk, "the connection closed inside the answer's body"
        body += chunk
    return RawResponse(int(status_line.split()[1]), headers, body)


def send_short_body_then_half_close(
    served: Served, method: str, path: str, declared: int, sent: bytes
) -> RawResponse:
    headers = {"Content-Length": str(declared)}
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as sock:
        sock.sendall(signed_head(served, method, path, headers) + sent)
        sock.shutdown(socket.SHUT_WR)
        return read_answer(sock)


def send_aws_chunked(
    served: Served, method: str, path: str, headers: dict[str, str], body: bytes, payload: str
) -> RawResponse:
    """A streaming (aws-chunked) upload as framed by the caller, framing errors and all."""
    headers = headers | {"Content-Length": str(len(body)), "Content-Encoding": "aws-chunked"}
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as sock:
        sock.sendall(signed_head(served, method, path, headers, payload) + body)
        return read_answer(sock)


# -- each hostile input named ----------------------------------------------------------------


def test_xml_bodies_over_their_limit_are_max_message_length_exceeded(
    served: Served, bucket: str
) -> None:
    padding = b"<!--" + b"x" * (2 * MiB) + b"-->"
    body = delete_body("k") + padding
    response = raw_request(served, "POST", f"/{bucket}?delete", body, headers=md5_header(body))
    assert (response.status, code_of(response)) == (400, "MaxMessageLengthExceeded")
    lifecycle = b"<LifecycleConfiguration>" + padding + b"</LifecycleConfiguration>"
    response = raw_request(served, "PUT", f"/{bucket}?lifecycle", lifecycle)
    assert (response.status, code_of(response)) == (400, "MaxMessageLengthExceeded")
    upload = served.client().create_multipart_upload(Bucket=bucket, Key="m")["UploadId"]
    parts = "".join(
        f'<Part><ETag>"{n:032x}"</ETag><PartNumber>{n}</PartNumber>'
        f"<ChecksumCRC32>AAAAAA==</ChecksumCRC32></Part>"
        for n in range(1, 10_001)
    )
    complete = f"<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>".encode()
    assert MiB < len(complete) < 4 * MiB  # the most parts S3 allows, with checksums
    response = raw_request(served, "POST", f"/{bucket}/m?uploadId={upload}", complete)
    assert (response.status, code_of(response)) == (400, "InvalidPart")  # read, not refused
    response = raw_request(served, "POST", f"/{bucket}/m?uploadId={upload}", complete * 4)
    assert (response.status, code_of(response)) == (400, "MaxMessageLengthExceeded")
    assert not logged_failure(served, response)


def test_a_range_of_ten_thousand_digits_is_s3s_answer(served: Served, bucket: str) -> None:
    s3 = served.client()
    s3.put_object(Bucket=bucket, Key="k", Body=b"0123456789")
    huge = "9" * 10_000
    rest = raw_request(served, "GET", f"/{bucket}/k", headers={"Range": f"bytes=2-{huge}"})
    assert (rest.status, rest.body, rest.headers["Content-Range"]) == (
        206,
        b"23456789",
        "bytes 2-9/10",
    )
    past = raw_request(served, "GET", f"/{bucket}/k", headers={"Range": f"bytes={huge}-"})
    assert (past.status, code_of(past)) == (416, "InvalidRange")
    suffix = raw_request(served, "GET", f"/{bucket}/k", headers={"Range": f"bytes=-{huge}"})
    assert (suffix.status, suffix.body) == (206, b"0123456789")
    upload = s3.create_multipart_upload(Bucket=bucket, Key="copy")["UploadId"]
    copy = raw_request(
        served,
        "PUT",
        f"/{bucket}/copy?partNumber=1&uploadId={upload}",
        headers={"x-amz-copy-source": f"{bucket}/k", "x-amz-copy-source-range": f"bytes=0-{huge}"},
    )
    assert (copy.status, code_of(copy)) == (400, "InvalidArgument")


def test_a_body_shorter_than_its_length_then_half_closed_is_incomplete_body(
    served: Served, bucket: str
) -> None:
    for method, path, declared, sent in [
        ("PUT", f"/{bucket}/blocks", 300_000, b"x" * 1000),  # stored in blocks on the nodes
        ("PUT", f"/{bucket}/small", 1000, b"x" * 10),  # kept in its metadata row
        ("POST", f"/{bucket}?delete", 500, delete_body("k")),
    ]:
        response = send_short_body_then_half_close(served, method, path, declared, sent)
        assert (response.status, code_of(response)) == (400, "IncompleteBody"), path
        # The request's access line is its last: a failure would be logged before it.
        assert access_lines(served, response.headers["x-amz-request-id"]), path
        assert not logged_failure(served, response)
    assert "Contents" not in served.client().list_objects_v2(Bucket=bucket)


def test_an_aws_chunked_body_needs_its_decoded_length(served: Served, bucket: str) -> None:
    body = b"5\r\nhello\r\n0\r\n\r\n"
    payload = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
    untold = send_aws_chunked(served, "PUT", f"/{bucket}/chunked", {}, body, payload)
    assert (untold.status, code_of(untold)) == (411, "MissingContentLength")
    told = {"x-amz-decoded-content-length": "5"}
    stored = send_aws_chunked(served, "PUT", f"/{bucket}/chunked", told, body, payload)
    assert stored.status == 200, stored.body
    assert served.client().get_object(Bucket=bucket, Key="chunked")["Body"].read() == b"hello"


def test_delete_objects_checks_its_digest_before_deleting(served: Served, bucket: str) -> None:
    s3 = served.client()
    s3.put_object(Bucket=bucket, Key="kept", Body=b"data")
    body = delete_body("kept")
    wrong_md5 = md5_header(delete_body("other"))
    response = raw_request(served, "POST", f"/{bucket}?delete", body, headers=wrong_md5)
    assert (response.status, code_of(response)) == (400, "BadDigest")
    wrong_crc = {"x-amz-checksum-crc32": base64.b64encode(b"\0\0\0\0").decode()}
    response = raw_request(served, "POST", f"/{bucket}?delete", body, headers=wrong_crc)
    assert (response.status, code_of(response)) == (400, "BadDigest")
    response = raw_request(served, "POST", f"/{bucket}?delete", body)
    assert (response.status, code_of(response)) == (400, "InvalidRequest")  # no digest at all
    half_formed = b"<Delete><Object><Key>kept</Key></Object><Object></Object></Delete>"
    response = raw_request(
        served, "POST", f"/{bucket}?delete", half_formed, headers=md5_header(half_formed)
    )
    assert (response.status, code_of(response)) == (400, "MalformedXML")  # before any delete
    assert s3.get_object(Bucket=bucket, Key="kept")["Body"].read() == b"data"
    right_crc = {
        "x-amz-checksum-crc32": base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()
    }
    response = raw_request(served, "POST", f"/{bucket}?delete", body, headers=right_crc)
    assert response.status == 200 and b"<Deleted><Key>kept</Key>" in response.body
    s3.put_object(Bucket=bucket, Key="kept", Body=b"data")
    deleted = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "kept"}]})
    assert [d["Key"] for d in deleted["Deleted"]] == ["kept"]  # boto3 sends its digest


def test_copying_from_another_accounts_bucket_is_access_denied(served: Served, bucket: str) -> None:
    theirs = served.client(served.other)
    their_bucket = unique("theirs")
    theirs.create_bucket(Bucket=their_bucket)
    theirs.put_object(Bucket=their_bucket, Key="secret", Body=b"theirs")
    source = {"x-amz-copy-source": f"{their_bucket}/secret"}
    copy = raw_request(served, "PUT", f"/{bucket}/stolen", headers=source)
    assert (copy.status, code_of(copy)) == (403, "AccessDenied")
    upload = served.client().create_multipart_upload(Bucket=bucket, Key="stolen")["UploadId"]
    part = raw_request(
        served, "PUT", f"/{bucket}/stolen?partNumber=1&uploadId={upload}", headers=source
    )
    assert (part.status, code_of(part)) == (403, "AccessDenied")
    missing = {"x-amz-copy-source": f"{unique('nobody')}/k"}
    copy = raw_request(served, "PUT", f"/{bucket}/stolen", headers=missing)
    assert (copy.status, code_of(copy)) == (404, "NoSuchBucket")  # a name nobody holds


def lifecycle_xml(*rules: str) -> bytes:
    return f"<LifecycleConfiguration>{''.join(rules)}</LifecycleConfiguration>".encode()


def rule_xml(inner: str, filter_: str = "<Filter><Prefix>logs/</Prefix></Filter>") -> str:
    return f"<Rule><ID>r</ID>{filter_}<Status>Enabled</Status>{inner}</Rule>"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (
            lifecycle_xml(rule_xml("<Expiration><Days>3000000</Days></Expiration>")),
            400,
            "InvalidArgument",
        ),
        (
            lifecycle_xml(rule_xml("<Expiration><Days>0</Days></Expiration>")),
            400,
            "InvalidArgument",
        ),
        (
            lifecycle_xml(rule_xml("<Expiration><Days>1.5</Days></Expiration>")),
            400,
            "InvalidArgument",
        ),
        (
            lifecycle_xml(rule_xml("<Expiration><Days>9" + "9" * 5000 + "</Days></Expiration>")),
            400,
            "InvalidArgument",
        ),
        (
            lifecycle_xml(rule_xml("<Expiration><Date>2030-01-01T10:00:00Z</Date></Expiration>")),
            400,
            "InvalidArgument",
        ),
        (
            lifecycle_xml(
                rule_xml("<Expiration><Days>1</Days><Date>2030-01-01T00:00:00Z</Date></Expiration>")
            ),
            400,
            "MalformedXML",
        ),
        (
            lifecycle_xml(
                rule_xml(
                    "<AbortIncompleteMultipartUpload><DaysAfterInitiation>-1</DaysAfterInitiation>"
                    "</AbortIncompleteMultipartUpload>"
                )
            ),
            400,
            "InvalidArgument",
        ),
        (
            lifecycle_xml(
                f"<Rule><ID>{'i' * 256}</ID><Prefix></Prefix><Status>Enabled</Status>"
                "<Expiration><Days>1</Days></Expiration></Rule>"
            ),
            400,
            "InvalidArgument",
        ),
        (
            lifecycle_xml(
                rule_xml(
                    "<Expiration><Days>1</Days></Expiration>",
                    "<Filter><Prefix>a</Prefix></Filter><Prefix>b</Prefix>",
                )
            ),
            400,
            "MalformedXML",
        ),
        (
            lifecycle_xml(
                rule_xml(
                    "<Expiration><Days>1</Days></Expiration>",
                    "<Filter><ObjectSizeGreaterThan>5</ObjectSizeGreaterThan></Filter>",
                )
            ),
            501,
            "NotImplemented",
        ),
        (
            lifecycle_xml(*[rule_xml("<Expiration><Days>1</Days></Expiration>")] * 1001),
            400,
            "MalformedXML",
        ),
        (  # S3: InvalidRequest, "At least one action needs to be specified in a rule"
            lifecycle_xml(rule_xml("")),
            400,
            "InvalidRequest",
        ),
        (
            lifecycle_xml(
                rule_xml(
                    "<Expiration><Days>1</Days>"
                    "<ExpiredObjectDeleteMarker>true</ExpiredObjectDeleteMarker></Expiration>"
                )
            ),
            400,
            "MalformedXML",
        ),
        (
            lifecycle_xml(
                rule_xml(
                    "<Expiration><Days>1</Days></Expiration>",
                    "<Filter><And><Tag><Key>k</Key><Value>1</Value></Tag>"
                    "<Tag><Key>k</Key><Value>2</Value></Tag></And></Filter>",
                )
            ),
            400,
            "InvalidRequest",
        ),
    ],
)
def test_lifecycle_rules_are_validated_as_s3_does(
    served: Served, bucket: str, body: bytes, status: int, code: str
) -> None:
    response = raw_request(served, "PUT", f"/{bucket}?lifecycle", body, headers=md5_header(body))
    assert (response.status, code_of(response)) == (status, code)


def test_a_request_with_too_many_header_lines_is_refused(served: Served) -> None:
    headers = {f"x-amz-meta-h{n}": "v" for n in range(300)}
    response = raw_request(served, "GET", "/", headers=headers)
    assert response.status == 431


T = TypeVar("T")


def against_bare_server(client: Callable[[int], Awaitable[T]], head_seconds: float) -> T:
    """What `client` makes of shoal/s3/http.py alone on a loopback port (its argument),
    answering every request "ok", with this head deadline."""

    async def answer(request: http.Request) -> http.Response:
        return http.Response(body=b"ok")

    async def main() -> T:
        sock = socket.create_server(("127.0.0.1", 0))
        server = await http.serve(answer, sock, head_seconds=head_seconds)
        try:
            return await asyncio.wait_for(client(sock.getsockname()[1]), 30)
        finally:
            await server.close(grace=1)

    return uvloop.run(main())


def test_a_request_head_that_dribbles_in_is_cut_off() -> None:
    """A head must arrive whole within the head deadline (here 0.5 s; [s3]
    request_head_seconds, default 20 s), however steadily its lines come."""

    async def dribble(port: int) -> tuple[bytes, float]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        started = time.monotonic()
        answer = asyncio.ensure_future(reader.read(65536))
        writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for n in range(100):  # a line every 0.1 s: never idle, never done
            if answer.done():
                break
            writer.write(f"x-slow-{n}: v\r\n".encode())
            await asyncio.sleep(0.1)
        answered = await answer
        writer.close()
        return answered, time.monotonic() - started

    answered, seconds = against_bare_server(dribble, head_seconds=0.5)
    assert answered.startswith(b"HTTP/1.1 400 ") and b"<Code>RequestTimeout</Code>" in answered
    assert seconds < 5


def test_a_busy_connection_stays_open_and_an_idle_one_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each request moves the connection's idle and head deadlines: requests that come for
    longer than both deadlines are all answered on one connection, which is closed once it
    stays idle past the idle deadline (here 1 s; KEEPALIVE_SECONDS, 75 s). The deadlines are
    several gaps long, so that a loaded machine's pause between two requests is not idleness."""
    monkeypatch.setattr(http, "KEEPALIVE_SECONDS", 1.0)

    async def busy_then_idle(port: int) -> tuple[list[bytes], bytes, float]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answers = []
        for n in range(25):  # 2.4 s of requests, 0.1 s apart
            if n:
                await asyncio.sleep(0.1)
            writer.write(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answers.append(await reader.readuntil(b"\r\n\r\nok"))
        idle_since = time.monotonic()
        rest = await reader.read()  # until the server closes the connection
        writer.close()
        return answers, rest, time.monotonic() - idle_since

    answers, rest, idle_seconds = against_bare_server(busy_then_idle, head_seconds=0.8)
    assert all(a.startswith(b"HTTP/1.1 200 ") for a in answers), answers
    assert rest == b""
    assert 0.8 < idle_seconds < 5


# -- the fuzzer ----------------------------------------------------------------------------

SAFE_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12)
NUMBERS = st.one_of(
    st.integers(-5, 12_000).map(str),
    st.sampled_from(["", "0", "-0", "1e3", "1_0", " 7", "0x10", "9" * 30, "9" * 5000]),
    SAFE_TEXT,
)
SUB_RESOURCES = {
    "uploads": st.just(""),
    "delete": st.just(""),
    "lifecycle": st.just(""),
    "cors": st.just(""),
    "partNumber": NUMBERS,
    "uploadId": st.one_of(st.just("UPLOAD"), st.just("UPLOAD"), st.uuids().map(str), SAFE_TEXT),
    "list-type": st.sampled_from(["1", "2", "3", ""]),
    "max-keys": NUMBERS,
    "max-parts": NUMBERS,
    "max-uploads": NUMBERS,
    "part-number-marker": NUMBERS,
    "prefix": SAFE_TEXT,
    "delimiter": SAFE_TEXT,
    "marker": SAFE_TEXT,
    "start-after": SAFE_TEXT,
    "continuation-token": SAFE_TEXT,
    "encoding-type": st.sampled_from(["url", "xml", ""]),
    "fetch-owner": st.sampled_from(["true", "false", "x"]),
    "versionId": st.sampled_from(["null", "3", ""]),
    "versions": st.just(""),
    "location": st.just(""),
    "versioning": st.just(""),
    "acl": st.just(""),
    "response-content-type": SAFE_TEXT,
    "key-marker": SAFE_TEXT,
    "upload-id-marker": SAFE_TEXT,
}
DIGITS = st.one_of(st.integers(0, 40).map(str), st.sampled_from(["", "9" * 25, "9" * 10_000]))
HEADERS = {
    "Range": st.one_of(
        st.builds(lambda a, b: f"bytes={a}-{b}", DIGITS, DIGITS),
        st.sampled_from(["bytes=0-1,3-4", "bytes=", "items=0-1", "bytes=--1"]),
        SAFE_TEXT,
    ),
    "Content-MD5": st.one_of(
        st.binary(min_size=16, max_size=16).map(lambda b: base64.b64encode(b).decode()),
        SAFE_TEXT,
    ),
    "If-Match": st.sampled_from(['"abc"', "*", "", '"d41d8cd98f00b204e9800998ecf8427e"']),
    "If-None-Match": st.sampled_from(['"abc"', "*", ""]),
    "If-Modified-Since": st.sampled_from(["Wed, 21 Oct 2015 07:28:00 GMT", "yesterday", ""]),
    "If-Unmodified-Since": st.sampled_from(["Wed, 21 Oct 2015 07:28:00 GMT", "0"]),
    "x-amz-copy-source": st.one_of(
        st.sampled_from(
            [
                "BUCKET/a",
                "/BUCKET/b",
                "BUCKET/a?versionId=x",
                "THEIRS/a",
                "nobody-here/a",
                "/",
                "%ff/%00",
            ]
        ),
        SAFE_TEXT,
    ),
    "x-amz-copy-source-range": st.builds(lambda a, b: f"bytes={a}-{b}", DIGITS, DIGITS),
    "x-amz-copy-source-if-match": st.sampled_from(['"abc"', "*"]),
    "x-amz-metadata-directive": st.sampled_from(["COPY", "REPLACE", "MOVE"]),
    "x-amz-checksum-crc32": st.one_of(st.sampled_from(["AAAAAA==", "x"]), SAFE_TEXT),
    "x-amz-checksum-sha256": st.sampled_from(
        ["AAAA", "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="]
    ),
    "x-amz-checksum-algorithm": st.sampled_from(["CRC32", "SHA256", "MD5", "crc64nvme", ""]),
    "x-amz-sdk-checksum-algorithm": st.sampled_from(["CRC32", "BOGUS"]),
    "x-amz-checksum-mode": st.sampled_from(["ENABLED", "nope"]),
    "x-amz-decoded-content-length": NUMBERS,
    "x-amz-meta-a": SAFE_TEXT,
    "x-amz-meta-big": st.just("m" * 3000),
    "Content-Type": st.sampled_from(["application/xml", "text/plain", ""]),
    "Content-Encoding": st.sampled_from(["aws-chunked", "gzip", ""]),
    "x-amz-trailer": st.sampled_from(["x-amz-checksum-crc32", "bogus"]),
    "Expect": st.just("100-continue"),
    "Origin": st.one_of(st.sampled_from(["http://127.0.0.1:8123", "null", ""]), SAFE_TEXT),
    "Access-Control-Request-Method": st.sampled_from(["PUT", "GET", "TRACE", "put", ""]),
    "Access-Control-Request-Headers": st.one_of(
        st.sampled_from(["content-type, x-amz-meta-a", ",,", ""]), SAFE_TEXT
    ),
}
XML_TEXT = st.one_of(
    SAFE_TEXT, NUMBERS, st.sampled_from(["2030-01-01T00:00:00Z", "2030-01-01", '"etag"'])
)


def xml_tree(tag: str, children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.lists(children, max_size=4).map(lambda parts: f"<{tag}>{''.join(parts)}</{tag}>")


def leaf(tag: str) -> st.SearchStrategy[str]:
    return XML_TEXT.map(lambda text: f"<{tag}>{escape_xml(text)}</{tag}>")


def escape_xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


DELETE_XML = xml_tree(
    "Delete",
    st.one_of(leaf("Quiet"), xml_tree("Object", st.one_of(leaf("Key"), leaf("VersionId")))),
)
COMPLETE_XML = xml_tree(
    "CompleteMultipartUpload",
    xml_tree("Part", st.one_of(leaf("PartNumber"), leaf("ETag"), leaf("ChecksumCRC32"))),
)
FILTER_XML = xml_tree(
    "Filter",
    st.one_of(
        leaf("Prefix"),
        leaf("ObjectSizeGreaterThan"),
        xml_tree("Tag", st.one_of(leaf("Key"), leaf("Value"))),
        xml_tree("And", st.one_of(leaf("Prefix"), leaf("ObjectSizeLessThan"))),
    ),
)
RULE_XML = xml_tree(
    "Rule",
    st.one_of(
        leaf("ID"),
        st.sampled_from(["<Status>Enabled</Status>", "<Status>Disabled</Status>"]),
        leaf("Status"),
        leaf("Prefix"),
        FILTER_XML,
        xml_tree(
            "Expiration",
            st.one_of(leaf("Days"), leaf("Date"), leaf("ExpiredObjectDeleteMarker")),
        ),
        xml_tree("AbortIncompleteMultipartUpload", leaf("DaysAfterInitiation")),
        xml_tree("Transition", leaf("Days")),
        xml_tree("NoncurrentVersionExpiration", leaf("NoncurrentDays")),
    ),
)
LIFECYCLE_XML = xml_tree("LifecycleConfiguration", RULE_XML)
CORS_RULE_XML = xml_tree(
    "CORSRule",
    st.one_of(
        leaf("ID"),
        st.sampled_from(["<AllowedOrigin>*</AllowedOrigin>", "<AllowedMethod>GET</AllowedMethod>"]),
        leaf("AllowedOrigin"),
        leaf("AllowedMethod"),
        leaf("AllowedHeader"),
        leaf("ExposeHeader"),
        leaf("MaxAgeSeconds"),
    ),
)
CORS_XML = xml_tree("CORSConfiguration", CORS_RULE_XML)


@st.composite
def mutated(draw: st.DrawFn, documents: st.SearchStrategy[str]) -> bytes:
    """An XML body, sometimes cut, spliced or given a declaration, namespace or entity."""
    body = draw(documents).encode()
    how = draw(st.sampled_from(["as is", "as is", "cut", "splice", "namespace", "entity"]))
    if how == "cut" and body:
        body = body[: draw(st.integers(0, len(body) - 1))]
    elif how == "splice":
        at = draw(st.integers(0, len(body)))
        body = body[:at] + draw(st.binary(max_size=8)) + body[at:]
    elif how == "namespace":
        body = body.replace(b">", b' xmlns="http://s3.amazonaws.com/doc/2006-03-01/">', 1)
    elif how == "entity":
        body = b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY e "x">]>' + body.replace(
            b"</", b"&e;</", 1
        )
    return body


@st.composite
def aws_chunked_bodies(draw: st.DrawFn) -> tuple[str, dict[str, str], bytes]:
    """An aws-chunked body (x-amz-content-sha256, headers, bytes): chunks of random data, a
    trailing checksum right or wrong, chunk signatures that cannot be right, then perhaps
    mutated (cut, a byte spliced in, a chunk size of absurd hex)."""
    data = draw(st.binary(max_size=300))
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=3)))
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    signed = draw(st.booleans())
    extension = ";chunk-signature=" + "0" * 64 if signed else ""
    body = b"".join(f"{len(c):x}{extension}\r\n".encode() + c + b"\r\n" for c in chunks if c)
    body += f"0{extension}\r\n".encode()
    headers = {"x-amz-decoded-content-length": draw(st.one_of(st.just(str(len(data))), NUMBERS))}
    crc = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    trailer = draw(
        st.sampled_from(
            ["", f"x-amz-checksum-crc32:{crc}", "x-amz-checksum-crc32:AAAAAA==", "bogus"]
        )
    )
    if trailer and not signed:
        headers["x-amz-trailer"] = "x-amz-checksum-crc32"
        body += trailer.encode() + b"\r\n"
    body += b"\r\n"
    how = draw(st.sampled_from(["as is", "as is", "cut", "splice", "huge size"]))
    if how == "cut" and body:
        body = body[: draw(st.integers(0, len(body) - 1))]
    elif how == "splice":
        at = draw(st.integers(0, len(body)))
        body = body[:at] + draw(st.binary(min_size=1, max_size=4)) + body[at:]
    elif how == "huge size":
        body = b"f" * draw(st.sampled_from([17, 40, 5000])) + body
    payload = (
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD" if signed else "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
    )
    return payload, headers, body


BODIES = st.one_of(
    st.just(b""),
    st.binary(max_size=64),
    mutated(DELETE_XML),
    mutated(COMPLETE_XML),
    mutated(LIFECYCLE_XML),
    mutated(CORS_XML),
)


# Sub-resources that make an operation together, so most requests reach a handler.
OPERATIONS = [
    [],
    ["delete"],
    ["uploads"],
    ["uploadId"],
    ["uploadId", "partNumber"],
    ["lifecycle"],
    ["cors"],
    ["list-type", "max-keys", "prefix"],
    ["list-type", "continuation-token", "delimiter"],
    ["uploadId", "max-parts", "part-number-marker"],
    ["uploads", "max-uploads", "key-marker"],
    ["versions", "max-keys"],
    ["versionId"],
]
METHODS = ["GET", "PUT", "POST", "DELETE", "HEAD"]


@st.composite
def hostile_requests(draw: st.DrawFn, names: dict[str, str]) -> dict[str, Any]:
    method = draw(st.sampled_from(METHODS * 4 + ["PATCH", "OPTIONS"]))
    where = draw(st.sampled_from([names["BUCKET"]] * 8 + [names["THEIRS"], "nobody-here", ""]))
    key = draw(
        st.one_of(
            st.sampled_from(["a", "a", "b", "dir/c", "", "a" * 1100]),
            st.text(st.characters(min_codepoint=0x20, max_codepoint=0x2FF), max_size=8),
        )
    )
    path = "/" + quote(where, safe="") + ("/" + quote(key, safe="/") if where and key else "")
    chosen = draw(
        st.one_of(
            st.sampled_from(OPERATIONS),
            st.lists(st.sampled_from(sorted(SUB_RESOURCES)), max_size=3, unique=True),
        )
    )
    if method == "POST" and draw(st.booleans()):
        chosen = draw(st.sampled_from([["delete"], ["uploads"], ["uploadId"]]))
    query = [(name, placed(draw(SUB_RESOURCES[name]), names)) for name in chosen]
    if query:
        path += "?" + "&".join(
            quote(n, safe="") + ("=" + quote(v, safe="") if v else "") for n, v in query
        )
    header_names = draw(st.lists(st.sampled_from(sorted(HEADERS)), max_size=4, unique=True))
    headers = {name: placed(draw(HEADERS[name]), names) for name in header_names}
    body = draw(BODIES)
    if draw(st.booleans()) and "Content-MD5" not in headers:
        headers |= md5_header(body)  # so that DeleteObjects goes on to its XML
    framing = "plain"
    if method in ("PUT", "POST"):
        framing = draw(st.sampled_from(["plain"] * 7 + ["cut short", "aws-chunked"] * 2))
    streamed = draw(aws_chunked_bodies()) if framing == "aws-chunked" else None
    return {
        "method": method,
        "path": path,
        "headers": headers,
        "body": body,
        "framing": framing,
        "streamed": streamed,
    }


def placed(value: str, names: dict[str, str]) -> str:
    """A drawn value with BUCKET, THEIRS and UPLOAD replaced by the fuzz bucket's names."""
    for placeholder, name in names.items():
        value = value.replace(placeholder, name)
    return value


@pytest.fixture(scope="module")
def fuzz_names(served: Served) -> dict[str, str]:
    """A bucket with objects and an open upload (part 1 uploaded), and another account's."""
    mine, theirs = unique("fuzz"), unique("fuzztheirs")
    s3 = served.client()
    s3.create_bucket(Bucket=mine)
    for key in ("a", "b", "dir/c"):
        s3.put_object(Bucket=mine, Key=key, Body=key.encode() * 100)
    cors = {"AllowedOrigins": ["http://127.0.0.1:*"], "AllowedMethods": ["GET", "PUT"]}
    s3.put_bucket_cors(Bucket=mine, CORSConfiguration={"CORSRules": [cors]})
    upload = s3.create_multipart_upload(Bucket=mine, Key="a")["UploadId"]
    s3.upload_part(Bucket=mine, Key="a", UploadId=upload, PartNumber=1, Body=b"part")
    other = served.client(served.other)
    other.create_bucket(Bucket=theirs)
    other.put_object(Bucket=theirs, Key="a", Body=b"theirs")
    return {"BUCKET": mine, "THEIRS": theirs, "UPLOAD": upload}


FUZZ_EXAMPLES = 1500


@pytest.mark.slow
def test_fuzzed_requests_never_get_a_500(served: Served, fuzz_names: dict[str, str]) -> None:
    """Random signed requests: methods, paths, sub-resources, headers, XML bodies (mutated),
    and bodies cut short; every answer is below 500 and every error is S3's XML."""
    log_start = served.log.stat().st_size

    @settings(
        max_examples=FUZZ_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(request=hostile_requests(fuzz_names))
    def check(request: dict[str, Any]) -> None:
        if request["framing"] == "cut short":
            declared = len(request["body"]) + 10
            response = send_short_body_then_half_close(
                served, request["method"], request["path"], declared, request["body"]
            )
        elif request["framing"] == "aws-chunked":
            payload, headers, body = request["streamed"]
            response = send_aws_chunked(
                served,
                request["method"],
                request["path"],
                request["headers"] | headers,
                body,
                payload,
            )
        else:
            response = raw_request(
                served,
                request["method"],
                request["path"],
                request["body"],
                headers=request["headers"],
            )
        # 501 is S3's NotImplemented (an ACL, say): an answer, not a failure.
        assert response.status < 500 or response.status == 501, (
            response.status,
            response.body[:300],
        )
        if response.status >= 400 and request["method"] != "HEAD":
            code = code_of(response)  # a well-formed S3 error
            assert response.status != 501 or code == "NotImplemented"

    check()
    time.sleep(0.5)  # the gateway's log lines reach the file
    logged = served.log.read_bytes()[log_start:].decode(errors="replace")
    failures = failures_in_requests(logged)
    assert failures == [], "\n".join(failures)[-3000:]


# Loggers of serve's own loops, which share its log file with the gateway: what they say
# meanwhile (a disk probe slower than its bound on a loaded machine, say) is not about the
# requests sent.
BACKGROUND_LOGGERS = ("shoal.storage", "shoal.replication", "shoal.gc", "shoal.pipeline")


def failures_in_requests(logged: str) -> list[str]:
    """The log records, tracebacks included, that say an error or a traceback, but for those
    of serve's background loops."""
    records = re.split(r"\n(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ )", logged)
    return [
        record
        for record in records
        if ("Traceback" in record or " ERROR " in record or " CRITICAL " in record)
        and logger_of(record) not in BACKGROUND_LOGGERS
    ]


def logger_of(record: str) -> str:
    """The logger's name in a record of the text format (date, time, level, name, message)."""
    fields = record.split(" ", 4)
    return fields[3] if len(fields) > 3 else ""
