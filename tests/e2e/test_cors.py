"""CORS: Put/Get/DeleteBucketCors with boto3, the preflight `OPTIONS` and the
`Access-Control-*` headers of requests with an `Origin`, against `shoal serve`."""

from __future__ import annotations

import time
from typing import Any

import pytest

from shoal.s3.cors import RULES_KEEP_SECONDS
from tests.e2e.test_boto3 import error_code
from tests.fixtures.serve import RawResponse, Served, raw_request

PAGE = "http://127.0.0.1:8123"
VARY = "Origin, Access-Control-Request-Headers, Access-Control-Request-Method"
RULES = [
    {
        "ID": "uploads",
        "AllowedOrigins": [PAGE, "https://*.example.com"],
        "AllowedMethods": ["PUT", "GET"],
        "AllowedHeaders": ["content-type", "x-amz-*"],
        "ExposeHeaders": ["ETag"],
        "MaxAgeSeconds": 300,
    },
    {"AllowedOrigins": ["*"], "AllowedMethods": ["HEAD"]},
]


def lowered(response: RawResponse) -> dict[str, str]:
    return {name.lower(): value for name, value in response.headers.items()}


def preflight(served: Served, path: str, origin: str | None, method: str | None, **more: str):
    headers = dict(more)
    if origin is not None:
        headers["Origin"] = origin
    if method is not None:
        headers["Access-Control-Request-Method"] = method
    return raw_request(served, "OPTIONS", path, headers=headers, sign=False)


def test_put_get_delete_bucket_cors(s3: Any, bucket: str) -> None:
    assert error_code(s3.get_bucket_cors, Bucket=bucket) == "NoSuchCORSConfiguration"
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration={"CORSRules": RULES})
    got = s3.get_bucket_cors(Bucket=bucket)["CORSRules"]
    assert got == RULES
    s3.delete_bucket_cors(Bucket=bucket)
    assert error_code(s3.get_bucket_cors, Bucket=bucket) == "NoSuchCORSConfiguration"
    assert error_code(s3.get_bucket_cors, Bucket=bucket + "-none") == "NoSuchBucket"


@pytest.mark.parametrize(
    ("rule", "code"),
    [
        ({"AllowedOrigins": ["*"], "AllowedMethods": ["PATCH"]}, "InvalidRequest"),
        ({"AllowedOrigins": ["*.*"], "AllowedMethods": ["GET"]}, "InvalidRequest"),
        (
            {"AllowedOrigins": ["*"], "AllowedMethods": ["GET"], "AllowedHeaders": ["*a*"]},
            "InvalidRequest",
        ),
        ({"AllowedOrigins": [], "AllowedMethods": ["GET"]}, "MalformedXML"),
        ({"AllowedOrigins": ["*"], "AllowedMethods": ["GET"], "ID": "i" * 256}, "InvalidArgument"),
    ],
)
def test_put_bucket_cors_refuses_what_s3_refuses(
    s3: Any, bucket: str, rule: dict[str, Any], code: str
) -> None:
    assert (
        error_code(s3.put_bucket_cors, Bucket=bucket, CORSConfiguration={"CORSRules": [rule]})
        == code
    )
    too_many = [{"AllowedOrigins": ["*"], "AllowedMethods": ["GET"]}] * 101
    assert (
        error_code(s3.put_bucket_cors, Bucket=bucket, CORSConfiguration={"CORSRules": too_many})
        == "MalformedXML"
    )
    assert error_code(s3.get_bucket_cors, Bucket=bucket) == "NoSuchCORSConfiguration"


