"""AWS Signature Version 4 for S3 requests: who signed a request, and is its body what was signed.

A pure library: the gateway hands over plain values (`SignedRequest`) and the raw body as an
async iterator of bytes; nothing here knows about HTTP frameworks or the metadata tier.

The flow, for every request:

1. `parse(request, now)` finds the signature, in the ``Authorization`` header or in the query
   string of a presigned URL, and checks everything that needs no secret: the algorithm, the
   credential scope (``AKID/YYYYMMDD/region/s3/aws4_request``; any region is accepted, the
   service must be ``s3``), the request time against ``now`` (clock skew, presigned expiry) and
   the payload mode announced in ``x-amz-content-sha256``, and that every ``x-amz-*`` header
   is among the signed ones (an unsigned one is AccessDenied). It returns `Credentials`, whose
   ``access_key_id`` tells the gateway which secret to look up.
2. `verify(credentials, request, secret_key)` rebuilds the canonical request the way S3 does
   (no path normalisation, no double encoding), derives the signing key
   (``kSecret -> date -> region -> service -> aws4_request``) and compares signatures. It returns
   `Verified`.
3. `Verified.body(raw)` wraps the raw body so that it yields the object's bytes whatever the
   payload mode: checked against the signed SHA-256, passed through (``UNSIGNED-PAYLOAD``), or
   decoded from ``aws-chunked`` with every chunk signature verified before its data is released
   and the trailers (``x-amz-checksum-*``) collected into `Verified.trailers`.

Every refusal is a `SigV4Error` carrying the S3 error code; nothing else is raised on malformed
client input. A body check can only fail once the stream has been read, so the gateway must not
commit an object until `Verified.body` has finished without raising.

Reference: the AWS S3 API documentation, "Authenticating Requests (AWS Signature Version 4)"
and its pages on query parameters, chunked uploads and trailing headers.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from urllib.parse import quote_from_bytes, unquote_to_bytes

from shoal import httpdate

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "s3"
TERMINATOR = "aws4_request"

# S3 refuses requests whose time is more than 15 minutes away from its own clock: it bounds how
# long a captured request can be replayed, while tolerating ordinary client clock drift.
MAX_CLOCK_SKEW = timedelta(minutes=15)
# The longest validity S3 accepts for a presigned URL (X-Amz-Expires): one week.
MAX_PRESIGNED_EXPIRES = 604_800

# Bounds on aws-chunked bodies, so that a client cannot make the gateway buffer without limit:
# a chunk header line ("hex-size;chunk-signature=<64 hex>") is under 100 bytes in practice;
# clients send chunks of 8 KiB to 1 MiB (S3 allows any size; 64 MiB leaves ample room); the
# trailer section holds a few checksum lines.
MAX_LINE = 4096
MAX_CHUNK_SIZE = 64 * 1024 * 1024
MAX_TRAILER_SECTION = 16 * 1024

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
__all__ = [
    "MAX_CLOCK_SKEW",
    "Credentials",
    "PayloadMode",
    "SigV4Error",
    "SignedRequest",
    "Verified",
    "check_sha256",
    "parse",
    "verify",
]

_AMZ_DATE = re.compile(r"[0-9]{8}T[0-9]{6}Z")
_SCOPE_DATE = re.compile(r"[0-9]{8}")
# x-amz-* headers that need not be listed in SignedHeaders: the signature binds them anyway.
_BOUND_UNLISTED = frozenset({"x-amz-date", "x-amz-content-sha256"})
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_CHUNK_SIZE = re.compile(r"[0-9a-fA-F]{1,16}")
_DIGITS = re.compile(r"[0-9]{1,19}")
_TRAILER_SIGNATURE = "x-amz-trailer-signature"
_PRESIGN_PARAMS = (
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Signature",
    "X-Amz-Date",
    "X-Amz-SignedHeaders",
    "X-Amz-Expires",
)
# Any of these in the query makes a request presigned (and then all six must be there).
_PRESIGNED_MARKS = frozenset(_PRESIGN_PARAMS[:3])


class SigV4Error(Exception):
    """A refused request: ``code`` is the S3 error code, ``message`` its human text.

    ``details`` holds the extra elements S3 puts in its XML error for this code (for example
    ``StringToSign`` and ``CanonicalRequest`` for SignatureDoesNotMatch), element name -> text.
    """

    def __init__(self, code: str, message: str, details: Mapping[str, str] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details: dict[str, str] = dict(details or {})


def signature_mismatch(
    access_key_id: str, to_sign: str, provided: str, **diagnostics: str
) -> SigV4Error:
    """SignatureDoesNotMatch for a request's signature (V4 or V2), with the details S3 gives
    to find what the client signed differently: what was signed, and `diagnostics` (V4's
    canonical request, V2's bytes of the string to sign)."""
    return SigV4Error(
        "SignatureDoesNotMatch",
        "The request signature we calculated does not match the signature you provided. "
        "Check your key and signing method.",
        {
            "AWSAccessKeyId": access_key_id,
            "StringToSign": to_sign,
            "SignatureProvided": provided,
            **diagnostics,
        },
    )


class PayloadMode(StrEnum):
    """How the body is protected, from ``x-amz-content-sha256`` (presigned: UNSIGNED)."""

    SHA256 = "sha256"  # the header holds the hex SHA-256 of the body
    UNSIGNED = "UNSIGNED-PAYLOAD"
    STREAMING_SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
    STREAMING_SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
    STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"

    # The properties compare members by identity: an Enum's `name` and hash are Python
    # code, and every signed request asks both questions.
    @property
    def chunked(self) -> bool:
        """Whether the body is aws-chunked framed."""
        return self is not PayloadMode.SHA256 and self is not PayloadMode.UNSIGNED

    @property
    def signed_chunks(self) -> bool:
        """Whether every chunk carries a signature chained from the request's."""
        return self in (PayloadMode.STREAMING_SIGNED, PayloadMode.STREAMING_SIGNED_TRAILER)

    @property
    def has_trailers(self) -> bool:
        """Whether trailing headers may follow the last chunk."""
        return (
            self is PayloadMode.STREAMING_SIGNED_TRAILER
            or self is PayloadMode.STREAMING_UNSIGNED_TRAILER
        )


_LITERAL_MODES = {mode.value: mode for mode in PayloadMode if mode is not PayloadMode.SHA256}


@dataclass(frozen=True)
class SignedRequest:
    """The parts of an HTTP request that SigV4 covers, as the gateway received them.

    ``raw_path`` is the path exactly as sent, still percent-encoded, without the query string.
    ``query`` holds the percent-decoded (name, value) pairs in the order received ('+' decoded
    as a space, as aiohttp does); a parameter without '=' has the value "". ``headers`` has
    lowercase names; a repeated header is given once, its values stripped and joined by ','.
    """

    method: str
    raw_path: str
    query: Sequence[tuple[str, str]]
    headers: Mapping[str, str]


@dataclass(frozen=True)
class Credentials:
    """What `parse` found: who claims to have signed, and everything `verify` needs."""

    access_key_id: str
    region: str
    scope: str  # "YYYYMMDD/region/s3/aws4_request"
    request_time: datetime  # UTC
    amz_date: str  # the request time as signed: "YYYYMMDDTHHMMSSZ"
    signed_headers: tuple[str, ...]
    signature: str  # lowercase hex
    presigned: bool
    payload: str  # the payload hash line of the canonical request
    mode: PayloadMode
    decoded_length: int | None  # x-amz-decoded-content-length, for aws-chunked bodies
    trailer_names: tuple[str, ...]  # x-amz-trailer, lowercase
    expires: datetime | None  # presigned URLs only


def parse(request: SignedRequest, now: datetime) -> Credentials:
    """Read and check the signature's claims, without the secret; raise SigV4Error if refused.

    ``now`` is the server's time (a naive datetime is taken as UTC). A request without any
    signature is refused with AccessDenied (the gateway serves a request with no credentials
    at all as anonymous before it gets here: app.py, access.py).
    """
    now = in_utc(now)
    refuse_session_tokens(request)
    authorization = request.headers.get("authorization")
    names = {name for name, _ in request.query} if request.query else set()
    presigned = not names.isdisjoint(_PRESIGNED_MARKS)
    if authorization is not None and presigned:
        raise two_mechanisms()
    if authorization is not None:
        return _parse_header_auth(request, authorization, now)
    if presigned:
        return _parse_query_auth(request, now)
    if "AWSAccessKeyId" in names or "Signature" in names:
        raise _unsupported_algorithm("InvalidArgument")
    raise SigV4Error("AccessDenied", "Access Denied: the request is not signed")


def verify(credentials: Credentials, request: SignedRequest, secret_key: str | None) -> Verified:
    """Check the signature with the secret of ``credentials.access_key_id``.

    ``secret_key`` is None when the gateway knows no such key: that is InvalidAccessKeyId.
    """
    if secret_key is None:
        raise SigV4Error(
            "InvalidAccessKeyId",
            "The AWS Access Key Id you provided does not exist in our records.",
            {"AWSAccessKeyId": credentials.access_key_id},
        )
    key = _signing_key(secret_key, credentials.scope)
    canonical = _canonical_request(credentials, request)
    to_sign = "\n".join(
        [ALGORITHM, credentials.amz_date, credentials.scope, _sha256_hex(canonical)]
    )
    if not hmac.compare_digest(_hmac(key, to_sign).hex(), credentials.signature):
        raise signature_mismatch(
            credentials.access_key_id,
            to_sign,
            credentials.signature,
            CanonicalRequest=canonical,
        )
    return Verified(credentials, key)


class Verified:
    """A request whose signature holds; `body` decodes and checks its payload.

    After `body` has been read to the end, `trailers` holds the trailing headers of an
    aws-chunked body (lowercase name -> value, ``x-amz-trailer-signature`` left out).
    """

    def __init__(self, credentials: Credentials, key: bytes) -> None:
        self.credentials = credentials
        self.trailers: dict[str, str] = {}
        self._key = key

    @property
    def access_key_id(self) -> str:
        return self.credentials.access_key_id

    @property
    def decoded_length(self) -> int | None:
        """The object's length announced by x-amz-decoded-content-length (aws-chunked only)."""
        return self.credentials.decoded_length

    def body(self, raw: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
        """The object's bytes from the raw body, checked as the payload mode requires.

        Raises SigV4Error while iterating: XAmzContentSHA256Mismatch (after the last byte),
        SignatureDoesNotMatch (before a badly signed chunk is released), IncompleteBody, or
        InvalidArgument for a malformed aws-chunked body.
        """
        creds = self.credentials
        if creds.mode is PayloadMode.SHA256:
            return check_sha256(raw, creds.payload)
        if creds.mode is PayloadMode.UNSIGNED:
            return _passthrough(raw)
        chain = None
        if creds.mode.signed_chunks:
            chain = _ChunkChain(self._key, creds.amz_date, creds.scope, creds.signature)
        decoder = _ChunkedDecoder(
            chain, creds.decoded_length, creds.trailer_names, creds.mode.has_trailers, self.trailers
        )
        return decoder.decode(raw)


async def check_sha256(stream: AsyncIterable[bytes], expected: str) -> AsyncIterator[bytes]:
    """Pass ``stream`` through; at its end, raise XAmzContentSHA256Mismatch if its SHA-256
    differs from the hex digest ``expected``."""
    digest = hashlib.sha256()
    async for piece in stream:
        digest.update(piece)
        yield piece
    if digest.hexdigest() != expected.lower():
        raise SigV4Error(
            "XAmzContentSHA256Mismatch",
            "The provided 'x-amz-content-sha256' header does not match what was computed.",
            {
                "ClientComputedContentSHA256": expected,
                "S3ComputedContentSHA256": digest.hexdigest(),
            },
        )


@functools.lru_cache(maxsize=1024)
def _signing_key(secret_key: str, scope: str) -> bytes:
    """The SigV4 signing key for a credential scope "YYYYMMDD/region/service/aws4_request".

    Kept per (secret, scope), as SDKs keep it per day: four HMACs fewer per request."""
    key = utf8("AWS4" + secret_key)
    for part in scope.split("/"):
        key = _hmac(key, part)
    return key


def _canonical_request(credentials: Credentials, request: SignedRequest) -> str:
    """The canonical request S3 signs, as the documentation defines it."""
    return "\n".join(
        [
            request.method,
            _canonical_uri(request.raw_path),
            _canonical_query(request.query, presigned=credentials.presigned),
            _canonical_headers(credentials.signed_headers, request.headers),
            ";".join(credentials.signed_headers),
            credentials.payload,
        ]
    )


def _canonical_uri(raw_path: str) -> str:
    """The path as sent, re-encoded the SigV4 way; S3 neither normalises nor double-encodes.

    Decoding first makes the result independent of how the client chose to escape: '~' sent
    raw or as %7E, a space as %20; every byte outside A-Z a-z 0-9 - _ . ~ and '/' is escaped.
    """
    return quote_from_bytes(unquote_to_bytes(utf8(raw_path)), safe="/") or "/"


def _canonical_query(query: Iterable[tuple[str, str]], *, presigned: bool = False) -> str:
    """Every parameter encoded (including '/'), sorted by name then value."""
    pairs = sorted(
        (_uri_encode(name), _uri_encode(value))
        for name, value in query
        if not (presigned and name == "X-Amz-Signature")
    )
    return "&".join(f"{name}={value}" for name, value in pairs)


# --- Parsing the two forms of authentication ---------------------------------------------------


def _parse_header_auth(request: SignedRequest, authorization: str, now: datetime) -> Credentials:
    code = "AuthorizationHeaderMalformed"
    algorithm, _, rest = authorization.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise _unsupported_algorithm("InvalidArgument")
    fields = _authorization_fields(rest)
    access_key_id, scope_date, region = _parse_credential(fields["Credential"], code)
    signed_headers = _parse_signed_headers(fields["SignedHeaders"], code)
    _refuse_unsigned_amz_headers(request.headers, signed_headers)
    signature = _parse_signature(fields["Signature"], code)
    request_time, stamp = _header_request_time(request.headers)
    _check_scope_date(scope_date, stamp, code)
    check_clock_skew(request_time, now)
    content_sha256 = request.headers.get("x-amz-content-sha256")
    if content_sha256 is None:
        raise SigV4Error(
            "MissingSecurityHeader",
            "Missing required header for this request: x-amz-content-sha256",
        )
    mode = _payload_mode(content_sha256)
    return Credentials(
        access_key_id=access_key_id,
        region=region,
        scope=_scope(scope_date, region),
        request_time=request_time,
        amz_date=stamp,
        signed_headers=signed_headers,
        signature=signature,
        presigned=False,
        payload=content_sha256,
        mode=mode,
        decoded_length=_decoded_length(request.headers) if mode.chunked else None,
        trailer_names=_trailer_names(request.headers) if mode.has_trailers else (),
        expires=None,
    )


def _parse_query_auth(request: SignedRequest, now: datetime) -> Credentials:
    code = "AuthorizationQueryParametersError"
    params = _presign_params(request.query)
    if params["X-Amz-Algorithm"] != ALGORITHM:
        raise SigV4Error(code, 'X-Amz-Algorithm only supports "AWS4-HMAC-SHA256"')
    access_key_id, scope_date, region = _parse_credential(params["X-Amz-Credential"], code)
    signed_headers = _parse_signed_headers(params["X-Amz-SignedHeaders"], code)
    _refuse_unsigned_amz_headers(request.headers, signed_headers)
    signature = _parse_signature(params["X-Amz-Signature"], code)
    request_time = _parse_amz_date(params["X-Amz-Date"])
    if request_time is None:
        raise SigV4Error(
            code, "X-Amz-Date must be in the ISO8601 Long Format \"yyyyMMdd'T'HHmmss'Z'\""
        )
    _check_scope_date(scope_date, params["X-Amz-Date"], code)
    expires = request_time + timedelta(seconds=_parse_expires(params["X-Amz-Expires"]))
    _check_presigned_window(request_time, expires, now)
    payload, mode = _presigned_payload(request.headers, signed_headers)
    return Credentials(
        access_key_id=access_key_id,
        region=region,
        scope=_scope(scope_date, region),
        request_time=request_time,
        amz_date=params["X-Amz-Date"],
        signed_headers=signed_headers,
        signature=signature,
        presigned=True,
        payload=payload,
        mode=mode,
        decoded_length=None,
        trailer_names=(),
        expires=expires,
    )


def in_utc(now: datetime) -> datetime:
    """The server's time as an aware UTC datetime (a naive one is taken as UTC)."""
    return now.replace(tzinfo=UTC) if now.tzinfo is None else now.astimezone(UTC)


def refuse_session_tokens(request: SignedRequest) -> None:
    """InvalidArgument for temporary credentials, in a header or the query (in any case:
    a token this store cannot check must not pass as an ordinary parameter)."""
    in_query = bool(request.query) and any(
        name.lower() == "x-amz-security-token" for name, _ in request.query
    )
    if in_query or "x-amz-security-token" in request.headers:
        raise SigV4Error(
            "InvalidArgument",
            "Temporary credentials (X-Amz-Security-Token) are not supported by this store; "
            "sign with an access key and its secret.",
        )


def two_mechanisms() -> SigV4Error:
    """A request signed both in its Authorization header and in its query."""
    return SigV4Error(
        "InvalidArgument",
        "Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter, "
        "Signature query string parameter or the Authorization header should be specified",
    )


def _unsupported_algorithm(code: str) -> SigV4Error:
    return SigV4Error(
        code,
        "The authorization mechanism you have provided is not supported. "
        "Please use AWS4-HMAC-SHA256.",
    )


def _authorization_fields(rest: str) -> dict[str, str]:
    """Credential, SignedHeaders and Signature from "Credential=..., SignedHeaders=..., ..."."""
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, equals, value = part.strip().partition("=")
        if not equals or name not in ("Credential", "SignedHeaders", "Signature"):
            raise _malformed_header(f"unexpected component {part.strip()[:64]!r}")
        if name in fields:
            raise _malformed_header(f"{name} is given twice")
        fields[name] = value.strip()
    for name in ("Credential", "SignedHeaders", "Signature"):
        if name not in fields:
            raise _malformed_header(f"missing {name}")
    return fields


def _malformed_header(why: str) -> SigV4Error:
    return SigV4Error(
        "AuthorizationHeaderMalformed", f"The authorization header is malformed; {why}."
    )


def _parse_credential(value: str, code: str) -> tuple[str, str, str]:
    """(access key id, scope date, region) from "AKID/YYYYMMDD/region/s3/aws4_request"."""
    parts = value.split("/")
    if len(parts) != 5 or not parts[0] or not parts[2]:
        raise SigV4Error(
            code,
            "The Credential is malformed; expecting "
            '"<YOUR-AKID>/YYYYMMDD/REGION/SERVICE/aws4_request".',
        )
    access_key_id, scope_date, region, service, terminator = parts
    if _SCOPE_DATE.fullmatch(scope_date) is None or not _is_calendar_day(scope_date):
        raise SigV4Error(code, f"Invalid credential date {scope_date[:16]!r}; expecting YYYYMMDD.")
    if service != SERVICE:
        raise SigV4Error(
            code,
            f"The Credential has the incorrect service {service[:32]!r}; this endpoint "
            f"belongs to {SERVICE!r}.",
        )
    if terminator != TERMINATOR:
        raise SigV4Error(
            code, f"The Credential has a terminator {terminator[:32]!r}; expecting {TERMINATOR!r}."
        )
    return access_key_id, scope_date, region


def _parse_signed_headers(value: str, code: str) -> tuple[str, ...]:
    names = tuple(value.split(";"))
    if any(not name or name != name.strip() for name in names):
        raise SigV4Error(
            code, "SignedHeaders is malformed: expecting lowercase names split by ';'."
        )
    if "host" not in names:
        raise SigV4Error(code, "SignedHeaders must include the host header.")
    return names


def _refuse_unsigned_amz_headers(headers: Mapping[str, str], signed: tuple[str, ...]) -> None:
    """As S3: every x-amz-* header of a request is signed. One left out could change what the
    request does without its signer's say: a presigned PUT, which signs only its host, would
    otherwise become a copy of another object (x-amz-copy-source), made public (x-amz-acl).
    x-amz-date and x-amz-content-sha256 are bound without being listed (the string to sign
    holds the date, the canonical request the payload's hash)."""
    unsigned = sorted(
        name
        for name in headers
        if name.startswith("x-amz-") and name not in signed and name not in _BOUND_UNLISTED
    )
    if unsigned:
        raise SigV4Error(
            "AccessDenied",
            "There were headers present in the request which were not signed",
            {"HeadersNotSigned": ", ".join(unsigned)},
        )


def _parse_signature(value: str, code: str) -> str:
    if _HEX64.fullmatch(value) is None:
        raise SigV4Error(code, "The Signature must be 64 hexadecimal characters.")
    return value.lower()


def _scope(scope_date: str, region: str) -> str:
    return f"{scope_date}/{region}/{SERVICE}/{TERMINATOR}"


# What a POST policy's verifier (post.py) shares with the header and query signatures.
parse_credential = _parse_credential
signing_key = _signing_key
scope = _scope


def _check_scope_date(scope_date: str, stamp: str, code: str) -> None:
    """`stamp`: the request time as signed (YYYYMMDDTHHMMSSZ)."""
    if scope_date != stamp[:8]:
        raise SigV4Error(
            code,
            f"Invalid credential date {scope_date!r}: it is not the day of the request time "
            f"{stamp}.",
        )


def _header_request_time(headers: Mapping[str, str]) -> tuple[datetime, str]:
    """The request time from X-Amz-Date or, failing that, the Date header (RFC 7231), and
    as it is signed: X-Amz-Date's value as sent (it was checked to be one), else formatted."""
    stamp = headers.get("x-amz-date")
    when = _parse_amz_date(stamp) if stamp is not None else httpdate.parse(headers.get("date"))
    if when is None:
        raise SigV4Error(
            "AccessDenied", "AWS authentication requires a valid Date or x-amz-date header"
        )
    return when, stamp if stamp is not None else _amz_date(when)


def _parse_amz_date(value: str) -> datetime | None:
    if _AMZ_DATE.fullmatch(value) is None:
        return None
    try:  # the digits are checked: slicing is ~10x cheaper than strptime
        return datetime(
            int(value[0:4]),
            int(value[4:6]),
            int(value[6:8]),
            int(value[9:11]),
            int(value[11:13]),
            int(value[13:15]),
            tzinfo=UTC,
        )
    except ValueError:  # a month 13, a 31st of April...
        return None


def _is_calendar_day(digits: str) -> bool:
    """True for eight digits that name a day (YYYYMMDD): not a month 13 or an April 31st."""
    try:
        datetime(int(digits[0:4]), int(digits[4:6]), int(digits[6:8]))
    except ValueError:
        return False
    return True


def _amz_date(moment: datetime) -> str:
    """A UTC moment in SigV4's ISO 8601 basic form, 20240131T120000Z."""
    return moment.strftime("%Y%m%dT%H%M%SZ")


def _presign_params(query: Sequence[tuple[str, str]]) -> dict[str, str]:
    params: dict[str, str] = {}
    for name, value in query:
        if name in _PRESIGN_PARAMS:
            if name in params:
                raise SigV4Error("AuthorizationQueryParametersError", f"{name} is given twice.")
            params[name] = value
    if len(params) != len(_PRESIGN_PARAMS):
        raise SigV4Error(
            "AuthorizationQueryParametersError",
            "Query-string authentication version 4 requires the X-Amz-Algorithm, "
            "X-Amz-Credential, X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, "
            "and X-Amz-Expires parameters.",
        )
    return params


def _parse_expires(value: str) -> int:
    code = "AuthorizationQueryParametersError"
    if _DIGITS.fullmatch(value) is None:
        raise SigV4Error(code, "X-Amz-Expires should be a number of seconds.")
    seconds = int(value)
    if seconds > MAX_PRESIGNED_EXPIRES:
        raise SigV4Error(code, "X-Amz-Expires must be less than a week (in seconds) that is 604800")
    if seconds < 1:
        raise SigV4Error(code, "X-Amz-Expires must be at least 1 second.")
    return seconds


def check_clock_skew(request_time: datetime, now: datetime) -> None:
    if abs(request_time - now) > MAX_CLOCK_SKEW:
        raise SigV4Error(
            "RequestTimeTooSkewed",
            "The difference between the request time and the current time is too large.",
            {
                "RequestTime": _amz_date(request_time),
                "ServerTime": _amz_date(now),
                "MaxAllowedSkewMilliseconds": str(int(MAX_CLOCK_SKEW.total_seconds() * 1000)),
            },
        )


def _check_presigned_window(request_time: datetime, expires: datetime, now: datetime) -> None:
    window = {
        "X-Amz-Date": _amz_date(request_time),
        "Expires": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "ServerTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if request_time - now > MAX_CLOCK_SKEW:
        raise SigV4Error("AccessDenied", "Request is not valid yet", window)
    if now > expires:
        raise SigV4Error("AccessDenied", "Request has expired", window)


def _payload_mode(content_sha256: str) -> PayloadMode:
    if _HEX64.fullmatch(content_sha256) is not None:
        return PayloadMode.SHA256
    mode = _LITERAL_MODES.get(content_sha256)
    if mode is None:
        raise SigV4Error(
            "InvalidArgument",
            "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, STREAMING-UNSIGNED-PAYLOAD-TRAILER, "
            "STREAMING-AWS4-HMAC-SHA256-PAYLOAD, STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER "
            "or a valid sha256 value.",
        )
    return mode


def _presigned_payload(
    headers: Mapping[str, str], signed_headers: tuple[str, ...]
) -> tuple[str, PayloadMode]:
    """A presigned URL signs UNSIGNED-PAYLOAD, unless x-amz-content-sha256 was signed with it."""
    value = headers.get("x-amz-content-sha256")
    if value is None or "x-amz-content-sha256" not in signed_headers:
        return PayloadMode.UNSIGNED.value, PayloadMode.UNSIGNED
    mode = _payload_mode(value)
    if mode.chunked:
        raise SigV4Error("InvalidArgument", "A presigned URL cannot carry an aws-chunked body.")
    return value, mode


def _decoded_length(headers: Mapping[str, str]) -> int | None:
    value = headers.get("x-amz-decoded-content-length")
    if value is None:
        return None
    if _DIGITS.fullmatch(value.strip()) is None:
        raise SigV4Error("InvalidArgument", "x-amz-decoded-content-length must be a number.")
    return int(value)


def _trailer_names(headers: Mapping[str, str]) -> tuple[str, ...]:
    value = headers.get("x-amz-trailer", "")
    return tuple(name.strip().lower() for name in value.split(",") if name.strip())


# --- Canonicalisation helpers --------------------------------------------------------------


def _canonical_headers(names: Sequence[str], headers: Mapping[str, str]) -> str:
    lines = []
    for name in names:
        value = headers.get(name.lower())
        if value is None:
            raise SigV4Error(
                "SignatureDoesNotMatch",
                f"The header {name[:64]!r} is listed in SignedHeaders but is not in the request.",
            )
        lines.append(f"{name}:{' '.join(value.split())}\n")
    return "".join(lines)


def _uri_encode(value: str) -> str:
    return quote_from_bytes(utf8(value), safe="")


def utf8(value: str) -> bytes:
    """UTF-8 bytes; undecodable bytes the server kept as surrogates come back as they were."""
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogatepass")


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.digest(key, utf8(message), "sha256")  # one call into OpenSSL, no HMAC object


def _sha256_hex(value: str) -> str:
    return hashlib.sha256(utf8(value)).hexdigest()


# --- Bodies --------------------------------------------------------------------------------


async def _passthrough(raw: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    async for piece in raw:
        if piece:
            yield bytes(piece)


@dataclass
class _ChunkChain:
    """The chain of chunk signatures, seeded with the request's own signature."""

    key: bytes
    amz_date: str
    scope: str
    previous: str

    def check_chunk(self, data_sha256: str, claimed: str) -> None:
        self._check("AWS4-HMAC-SHA256-PAYLOAD", f"{EMPTY_SHA256}\n{data_sha256}", claimed, "chunk")

    def check_trailer(self, canonical_trailers: str, claimed: str) -> None:
        self._check("AWS4-HMAC-SHA256-TRAILER", _sha256_hex(canonical_trailers), claimed, "trailer")

    def _check(self, algorithm: str, tail: str, claimed: str, what: str) -> None:
        to_sign = f"{algorithm}\n{self.amz_date}\n{self.scope}\n{self.previous}\n{tail}"
        expected = _hmac(self.key, to_sign).hex()
        if not hmac.compare_digest(expected, claimed.lower()):
            raise SigV4Error(
                "SignatureDoesNotMatch",
                f"The {what} signature we calculated does not match the one you provided.",
                {"StringToSign": to_sign, "SignatureProvided": claimed},
            )
        self.previous = expected


class _Reader:
    """Lines and byte runs from an async iterator of arbitrarily split bytes."""

    def __init__(self, source: AsyncIterable[bytes]) -> None:
        self._source = aiter(source)
        self._buffer = b""
        self._pos = 0

    async def _more(self) -> bool:
        """Append the next non-empty piece of the source; False at its end."""
        piece = b""
        while not piece:
            try:
                piece = await anext(self._source)
            except StopAsyncIteration:
                return False
        self._buffer = self._buffer[self._pos :] + bytes(piece)
        self._pos = 0
        return True

    async def line(self) -> bytes | None:
        """The next line without its "\\r\\n" (or "\\n"); a last unterminated line as is;
        None at the end of the source."""
        while True:
            end = self._buffer.find(b"\n", self._pos, self._pos + MAX_LINE + 1)
            if end >= 0:
                line = self._buffer[self._pos : end]
                self._pos = end + 1
                return line.removesuffix(b"\r")
            if len(self._buffer) - self._pos > MAX_LINE:
                raise _malformed_body(f"a line is longer than {MAX_LINE} bytes")
            if not await self._more():
                line = self._buffer[self._pos :]
                self._pos = len(self._buffer)
                return line.removesuffix(b"\r") if line else None

    async def some(self, limit: int) -> bytes:
        """Between 1 and ``limit`` bytes; IncompleteBody if the source has ended."""
        if self._pos >= len(self._buffer) and not await self._more():
            raise _incomplete_body()
        piece = self._buffer[self._pos : self._pos + limit]
        self._pos += len(piece)
        return piece


def _incomplete_body() -> SigV4Error:
    return SigV4Error("IncompleteBody", "The aws-chunked body ends before its last chunk.")


def _malformed_body(why: str) -> SigV4Error:
    return SigV4Error("InvalidArgument", f"Malformed aws-chunked body: {why}.")


@dataclass
class _ChunkedDecoder:
    """Decodes an aws-chunked body: ``hex-size[;chunk-signature=sig]\\r\\n data \\r\\n`` ...,
    a last chunk of size 0, then optional trailer lines ``name:value\\r\\n`` and ``\\r\\n``."""

    chain: _ChunkChain | None
    decoded_length: int | None
    declared_trailers: tuple[str, ...]
    trailers_allowed: bool
    trailers: dict[str, str]
    _count: int = field(default=0)

    async def decode(self, raw: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
        reader = _Reader(raw)
        while True:
            size, signature = await self._chunk_header(reader)
            if size == 0:
                break
            async for data in self._chunk_data(reader, size, signature):
                yield data
            end = await reader.line()
            if end is None:
                raise _incomplete_body()
            if end:
                raise _malformed_body("a chunk's data is not followed by CRLF")
        if self.chain is not None:
            self.chain.check_chunk(EMPTY_SHA256, signature or "")
        await self._trailer_section(reader)
        if self.decoded_length is not None and self._count != self.decoded_length:
            raise SigV4Error(
                "IncompleteBody",
                f"The body holds {self._count} bytes; x-amz-decoded-content-length "
                f"announced {self.decoded_length}.",
            )

    async def _chunk_header(self, reader: _Reader) -> tuple[int, str | None]:
        line = await reader.line()
        if line is None:
            raise _incomplete_body()
        size_text, *extensions = line.decode("latin-1").split(";")
        if _CHUNK_SIZE.fullmatch(size_text.strip()) is None:
            raise _malformed_body(f"bad chunk size {size_text[:32]!r}")
        size = int(size_text.strip(), 16)
        if size > MAX_CHUNK_SIZE:
            raise _malformed_body(f"a chunk is larger than {MAX_CHUNK_SIZE} bytes")
        if self.decoded_length is not None and self._count + size > self.decoded_length:
            raise SigV4Error(
                "InvalidArgument",
                "The body holds more bytes than x-amz-decoded-content-length announced.",
            )
        return size, self._chunk_signature(extensions)

    def _chunk_signature(self, extensions: list[str]) -> str | None:
        if self.chain is None:
            return None  # unsigned chunks: extensions carry nothing we need
        for extension in extensions:
            name, _, value = extension.strip().partition("=")
            if name == "chunk-signature" and _HEX64.fullmatch(value) is not None:
                return value
        raise SigV4Error("SignatureDoesNotMatch", "A chunk has no valid chunk-signature.")

    async def _chunk_data(
        self, reader: _Reader, size: int, signature: str | None
    ) -> AsyncIterator[bytes]:
        remaining = size
        self._count += size
        if self.chain is None:
            while remaining:
                piece = await reader.some(remaining)
                remaining -= len(piece)
                yield piece
            return
        # A signed chunk is held whole until its signature is checked: unverified data never
        # leaves this module.
        pieces = []
        digest = hashlib.sha256()
        while remaining:
            piece = await reader.some(remaining)
            digest.update(piece)
            pieces.append(piece)
            remaining -= len(piece)
        self.chain.check_chunk(digest.hexdigest(), signature or "")
        yield b"".join(pieces)

    async def _trailer_section(self, reader: _Reader) -> None:
        """Everything after the last chunk: trailer lines, blank lines, then the end."""
        received: dict[str, str] = {}
        signature = None
        total = 0
        while (line := await reader.line()) is not None:
            total += len(line) + 2
            if total > MAX_TRAILER_SECTION:
                raise _malformed_body(f"the trailers exceed {MAX_TRAILER_SECTION} bytes")
            if not line.strip():
                continue
            name, colon, value = line.decode("latin-1").partition(":")
            name, value = name.strip().lower(), value.strip()
            if not colon or not self.trailers_allowed:
                raise _malformed_body("unexpected data after the last chunk")
            if name == _TRAILER_SIGNATURE and self.chain is not None and signature is None:
                signature = value
            elif name in self.declared_trailers and name not in received:
                received[name] = value
            else:
                raise _malformed_body(f"unexpected or repeated trailer {name[:64]!r}")
        self._check_trailers(received, signature)
        self.trailers.update(received)

    def _check_trailers(self, received: dict[str, str], signature: str | None) -> None:
        missing = [name for name in self.declared_trailers if name not in received]
        if missing:
            raise SigV4Error(
                "IncompleteBody",
                f"The trailer {missing[0]!r} announced in x-amz-trailer is missing.",
            )
        if self.chain is not None and self.trailers_allowed:
            if signature is None or _HEX64.fullmatch(signature) is None:
                raise SigV4Error("SignatureDoesNotMatch", "The trailer has no valid signature.")
            canonical = "".join(f"{name}:{value}\n" for name, value in received.items())
            self.chain.check_trailer(canonical, signature)
