"""SigV2 verification, held to botocore's real v2 signers and to the AWS documentation's examples.

Requests are signed by botocore: directly (`HmacV1Auth` for the ``Authorization: AWS`` header,
`HmacV1QueryAuth` for presigned URLs), through a boto3 client signing with ``signature_version
"s3"`` whose requests are captured just before they would be sent, and through the presigned
URLs that a default boto3 client makes for a custom endpoint in us-east-1. Every request is
turned into the `SignedRequest` the gateway would build from the wire. The examples of the S3
documentation ("Signing and authenticating REST requests", AWS signature version 2) check the
canonicalisation against signatures we did not compute ourselves.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import formatdate
from typing import Any
from unittest import mock
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import boto3
import botocore.auth
import pytest
from botocore.awsrequest import AWSPreparedRequest, AWSRequest, AWSResponse
from botocore.config import Config
from botocore.credentials import Credentials as BotoCredentials
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.s3.metrics import UNSUPPORTED, auth_failure_reason
from shoal.s3.sigv2 import SUBRESOURCES, V2Credentials, is_sigv2, parse, refuse_if_off, verify
from shoal.s3.sigv4 import SignedRequest, SigV4Error

AKID = "AKIDSHOALTEST0000001"
SECRET = "shoal/secret+key=with/odd+chars"
T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
ENDPOINT = "http://s3.test:9000"

# The AWS documentation's example credentials.
DOC_AKID = "AKIAIOSFODNN7EXAMPLE"
DOC_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"

# Object keys that exercise the path encoding: spaces, non-ASCII, and the characters that
# URL encoders disagree about.
ODD_KEYS = [
    "plain.txt",
    "with space/and more spaces.txt",
    "unicode/ünïcødé/日本語.txt",
    "a+b/c+d",
    "tilde~name",
    "equals=sign&amp?question",
    "percent%20literal",
    "semi;colon,comma:colon@at!bang$dollar'quote(paren)*star",
]


# --- Helpers -----------------------------------------------------------------------------------


def to_signed_request(prepared: AWSPreparedRequest | AWSRequest) -> SignedRequest:
    """What the gateway would hand over for this request: the raw path as in the URL, the
    query decoded in order, lowercase header names with repeated values joined by ','."""
    url = urlsplit(prepared.url)
    headers: dict[str, str] = {}
    for name in dict.fromkeys(prepared.headers.keys()):
        # An AWSRequest's HTTPHeaders keep repeated headers; a prepared request's dict does not.
        get_all = getattr(prepared.headers, "get_all", None)
        values = get_all(name) if get_all is not None else [prepared.headers[name]]
        headers[name.lower()] = ",".join(_text(value).strip() for value in values)
    headers.setdefault("host", url.netloc)
    query = parse_qsl(url.query, keep_blank_values=True)
    return SignedRequest(prepared.method, url.path, query, headers)


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def url_request(method: str, url: str, headers: dict[str, str] | None = None) -> SignedRequest:
    """The gateway's view of a request made with ``url`` as is (a presigned URL)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    return SignedRequest(method, parts.path, query, {"host": parts.netloc, **(headers or {})})


def key_path(bucket: str, key: str) -> str:
    """The path botocore puts in its URLs (it quotes keys keeping '/' and '~')."""
    return f"/{bucket}/{quote(key, safe='/~')}"


def header_signed(
    method: str,
    url: str,
    *,
    headers: dict[str, str] | list[tuple[str, str]] | None = None,
    body: bytes = b"",
    when: datetime = T0,
    auth_path: str | None = None,
    secret: str = SECRET,
) -> AWSRequest:
    """A request signed by botocore's HmacV1Auth (``Authorization: AWS AKID:signature``)."""
    request = AWSRequest(method=method, url=url, data=body, auth_path=auth_path)
    pairs = headers.items() if isinstance(headers, dict) else headers or []
    for name, value in pairs:
        request.headers[name] = value  # HTTPHeaders appends: a name given twice is repeated
    auth = botocore.auth.HmacV1Auth(BotoCredentials(AKID, secret))
    date = formatdate(when.timestamp(), usegmt=True)
    with mock.patch.object(auth, "_get_date", return_value=date):
        auth.add_auth(request)
    return request


def query_signed(
    method: str,
    url: str,
    *,
    expires: int,
    headers: dict[str, str] | None = None,
    secret: str = SECRET,
) -> AWSRequest:
    """A URL presigned by botocore's HmacV1QueryAuth, valid until ``expires`` (epoch seconds).

    The signer moves Content-Type, Content-MD5 and x-amz-* headers into the query; what stays
    in ``headers`` is only what the URL's user would send anyway.
    """
    request = AWSRequest(method=method, url=url, headers=dict(headers or {}))
    auth = botocore.auth.HmacV1QueryAuth(BotoCredentials(AKID, secret))
    with mock.patch.object(auth, "_get_date", return_value=str(expires)):
        auth.add_auth(request)
    return request


def check(request: SignedRequest, now: datetime = T0, **kwargs: Any) -> V2Credentials:
    """Parse and verify with the test secret; the credentials if the signature holds."""
    assert is_sigv2(request)
    credentials = parse(request, now)
    verify(credentials, request, SECRET, **kwargs)
    return credentials


def refused(request: SignedRequest, now: datetime = T0, **kwargs: Any) -> SigV4Error:
    with pytest.raises(SigV4Error) as caught:
        check(request, now, **kwargs)
    return caught.value


EXPIRES = int((T0 + timedelta(hours=1)).timestamp())


class _EmptyBody:
    def stream(self, **_: Any) -> Any:
        return iter(())

    def read(self, *_: Any, **__: Any) -> bytes:
        return b""


