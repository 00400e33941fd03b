"""POST Object: browser form uploads signed by a SigV4 POST policy, as boto3's
generate_presigned_post makes them, posted as multipart/form-data by urllib3 against
`shoal serve`; each violated condition answers S3's code."""

from __future__ import annotations

import base64
import hashlib
import os
from typing import Any
from xml.etree import ElementTree

import urllib3

from tests.fixtures.serve import Served, raw_request

NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


def post_form(
    post: dict[str, Any], data: bytes, filename: str = "upload.bin", **extra: str
) -> urllib3.BaseHTTPResponse:
    """The form as a browser sends it: the presigned fields (and `extra`), then the file."""
    fields: dict[str, Any] = {**post["fields"], **extra}
    fields["file"] = (filename, data, "application/octet-stream")
    return urllib3.request("POST", post["url"], fields=fields, redirect=False, retries=False)


def error_of(response: urllib3.BaseHTTPResponse) -> tuple[int, str, str]:
    root = ElementTree.fromstring(response.data)
    return response.status, root.findtext("Code") or "", root.findtext("Message") or ""


def test_presigned_post_with_conditions(s3: Any, bucket: str) -> None:
    post = s3.generate_presigned_post(
        bucket,
        "uploads/${filename}",
        Fields={"success_action_status": "201", "x-amz-meta-owner": "ana"},
        Conditions=[
            ["content-length-range", 1, 1024],
            ["starts-with", "$key", "uploads/"],
            {"success_action_status": "201"},
            {"x-amz-meta-owner": "ana"},
        ],
        ExpiresIn=300,
    )
    response = post_form(post, b"hello form", filename="notes.txt")
    assert response.status == 201, response.data
    root = ElementTree.fromstring(response.data)
    assert root.tag == f"{NS}PostResponse"
    assert root.findtext(f"{NS}Bucket") == bucket
    assert root.findtext(f"{NS}Key") == "uploads/notes.txt"
    etag = f'"{hashlib.md5(b"hello form").hexdigest()}"'
    assert root.findtext(f"{NS}ETag") == etag
    got = s3.get_object(Bucket=bucket, Key="uploads/notes.txt")
    assert got["Body"].read() == b"hello form"
    assert got["Metadata"] == {"owner": "ana"}
    assert got["ETag"] == etag


def test_default_status_content_type_and_redirect(s3: Any, bucket: str) -> None:
    post = s3.generate_presigned_post(
        bucket,
        "k",
        Fields={"Content-Type": "text/plain"},
        Conditions=[{"Content-Type": "text/plain"}],
    )
    response = post_form(post, b"abc")
    assert response.status == 204
    assert s3.head_object(Bucket=bucket, Key="k")["ContentType"] == "text/plain"
    redirect = "https://example.com/done?x=1"
    post = s3.generate_presigned_post(
        bucket,
        "r",
        Fields={"success_action_redirect": redirect},
        Conditions=[{"success_action_redirect": redirect}],
    )
    response = post_form(post, b"abc")
    assert response.status == 303
    location = response.headers["Location"]
    assert location.startswith("https://example.com/done?x=1&bucket=")
    assert "key=r" in location and "etag=" in location


def test_upload_of_several_mib_streams_across_blocks(s3: Any, bucket: str) -> None:
    data = os.urandom(3 * 1024 * 1024 + 12345)
    post = s3.generate_presigned_post(bucket, "big")
    response = post_form(post, data)
    assert response.status == 204, response.data
    assert s3.get_object(Bucket=bucket, Key="big")["Body"].read() == data


def test_violated_conditions_answer_s3_codes(s3: Any, bucket: str) -> None:
    limited = s3.generate_presigned_post(
        bucket,
        "in/${filename}",
        Conditions=[["content-length-range", 5, 10], ["starts-with", "$key", "in/"]],
    )
    assert error_of(post_form(limited, b"x" * 11))[:2] == (400, "EntityTooLarge")
    assert error_of(post_form(limited, b"x" * 4))[:2] == (400, "EntityTooSmall")
    big = os.urandom(2 * 1024 * 1024)  # refused while it streams to the nodes
    assert error_of(post_form(limited, big))[:2] == (400, "EntityTooLarge")

    outside = {**limited, "fields": {**limited["fields"], "key": "out/x"}}
    status, code, message = error_of(post_form(outside, b"x" * 6))
    assert (status, code) == (403, "AccessDenied")
    assert (
        message
        == 'Invalid according to Policy: Policy Condition failed: ["starts-with", "$key", "in/"]'
    )

    status, code, message = error_of(post_form(limited, b"x" * 6, **{"x-amz-meta-a": "b"}))
    assert (status, code) == (403, "AccessDenied")
    assert message == "Invalid according to Policy: Extra input fields: x-amz-meta-a"
    # x-ignore-* fields need no condition.
    assert post_form(limited, b"x" * 6, **{"x-ignore-me": "1"}).status == 204

    forged = {**limited, "fields": {**limited["fields"], "x-amz-signature": "0" * 64}}
    assert error_of(post_form(forged, b"x" * 6))[:2] == (403, "SignatureDoesNotMatch")

    response = urllib3.request(
        "POST", limited["url"], fields=limited["fields"], redirect=False, retries=False
    )
    assert error_of(response)[:2] == (400, "IncorrectNumberOfFilesInPostRequest")

    for name in ("key", "policy"):
        fields = {k: v for k, v in limited["fields"].items() if k != name}
        assert error_of(post_form({**limited, "fields": fields}, b"x" * 6))[1] == "InvalidArgument"
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 1  # only the x-ignore-* one


def test_expired_and_malformed_policies(served: Served, s3: Any, bucket: str) -> None:
    expired = s3.generate_presigned_post(bucket, "k", ExpiresIn=-10)
    status, code, message = error_of(post_form(expired, b"x"))
    assert (status, code, message) == (
        403,
        "AccessDenied",
        "Invalid according to Policy: Policy expired.",
    )
    good = s3.generate_presigned_post(bucket, "k")
    not_json = base64.b64encode(b"{nope").decode()
    fields = {**good["fields"], "policy": not_json}
    # A policy that is not JSON is refused after its signature: sign it as boto3 would.
    from botocore.auth import S3SigV4PostAuth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    keys = served.root
    signer = S3SigV4PostAuth(
        Credentials(keys.access_key_id, keys.secret_access_key), "s3", "us-east-1"
    )
    request = AWSRequest(method="POST", url=good["url"])
    request.context["s3-presign-post-fields"] = {}
    request.context["s3-presign-post-policy"] = {"expiration": "x", "conditions": []}
    signer.add_auth(request)
    signed = request.context["s3-presign-post-fields"]
    fields = {**signed, "key": "k", "policy": not_json}
    fields["x-amz-signature"] = signer.signature(not_json, request)
    assert error_of(post_form({"url": good["url"], "fields": fields}, b"x"))[:2] == (
        400,
        "InvalidPolicyDocument",
    )


def test_post_that_is_not_a_form(served: Served, bucket: str) -> None:
    response = raw_request(served, "POST", f"/{bucket}", b"hello", sign=False)
    assert response.status == 412
    broken = urllib3.request(
        "POST",
        f"{served.endpoint}/{bucket}",
        body=b'--b\r\nContent-Disposition: form-data; name="key"\r\n\r\nk',
        headers={"Content-Type": "multipart/form-data; boundary=b"},
        retries=False,
    )
    assert error_of(broken)[:2] == (400, "MalformedPOSTRequest")
