"""SigV4 verification, held to real signers and to the AWS documentation's own examples.

Requests are signed by botocore (the signer behind boto3 and the aws cli), either directly
(`S3SigV4Auth`, `S3SigV4QueryAuth`) or through a boto3 client whose requests are captured just
before they would be sent, so the path and query encoding is the real clients' too. The
examples from the S3 API reference ("Signature Calculations for the Authorization Header",
"Authenticating Requests: Using Query Parameters", chunked uploads and trailing headers) check
the canonicalisation and the chunk signature chain against values we did not compute ourselves.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import zlib
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock
from urllib.parse import parse_qsl, urlsplit

import boto3
import botocore.auth
import pytest
from botocore.awsrequest import AWSPreparedRequest, AWSRequest, AWSResponse
from botocore.config import Config
from botocore.credentials import Credentials as BotoCredentials
from botocore.httpchecksum import AwsChunkedWrapper, Crc32Checksum
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.s3.sigv4 import (
    MAX_CLOCK_SKEW,
    PayloadMode,
    SignedRequest,
    SigV4Error,
    Verified,
    check_sha256,
    parse,
    verify,
)

try:
    import botocore.crt.auth

    _SIGNER_MODULES: tuple[Any, ...] = (botocore.auth, botocore.crt.auth)
except ImportError:  # awscrt is not installed: botocore signs in Python only
    _SIGNER_MODULES = (botocore.auth,)

AKID = "AKIDSHOALTEST0000001"
SECRET = "shoal/secret+key=with/odd+chars"
T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)
ENDPOINT = "https://s3.test:9000"

# The AWS documentation's example credentials and request time.
DOC_AKID = "AKIAIOSFODNN7EXAMPLE"
DOC_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
DOC_NOW = datetime(2013, 5, 24, 0, 0, 30, tzinfo=UTC)
DOC_SCOPE = f"{DOC_AKID}/20130524/us-east-1/s3/aws4_request"
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


# --- Helpers -----------------------------------------------------------------------------------


@contextmanager
def botocore_time(when: datetime = T0) -> Iterator[None]:
    """Make botocore sign at ``when`` instead of the wall clock.

    With awscrt installed, boto3 clients sign with botocore's CRT signers (as the aws cli v2
    does), which read the clock through their own module: both are patched.
    """

    def fake_now(remove_tzinfo: bool = True) -> datetime:
        aware = when.astimezone(UTC)
        return aware.replace(tzinfo=None) if remove_tzinfo else aware

    with ExitStack() as stack:
        for module in _SIGNER_MODULES:
            stack.enter_context(mock.patch.object(module, "get_current_datetime", fake_now))
        yield


def to_signed_request(prepared: AWSPreparedRequest | AWSRequest) -> SignedRequest:
    """What the gateway would hand over for this request."""
    url = urlsplit(prepared.url)
    headers = {name.lower(): _text(value) for name, value in prepared.headers.items()}
    headers.setdefault("host", url.netloc)
    query = parse_qsl(url.query, keep_blank_values=True)
    return SignedRequest(prepared.method, url.path, query, headers)


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value


def body_bytes(prepared: AWSPreparedRequest | AWSRequest) -> bytes:
    body = prepared.body
    if body is None:
        return b""
    if isinstance(body, bytes | bytearray):
        return bytes(body)
    if isinstance(body, str):
        return body.encode()
    return body.read()


def header_signed(
    method: str,
    url: str,
    *,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    secret: str = SECRET,
    unsigned_payload: bool = False,
    when: datetime = T0,
    context: dict[str, Any] | None = None,
) -> AWSRequest:
    """A request signed by botocore's S3SigV4Auth (Authorization header)."""
    request = AWSRequest(method=method, url=url, data=body, headers=dict(headers or {}))
    request.context.update(context or {})
    if unsigned_payload:
        request.context["client_config"] = Config(s3={"payload_signing_enabled": False})
    auth = botocore.auth.S3SigV4Auth(BotoCredentials(AKID, secret), "s3", "eu-central-1")
    with botocore_time(when):
        auth.add_auth(request)
    return request


def presigned(method: str, url: str, *, expires: int = 3600, when: datetime = T0) -> AWSRequest:
    """A request presigned by botocore's S3SigV4QueryAuth."""
    request = AWSRequest(method=method, url=url)
    auth = botocore.auth.S3SigV4QueryAuth(
        BotoCredentials(AKID, SECRET), "s3", "us-east-1", expires=expires
    )
    with botocore_time(when):
        auth.add_auth(request)
    return request


class _EmptyBody:
    def stream(self, **_: Any) -> Iterator[bytes]:
        return iter(())

    def read(self, *_: Any, **__: Any) -> bytes:
        return b""


