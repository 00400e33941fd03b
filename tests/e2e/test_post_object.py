"""POST Object: browser form uploads signed by a SigV4 (or SigV2) POST policy, as boto3's
generate_presigned_post makes them, posted as multipart/form-data by urllib3 against
`shoal serve`, and by a real HTML form in headless Chromium (skipped without a `chromium`
binary); each violated condition answers S3's code."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import boto3
import pytest
import urllib3
from botocore.config import Config as BotoConfig

from tests.e2e.test_cors_browser import CHROMIUM, dom_after_scripts
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


def without(post: dict[str, Any], *names: str) -> dict[str, Any]:
    return {**post, "fields": {k: v for k, v in post["fields"].items() if k not in names}}


def assert_missing_field(response: urllib3.BaseHTTPResponse, named: str) -> None:
    """S3's answer to a form without a field it needs (localstack's AWS snapshots of
    test_post_request_missing_signature and _missing_fields)."""
    root = ElementTree.fromstring(response.data)
    assert (response.status, root.findtext("Code")) == (400, "InvalidArgument"), response.data
    assert root.findtext("Message") == (
        f"Bucket POST must contain a field named '{named}'.  "
        "If it is specified, please check the order of the fields."
    )
    assert (root.findtext("ArgumentName"), root.findtext("ArgumentValue")) == (named, "")


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


def test_checksum_and_md5_fields_are_verified(s3: Any, bucket: str) -> None:
    data = b"checked data"
    right = base64.b64encode(hashlib.sha256(data).digest()).decode()
    wrong = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
    md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
    wrong_md5 = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    for sha256, md5_field, status in (
        (right, md5, 204),
        (wrong, md5, 400),
        (right, wrong_md5, 400),
    ):
        fields = {"x-amz-checksum-sha256": sha256, "Content-MD5": md5_field}
        post = s3.generate_presigned_post(
            bucket, "c", Fields=fields, Conditions=[{k: v} for k, v in fields.items()]
        )
        response = post_form(post, data)
        assert response.status == status, response.data
        if status == 204:
            assert response.headers["x-amz-checksum-sha256"] == right
        else:
            assert error_of(response)[1] == "BadDigest"
    got = s3.head_object(Bucket=bucket, Key="c", ChecksumMode="ENABLED")
    assert got["ChecksumSHA256"] == right


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

    credential = limited["fields"]["x-amz-credential"]
    for name, value, code in (
        (
            "x-amz-credential",
            "AKIDUNKNOWN" + credential[credential.index("/") :],
            "InvalidAccessKeyId",
        ),
        ("x-amz-credential", "no-scope", "InvalidArgument"),
        ("x-amz-algorithm", "AWS4-HMAC-SHA1", "InvalidArgument"),
    ):
        changed = {**limited, "fields": {**limited["fields"], name: value}}
        assert error_of(post_form(changed, b"x" * 6))[1] == code

    response = urllib3.request(
        "POST", limited["url"], fields=limited["fields"], redirect=False, retries=False
    )
    assert error_of(response)[:2] == (400, "IncorrectNumberOfFilesInPostRequest")

    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 1  # only the x-ignore-* one


def test_a_missing_field_is_named_as_s3_names_it(s3: Any, bucket: str) -> None:
    post = s3.generate_presigned_post(bucket, "k")
    for dropped, named in (
        (("key",), "key"),
        (("policy",), "Policy"),
        (("x-amz-signature",), "X-Amz-Signature"),
        (("x-amz-algorithm", "x-amz-credential"), "X-Amz-Algorithm"),
    ):
        assert_missing_field(post_form(without(post, *dropped), b"x"), named)
    # No signature field at all: an anonymous upload, which a private bucket refuses.
    anonymous = {**post, "fields": {"key": "k", "policy": post["fields"]["policy"]}}
    assert error_of(post_form(anonymous, b"x")) == (403, "AccessDenied", "Access Denied")
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket)


def test_fields_refused_as_put_object_headers_are(s3: Any, bucket: str) -> None:
    for fields, status, code in (
        ({"x-amz-acl": "private"}, 204, ""),
        ({"x-amz-acl": "public-read-write"}, 400, "AccessControlListNotSupported"),
        ({"acl": "public-read-write"}, 400, "AccessControlListNotSupported"),  # S3's field
        ({"x-amz-server-side-encryption": "aws:kms"}, 501, "NotImplemented"),
    ):
        post = s3.generate_presigned_post(
            bucket, "acl", Fields=fields, Conditions=[{k: v} for k, v in fields.items()]
        )
        response = post_form(post, b"data")
        assert response.status == status, response.data
        if code:
            assert error_of(response)[1] == code


@pytest.mark.parametrize("field", ["acl", "x-amz-acl"])  # S3's form field, and the header's
def test_a_public_read_field_makes_the_object_public_read(s3: Any, bucket: str, field: str) -> None:
    fields = {field: "public-read"}
    post = s3.generate_presigned_post(
        bucket, "public", Fields=fields, Conditions=[{k: v} for k, v in fields.items()]
    )
    assert post_form(post, b"data").status == 204
    grants = s3.get_object_acl(Bucket=bucket, Key="public")["Grants"]
    assert any(g["Grantee"].get("URI", "").endswith("/AllUsers") for g in grants), grants


def test_a_tagging_field_tags_the_object(s3: Any, bucket: str) -> None:
    tagging = "<Tagging><TagSet><Tag><Key>team</Key><Value>web</Value></Tag></TagSet></Tagging>"
    fields = {"tagging": tagging}
    post = s3.generate_presigned_post(
        bucket, "tagged", Fields=fields, Conditions=[{k: v} for k, v in fields.items()]
    )
    assert post_form(post, b"data").status == 204
    assert s3.get_object_tagging(Bucket=bucket, Key="tagged")["TagSet"] == [
        {"Key": "team", "Value": "web"}
    ]
    bad = {"tagging": "<Tagging><TagSet><Tag><Key>a</Key></Tag></TagSet></Tagging>"}
    post = s3.generate_presigned_post(
        bucket, "untagged", Fields=bad, Conditions=[{k: v} for k, v in bad.items()]
    )
    assert error_of(post_form(post, b"data"))[1] == "MalformedXML"


def test_expired_and_malformed_policies(served: Served, s3: Any, bucket: str) -> None:
    expired = s3.generate_presigned_post(bucket, "k", ExpiresIn=-10)
    status, code, message = error_of(post_form(expired, b"x"))
    assert (status, code, message) == (
        403,
        "AccessDenied",
        "Invalid according to Policy: Policy expired.",
    )
    good = s3.generate_presigned_post(bucket, "k")
    # A policy that is not JSON is refused after its signature: sign it as boto3 would.
    not_json = base64.b64encode(b"{nope").decode()
    sign, credential = policy_signer(served, good["url"])
    fields = {**credential, "key": "k", "policy": not_json, "x-amz-signature": sign(not_json)}
    assert error_of(post_form({"url": good["url"], "fields": fields}, b"x"))[:2] == (
        400,
        "InvalidPolicyDocument",
    )


def test_a_form_signed_with_sigv2_uploads(served: Served, s3: Any, bucket: str) -> None:
    """What boto3's generate_presigned_post makes for a client in us-east-1 that names no
    signature_version: AWSAccessKeyId, policy and signature (HMAC-SHA1), as S3 takes."""
    keys = served.root
    default = boto3.client(
        "s3",
        endpoint_url=served.endpoint,
        region_name="us-east-1",
        aws_access_key_id=keys.access_key_id,
        aws_secret_access_key=keys.secret_access_key,
        config=BotoConfig(s3={"addressing_style": "path"}),
    )
    post = default.generate_presigned_post(
        bucket, "v2/${filename}", Conditions=[["starts-with", "$key", "v2/"]]
    )
    default.close()
    assert {"AWSAccessKeyId", "signature", "policy"} <= set(post["fields"])
    assert post_form(post, b"signed with SigV2", filename="f.txt").status == 204
    assert s3.get_object(Bucket=bucket, Key="v2/f.txt")["Body"].read() == b"signed with SigV2"
    forged = {
        **post,
        "fields": {**post["fields"], "signature": "AAAA" + post["fields"]["signature"][4:]},
    }
    assert error_of(post_form(forged, b"x"))[:2] == (403, "SignatureDoesNotMatch")
    unknown = {**post, "fields": {**post["fields"], "AWSAccessKeyId": "AKIDUNKNOWN"}}
    assert error_of(post_form(unknown, b"x"))[:2] == (403, "InvalidAccessKeyId")
    assert_missing_field(post_form(without(post, "signature"), b"x"), "Signature")
    assert_missing_field(post_form(without(post, "AWSAccessKeyId"), b"x"), "AWSAccessKeyId")


def policy_signer(served: Served, url: str) -> tuple[Callable[[str], str], dict[str, str]]:
    """boto3's SigV4 signer of a form's policy (base64 text -> x-amz-signature), and the
    credential fields a form signed by it carries."""
    from botocore.auth import S3SigV4PostAuth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    keys = served.root
    signer = S3SigV4PostAuth(
        Credentials(keys.access_key_id, keys.secret_access_key), "s3", "us-east-1"
    )
    request = AWSRequest(method="POST", url=url)
    request.context["s3-presign-post-fields"] = {}
    request.context["s3-presign-post-policy"] = {"expiration": "x", "conditions": []}
    signer.add_auth(request)
    names = ("x-amz-algorithm", "x-amz-credential", "x-amz-date")
    credential = {name: request.context["s3-presign-post-fields"][name] for name in names}
    return (lambda encoded: signer.signature(encoded, request)), credential


def signed_post(served: Served, bucket: str, policy: dict[str, Any], **fields: str) -> Any:
    """A SigV4 form for any policy document; the policy also names the credential fields,
    as boto3's do."""
    url = f"{served.endpoint}/{bucket}"
    sign, credential = policy_signer(served, url)
    conditions = [*policy["conditions"], *({k: v} for k, v in credential.items())]
    encoded = base64.b64encode(json.dumps({**policy, "conditions": conditions}).encode()).decode()
    return {
        "url": url,
        "fields": {**credential, "x-amz-signature": sign(encoded), "policy": encoded, **fields},
    }