def test_preflight_answers_from_the_first_matching_rule(
    served: Served, s3: Any, bucket: str
) -> None:
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration={"CORSRules": RULES})
    allowed = preflight(
        served,
        f"/{bucket}/some/key",
        PAGE,
        "PUT",
        **{"Access-Control-Request-Headers": "Content-Type, X-Amz-Meta-A"},
    )
    assert allowed.status == 200, allowed.body
    headers = lowered(allowed)
    assert headers["access-control-allow-origin"] == PAGE
    assert headers["access-control-allow-methods"] == "PUT, GET"
    assert headers["access-control-allow-headers"] == "content-type, x-amz-meta-a"
    assert headers["access-control-expose-headers"] == "ETag"
    assert headers["access-control-max-age"] == "300"
    assert headers["access-control-allow-credentials"] == "true"
    assert headers["vary"] == VARY
    wildcard = preflight(served, f"/{bucket}", "https://a.example.com", "GET")
    assert wildcard.status == 200
    assert lowered(wildcard)["access-control-allow-origin"] == "https://a.example.com"
    # With rules, a preflight must name a method S3 knows.
    for method, named in ((None, b"null"), ("TRACE", b"TRACE")):
        refused = preflight(served, f"/{bucket}/k", PAGE, method)
        assert refused.status == 400 and b"<Code>BadRequest</Code>" in refused.body
        assert b"Invalid Access-Control-Request-Method: " + named in refused.body
    anyone = preflight(served, f"/{bucket}/k", "http://elsewhere", "HEAD")
    assert anyone.status == 200
    assert lowered(anyone)["access-control-allow-origin"] == "*"
    assert "access-control-allow-credentials" not in lowered(anyone)
    # Virtual-hosted style names the bucket in the Host header.
    virtual = raw_request(
        served,
        "OPTIONS",
        "/k",
        headers={"Origin": PAGE, "Access-Control-Request-Method": "GET"},
        host=f"{bucket}.localhost:{served.port}",
        sign=False,
    )
    assert virtual.status == 200, virtual.body
    for refused in (
        preflight(served, f"/{bucket}/k", "http://elsewhere", "PUT"),
        preflight(served, f"/{bucket}/k", PAGE, "DELETE"),
        preflight(
            served, f"/{bucket}/k", PAGE, "PUT", **{"Access-Control-Request-Headers": "x-other"}
        ),
    ):
        assert refused.status == 403
        assert b"<Code>AccessForbidden</Code>" in refused.body
        assert b"This CORS request is not allowed" in refused.body
        assert "access-control-allow-origin" not in lowered(refused)
        assert "vary" not in lowered(refused)  # as S3: Vary only when a rule matched


def test_preflight_without_rules_or_bucket_or_origin(served: Served, bucket: str) -> None:
    # A name no bucket can have (not UTF-8, not S3's rules) is one more bucket without rules.
    for path in (f"/{bucket}/k", f"/{bucket}-none/k", "/%ff/k", "/A_B/k", "/"):
        refused = preflight(served, path, PAGE, "GET")
        assert refused.status == 403
        assert b"<Code>AccessForbidden</Code>" in refused.body
        assert b"CORS is not enabled for this bucket" in refused.body
        # S3 names the bucket as the resource, for an object's URL too.
        assert b"<Method>GET</Method><ResourceType>BUCKET</ResourceType>" in refused.body
    assert preflight(served, f"/{bucket}/k", None, "GET").status == 400
    # Without rules, a preflight that names no method is refused as any other, as OPTIONS.
    for method in (None, "TRACE"):
        refused = preflight(served, f"/{bucket}/k", PAGE, method)
        assert refused.status == 403 and b"CORS is not enabled" in refused.body
        assert f"<Method>{method or 'OPTIONS'}</Method>".encode() in refused.body


def test_requests_with_an_origin_get_access_control_headers(
    served: Served, s3: Any, bucket: str
) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"data")
    plain = raw_request(served, "GET", f"/{bucket}/k", headers={"Origin": PAGE})
    assert plain.status == 200
    assert "access-control-allow-origin" not in lowered(plain)
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration={"CORSRules": RULES})
    time.sleep(RULES_KEEP_SECONDS + 0.2)  # another gateway process may have kept "no rules"
    got = raw_request(served, "GET", f"/{bucket}/k", headers={"Origin": PAGE})
    assert got.status == 200 and got.body == b"data"
    headers = lowered(got)
    assert headers["access-control-allow-origin"] == PAGE
    assert headers["access-control-expose-headers"] == "ETag"
    assert headers["access-control-allow-credentials"] == "true"
    assert headers["vary"] == VARY
    # An error answer of an authenticated request carries them too.
    missing = raw_request(served, "GET", f"/{bucket}/nothing", headers={"Origin": PAGE})
    assert missing.status == 404
    assert lowered(missing)["access-control-allow-origin"] == PAGE
    # A method no rule allows for this origin: no Access-Control-* headers and, as S3
    # answers (localstack's AWS snapshot of test_cors_match_methods), no Vary.
    deleting = raw_request(served, "DELETE", f"/{bucket}/k", headers={"Origin": PAGE})
    assert deleting.status == 204
    assert "access-control-allow-origin" not in lowered(deleting)
    assert "vary" not in lowered(deleting)
    without = raw_request(served, "GET", f"/{bucket}/nothing")
    assert "access-control-allow-origin" not in lowered(without)
    # The bucket's rules hold for another account's request too (here refused: the bucket
    # is private), as for its owner's and an anonymous browser's.
    stranger = raw_request(
        served, "GET", f"/{bucket}/k", headers={"Origin": PAGE}, keys=served.other
    )
    assert stranger.status == 403
    assert lowered(stranger)["access-control-allow-origin"] == PAGE