def boto3_capture(call: Callable[[Any], Any], *, when: datetime = T0) -> AWSPreparedRequest:
    """The request a boto3 S3 client makes for ``call(client)``, captured instead of sent."""
    session = boto3.session.Session(
        aws_access_key_id=AKID, aws_secret_access_key=SECRET, region_name="us-east-1"
    )
    config = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1})
    client = session.client("s3", endpoint_url=ENDPOINT, config=config)
    captured: list[AWSPreparedRequest] = []

    def before_send(request: AWSPreparedRequest, **_: Any) -> AWSResponse:
        captured.append(request)
        return AWSResponse(request.url, 200, {}, _EmptyBody())

    client.meta.events.register("before-send.s3", before_send)
    with botocore_time(when):
        call(client)
    assert len(captured) == 1
    return captured[0]


def boto3_presigned_url(method: str, params: dict[str, str], *, expires: int = 900) -> str:
    session = boto3.session.Session(
        aws_access_key_id=AKID, aws_secret_access_key=SECRET, region_name="us-east-1"
    )
    config = Config(s3={"addressing_style": "path"}, signature_version="s3v4")
    client = session.client("s3", endpoint_url=ENDPOINT, config=config)
    with botocore_time():
        return client.generate_presigned_url(method, Params=params, ExpiresIn=expires)


def url_request(method: str, url: str, headers: dict[str, str] | None = None) -> SignedRequest:
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    return SignedRequest(method, parts.path, query, {"host": parts.netloc, **(headers or {})})


async def _pieces(data: bytes, cuts: Sequence[int]) -> AsyncIterator[bytes]:
    start = 0
    for cut in sorted(cuts):
        yield data[start:cut]
        start = cut
    yield data[start:]


def read_body(verified: Verified, data: bytes, cuts: Sequence[int] = ()) -> bytes:
    """The decoded body, fed to the decoder split at ``cuts``."""

    async def run() -> bytes:
        return b"".join([piece async for piece in verified.body(_pieces(data, cuts))])

    return asyncio.run(run())


def accepted(request: SignedRequest, now: datetime = T0, secret: str = SECRET) -> Verified:
    return verify(parse(request, now), request, secret)


def refused(request: SignedRequest, now: datetime = T0, secret: str = SECRET) -> SigV4Error:
    with pytest.raises(SigV4Error) as caught:
        accepted(request, now, secret)
    return caught.value


def replace_header(request: SignedRequest, **headers: str) -> SignedRequest:
    return SignedRequest(
        request.method, request.raw_path, request.query, {**request.headers, **headers}
    )


# --- The AWS documentation's examples ----------------------------------------------------------


def test_aws_doc_get_object_example() -> None:
    """S3 API reference, "Example: GET Object" (header auth, empty payload hash)."""
    request = SignedRequest(
        "GET",
        "/test.txt",
        [],
        {
            "host": "examplebucket.s3.amazonaws.com",
            "range": "bytes=0-9",
            "x-amz-content-sha256": EMPTY_SHA256,
            "x-amz-date": "20130524T000000Z",
            "authorization": f"AWS4-HMAC-SHA256 Credential={DOC_SCOPE},"
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41",
        },
    )
    verified = accepted(request, DOC_NOW, DOC_SECRET)
    assert verified.access_key_id == DOC_AKID
    assert read_body(verified, b"") == b""

    error = refused(replace_header(request, range="bytes=0-10"), DOC_NOW, DOC_SECRET)
    assert error.code == "SignatureDoesNotMatch"
    # The documentation's own intermediate value: the string to sign.
    unchanged = refused(request, DOC_NOW, "not the secret")
    assert unchanged.details["StringToSign"].endswith(
        "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972"
    )