def boto3_client(**config: Any) -> Any:
    return boto3.client(
        "s3",
        endpoint_url="http://127.0.0.1:1",
        region_name="us-east-1",
        aws_access_key_id=AKID,
        aws_secret_access_key=SECRET,
        config=Config(**config) if config else None,
    )


def boto3_capture(call: Callable[[Any], Any]) -> AWSPreparedRequest:
    """The request a boto3 client signing with SigV2 headers makes for ``call(client)``."""
    client = boto3_client(signature_version="s3", retries={"max_attempts": 1})
    captured: list[AWSPreparedRequest] = []

    def before_send(request: AWSPreparedRequest, **_: Any) -> AWSResponse:
        captured.append(request)
        return AWSResponse(request.url, 200, {}, _EmptyBody())

    client.meta.events.register("before-send.s3", before_send)
    call(client)
    assert len(captured) == 1
    return captured[0]


# --- Detection ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "headers", "expected"),
    [
        ([], {"authorization": f"AWS {AKID}:c2lnbmF0dXJl"}, True),
        ([], {"authorization": f"AWS4-HMAC-SHA256 Credential={AKID}/20250101/..."}, False),
        ([], {"authorization": "AWS4 something"}, False),
        ([], {"authorization": "Bearer token"}, False),
        ([("AWSAccessKeyId", AKID), ("Signature", "x"), ("Expires", "1")], {}, True),
        ([("AWSAccessKeyId", AKID)], {}, True),  # incomplete: parse says what is missing
        ([("Signature", "x")], {}, True),
        ([("X-Amz-Algorithm", "AWS4-HMAC-SHA256"), ("X-Amz-Signature", "ab")], {}, False),
        ([("AWSAccessKeyId", AKID), ("X-Amz-Credential", "x")], {}, False),
        ([("prefix", "a"), ("Expires", "1")], {}, False),
        ([], {}, False),
    ],
)
def test_is_sigv2(query: list[tuple[str, str]], headers: dict[str, str], expected: bool) -> None:
    assert is_sigv2(SignedRequest("GET", "/b/k", query, headers)) is expected


# --- Which SigV2 requests [s3] signature_v2 lets in --------------------------------------------


def test_boto3_presigns_with_sigv2_and_signs_headers_with_sigv2_when_asked() -> None:
    """What the default "presigned" rests on: boto3's default presigner in us-east-1 makes
    SigV2 query URLs; its "s3" signature version signs the Authorization header."""
    url = boto3_client().generate_presigned_url("get_object", Params={"Bucket": "b", "Key": "k"})
    assert is_sigv2(url_request("GET", url)) and "AWSAccessKeyId=" in url
    header = to_signed_request(boto3_capture(lambda client: client.get_object(Bucket="b", Key="k")))
    assert header.headers["authorization"].startswith("AWS ") and is_sigv2(header)


@pytest.mark.parametrize(
    ("setting", "header_accepted", "presigned_accepted"),
    [("all", True, True), ("presigned", False, True), ("off", False, False)],
)
def test_signature_v2_setting_accepts_what_it_names(
    setting: str, header_accepted: bool, presigned_accepted: bool
) -> None:
    url = boto3_client().generate_presigned_url("get_object", Params={"Bucket": "b", "Key": "k"})
    presigned = url_request("GET", url)
    header = to_signed_request(boto3_capture(lambda client: client.get_object(Bucket="b", Key="k")))
    for request, accepted, form in (
        (header, header_accepted, "the Authorization header"),
        (presigned, presigned_accepted, "presigned URLs"),
    ):
        if accepted:
            refuse_if_off(request, setting)
            continue
        with pytest.raises(SigV4Error) as refusal:
            refuse_if_off(request, setting)
        assert refusal.value.code == "InvalidRequest"
        assert f"Signature Version 2 in {form} is off" in refusal.value.message
        assert auth_failure_reason(refusal.value) == UNSUPPORTED  # as the metrics count it


# --- The AWS documentation's examples ----------------------------------------------------------