def test_policies_are_read_as_s3_reads_them(served: Served, bucket: str) -> None:
    later = "2099-01-01T00:00:00Z"

    def answer(conditions: list[Any], expiration: str = later, **fields: str) -> Any:
        policy = {"expiration": expiration, "conditions": [{"bucket": bucket}, *conditions]}
        form = signed_post(served, bucket, policy, key="p", **fields)
        response = post_form(form, b"x" * 6)
        return response.status if response.status < 300 else error_of(response)

    # Numbers as strings, and operators in any case, are taken.
    assert answer([["content-length-range", "5", "10"], ["eq", "$key", "p"]]) == 204
    assert answer([["StArTs-WiTh", "$KeY", "p"]]) == 204
    assert answer([["EQ", "$key", "p"], ["Content-Length-Range", 1, 9]]) == 204
    assert answer([["eq", "$key", "p"]], expiration="2099-01-01T00:00:00.123Z") == 204
    # A condition that cannot hold fails as a condition, 403.
    for failing in (["content-length-range", "test", "10"], ["eq", "key", "p"]):
        status, code, message = answer([failing, ["eq", "$key", "p"]])
        assert (status, code) == (403, "AccessDenied")
        assert message == (
            f"Invalid according to Policy: Policy Condition failed: {json.dumps(failing)}"
        )
    # A malformed policy is 400 InvalidPolicyDocument.
    status, code, message = answer([{"key": "p", "acl": "private"}])
    assert (status, code) == (400, "InvalidPolicyDocument")
    assert message.endswith("Simple-Conditions must have exactly one property specified.")
    for expiration in (
        "2099-01-01 00:00:00",
        "2099-01-01T00:00:00",
        "2099-01-01",
        "2099-02-30T00:00:00Z",
    ):
        status, code, _ = answer([["eq", "$key", "p"]], expiration=expiration)
        assert (status, code) == (400, "InvalidPolicyDocument"), expiration


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


