"""Authentication failures, malformed requests, addressing styles and protocol details."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote

import pytest
from botocore.auth import S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tests.fixtures.postgres import unique
from tests.fixtures.serve import Keys, Served, mock_clock, raw_request, signed_headers


@pytest.fixture(scope="module")
def bucket(served: Served) -> str:
    name = unique("err")
    client = served.client()
    client.create_bucket(Bucket=name)
    client.put_object(Bucket=name, Key="k", Body=b"value")
    return name


def code_of(body: bytes) -> str:
    return body.split(b"<Code>")[1].split(b"</Code>")[0].decode()


def test_wrong_secret_and_unknown_key(served: Served, bucket: str) -> None:
    wrong = Keys(served.root.access_key_id, "not-the-secret")
    response = raw_request(served, "GET", f"/{bucket}/k", keys=wrong)
    assert (response.status, code_of(response.body)) == (403, "SignatureDoesNotMatch")
    unknown = Keys("SHNOSUCHKEY000000000", "whatever")
    response = raw_request(served, "GET", f"/{bucket}/k", keys=unknown)
    assert (response.status, code_of(response.body)) == (403, "InvalidAccessKeyId")


def test_anonymous_requests_are_refused(served: Served, bucket: str) -> None:
    response = raw_request(served, "GET", f"/{bucket}/k", sign=False)
    assert (response.status, code_of(response.body)) == (403, "AccessDenied")
    assert response.headers.get("x-amz-request-id")


def test_skewed_clock(served: Served, bucket: str) -> None:
    past = datetime.now(UTC) - timedelta(minutes=20)
    response = raw_request(served, "GET", f"/{bucket}/k", signed_at=past)
    assert (response.status, code_of(response.body)) == (403, "RequestTimeTooSkewed")
    recent = datetime.now(UTC) - timedelta(minutes=5)
    assert raw_request(served, "GET", f"/{bucket}/k", signed_at=recent).status == 200


def test_expired_presigned_url(served: Served, bucket: str) -> None:
    # Presigned 10 s ago for 1 s, by botocore's own signer (boto3's presign may use the CRT
    # signer, whose clock mock_clock does not set).
    keys = Credentials(served.root.access_key_id, served.root.secret_access_key)

    def presigned(at: datetime, seconds: int) -> str:
        request = AWSRequest(method="GET", url=f"{served.endpoint}/{bucket}/k")
        with mock_clock(at):
            S3SigV4QueryAuth(keys, "s3", "us-east-1", expires=seconds).add_auth(request)
        return str(request.prepare().url)

    with urllib.request.urlopen(presigned(datetime.now(UTC), 60)) as valid:  # still valid
        assert valid.status == 200
    url = presigned(datetime.now(UTC) - timedelta(seconds=10), 1)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url)
    body = refused.value.read()
    refused.value.close()
    assert refused.value.code == 403 and code_of(body) == "AccessDenied"


def test_malformed_xml(served: Served, bucket: str) -> None:
    response = raw_request(served, "POST", f"/{bucket}?delete", b"<Delete><Object><Key>k</Key>")
    assert (response.status, code_of(response.body)) == (400, "MalformedXML")
    response = raw_request(served, "POST", f"/{bucket}?delete", b"<Delete></Delete>")
    assert code_of(response.body) == "MalformedXML"
    upload = served.client().create_multipart_upload(Bucket=bucket, Key="m")["UploadId"]
    response = raw_request(served, "POST", f"/{bucket}/m?uploadId={upload}", b"<Complete")
    assert (response.status, code_of(response.body)) == (400, "MalformedXML")
    bomb = (
        b'<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;">]>'
        b"<Delete><Object><Key>&b;</Key></Object></Delete>"
    )
    assert code_of(raw_request(served, "POST", f"/{bucket}?delete", bomb).body) == "MalformedXML"


def test_error_bodies_name_the_resource_and_request(served: Served, bucket: str) -> None:
    response = raw_request(served, "GET", f"/{bucket}/missing")
    assert response.status == 404
    assert b"<Code>NoSuchKey</Code>" in response.body
    assert f"<Resource>/{bucket}/missing</Resource>".encode() in response.body
    request_id = response.headers["x-amz-request-id"]
    assert f"<RequestId>{request_id}</RequestId>".encode() in response.body


def test_virtual_hosted_style(served: Served, bucket: str) -> None:
    host = f"{bucket}.localhost:{served.port}"
    response = raw_request(served, "GET", "/k", host=host)
    assert (response.status, response.body) == (200, b"value")
    listing = raw_request(served, "GET", "/?list-type=2", host=host)
    assert b"<Key>k</Key>" in listing.body


def test_expect_100_continue(served: Served, bucket: str) -> None:
    body = b"x" * 100_000
    response = raw_request(
        served,
        "PUT",
        f"/{bucket}/expect",
        body,
        headers={"Expect": "100-continue", "Content-Length": str(len(body))},
    )
    assert response.status == 200
    assert served.client().get_object(Bucket=bucket, Key="expect")["Body"].read() == body


def test_a_put_to_a_missing_bucket_is_refused_before_its_body_is_sent(
    served: Served, bucket: str
) -> None:
    path = f"/{unique('missing')}/k"
    headers = signed_headers(
        served, "PUT", path, {"Expect": "100-continue", "Content-Length": "1000000"}
    )
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as sock:
        sock.sendall(f"PUT {path} HTTP/1.1\r\n{head}\r\n".encode())  # no body yet
        answer = b""
        while chunk := sock.recv(65536):  # the gateway answers, then ends the connection
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 404 ") and b"<Code>NoSuchBucket</Code>" in answer
    assert b"\r\nConnection: close\r\n" in answer
    # boto3 (which sends Expect: 100-continue with a body) reads the refusal, then goes on.
    s3 = served.client()
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket=path.split("/")[1], Key="k", Body=b"x" * 100_000)
    assert refused.value.response["Error"]["Code"] == "NoSuchBucket"
    s3.put_object(Bucket=bucket, Key="k", Body=b"x" * 100_000)
    assert s3.head_object(Bucket=bucket, Key="k")["ContentLength"] == 100_000


def test_unsupported_subresources_say_not_implemented(served: Served, bucket: str) -> None:
    response = raw_request(served, "GET", f"/{bucket}?policy")
    assert (response.status, code_of(response.body)) == (501, "NotImplemented")


def test_one_access_log_line_per_request(served: Served, bucket: str) -> None:
    served.client().put_object(Bucket=bucket, Key="logged", Body=bytes(1234))
    response = raw_request(served, "GET", f"/{bucket}/logged")
    request_id = response.headers["x-amz-request-id"]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        lines = [line for line in served.log.read_text().splitlines() if request_id in line]
        if lines:
            break
        time.sleep(0.1)
    assert len(lines) == 1
    assert "op=GetObject status=200" in lines[0] and "account=" in lines[0]
    assert "bytes_out=1234 " in lines[0]  # the body, not the response head


def test_other_accounts_see_nothing_of_mine(served: Served, bucket: str) -> None:
    other = served.client(served.other)
    with pytest.raises(ClientError) as refused:
        other.list_objects_v2(Bucket=bucket)
    assert refused.value.response["Error"]["Code"] == "AccessDenied"
    with pytest.raises(ClientError):
        other.put_object(Bucket=bucket, Key="intruder", Body=b"")
    names: list[Any] = [
        o["Key"] for o in served.client().list_objects_v2(Bucket=bucket)["Contents"]
    ]
    assert "intruder" not in names


def test_errors_say_s3_s_words_and_carry_s3_s_elements(served: Served, bucket: str) -> None:
    """Clients show an error's Message as S3 wrote it; the metadata tier's own words (which
    name internal ids) never reach them, and the elements S3 adds to a code are there."""
    s3 = served.client()

    def error_of(call: Any, **kwargs: Any) -> dict[str, str]:
        with pytest.raises(ClientError) as refused:
            call(**kwargs)
        return dict(refused.value.response["Error"])

    assert error_of(s3.get_object, Bucket=bucket, Key="missing")["Message"] == (
        "The specified key does not exist."
    )
    assert error_of(s3.list_objects_v2, Bucket=unique("absent"))["Message"] == (
        "The specified bucket does not exist"
    )
    stale = '"' + "0" * 32 + '"'
    failed = error_of(s3.put_object, Bucket=bucket, Key="k", Body=b"v", IfMatch=stale)
    assert (failed["Code"], failed["Message"], failed["Condition"]) == (
        "PreconditionFailed",
        "At least one of the pre-conditions you specified did not hold",
        "If-Match",
    )
    read = error_of(s3.get_object, Bucket=bucket, Key="k", IfUnmodifiedSince=datetime(2000, 1, 1))
    assert (read["Code"], read["Condition"]) == ("PreconditionFailed", "If-Unmodified-Since")
    copied = error_of(
        s3.copy_object,
        Bucket=bucket,
        Key="copy",
        CopySource={"Bucket": bucket, "Key": "k"},
        CopySourceIfNoneMatch="*",
    )
    assert (copied["Code"], copied["Condition"]) == (
        "PreconditionFailed",
        "x-amz-copy-source-If-None-Match",
    )

    upload = s3.create_multipart_upload(Bucket=bucket, Key="parts")["UploadId"]
    etags = [
        s3.upload_part(Bucket=bucket, Key="parts", UploadId=upload, PartNumber=n, Body=b"small")[
            "ETag"
        ]
        for n in (1, 2)
    ]
    parts = [{"PartNumber": n, "ETag": etag} for n, etag in zip((1, 2), etags, strict=True)]
    small = error_of(
        s3.complete_multipart_upload,
        Bucket=bucket,
        Key="parts",
        UploadId=upload,
        MultipartUpload={"Parts": parts},
    )
    assert small == {
        "Resource": f"/{bucket}/parts",
        "Code": "EntityTooSmall",
        "Message": "Your proposed upload is smaller than the minimum allowed size",
        "ProposedSize": "5",
        "MinSizeAllowed": str(5 * 1024 * 1024),
        "PartNumber": "1",
    }
    marker = raw_request(served, "GET", f"/{bucket}/parts?uploadId={upload}&part-number-marker=-1")
    assert (marker.status, code_of(marker.body)) == (400, "InvalidArgument")
    assert b"<ArgumentName>part-number-marker</ArgumentName>" in marker.body
    s3.abort_multipart_upload(Bucket=bucket, Key="parts", UploadId=upload)


def test_a_sub_resource_with_a_method_it_lacks_is_refused_never_the_plain_operation(
    served: Served, bucket: str
) -> None:
    """DELETE /bucket?uploads once deleted the bucket, DELETE /bucket/key?uploads the key."""
    s3 = served.client()
    s3.put_object(Bucket=bucket, Key="kept", Body=b"kept")
    for method, path in [
        ("DELETE", f"/{bucket}?uploads"),
        ("DELETE", f"/{bucket}?versions"),
        ("DELETE", f"/{bucket}/kept?uploads"),
        ("PUT", f"/{bucket}/kept?uploads"),
    ]:
        answer = raw_request(served, method, path)
        assert (answer.status, code_of(answer.body)) == (405, "MethodNotAllowed"), path
    assert s3.get_object(Bucket=bucket, Key="kept")["Body"].read() == b"kept"


def test_listing_parameters_are_read_as_s3_reads_them(served: Served, bucket: str) -> None:
    """A damaged continuation token is refused (it never restarts the listing), max-keys is
    ASCII digits only, and ListMultipartUploads percent-encodes what it names when asked."""
    s3 = served.client()
    for token in ("%21%21%21", "a", "a" * 5):  # "!!!", and lengths base64 never has
        answer = raw_request(served, "GET", f"/{bucket}?list-type=2&continuation-token={token}")
        assert (answer.status, code_of(answer.body)) == (400, "InvalidArgument"), token
        assert b"<ArgumentName>continuation-token</ArgumentName>" in answer.body
    for count in ("1_0", "%2B5", "%D9%A1"):  # 1_0, +5, an Arabic-Indic one
        answer = raw_request(served, "GET", f"/{bucket}?list-type=2&max-keys={count}")
        assert (answer.status, code_of(answer.body)) == (400, "InvalidArgument"), count
    key = "up/a b%+é"
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    try:
        answer = raw_request(served, "GET", f"/{bucket}?uploads=&encoding-type=url&prefix=up%2F")
        assert b"<Key>up/a%20b%25%2B%C3%A9</Key>" in answer.body
        assert b"<EncodingType>url</EncodingType>" in answer.body
        listed = s3.list_multipart_uploads(Bucket=bucket, Prefix="up/", EncodingType="url")
        assert [unquote(u["Key"]) for u in listed["Uploads"]] == [key]
    finally:
        s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload)