# (method, raw path, query, headers, host bucket, request time, published signature): the
# examples of "Signing and authenticating REST requests" (signature version 2), for the key
# DOC_AKID / DOC_SECRET. Their StringToSign covers path- and virtual-hosted style, a CNAME
# bucket, a sub-resource, parameters left unsigned, repeated and folded x-amz-* headers,
# x-amz-date replacing Date, and a path percent-encoded with mixed case.
DOC_EXAMPLES = [
    pytest.param(
        "GET",
        "/photos/puppy.jpg",
        [],
        {"host": "awsexamplebucket1.us-west-1.s3.amazonaws.com"},
        "awsexamplebucket1",
        "Tue, 27 Mar 2007 19:36:42 +0000",
        "qgk2+6Sv9/oM7G3qLEjTH1a1l1g=",
        id="object-get",
    ),
    pytest.param(
        "GET",
        "/photos/puppy.jpg",
        [],
        {"host": "johnsmith.s3.amazonaws.com"},
        "johnsmith",
        "Tue, 27 Mar 2007 19:36:42 +0000",
        "bWq2s1WEIj+Ydj0vQ697zp+IXMU=",
        id="object-get-johnsmith",
    ),
    pytest.param(
        "PUT",
        "/photos/puppy.jpg",
        [],
        {"host": "johnsmith.s3.amazonaws.com", "content-type": "image/jpeg"},
        "johnsmith",
        "Tue, 27 Mar 2007 21:15:45 +0000",
        "MyyxeRY7whkBe+bq8fHCL/2kKUg=",
        id="object-put",
    ),
    pytest.param(
        "GET",
        "/",
        [("prefix", "photos"), ("max-keys", "50"), ("marker", "puppy")],
        {"host": "johnsmith.s3.amazonaws.com", "user-agent": "Mozilla/5.0"},
        "johnsmith",
        "Tue, 27 Mar 2007 19:42:41 +0000",
        "htDYFYduRNen8P9ZfE/s9SuKy0U=",
        id="list",
    ),
    pytest.param(
        "GET",
        "/",
        [("acl", "")],
        {"host": "johnsmith.s3.amazonaws.com"},
        "johnsmith",
        "Tue, 27 Mar 2007 19:44:46 +0000",
        "c2WLPFtWHVgbEmeEG93a4cG37dM=",
        id="fetch-acl",
    ),
    pytest.param(
        "DELETE",
        "/johnsmith/photos/puppy.jpg",
        [],
        {"host": "s3.amazonaws.com", "x-amz-date": "Tue, 27 Mar 2007 21:20:26 +0000"},
        None,
        "Tue, 27 Mar 2007 21:20:27 +0000",
        "R4dJ53KECjStyBO5iTBJZ4XVOaI=",
        id="delete-x-amz-date",
    ),
    pytest.param(
        "PUT",
        "/db-backup.dat.gz",
        [],
        {
            "host": "static.johnsmith.net:8080",
            "x-amz-acl": "public-read",
            "content-type": "application/x-download",
            "content-md5": "4gJE4saaMU4BqNR0kLY+lw==",
            "x-amz-meta-reviewedby": "joe@johnsmith.net,jane@johnsmith.net",
            "x-amz-meta-filechecksum": "0x02661779",
            "x-amz-meta-checksumalgorithm": "crc32",
            "content-disposition": "attachment; filename=database.dat",
            "content-encoding": "gzip",
            "content-length": "5913339",
        },
        "static.johnsmith.net",
        "Tue, 27 Mar 2007 21:06:08 +0000",
        "ilyl83RwaSoYIEdixDQcA4OnAnc=",
        id="upload-cname-amz-headers",
    ),
    pytest.param(
        "GET",
        "/",
        [],
        {"host": "s3.amazonaws.com"},
        None,
        "Wed, 28 Mar 2007 01:29:59 +0000",
        "qGdzdERIC03wnaRNKh6OqZehG9s=",
        id="list-buckets",
    ),
    pytest.param(
        "GET",
        "/dictionary/fran%C3%A7ais/pr%c3%a9f%c3%a8re",
        [],
        {"host": "s3.amazonaws.com"},
        None,
        "Wed, 28 Mar 2007 01:49:49 +0000",
        "DNEZGsoieTZ92F3bUfSPQcbGmlM=",
        id="unicode-keys",
    ),
]


@pytest.mark.parametrize(
    ("method", "path", "query", "headers", "bucket", "date", "signature"), DOC_EXAMPLES
)
def test_documentation_examples(
    method: str,
    path: str,
    query: list[tuple[str, str]],
    headers: dict[str, str],
    bucket: str | None,
    date: str,
    signature: str,
) -> None:
    all_headers = {**headers, "date": date, "authorization": f"AWS {DOC_AKID}:{signature}"}
    request = SignedRequest(method, path, query, all_headers)
    now = datetime.strptime(date, "%a, %d %b %Y %H:%M:%S %z")
    assert is_sigv2(request)
    credentials = parse(request, now)
    assert credentials.access_key_id == DOC_AKID
    verify(credentials, request, DOC_SECRET, host_bucket=bucket)
    with pytest.raises(SigV4Error) as caught:
        verify(credentials, request, DOC_SECRET + "x", host_bucket=bucket)
    assert caught.value.code == "SignatureDoesNotMatch"


def test_documentation_query_string_example() -> None:
    """The documentation's presigned URL (virtual-hosted, Expires 1175139620)."""
    url = (
        "https://johnsmith.s3.amazonaws.com/photos/puppy.jpg?AWSAccessKeyId=AKIAIOSFODNN7EXAMPLE"
        "&Signature=NpgCjnDzrM%2BWFzoENXmpNDUsSn8%3D&Expires=1175139620"
    )
    request = url_request("GET", url)
    now = datetime.fromtimestamp(1175139620 - 60, UTC)
    credentials = parse(request, now)
    assert credentials.presigned
    assert credentials.expires == 1175139620
    verify(credentials, request, DOC_SECRET, host_bucket="johnsmith")
    with pytest.raises(SigV4Error) as caught:
        parse(request, now + timedelta(minutes=2))
    assert (caught.value.code, caught.value.message) == ("AccessDenied", "Request has expired")


# --- Presigned URLs (HmacV1QueryAuth) ----------------------------------------------------------


@pytest.mark.parametrize("key", ODD_KEYS)
@pytest.mark.parametrize("method", ["GET", "PUT", "HEAD", "DELETE"])
def test_presigned_url_is_accepted(method: str, key: str) -> None:
    signed = query_signed(method, ENDPOINT + key_path("bucket", key), expires=EXPIRES)
    assert "AWSAccessKeyId=" in signed.url
    credentials = check(url_request(method, signed.url))
    assert credentials.access_key_id == AKID
    assert credentials.presigned
    assert credentials.expires == EXPIRES


def test_presigned_url_with_response_overrides() -> None:
    """response-* values are signed decoded: the URL carries them percent-encoded."""
    overrides = {
        "response-content-type": "text/plain; charset=utf-8",
        "response-content-disposition": 'attachment; filename="ünï cødé+.txt"',
        "response-cache-control": "no-cache, max-age=0",
        "response-expires": "Thu, 01 Dec 1994 16:00:00 GMT",
    }
    url = f"{ENDPOINT}/bucket/key.txt?" + urlencode(overrides, quote_via=quote)
    signed = query_signed("GET", url, expires=EXPIRES)
    request = url_request("GET", signed.url)
    check(request)
    tampered = [
        (name, "text/html" if name == "response-content-type" else value)
        for name, value in request.query
    ]
    assert refused(dataclasses.replace(request, query=tampered)).code == "SignatureDoesNotMatch"