def test_aws_doc_presigned_example() -> None:
    """S3 API reference, query-string authentication example (GET /test.txt, one day)."""
    query = [
        ("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),
        ("X-Amz-Credential", DOC_SCOPE),
        ("X-Amz-Date", "20130524T000000Z"),
        ("X-Amz-Expires", "86400"),
        ("X-Amz-SignedHeaders", "host"),
        ("X-Amz-Signature", "aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"),
    ]
    request = SignedRequest("GET", "/test.txt", query, {"host": "examplebucket.s3.amazonaws.com"})
    credentials = parse(request, DOC_NOW)
    assert credentials.presigned and credentials.mode is PayloadMode.UNSIGNED
    assert credentials.expires == datetime(2013, 5, 25, tzinfo=UTC)
    verify(credentials, request, DOC_SECRET)


DOC_DATA = b"a" * 66560
DOC_CHUNK_SIGNATURES = (
    "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
    "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
    "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
)


def doc_chunked_body(signatures: Sequence[str], after_last: bytes = b"\r\n") -> bytes:
    return (
        f"10000;chunk-signature={signatures[0]}\r\n".encode()
        + DOC_DATA[:65536]
        + f"\r\n400;chunk-signature={signatures[1]}\r\n".encode()
        + DOC_DATA[65536:]
        + f"\r\n0;chunk-signature={signatures[2]}\r\n".encode()
        + after_last
    )


def doc_chunked_request() -> SignedRequest:
    """ "Signature Calculations ... Transferring Payload in Multiple Chunks": Example PUT Object."""
    return SignedRequest(
        "PUT",
        "/examplebucket/chunkObject.txt",
        [],
        {
            "host": "s3.amazonaws.com",
            "x-amz-date": "20130524T000000Z",
            "x-amz-storage-class": "REDUCED_REDUNDANCY",
            "authorization": f"AWS4-HMAC-SHA256 Credential={DOC_SCOPE},"
            "SignedHeaders=content-encoding;content-length;host;x-amz-content-sha256;"
            "x-amz-date;x-amz-decoded-content-length;x-amz-storage-class,"
            "Signature=4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9",
            "x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
            "content-encoding": "aws-chunked",
            "x-amz-decoded-content-length": "66560",
            "content-length": "66824",
        },
    )


@pytest.mark.parametrize(
    "cuts", [(), (1, 2, 3, 87, 88, 65623, 65624, 65626), tuple(range(0, 66824, 997))]
)
def test_aws_doc_chunked_upload_example(cuts: tuple[int, ...]) -> None:
    verified = accepted(doc_chunked_request(), DOC_NOW, DOC_SECRET)
    assert verified.credentials.mode is PayloadMode.STREAMING_SIGNED
    assert verified.decoded_length == 66560
    body = doc_chunked_body(DOC_CHUNK_SIGNATURES)
    assert len(body) == 66824  # the documented Content-Length
    assert read_body(verified, body, cuts) == DOC_DATA
    assert verified.trailers == {}


@pytest.mark.parametrize("which", [0, 1, 2])
def test_aws_doc_chunked_upload_with_one_bad_chunk_signature(which: int) -> None:
    signatures = list(DOC_CHUNK_SIGNATURES)
    signatures[which] = signatures[which][:-1] + ("0" if signatures[which][-1] != "0" else "1")
    verified = accepted(doc_chunked_request(), DOC_NOW, DOC_SECRET)
    released = bytearray()

    async def run() -> None:
        async for piece in verified.body(_pieces(doc_chunked_body(signatures), [5000])):
            released.extend(piece)

    with pytest.raises(SigV4Error) as caught:
        asyncio.run(run())
    assert caught.value.code == "SignatureDoesNotMatch"
    assert len(released) == [0, 65536, 66560][which]  # nothing of a bad chunk is released


def test_aws_doc_chunked_upload_with_changed_data_or_swapped_order() -> None:
    verified = accepted(doc_chunked_request(), DOC_NOW, DOC_SECRET)
    body = bytearray(doc_chunked_body(DOC_CHUNK_SIGNATURES))
    body[70000 - 4000] = ord("b")
    with pytest.raises(SigV4Error) as caught:
        read_body(verified, bytes(body))
    assert caught.value.code == "SignatureDoesNotMatch"


def test_aws_doc_chunked_upload_with_trailer_example() -> None:
    """ "Signature calculations for trailing headers": the seed, chunk and trailer signatures."""
    request = doc_chunked_request()
    headers = {
        **request.headers,
        "x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
        "x-amz-trailer": "x-amz-checksum-crc32c",
        "authorization": f"AWS4-HMAC-SHA256 Credential={DOC_SCOPE},"
        "SignedHeaders=content-encoding;host;x-amz-content-sha256;x-amz-date;"
        "x-amz-decoded-content-length;x-amz-storage-class;x-amz-trailer,"
        "Signature=106e2a8a18243abcf37539882f36619c00e2dfc72633413f02d3b74544bfeb8e",
    }
    request = SignedRequest(request.method, request.raw_path, [], headers)
    signatures = (
        "b474d8862b1487a5145d686f57f013e54db672cee1c953b3010fb58501ef5aa2",
        "1c1344b170168f8e65b41376b44b20fe354e373826ccbbe2c1d40a8cae51e5c7",
        "2ca2aba2005185cf7159c6277faf83795951dd77a3a99e6e65d5c9f85863f992",
    )
    trailer = (
        b"x-amz-checksum-crc32c:sOO8/Q==\r\n"
        b"x-amz-trailer-signature:d81f82fc3505edab99d459891051a732e8730629a2e4a59689829ca17fe2e435"
        b"\r\n\r\n"
    )
    verified = accepted(request, DOC_NOW, DOC_SECRET)
    assert read_body(verified, doc_chunked_body(signatures, trailer), [66600]) == DOC_DATA
    assert verified.trailers == {"x-amz-checksum-crc32c": "sOO8/Q=="}

    for changed in (
        trailer.replace(b"sOO8/Q==", b"sOO8/A=="),
        trailer.replace(b"d81f82fc", b"d81f82fd"),
        trailer.replace(b"x-amz-trailer-signature", b"x-amz-trailer-signatura"),
    ):
        verified = accepted(request, DOC_NOW, DOC_SECRET)
        with pytest.raises(SigV4Error) as caught:
            read_body(verified, doc_chunked_body(signatures, changed))
        assert caught.value.code in ("SignatureDoesNotMatch", "InvalidArgument")
        assert verified.trailers == {}


# --- Header authentication signed by botocore --------------------------------------------------


def test_signed_payload_is_accepted_and_checked() -> None:
    data = b"hello, shoal\n" * 1000
    request = header_signed("PUT", f"{ENDPOINT}/bucket/key.txt", body=data)
    signed = to_signed_request(request)
    verified = accepted(signed)
    assert verified.credentials.mode is PayloadMode.SHA256
    assert verified.credentials.region == "eu-central-1"  # any region is accepted
    assert read_body(verified, data, [1, 100, 5000]) == data

    with pytest.raises(SigV4Error) as caught:
        read_body(verified, data[:-1] + b"?")
    assert caught.value.code == "XAmzContentSHA256Mismatch"


def test_check_sha256_wraps_any_stream() -> None:
    data = b"x" * 10

    async def run(expected: str) -> bytes:
        return b"".join([p async for p in check_sha256(_pieces(data, [3]), expected)])

    assert asyncio.run(run(hashlib.sha256(data).hexdigest().upper())) == data
    with pytest.raises(SigV4Error) as caught:
        asyncio.run(run(EMPTY_SHA256))
    assert caught.value.code == "XAmzContentSHA256Mismatch"


def test_unsigned_payload_passes_through() -> None:
    data = b"\x00\x01 whatever \xff" * 50
    request = header_signed("PUT", f"{ENDPOINT}/bucket/k", body=data, unsigned_payload=True)
    verified = accepted(to_signed_request(request))
    assert verified.credentials.payload == "UNSIGNED-PAYLOAD"
    assert read_body(verified, data, [7]) == data


def test_wrong_secret_unknown_key_and_tampering_are_refused() -> None:
    request = to_signed_request(
        header_signed("PUT", f"{ENDPOINT}/b/k", body=b"x", headers={"x-amz-meta-a": "1"})
    )
    assert refused(request, secret="wrong").code == "SignatureDoesNotMatch"
    with pytest.raises(SigV4Error) as caught:
        verify(parse(request, T0), request, None)
    assert caught.value.code == "InvalidAccessKeyId"

    tampered = [
        replace_header(request, **{"x-amz-meta-a": "2"}),
        replace_header(request, host="other.test:9000"),
        SignedRequest("POST", request.raw_path, request.query, request.headers),
        SignedRequest(request.method, "/b/k2", request.query, request.headers),
        SignedRequest(request.method, request.raw_path, [("acl", "")], request.headers),
    ]
    for changed in tampered:
        assert refused(changed).code == "SignatureDoesNotMatch"
    missing = {k: v for k, v in request.headers.items() if k != "x-amz-meta-a"}
    without = SignedRequest(request.method, request.raw_path, request.query, missing)
    assert refused(without).code == "SignatureDoesNotMatch"


def test_header_values_are_trimmed_and_spaces_collapsed() -> None:
    request = header_signed("GET", f"{ENDPOINT}/b/k", headers={"x-amz-meta-note": "a   b  c"})
    signed = to_signed_request(request)
    accepted(replace_header(signed, **{"x-amz-meta-note": "  a b    c "}))


@pytest.mark.parametrize(
    ("delta", "ok"),
    [
        (timedelta(0), True),
        (MAX_CLOCK_SKEW - timedelta(seconds=1), True),
        (-MAX_CLOCK_SKEW + timedelta(seconds=1), True),
        (MAX_CLOCK_SKEW + timedelta(seconds=1), False),
        (-MAX_CLOCK_SKEW - timedelta(seconds=1), False),
    ],
)
def test_clock_skew(delta: timedelta, ok: bool) -> None:
    request = to_signed_request(header_signed("GET", f"{ENDPOINT}/b/k"))
    if ok:
        accepted(request, now=T0 + delta)
    else:
        error = refused(request, now=T0 + delta)
        assert error.code == "RequestTimeTooSkewed"
        assert error.details["MaxAllowedSkewMilliseconds"] == "900000"


def test_date_header_instead_of_x_amz_date() -> None:
    """botocore signs with the Date header when the request has one (and then no X-Amz-Date)."""
    request = header_signed("GET", f"{ENDPOINT}/b/k", headers={"Date": "placeholder"})
    signed = to_signed_request(request)
    assert "x-amz-date" not in signed.headers
    assert "date" in signed.headers and "date" in signed.headers["authorization"]
    credentials = parse(signed, T0)
    assert credentials.request_time == T0
    assert credentials.amz_date == "20250101T120000Z"
    verify(credentials, signed, SECRET)
    assert refused(signed, now=T0 + timedelta(minutes=16)).code == "RequestTimeTooSkewed"
    # The same instant written another way: the time parses, but the signed text differs.
    rfc7231 = replace_header(signed, date="Wed, 01 Jan 2025 12:00:00 GMT")
    assert refused(rfc7231).code == "SignatureDoesNotMatch"
    bad = {k: v for k, v in signed.headers.items() if k != "date"}
    error = refused(SignedRequest("GET", signed.raw_path, [], bad))
    assert error.code == "AccessDenied"


# --- Paths and query strings as real clients encode them ---------------------------------------

KEYS = [
    "plain.txt",
    "with space.txt",
    "ünïcødé/日本語 ファイル.txt",
    "tilde~name",
    "plus+sign",
    "eq=uals&amp",
    "dir//double/./dot/../x",
    "percent%41literal",
    "semi;colon,comma!'()*$@:[]",
    "emoji-\U0001f600",
]


@pytest.mark.parametrize("key", KEYS)
def test_boto3_keys_with_special_characters(key: str) -> None:
    data = key.encode() * 3
    put = boto3_capture(
        lambda c: c.put_object(
            Bucket="bucket", Key=key, Body=data, ChecksumAlgorithm="SHA256", Metadata={"k": "v v"}
        )
    )
    verified = accepted(to_signed_request(put))
    assert read_body(verified, body_bytes(put), [3]) == data

    get = boto3_capture(lambda c: c.get_object(Bucket="bucket", Key=key, Range="bytes=0-1"))
    signed = to_signed_request(get)
    accepted(signed)

    # The same request with the path escaped differently (hex case, '~' escaped, safe
    # characters escaped) is the same canonical path.
    other = signed.raw_path.replace("~", "%7E").replace("%2B", "%2b").replace("t", "%74")
    accepted(SignedRequest(signed.method, other, signed.query, signed.headers))


@pytest.mark.parametrize("key", KEYS)
def test_boto3_presigned_urls_with_special_characters(key: str) -> None:
    url = boto3_presigned_url("get_object", {"Bucket": "bucket", "Key": key})
    request = url_request("GET", url)
    credentials = parse(request, T0 + timedelta(minutes=10))
    verify(credentials, request, SECRET)
    assert credentials.mode is PayloadMode.UNSIGNED


@pytest.mark.parametrize(
    "prefix",
    ["", "a b/", "ü+=&~*/%2F", "x/y?z#w", "tab\tnew\nline"],
)
def test_boto3_query_parameters_with_special_characters(prefix: str) -> None:
    listing = boto3_capture(
        lambda c: c.list_objects_v2(
            Bucket="bucket", Prefix=prefix, Delimiter="/", StartAfter=prefix + "~", MaxKeys=5
        )
    )
    signed = to_signed_request(listing)
    assert ("prefix", prefix) in signed.query
    accepted(signed)
    # Query parameter order on the wire does not matter.
    accepted(SignedRequest(signed.method, signed.raw_path, signed.query[::-1], signed.headers))
    changed = [(n, v + "x" if n == "prefix" else v) for n, v in signed.query]
    assert refused(SignedRequest("GET", signed.raw_path, changed, signed.headers)).code == (
        "SignatureDoesNotMatch"
    )


def test_boto3_subresource_without_value() -> None:
    request = boto3_capture(lambda c: c.create_multipart_upload(Bucket="bucket", Key="a b"))
    signed = to_signed_request(request)
    assert ("uploads", "") in signed.query
    accepted(signed)


# --- Presigned URLs ----------------------------------------------------------------------------


def test_presigned_url_window() -> None:
    request = to_signed_request(presigned("GET", f"{ENDPOINT}/b/some%20key", expires=600))
    accepted(request, now=T0)
    accepted(request, now=T0 + timedelta(seconds=600))
    expired = refused(request, now=T0 + timedelta(seconds=601))
    assert (expired.code, expired.message) == ("AccessDenied", "Request has expired")
    early = refused(request, now=T0 - MAX_CLOCK_SKEW - timedelta(seconds=1))
    assert (early.code, early.message) == ("AccessDenied", "Request is not valid yet")
    accepted(request, now=T0 - MAX_CLOCK_SKEW + timedelta(seconds=1))


def test_presigned_url_tampering_and_parameters() -> None:
    request = to_signed_request(presigned("PUT", f"{ENDPOINT}/b/k?partNumber=1&uploadId=u"))
    accepted(request)

    def with_query(query: list[tuple[str, str]]) -> SignedRequest:
        return SignedRequest(request.method, request.raw_path, query, request.headers)

    query = list(request.query)
    changed = [(n, "2" if n == "partNumber" else v) for n, v in query]
    assert refused(with_query(changed)).code == "SignatureDoesNotMatch"
    assert refused(with_query([*query, ("extra", "1")])).code == "SignatureDoesNotMatch"
    missing = [(n, v) for n, v in query if n != "X-Amz-Expires"]
    assert refused(with_query(missing)).code == "AuthorizationQueryParametersError"
    twice = [*query, ("X-Amz-Date", "20250101T120000Z")]
    assert refused(with_query(twice)).code == "AuthorizationQueryParametersError"
    for expires in ("0", "604801", "-1", "1e3", ""):
        bad = [(n, expires if n == "X-Amz-Expires" else v) for n, v in query]
        assert refused(with_query(bad)).code == "AuthorizationQueryParametersError"
    token = [*query, ("X-Amz-Security-Token", "t")]
    error = refused(with_query(token))
    assert error.code == "InvalidArgument" and "Security-Token" in error.message
    both = replace_header(request, authorization="AWS4-HMAC-SHA256 Credential=x")
    assert refused(both).code == "InvalidArgument"


def test_presigned_url_with_longest_expiry_is_signed_by_botocore_and_accepted() -> None:
    request = to_signed_request(presigned("GET", f"{ENDPOINT}/b/k", expires=604800))
    accepted(request, now=T0 + timedelta(days=7))
    assert refused(request, now=T0 + timedelta(days=7, seconds=1)).code == "AccessDenied"


# --- aws-chunked bodies ------------------------------------------------------------------------


def unsigned_trailer_request(
    data: bytes, *, chunk_size: int = 1024, decoded_length: int | None = None
) -> tuple[SignedRequest, bytes]:
    """A STREAMING-UNSIGNED-PAYLOAD-TRAILER upload framed and signed by botocore itself."""
    headers = {
        "Content-Encoding": "aws-chunked",
        "X-Amz-Trailer": "x-amz-checksum-crc32",
        "X-Amz-Decoded-Content-Length": str(
            len(data) if decoded_length is None else decoded_length
        ),
    }
    context = {"checksum": {"request_algorithm": {"in": "trailer", "name": "x-amz-checksum-crc32"}}}
    request = header_signed("PUT", f"{ENDPOINT}/b/k", headers=headers, context=context)
    body = AwsChunkedWrapper(
        _BytesIO(data),
        checksum_cls=Crc32Checksum,
        checksum_name="x-amz-checksum-crc32",
        chunk_size=chunk_size,
    ).read()
    return to_signed_request(request), body


class _BytesIO:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def read(self, size: int) -> bytes:
        piece, self._data = self._data[:size], self._data[size:]
        return piece


def crc32_b64(data: bytes) -> str:
    return base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()


def test_boto3_put_object_default_checksum_is_streaming_unsigned_trailer() -> None:
    """What current boto3 / aws cli send by default over TLS for PutObject."""
    data = b"0123456789" * 5000
    put = boto3_capture(lambda c: c.put_object(Bucket="bucket", Key="big file", Body=data))
    signed = to_signed_request(put)
    assert signed.headers["x-amz-content-sha256"] == "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
    verified = accepted(signed)
    assert verified.decoded_length == len(data)
    body = body_bytes(put)
    assert read_body(verified, body, [1, 9, 10, 11, len(body) - 3]) == data
    assert verified.trailers == {"x-amz-checksum-crc32": crc32_b64(data)}


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(max_size=5000),
    chunk_size=st.integers(min_value=1, max_value=2000),
    cut_fractions=st.lists(st.floats(min_value=0, max_value=1), max_size=12),
)
def test_unsigned_trailer_decoding_at_any_split(
    data: bytes, chunk_size: int, cut_fractions: list[float]
) -> None:
    request, body = unsigned_trailer_request(data, chunk_size=chunk_size)
    verified = accepted(request)
    cuts = [int(f * len(body)) for f in cut_fractions]
    assert read_body(verified, body, cuts) == data
    assert verified.trailers == {"x-amz-checksum-crc32": crc32_b64(data)}