BROWSER_PAGE = """<!DOCTYPE html>
<html><body><pre id="result">pending</pre>
<form id="upload" method="post" enctype="multipart/form-data" action=%(action)s></form>
<script>
const fields = %(fields)s;
const params = new URLSearchParams(location.search);
if (params.has("key")) {
  document.getElementById("result").textContent =
    "stored:" + params.get("bucket") + "/" + params.get("key") + "|etag:" + params.get("etag");
} else {
  const form = document.getElementById("upload");
  for (const [name, value] of Object.entries(fields)) {
    const input = document.createElement("input");
    input.type = "hidden"; input.name = name; input.value = value;
    form.appendChild(input);
  }
  const file = document.createElement("input");
  file.type = "file"; file.name = "file";
  const chosen = new DataTransfer();
  chosen.items.add(new File([%(content)s], "chosen file.txt", {type: "text/plain"}));
  file.files = chosen.files;
  form.appendChild(file);
  form.submit();
}
</script></body></html>
"""


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (Debian's chromium package)")
def test_a_browser_form_uploads_and_follows_the_redirect(
    s3: Any, bucket: str, tmp_path: Path
) -> None:
    content = "posted by a browser form"
    with page_server_of(lambda origin: _browser_page(s3, bucket, origin, content)) as origin:
        dom = dom_after_scripts(origin + "/", tmp_path / "profile")
    key = "forms/chosen file.txt"
    etag = s3.head_object(Bucket=bucket, Key=key)["ETag"]
    assert f"stored:{bucket}/{key}|etag:{etag}" in dom.replace("&quot;", '"'), dom
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == content.encode()


def _browser_page(s3: Any, bucket: str, origin: str, content: str) -> str:
    redirect = origin + "/done"
    post = s3.generate_presigned_post(
        bucket,
        "forms/${filename}",
        Fields={"success_action_redirect": redirect},
        Conditions=[{"success_action_redirect": redirect}, ["content-length-range", 1, 100]],
    )
    return BROWSER_PAGE % {
        "action": json.dumps(post["url"]),
        "fields": json.dumps(post["fields"]),
        "content": json.dumps(content),
    }


@contextlib.contextmanager
def page_server_of(make_page: Callable[[str], str]) -> Iterator[str]:
    """An http.server on 127.0.0.1 serving, at every path, the page `make_page` makes for its
    origin (the page's form redirects back to it)."""
    page: list[bytes] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page[0])))
            self.end_headers()
            self.wfile.write(page[0])

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    page.append(make_page(origin).encode())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield origin
    finally:
        server.shutdown()
        server.server_close()