def test_presigned_put_with_hoisted_headers() -> None:
    """botocore moves Content-Type, Content-MD5 and x-amz-* into the URL; the signature holds
    whether the uploader repeats them as headers or not, but not with other values."""
    md5 = base64.b64encode(hashlib.md5(b"data").digest()).decode()
    signed = query_signed(
        "PUT",
        f"{ENDPOINT}/bucket/key",
        expires=EXPIRES,
        headers={"Content-Type": "text/plain", "Content-MD5": md5, "x-amz-meta-colour": "blue"},
    )
    query = dict(parse_qsl(urlsplit(signed.url).query))
    assert query["content-type"] == "text/plain"
    assert query["x-amz-meta-colour"] == "blue"
    check(url_request("PUT", signed.url))
    same = {"content-type": "text/plain", "content-md5": md5, "x-amz-meta-colour": "blue"}
    check(url_request("PUT", signed.url, same))
    for name, value in [
        ("content-type", "text/html"),
        ("content-md5", base64.b64encode(hashlib.md5(b"other").digest()).decode()),
        ("x-amz-meta-colour", "red"),
        ("x-amz-meta-extra", "unsigned"),
    ]:
        error = refused(url_request("PUT", signed.url, {name: value}))
        assert error.code == "SignatureDoesNotMatch", name


def test_presigned_url_with_subresources() -> None:
    url = f"{ENDPOINT}/bucket/key?uploadId=" + quote("id/with+odd=chars", safe="")
    url += "&partNumber=7"
    signed = query_signed("PUT", url, expires=EXPIRES)
    request = url_request("PUT", signed.url)
    check(request)
    other_part = [(n, "8" if n == "partNumber" else v) for n, v in request.query]
    assert refused(dataclasses.replace(request, query=other_part)).code == "SignatureDoesNotMatch"


def test_presigned_url_expiry() -> None:
    signed = query_signed("GET", f"{ENDPOINT}/bucket/key", expires=EXPIRES)
    request = url_request("GET", signed.url)
    expires_at = datetime.fromtimestamp(EXPIRES, UTC)
    check(request, expires_at)  # valid up to and including its Expires second
    check(request, expires_at - timedelta(days=400))  # SigV2 has no maximum validity
    error = refused(request, expires_at + timedelta(seconds=1))
    assert (error.code, error.message) == ("AccessDenied", "Request has expired")
    assert error.details["Expires"] == expires_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert "ServerTime" in error.details


def test_presigned_url_naive_now_is_utc() -> None:
    signed = query_signed("GET", f"{ENDPOINT}/bucket/key", expires=EXPIRES)
    request = url_request("GET", signed.url)
    later = datetime.fromtimestamp(EXPIRES + 1, UTC).replace(tzinfo=None)
    assert refused(request, later).message == "Request has expired"


def test_presigned_url_unencoded_plus_in_signature() -> None:
    """A client that leaves '+' raw in the Signature gets it back: base64 has no spaces."""
    for secret in (f"s{i}" for i in range(100)):
        signed = query_signed("GET", f"{ENDPOINT}/bucket/key", expires=EXPIRES, secret=secret)
        signature = dict(parse_qsl(urlsplit(signed.url).query))["Signature"]
        if "+" in signature:
            break
    else:
        pytest.fail("no signature with a '+' among 100 secrets")
    raw = signed.url.replace(quote(signature, safe=""), signature)
    request = url_request("GET", raw)
    verify(parse(request, T0), request, secret)


@pytest.mark.parametrize(
    "tamper",
    [
        pytest.param(lambda r: dataclasses.replace(r, method="PUT"), id="method"),
        pytest.param(lambda r: dataclasses.replace(r, raw_path="/bucket/other"), id="path"),
        pytest.param(lambda r: dataclasses.replace(r, raw_path="/bucket/KEY"), id="path-case"),
        pytest.param(
            lambda r: dataclasses.replace(r, query=[*r.query, ("versionId", "v1")]),
            id="added-subresource",
        ),
        pytest.param(
            lambda r: dataclasses.replace(
                r, query=[(n, str(EXPIRES + 60) if n == "Expires" else v) for n, v in r.query]
            ),
            id="expires",
        ),
        pytest.param(
            lambda r: dataclasses.replace(r, headers={**r.headers, "x-amz-acl": "public-read"}),
            id="added-amz-header",
        ),
        pytest.param(
            lambda r: dataclasses.replace(r, headers={**r.headers, "content-type": "a/b"}),
            id="added-content-type",
        ),
    ],
)
def test_tampered_presigned_url_is_refused(tamper: Callable[[SignedRequest], Any]) -> None:
    signed = query_signed("GET", f"{ENDPOINT}/bucket/key", expires=EXPIRES)
    request = url_request("GET", signed.url)
    check(request)
    error = refused(tamper(request))
    assert error.code == "SignatureDoesNotMatch"
    assert error.details["SignatureProvided"]
    assert error.details["StringToSign"].startswith(tamper(request).method + "\n")


def test_wrong_secret_is_refused() -> None:
    signed = query_signed("GET", f"{ENDPOINT}/bucket/key", expires=EXPIRES, secret="other")
    error = refused(url_request("GET", signed.url))
    assert error.code == "SignatureDoesNotMatch"
    assert error.details["AWSAccessKeyId"] == AKID
    to_sign = error.details["StringToSign"]
    assert error.details["StringToSignBytes"] == " ".join(f"{b:02x}" for b in to_sign.encode())


def test_parameters_outside_the_resource_are_not_signed() -> None:
    """SigV2 signs only sub-resources: other parameters may be appended (as on S3)."""
    signed = query_signed("GET", f"{ENDPOINT}/bucket/key", expires=EXPIRES)
    check(url_request("GET", signed.url + "&prefix=x&list-type=2&x-id=GetObject"))