@pytest.mark.parametrize("declared", [0, 99, 101, 1000])
def test_decoded_length_mismatch(declared: int) -> None:
    request, body = unsigned_trailer_request(b"x" * 100, chunk_size=30, decoded_length=declared)
    verified = accepted(request)  # the client signed the wrong length: the signature holds
    with pytest.raises(SigV4Error) as caught:
        read_body(verified, body)
    assert caught.value.code in ("IncompleteBody", "InvalidArgument")
    assert caught.value.code == ("IncompleteBody" if declared > 100 else "InvalidArgument")


def test_aws_chunked_framing_errors() -> None:
    request, body = unsigned_trailer_request(b"y" * 100, chunk_size=40)
    assert body.startswith(b"28\r\n")

    def code(raw: bytes) -> str:
        verified = accepted(request)
        with pytest.raises(SigV4Error) as caught:
            read_body(verified, raw)
        return caught.value.code

    final = body.index(b"\r\n0\r\n") + 2
    assert code(body[:50]) == "IncompleteBody"  # cut inside a chunk
    assert code(body[:final]) == "IncompleteBody"  # cut before the last chunk
    assert code(b"") == "IncompleteBody"
    assert code(body[:final] + b"0\r\n\r\n") == "IncompleteBody"  # the trailer is missing
    assert code(b"zz\r\n" + body) == "InvalidArgument"
    assert code(b"28" + b" " * 5000 + body[2:]) == "InvalidArgument"  # header line too long
    assert code(b"8000000\r\n" + body) == "InvalidArgument"  # chunk beyond the limit
    assert code(body.replace(b"y\r\n28", b"yy\r\n28", 1)) == "InvalidArgument"
    assert code(body + b"x-amz-meta-extra:1\r\n") == "InvalidArgument"  # not announced
    assert code(body + b"garbage\r\n") == "InvalidArgument"
    # A last line without CRLF, or extra blank lines, are tolerated.
    for ending in (b"", b"\r\n\r\n\r\n"):
        verified = accepted(request)
        assert read_body(verified, body.rstrip(b"\r\n") + ending) == b"y" * 100
        assert verified.trailers == {"x-amz-checksum-crc32": crc32_b64(b"y" * 100)}