# --- Header authentication (HmacV1Auth) --------------------------------------------------------


@pytest.mark.parametrize("key", ODD_KEYS)
def test_header_signed_get(key: str) -> None:
    signed = header_signed("GET", ENDPOINT + key_path("bucket", key))
    credentials = check(to_signed_request(signed))
    assert credentials.access_key_id == AKID
    assert not credentials.presigned
    assert credentials.request_time == T0


def test_header_signed_put_with_metadata_md5_and_type() -> None:
    body = b"hello, world"
    md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
    signed = header_signed(
        "PUT",
        f"{ENDPOINT}/bucket/docs/report.txt",
        body=body,
        headers=[
            ("Content-MD5", md5),
            ("Content-Type", "text/plain; charset=utf-8"),
            ("X-Amz-Meta-Author", "  Ada Lovelace  "),
            ("x-amz-meta-reviewer", "joe"),
            ("x-amz-meta-reviewer", "jane"),  # repeated: signed joined by ','
            ("X-Amz-Storage-Class", "STANDARD"),
            ("Cache-Control", "no-cache"),  # not signed by SigV2
        ],
    )
    request = to_signed_request(signed)
    assert request.headers["x-amz-meta-reviewer"] == "joe,jane"
    check(request)
    check(dataclasses.replace(request, headers={**request.headers, "cache-control": "max-age=9"}))
    for name, value in [
        ("content-md5", base64.b64encode(hashlib.md5(b"other").digest()).decode()),
        ("content-type", "text/html"),
        ("x-amz-meta-author", "Charles Babbage"),
        ("x-amz-meta-reviewer", "jane,joe"),
        ("x-amz-meta-new", "value"),
    ]:
        tampered = dataclasses.replace(request, headers={**request.headers, name: value})
        assert refused(tampered).code == "SignatureDoesNotMatch", name
    for name in ("content-md5", "content-type", "x-amz-storage-class"):
        headers = {k: v for k, v in request.headers.items() if k != name}
        assert refused(dataclasses.replace(request, headers=headers)).code == (
            "SignatureDoesNotMatch"
        ), name


@pytest.mark.parametrize(
    ("method", "query"),
    [
        ("POST", "uploads"),
        ("GET", "uploads"),
        ("PUT", "uploadId=2~abc%2Fdef%2B%3D&partNumber=1"),
        ("PUT", "partNumber=1&uploadId=2~abc"),
        ("POST", "uploadId=2~abc"),
        ("DELETE", "uploadId=2~abc"),
        ("POST", "delete"),
        ("GET", "acl"),
        ("GET", "versionId=3%2Fx&response-content-type=text%2Fplain"),
        ("GET", "location"),
        ("GET", "versioning"),
        ("GET", "list-type=2&prefix=a%20b&delimiter=%2F"),
    ],
)
def test_header_signed_subresources(method: str, query: str) -> None:
    path = "/bucket" if query.split("=")[0] in ("delete", "location", "versioning") else "/b/k"
    signed = header_signed(method, f"{ENDPOINT}{path}?{query}")
    request = to_signed_request(signed)
    check(request)
    for name, _ in request.query:
        if name in SUBRESOURCES:
            dropped = [(n, v) for n, v in request.query if n != name]
            tampered = dataclasses.replace(request, query=dropped)
            assert refused(tampered).code == "SignatureDoesNotMatch", name


def test_header_signed_virtual_hosted_style() -> None:
    """botocore signs a virtual-hosted request's resource with the bucket (its auth_path)."""
    path = key_path("bucket", "some key/ü")
    signed = header_signed(
        "GET", "http://bucket.s3.test:9000" + path.removeprefix("/bucket"), auth_path=path
    )
    request = to_signed_request(signed)
    check(request, host_bucket="bucket")
    assert refused(request).code == "SignatureDoesNotMatch"
    assert refused(request, host_bucket="other").code == "SignatureDoesNotMatch"


def test_virtual_hosted_bucket_root() -> None:
    signed = header_signed("GET", "http://bucket.s3.test:9000/?uploads", auth_path="/bucket/")
    check(to_signed_request(signed), host_bucket="bucket")


@pytest.mark.parametrize("auth_path", [None, "/bucket/"])
def test_bucket_resource_with_or_without_trailing_slash(auth_path: str | None) -> None:
    """botocore signs a path-style "/bucket" as "/bucket/" (as S3 wants); a client signing the
    path as sent is accepted too."""
    signed = header_signed("POST", f"{ENDPOINT}/bucket?delete", auth_path=auth_path)
    request = to_signed_request(signed)
    assert request.raw_path == "/bucket"
    check(request)
    assert refused(dataclasses.replace(request, raw_path="/bucket2")).code == (
        "SignatureDoesNotMatch"
    )


def test_path_is_signed_as_sent() -> None:
    """Unlike SigV4, the path is not re-encoded: '~' sent as %7E is signed as %7E."""
    signed = header_signed("GET", f"{ENDPOINT}/bucket/a%7Eb%20c")
    request = to_signed_request(signed)
    assert request.raw_path == "/bucket/a%7Eb%20c"
    check(request)
    assert refused(dataclasses.replace(request, raw_path="/bucket/a~b%20c")).code == (
        "SignatureDoesNotMatch"
    )


def test_folded_and_padded_amz_headers() -> None:
    """Values are trimmed and a folded value is unfolded to single spaces, as documented."""
    to_sign = (
        "PUT\n\n\n"
        + formatdate(T0.timestamp(), usegmt=True)
        + "\nx-amz-meta-long:first part second part\nx-amz-meta-pad:x\n/bucket/key"
    )
    signature = base64.b64encode(_hmac_sha1(SECRET, to_sign)).decode()
    headers = {
        "date": formatdate(T0.timestamp(), usegmt=True),
        "authorization": f"AWS {AKID}:{signature}",
        "x-amz-meta-long": "first part\r\n   second part",
        "x-amz-meta-pad": "  x\t",
    }
    check(SignedRequest("PUT", "/bucket/key", [], headers))


def test_long_whitespace_runs_are_cheap() -> None:
    padding = " " * 200_000
    headers = {
        "date": formatdate(T0.timestamp(), usegmt=True),
        "authorization": f"AWS {AKID}:abc",
        "x-amz-meta-a": f"{padding}\n{padding}x{padding}",
    }
    assert refused(SignedRequest("GET", "/b/k", [], headers)).code == "SignatureDoesNotMatch"


def test_x_amz_date_replaces_date() -> None:
    """With x-amz-date, the Date line of the StringToSign is empty; skew is checked on it."""
    amz_date = formatdate(T0.timestamp(), usegmt=True)
    request = SignedRequest(
        "GET",
        "/bucket/key",
        [],
        {"x-amz-date": amz_date, "date": "Thu, 01 Jan 1970 00:00:00 GMT"},
    )
    to_sign = f"GET\n\n\n\nx-amz-date:{amz_date}\n/bucket/key"
    signature = base64.b64encode(_hmac_sha1(SECRET, to_sign)).decode()
    signed = dataclasses.replace(
        request, headers={**request.headers, "authorization": f"AWS {AKID}:{signature}"}
    )
    credentials = check(signed)
    assert credentials.date_line == ""
    assert credentials.request_time == T0


def test_iso_x_amz_date() -> None:
    to_sign = "GET\n\n\n\nx-amz-date:20250101T120000Z\n/bucket/key"
    signature = base64.b64encode(_hmac_sha1(SECRET, to_sign)).decode()
    headers = {"x-amz-date": "20250101T120000Z", "authorization": f"AWS {AKID}:{signature}"}
    assert check(SignedRequest("GET", "/bucket/key", [], headers)).request_time == T0


def _hmac_sha1(secret: str, message: str) -> bytes:
    return hmac.new(secret.encode(), message.encode(), hashlib.sha1).digest()


@pytest.mark.parametrize("offset", [timedelta(minutes=-14), timedelta(0), timedelta(minutes=14)])
def test_clock_skew_within_bounds(offset: timedelta) -> None:
    signed = header_signed("GET", f"{ENDPOINT}/bucket/key", when=T0 + offset)
    check(to_signed_request(signed))


@pytest.mark.parametrize("offset", [timedelta(minutes=-16), timedelta(minutes=16)])
def test_clock_skew_too_large(offset: timedelta) -> None:
    signed = header_signed("GET", f"{ENDPOINT}/bucket/key", when=T0 + offset)
    error = refused(to_signed_request(signed))
    assert error.code == "RequestTimeTooSkewed"
    assert error.details["MaxAllowedSkewMilliseconds"] == "900000"


def test_tampered_date_is_refused() -> None:
    signed = header_signed("GET", f"{ENDPOINT}/bucket/key")
    request = to_signed_request(signed)
    later = formatdate((T0 + timedelta(seconds=1)).timestamp(), usegmt=True)
    tampered = dataclasses.replace(request, headers={**request.headers, "date": later})
    assert refused(tampered).code == "SignatureDoesNotMatch"


# --- boto3 end to end --------------------------------------------------------------------------


@pytest.mark.parametrize("key", ODD_KEYS)
def test_boto3_default_presigned_get(key: str) -> None:
    """A default boto3 client with a custom endpoint in us-east-1 presigns with SigV2."""
    client = boto3_client()
    url = client.generate_presigned_url(
        "get_object",
        Params={"Bucket": "bucket", "Key": key, "ResponseContentType": "text/plain; x=1"},
        ExpiresIn=600,
    )
    query = dict(parse_qsl(urlsplit(url).query))
    assert {"AWSAccessKeyId", "Signature", "Expires"} <= query.keys()
    assert not any(name.startswith("X-Amz-") for name in query)
    now = datetime.now(UTC)
    credentials = check(url_request("GET", url), now)
    assert credentials.expires == int(query["Expires"])
    expired = datetime.fromtimestamp(int(query["Expires"]) + 1, UTC)
    assert refused(url_request("GET", url), expired).code == "AccessDenied"


def test_boto3_default_presigned_put() -> None:
    client = boto3_client()
    url = client.generate_presigned_url(
        "put_object",
        Params={
            "Bucket": "bucket",
            "Key": "uploads/ünï code+file~1.bin",
            "ContentType": "application/octet-stream",
            "Metadata": {"origin": "test"},
        },
        ExpiresIn=3600,
    )
    assert "AWSAccessKeyId=" in url and "Signature=" in url
    now = datetime.now(UTC)
    headers = {"content-type": "application/octet-stream", "x-amz-meta-origin": "test"}
    check(url_request("PUT", url, headers), now)
    check(url_request("PUT", url), now)
    assert refused(url_request("PUT", url, {"content-type": "text/html"}), now).code == (
        "SignatureDoesNotMatch"
    )
    assert refused(url_request("GET", url), now).code == "SignatureDoesNotMatch"


def test_boto3_presigned_multipart_part() -> None:
    client = boto3_client()
    url = client.generate_presigned_url(
        "upload_part",
        Params={"Bucket": "bucket", "Key": "k", "UploadId": "2~x/y+z=", "PartNumber": 3},
    )
    check(url_request("PUT", url), datetime.now(UTC))