# --- Malformed authentication: always a SigV4Error with S3's code -----------------------------

GOOD_AUTH = (
    f"AWS4-HMAC-SHA256 Credential={AKID}/20250101/us-east-1/s3/aws4_request, "
    "SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=" + "ab" * 32
)


def header_request(authorization: str | None, **headers: str) -> SignedRequest:
    base = {
        "host": "s3.test",
        "x-amz-date": "20250101T120000Z",
        "x-amz-content-sha256": EMPTY_SHA256,
    }
    if authorization is not None:
        base["authorization"] = authorization
    return SignedRequest("GET", "/b/k", [], {**base, **headers})


@pytest.mark.parametrize(
    ("authorization", "code"),
    [
        ("", "InvalidArgument"),
        ("Bearer abc", "InvalidArgument"),
        ("AWS AKID:c2lnbmF0dXJl", "InvalidArgument"),
        ("AWS4-HMAC-SHA256", "AuthorizationHeaderMalformed"),
        ("AWS4-HMAC-SHA256 garbage", "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace("SignedHeaders=", "Signedheaders="), "AuthorizationHeaderMalformed"),
        (
            GOOD_AUTH.replace(", SignedHeaders=host;x-amz-content-sha256;x-amz-date", ""),
            "AuthorizationHeaderMalformed",
        ),
        (
            GOOD_AUTH.replace("Signature=" + "ab" * 32, "Signature=" + "zz" * 32),
            "AuthorizationHeaderMalformed",
        ),
        (
            GOOD_AUTH.replace("Signature=" + "ab" * 32, "Signature=abc"),
            "AuthorizationHeaderMalformed",
        ),
        (GOOD_AUTH + ", Signature=" + "cd" * 32, "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace("/s3/", "/ec2/"), "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace("aws4_request", "aws5_request"), "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace("/20250101/", "/20250102/"), "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace("/20250101/", "/2025011/"), "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace("/20250101/", "/20251301/"), "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace(f"{AKID}/", ""), "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace("/us-east-1/", "//"), "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace("host;", ""), "AuthorizationHeaderMalformed"),
        (GOOD_AUTH.replace("host;", "host;;"), "AuthorizationHeaderMalformed"),
        ("AWS4-ECDSA-P256-SHA256 " + GOOD_AUTH.split(" ", 1)[1], "InvalidArgument"),
    ],
)
def test_malformed_authorization_header(authorization: str, code: str) -> None:
    with pytest.raises(SigV4Error) as caught:
        parse(header_request(authorization), T0)
    assert caught.value.code == code


def test_request_level_refusals() -> None:
    def code(request: SignedRequest) -> str:
        with pytest.raises(SigV4Error) as caught:
            parse(request, T0)
        return caught.value.code

    assert code(header_request(None)) == "AccessDenied"  # anonymous
    assert code(SignedRequest("GET", "/", [("AWSAccessKeyId", "a")], {})) == "InvalidArgument"
    no_sha = header_request(GOOD_AUTH)
    no_sha = SignedRequest(
        "GET", "/", [], {k: v for k, v in no_sha.headers.items() if k != "x-amz-content-sha256"}
    )
    assert code(no_sha) == "MissingSecurityHeader"
    assert code(header_request(GOOD_AUTH, **{"x-amz-content-sha256": "abc"})) == "InvalidArgument"
    for bad_date in ("2025-01-01T12:00:00Z", "20251301T120000Z", "20250431T120000Z"):
        assert code(header_request(GOOD_AUTH, **{"x-amz-date": bad_date})) == "AccessDenied"
    assert code(header_request(GOOD_AUTH, **{"x-amz-security-token": "t"})) == "InvalidArgument"
    signs_length = GOOD_AUTH.replace("x-amz-date,", "x-amz-date;x-amz-decoded-content-length,")
    assert signs_length != GOOD_AUTH
    chunked = header_request(
        signs_length,
        **{
            "x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
            "x-amz-decoded-content-length": "12x",
        },
    )
    assert code(chunked) == "InvalidArgument"
    # Every x-amz-* header is signed (the date and the payload's hash are bound anyway).
    unsigned = header_request(GOOD_AUTH, **{"x-amz-acl": "public-read", "x-amz-meta-a": "1"})
    with pytest.raises(SigV4Error) as refused:
        parse(unsigned, T0)
    assert refused.value.code == "AccessDenied"
    assert refused.value.details == {"HeadersNotSigned": "x-amz-acl, x-amz-meta-a"}
    credentials = parse(header_request(GOOD_AUTH), T0)
    assert credentials.access_key_id == AKID and credentials.signature == "ab" * 32


_header_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=200)
_auth_pieces = st.sampled_from(
    [
        "AWS4-HMAC-SHA256 ",
        "Credential=",
        f"{AKID}/20250101/us-east-1/s3/aws4_request",
        "/",
        ",",
        ", ",
        "SignedHeaders=",
        "host;x-amz-date",
        ";",
        "Signature=",
        "ab" * 32,
        "=",
        " ",
        "\x00",
        "é",
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    authorization=st.one_of(_header_text, st.lists(_auth_pieces, max_size=14).map("".join)),
    amz_date=st.one_of(st.none(), _header_text, st.just("20250101T120000Z")),
    date=st.one_of(st.none(), _header_text, st.just("Wed, 01 Jan 2025 12:00:00 +0000")),
    content_sha256=st.one_of(_header_text, st.sampled_from([m.value for m in PayloadMode])),
    query=st.lists(st.tuples(_header_text, _header_text), max_size=4),
)
def test_parse_and_verify_raise_only_sigv4_errors(
    authorization: str,
    amz_date: str | None,
    date: str | None,
    content_sha256: str,
    query: list[tuple[str, str]],
) -> None:
    headers = {"host": "s3.test", "authorization": authorization}
    headers["x-amz-content-sha256"] = content_sha256
    if amz_date is not None:
        headers["x-amz-date"] = amz_date
    if date is not None:
        headers["date"] = date
    for request in (
        SignedRequest("GET", "/b/\udcff%zz/k", query, headers),
        SignedRequest("GET", "/b/k", [*query, *_presign_query(authorization)], {"host": "s3"}),
    ):
        with suppress(SigV4Error):
            verify(parse(request, T0), request, SECRET)


def _presign_query(text: str) -> list[tuple[str, str]]:
    parts = (text.split(",") + [""] * 6)[:6]
    names = [
        "X-Amz-Algorithm",
        "X-Amz-Credential",
        "X-Amz-Date",
        "X-Amz-Expires",
        "X-Amz-SignedHeaders",
        "X-Amz-Signature",
    ]
    return list(zip(names, parts, strict=True))


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=300), signed=st.booleans())
def test_chunked_decoder_raises_only_sigv4_errors(raw: bytes, signed: bool) -> None:
    if signed:
        verified = accepted(doc_chunked_request(), DOC_NOW, DOC_SECRET)
    else:
        verified = accepted(unsigned_trailer_request(b"abc")[0])
    with suppress(SigV4Error):
        read_body(verified, raw, [len(raw) // 2])


@settings(max_examples=100, deadline=None)
@given(prefix=st.binary(max_size=40), suffix=st.binary(max_size=40))
def test_chunked_decoder_mutations_raise_only_sigv4_errors(prefix: bytes, suffix: bytes) -> None:
    request, body = unsigned_trailer_request(b"hello world", chunk_size=4)
    cut = len(prefix) % max(len(body), 1)
    with suppress(SigV4Error):
        read_body(accepted(request), body[:cut] + prefix + body[cut:] + suffix)