CAPTURED_CALLS = [
    pytest.param(
        lambda c: c.put_object(
            Bucket="bucket",
            Key="a b/ü+~=.txt",
            Body=b"hi",
            Metadata={"x": "y", "Mixed-Case": " padded "},
            ContentType="text/plain",
            ContentMD5=base64.b64encode(hashlib.md5(b"hi").digest()).decode(),
        ),
        id="put_object",
    ),
    pytest.param(lambda c: c.get_object(Bucket="bucket", Key="k"), id="get_object"),
    pytest.param(
        lambda c: c.get_object(
            Bucket="bucket", Key="k", ResponseContentDisposition='attachment; filename="a b"'
        ),
        id="get_object-override",
    ),
    pytest.param(lambda c: c.head_object(Bucket="bucket", Key="k"), id="head_object"),
    pytest.param(
        lambda c: c.create_multipart_upload(Bucket="bucket", Key="k"), id="create_multipart"
    ),
    pytest.param(
        lambda c: c.upload_part(Bucket="bucket", Key="k", UploadId="u/+=", PartNumber=1, Body=b"x"),
        id="upload_part",
    ),
    pytest.param(
        lambda c: c.complete_multipart_upload(
            Bucket="bucket",
            Key="k",
            UploadId="u",
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"e"'}]},
        ),
        id="complete_multipart",
    ),
    pytest.param(lambda c: c.list_parts(Bucket="bucket", Key="k", UploadId="u"), id="list_parts"),
    pytest.param(
        lambda c: c.delete_objects(Bucket="bucket", Delete={"Objects": [{"Key": "k"}]}),
        id="delete_objects",
    ),
    pytest.param(lambda c: c.list_objects_v2(Bucket="bucket", Prefix="p q/"), id="list_v2"),
    pytest.param(lambda c: c.list_buckets(), id="list_buckets"),
    pytest.param(lambda c: c.delete_object(Bucket="bucket", Key="k"), id="delete_object"),
]


@pytest.mark.parametrize("call", CAPTURED_CALLS)
def test_boto3_header_signed_requests(call: Callable[[Any], Any]) -> None:
    prepared = boto3_capture(call)
    request = to_signed_request(prepared)
    assert request.headers["authorization"].startswith(f"AWS {AKID}:")
    credentials = check(request, datetime.now(UTC))
    assert credentials.access_key_id == AKID
    tampered = dataclasses.replace(request, method="PATCH")
    assert refused(tampered, datetime.now(UTC)).code == "SignatureDoesNotMatch"


# --- Refusals of malformed or unacceptable requests --------------------------------------------


def _query(**params: str) -> list[tuple[str, str]]:
    return list(params.items())


@pytest.mark.parametrize(
    ("query", "headers", "code"),
    [
        ([], {}, "AccessDenied"),
        (_query(AWSAccessKeyId=AKID, Signature="abc"), {}, "AccessDenied"),
        (_query(AWSAccessKeyId=AKID, Expires=str(EXPIRES)), {}, "AccessDenied"),
        (_query(Signature="abc", Expires=str(EXPIRES)), {}, "AccessDenied"),
        (_query(AWSAccessKeyId="", Signature="abc", Expires=str(EXPIRES)), {}, "AccessDenied"),
        (_query(AWSAccessKeyId=AKID, Signature="abc", Expires="soon"), {}, "AccessDenied"),
        (_query(AWSAccessKeyId=AKID, Signature="abc", Expires="-5"), {}, "AccessDenied"),
        (_query(AWSAccessKeyId=AKID, Signature="abc", Expires="1" * 30), {}, "AccessDenied"),
        (
            [
                ("AWSAccessKeyId", AKID),
                ("AWSAccessKeyId", "B"),
                ("Signature", "a"),
                ("Expires", str(EXPIRES)),
            ],
            {},
            "InvalidArgument",
        ),
        (
            _query(AWSAccessKeyId=AKID, Signature="abc", Expires=str(EXPIRES)),
            {"authorization": f"AWS {AKID}:abc"},
            "InvalidArgument",
        ),
        (
            _query(AWSAccessKeyId=AKID, Signature="abc", Expires=str(EXPIRES)),
            {"x-amz-security-token": "token"},
            "InvalidArgument",
        ),
        (
            [
                ("AWSAccessKeyId", AKID),
                ("Signature", "abc"),
                ("Expires", str(EXPIRES)),
                ("x-amz-security-token", "token"),
            ],
            {},
            "InvalidArgument",
        ),
        (_query(**{"X-Amz-Signature": "ab", "Signature": "a"}), {}, "InvalidArgument"),
        ([], {"authorization": "AWS"}, "InvalidArgument"),
        ([], {"authorization": "AWS nocolon"}, "InvalidArgument"),
        ([], {"authorization": f"AWS {AKID}:"}, "InvalidArgument"),
        ([], {"authorization": "AWS :signature"}, "InvalidArgument"),
        ([], {"authorization": "AWS4-HMAC-SHA256 Credential=x"}, "InvalidArgument"),
        ([], {"authorization": f"AWS {AKID}:abc"}, "AccessDenied"),  # no date at all
        ([], {"authorization": f"AWS {AKID}:abc", "date": "yesterday"}, "AccessDenied"),
        (
            [],
            {"authorization": f"AWS {AKID}:abc", "date": formatdate(T0.timestamp())}
            | {"x-amz-date": "not a date"},
            "AccessDenied",
        ),
        (
            [],
            {"authorization": f"AWS {AKID}:abc", "x-amz-date": "20251399T250000Z"},
            "AccessDenied",
        ),
        (
            [],
            {"authorization": f"AWS {AKID}:abc", "date": "Mon, 01 Jan 2024 00:00:00 GMT"},
            "RequestTimeTooSkewed",
        ),
    ],
)
def test_malformed_requests_are_refused(
    query: list[tuple[str, str]], headers: dict[str, str], code: str
) -> None:
    with pytest.raises(SigV4Error) as caught:
        parse(SignedRequest("GET", "/bucket/key", query, headers), T0)
    assert caught.value.code == code


def test_signature_with_non_ascii_is_a_mismatch() -> None:
    headers = {"authorization": f"AWS {AKID}:sïgnätüre", "date": formatdate(T0.timestamp())}
    assert refused(SignedRequest("GET", "/bucket/key", [], headers)).code == (
        "SignatureDoesNotMatch"
    )


_TEXT = st.text(st.characters(codec="utf-8") | st.sampled_from(["\udcff", "\ud800"]), max_size=40)
_NAMES = (
    st.sampled_from(
        [
            "AWSAccessKeyId",
            "Signature",
            "Expires",
            "X-Amz-Signature",
            "uploads",
            "uploadId",
            "partNumber",
            "response-content-type",
            "x-amz-meta-a",
            "content-type",
            "prefix",
        ]
    )
    | _TEXT
)
_HEADER_NAMES = st.sampled_from(
    [
        "authorization",
        "date",
        "x-amz-date",
        "content-type",
        "content-md5",
        "x-amz-meta-a",
        "x-amz-security-token",
        "host",
    ]
)
_HEADER_VALUES = (
    _TEXT
    | _TEXT.map(lambda text: "AWS " + text)
    | st.builds(lambda a, b: f"AWS {a}:{b}", _TEXT, _TEXT)
    | st.datetimes().map(lambda when: formatdate(when.timestamp() if when.year > 1 else 0))
    | st.integers(-(10**20), 10**20).map(str)
)


@settings(max_examples=400, deadline=None)
@given(
    method=st.sampled_from(["GET", "PUT", "POST", "DELETE", "HEAD"]) | _TEXT,
    raw_path=_TEXT,
    query=st.lists(st.tuples(_NAMES, _TEXT | st.integers(0, 2**70).map(str)), max_size=6),
    headers=st.dictionaries(_HEADER_NAMES, _HEADER_VALUES, max_size=6),
    now=st.datetimes(
        min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
    ),
    host_bucket=st.none() | _TEXT,
)
def test_malformed_input_raises_only_sigv4_error(
    method: str,
    raw_path: str,
    query: list[tuple[str, str]],
    headers: dict[str, str],
    now: datetime,
    host_bucket: str | None,
) -> None:
    request = SignedRequest(method, raw_path, query, headers)
    is_sigv2(request)
    try:
        credentials = parse(request, now)
        verify(credentials, request, SECRET, host_bucket=host_bucket)
    except SigV4Error:
        pass


@settings(max_examples=200, deadline=None)
@given(
    raw_path=_TEXT,
    query=st.lists(st.tuples(_NAMES, _TEXT), max_size=6),
    amz=st.dictionaries(st.sampled_from(["x-amz-meta-a", "x-amz-acl", "content-type"]), _TEXT),
    signature=_TEXT,
    presigned=st.booleans(),
)
def test_well_formed_claims_with_odd_content_fail_only_as_mismatch(
    raw_path: str,
    query: list[tuple[str, str]],
    amz: dict[str, str],
    signature: str,
    presigned: bool,
) -> None:
    """Requests that get past `parse`, carrying arbitrary text (surrogates included) where the
    StringToSign is built: verify accepts or says SignatureDoesNotMatch, nothing else."""
    reserved = {"AWSAccessKeyId", "Signature", "Expires", "X-Amz-Signature", "X-Amz-Algorithm"}
    reserved |= {"X-Amz-Credential"}
    query = [(n, v) for n, v in query if n not in reserved and n.lower() != "x-amz-security-token"]
    headers = dict(amz)
    signature = signature.replace(":", "").strip()  # what the header form can carry
    if presigned:
        query += [("AWSAccessKeyId", AKID), ("Signature", signature or "x")]
        query.append(("Expires", str(EXPIRES)))
    else:
        headers["date"] = formatdate(T0.timestamp(), usegmt=True)
        headers["authorization"] = f"AWS {AKID}:{signature or 'x'}"
    request = SignedRequest("GET", raw_path, query, headers)
    assert is_sigv2(request)
    credentials = parse(request, T0)
    try:
        verify(credentials, request, SECRET)
    except SigV4Error as error:
        assert error.code == "SignatureDoesNotMatch"


_KEYS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=30)
_VALUES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=20)


@settings(max_examples=150, deadline=None)
@given(
    key=_KEYS,
    subresources=st.dictionaries(st.sampled_from(sorted(SUBRESOURCES)), _VALUES, max_size=4),
    method=st.sampled_from(["GET", "PUT", "HEAD", "DELETE", "POST"]),
)
def test_botocore_presigned_urls_round_trip(
    key: str, subresources: dict[str, str], method: str
) -> None:
    """Any key and any sub-resource values, as botocore presigns them, verify."""
    url = ENDPOINT + key_path("bucket", key)
    if subresources:
        url += "?" + "&".join(
            f"{name}={quote(value, safe='')}" if value else name
            for name, value in subresources.items()
        )
    signed = query_signed(method, url, expires=EXPIRES)
    check(url_request(method, signed.url))


_HEADER_TEXT = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20)


@settings(max_examples=150, deadline=None)
@given(
    key=_KEYS,
    metadata=st.dictionaries(
        st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=10), _HEADER_TEXT
    ),
    content_type=st.none() | _HEADER_TEXT,
)
def test_botocore_header_signed_requests_round_trip(
    key: str, metadata: dict[str, str], content_type: str | None
) -> None:
    """Any key and any printable x-amz-meta-* values, as HmacV1Auth signs them, verify."""
    headers = {f"x-amz-meta-{name}": value for name, value in metadata.items()}
    if content_type is not None:
        headers["Content-Type"] = content_type
    signed = header_signed("PUT", ENDPOINT + key_path("bucket", key), headers=headers)
    check(to_signed_request(signed))
