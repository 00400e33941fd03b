"""AWS Signature Version 2 for S3 requests: who signed a request, and does the signature hold.

SigV2 is S3's legacy signature (HMAC-SHA1). It is still what boto3 uses for presigned URLs
when its client has a custom endpoint, region us-east-1 and no ``signature_version`` setting
(query parameters ``AWSAccessKeyId``, ``Signature`` and ``Expires``), and what some old tools
send in the header ``Authorization: AWS AKID:signature``. Like `shoal.s3.sigv4`, this is a pure
library working on the same plain values (`SignedRequest`) and raising the same `SigV4Error`.

The flow, for a request that `is_sigv2` recognises (the gateway sends every other request to
`shoal.s3.sigv4`) and that ``[s3] signature_v2`` lets in (`refuse_if_off`):

1. `parse(request, now)` finds the signature, in the ``Authorization`` header or in the query
   string of a presigned URL, and checks everything that needs no secret: a presigned URL's
   ``Expires`` (epoch seconds) against ``now``, or a signed header's ``Date`` / ``x-amz-date``
   against ``now`` (15 minutes of clock skew). It returns `V2Credentials`, whose
   ``access_key_id`` tells the gateway which secret to look up.
2. `verify(credentials, request, secret_key)` rebuilds the StringToSign the way S3 does::

       HTTP-Verb \\n Content-MD5 \\n Content-Type \\n Date-or-Expires \\n
       CanonicalizedAmzHeaders CanonicalizedResource

   and compares ``base64(HMAC-SHA1(secret, StringToSign))`` with the signature, in constant
   time. The resource is the path exactly as sent (still percent-encoded), prefixed with
   ``/bucket`` for virtual-hosted-style requests (a bucket itself is ``/bucket/``), followed
   by the S3 sub-resources among the query parameters (``?acl``,
   ``?uploadId=..&partNumber=..``, ``?response-content-type=..``), sorted by name, their
   values not encoded.

What SigV2 does not protect, by design: the body (the gateway treats it as unsigned, like
SigV4's ``UNSIGNED-PAYLOAD``; a ``Content-MD5`` is signed here and checked against the body
elsewhere), the ``Host`` header, and every query parameter that is not a sub-resource (for
example a listing's ``prefix``, or parameters appended to a presigned URL).

Every refusal is a `SigV4Error` carrying the S3 error code; nothing else is raised on malformed
client input.

Reference: the AWS S3 API documentation, "Signing and authenticating REST requests (AWS
signature version 2)", and botocore's ``HmacV1Auth`` / ``HmacV1QueryAuth`` signers.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from shoal import httpdate
from shoal.s3.sigv4 import (
    SignedRequest,
    SigV4Error,
    check_clock_skew,
    in_utc,
    refuse_session_tokens,
    signature_mismatch,
    two_mechanisms,
    utf8,
)

__all__ = [
    "SUBRESOURCES",
    "V2Credentials",
    "is_sigv2",
    "parse",
    "refuse_if_off",
    "verify",
]

# The Authorization header of SigV2: "AWS AKID:signature". The space matters: SigV4 headers
# start with "AWS4-HMAC-SHA256".
HEADER_PREFIX = "AWS "

# The query parameters of a SigV2 presigned URL.
QUERY_ACCESS_KEY = "AWSAccessKeyId"
QUERY_SIGNATURE = "Signature"
QUERY_EXPIRES = "Expires"

# The query parameters that are part of the signed resource. S3 signs only these (its
# documented list); every other parameter is left out of the StringToSign. The set is the
# documentation's list together with botocore's (HmacV1Auth.QSAOfInterest): a client signs
# exactly the names in its own list, so a name missing here would make its signatures fail.
SUBRESOURCES = frozenset(
    {
        "accelerate",
        "acl",
        "analytics",
        "cors",
        "defaultObjectAcl",
        "delete",
        "inventory",
        "lifecycle",
        "location",
        "logging",
        "metrics",
        "notification",
        "object-lock",
        "partNumber",
        "policy",
        "replication",
        "requestPayment",
        "response-cache-control",
        "response-content-disposition",
        "response-content-encoding",
        "response-content-language",
        "response-content-type",
        "response-expires",
        "restore",
        "select",
        "select-type",
        "storageClass",
        "tagging",
        "torrent",
        "uploadId",
        "uploads",
        "versionId",
        "versioning",
        "versions",
        "website",
    }
)

# The query parameters of a SigV4 presigned URL: a request carrying them is SigV4's.
_SIGV4_QUERY = frozenset({"X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Signature"})
_SIGV2_QUERY = (QUERY_ACCESS_KEY, QUERY_SIGNATURE, QUERY_EXPIRES)
# Epoch seconds; 19 digits is more than any date needs and keeps int() cheap.
_EPOCH_SECONDS = re.compile(r"[0-9]{1,19}")
_AMZ_DATE = re.compile(r"[0-9]{8}T[0-9]{6}Z")
_AMZ_DATE_FORMAT = "%Y%m%dT%H%M%SZ"
_ISO_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True)
class V2Credentials:
    """What `parse` found: who claims to have signed, and everything `verify` needs.

    ``date_line`` is the fourth line of the StringToSign: a presigned URL's ``Expires`` as sent,
    a signed header's ``Date`` value, or "" when ``x-amz-date`` gives the request time.
    """

    access_key_id: str
    signature: str  # base64, as sent
    presigned: bool
    date_line: str
    request_time: datetime | None  # header auth: the time of Date or x-amz-date, UTC
    expires: int | None  # presigned URLs: Expires, in seconds since the epoch


def is_sigv2(request: SignedRequest) -> bool:
    """Whether the request claims a SigV2 signature, so that the gateway hands it to this module.

    True for an ``Authorization`` header starting with "AWS " and, when there is no
    ``Authorization`` header, for a query holding ``AWSAccessKeyId`` or ``Signature`` but no
    SigV4 presign parameter (X-Amz-Algorithm, X-Amz-Credential, X-Amz-Signature). An
    incomplete set of query parameters counts, so that `parse` refuses it the way S3 does.
    """
    authorization = request.headers.get("authorization")
    if authorization is not None:
        return authorization.lstrip().startswith(HEADER_PREFIX)
    names = {name for name, _ in request.query}
    if names & _SIGV4_QUERY:
        return False
    return QUERY_ACCESS_KEY in names or QUERY_SIGNATURE in names


def refuse_if_off(request: SignedRequest, accepted: str) -> None:
    """Refuse a SigV2 request that ``[s3] signature_v2`` (`accepted`) does not let in.

    "all" accepts both forms, "presigned" only query-string URLs, "off" neither. The refusal
    is what S3 answers where SigV2 is turned off (InvalidRequest, "not supported"), saying why.
    """
    presigned = "authorization" not in request.headers
    if accepted == "all" or (accepted == "presigned" and presigned):
        return
    raise _turned_off("presigned URLs" if presigned else "the Authorization header")


def refuse_form_if_off(accepted: str) -> None:
    """Refuse a POST form signed with SigV2 unless ``[s3] signature_v2`` lets presigned URLs
    in: a form's policy is signed ahead of its use, as a presigned URL is."""
    if accepted not in ("all", "presigned"):
        raise _turned_off("POST forms")


def _turned_off(form: str) -> SigV4Error:
    return SigV4Error(
        "InvalidRequest",
        f"The authorization mechanism you have provided is not supported: Signature Version 2"
        f" in {form} is off on this server. Please use AWS4-HMAC-SHA256.",
    )


def policy_signature_holds(secret_key: str, policy: str, signature: str) -> bool:
    """Does ``signature`` sign a POST form's ``policy`` (the base64 text as sent)? SigV2's form
    signature is base64(HMAC-SHA1(secret, policy)); compared in constant time."""
    return hmac.compare_digest(_sign(utf8(secret_key), policy), utf8(signature))


def parse(request: SignedRequest, now: datetime) -> V2Credentials:
    """Read and check the signature's claims, without the secret; raise SigV4Error if refused.

    ``now`` is the server's time (a naive datetime is taken as UTC). A request without any
    signature is refused with AccessDenied (the gateway serves anonymous requests, which
    carry no credentials at all, without calling this).
    """
    now = in_utc(now)
    refuse_session_tokens(request)
    authorization = request.headers.get("authorization")
    names = {name for name, _ in request.query}
    in_query = bool(names & (_SIGV4_QUERY | {QUERY_ACCESS_KEY, QUERY_SIGNATURE}))
    if authorization is not None and in_query:
        raise two_mechanisms()
    if authorization is not None:
        return _parse_header_auth(request, authorization, now)
    if names & _SIGV4_QUERY:
        raise SigV4Error("InvalidArgument", "This is a SigV4 presigned URL, not a SigV2 one.")
    if in_query or QUERY_EXPIRES in names:
        return _parse_query_auth(request.query, now)
    raise SigV4Error("AccessDenied", "Access Denied: the request is not signed")


def verify(
    credentials: V2Credentials,
    request: SignedRequest,
    secret_key: str,
    *,
    host_bucket: str | None = None,
) -> None:
    """Check the signature with the secret of ``credentials.access_key_id``.

    ``host_bucket`` is the bucket named by the ``Host`` header of a virtual-hosted-style
    request (``bucket.s3.example.com/key``); S3 signs such a request's resource as
    ``/bucket/key``. Leave it None for path-style requests, whose path already starts with the
    bucket. Raises SignatureDoesNotMatch, with S3's diagnostic details, if the signature fails.
    """
    candidates = _strings_to_sign(credentials, request, host_bucket)
    key, provided = utf8(secret_key), utf8(credentials.signature)
    matched = False
    for to_sign in candidates:  # every candidate is computed: the time does not tell which one
        matched |= hmac.compare_digest(_sign(key, to_sign), provided)
    if not matched:
        to_sign = candidates[0]
        raise signature_mismatch(
            credentials.access_key_id,
            to_sign,
            credentials.signature,
            StringToSignBytes=" ".join(f"{byte:02x}" for byte in utf8(to_sign)),
        )


def _strings_to_sign(
    credentials: V2Credentials, request: SignedRequest, host_bucket: str | None
) -> list[str]:
    """The StringToSign S3 computes for this request; more than one only where S3's resource
    for the request is ambiguous (see `_canonical_resources`), S3's own first."""
    headers = _signed_headers(request, presigned=credentials.presigned)
    amz_headers = "".join(f"{name}:{headers[name]}\n" for name in sorted(headers) if _amz(name))
    head = "\n".join(
        [
            request.method,
            headers.get("content-md5", ""),
            headers.get("content-type", ""),
            credentials.date_line,
            amz_headers,
        ]
    )
    return [head + resource for resource in _canonical_resources(request, host_bucket)]


def _sign(key: bytes, to_sign: str) -> bytes:
    """base64(HMAC-SHA1(key, StringToSign)), as ASCII bytes."""
    return base64.b64encode(hmac.new(key, utf8(to_sign), hashlib.sha1).digest())


# --- Parsing the two forms of authentication ---------------------------------------------------


def _parse_header_auth(request: SignedRequest, authorization: str, now: datetime) -> V2Credentials:
    scheme, _, credential = authorization.strip().partition(" ")
    if scheme != HEADER_PREFIX.strip():
        raise SigV4Error(
            "InvalidArgument",
            "Unsupported Authorization Type: this module verifies 'AWS AKID:signature' only.",
            {"ArgumentName": "Authorization", "ArgumentValue": authorization[:128]},
        )
    access_key_id, colon, signature = credential.strip().rpartition(":")
    if not colon or not access_key_id or not signature:
        raise SigV4Error(
            "InvalidArgument",
            "AWS authorization header is invalid.  Expected AwsAccessKeyId:signature",
            {"ArgumentName": "Authorization", "ArgumentValue": authorization[:128]},
        )
    amz_date = request.headers.get("x-amz-date")
    date = request.headers.get("date")
    if amz_date is not None:
        request_time = _parse_request_time(amz_date)
        date_line = ""  # x-amz-date is signed among the x-amz-* headers instead
    else:
        request_time = None if date is None else _parse_request_time(date)
        date_line = (date or "").strip()
    if request_time is None:
        raise SigV4Error(
            "AccessDenied", "AWS authentication requires a valid Date or x-amz-date header"
        )
    check_clock_skew(request_time, now)
    return V2Credentials(
        access_key_id=access_key_id,
        signature=signature,
        presigned=False,
        date_line=date_line,
        request_time=request_time,
        expires=None,
    )


def _parse_query_auth(query: Sequence[tuple[str, str]], now: datetime) -> V2Credentials:
    params: dict[str, str] = {}
    for name, value in query:
        if name in _SIGV2_QUERY:
            if name in params:
                raise SigV4Error("InvalidArgument", f"{name} is given twice.")
            params[name] = value
    if not all(params.get(name) for name in _SIGV2_QUERY):
        raise SigV4Error(
            "AccessDenied",
            "Query-string authentication requires the Signature, Expires and AWSAccessKeyId "
            "parameters",
        )
    expires_text = params[QUERY_EXPIRES]
    if _EPOCH_SECONDS.fullmatch(expires_text) is None:
        raise SigV4Error(
            "AccessDenied", f"Invalid date (should be seconds since epoch): {expires_text[:32]}"
        )
    expires = int(expires_text)
    if now.timestamp() > expires:
        raise SigV4Error(
            "AccessDenied",
            "Request has expired",
            {
                "Expires": datetime.fromtimestamp(expires, UTC).strftime(_ISO_FORMAT),
                "ServerTime": now.strftime(_ISO_FORMAT),
            },
        )
    # Base64 signatures contain '+'; a client that did not percent-encode it sends a '+' that
    # the query decoding turned into a space. A base64 text never holds a space, so this only
    # undoes that damage.
    signature = params[QUERY_SIGNATURE].replace(" ", "+")
    return V2Credentials(
        access_key_id=params[QUERY_ACCESS_KEY],
        signature=signature,
        presigned=True,
        date_line=expires_text,
        request_time=None,
        expires=expires,
    )


def _parse_request_time(value: str) -> datetime | None:
    """An HTTP date (RFC 7231: "Tue, 27 Mar 2007 19:36:42 +0000"), or the ISO 8601 basic
    format some clients put in x-amz-date ("20070327T193642Z"); None if it is neither."""
    value = value.strip()
    if _AMZ_DATE.fullmatch(value) is not None:
        try:
            return datetime.strptime(value, _AMZ_DATE_FORMAT).replace(tzinfo=UTC)
        except ValueError:
            return None
    return httpdate.parse(value)


# --- Canonicalisation --------------------------------------------------------------------------


def _signed_headers(request: SignedRequest, *, presigned: bool) -> dict[str, str]:
    """Content-MD5, Content-Type and the x-amz-* headers, lowercase name -> trimmed value.

    For a presigned URL, a parameter of the same (lowercase) name stands in for a header the
    request does not carry: botocore moves these headers into the URL's query when it presigns
    (``?content-type=..&x-amz-meta-a=..``). A header sent with the request takes precedence, so
    every header the gateway acts on is one the signature covers.
    """
    found: dict[str, str] = {}
    if presigned:
        for name, value in request.query:
            if _signable(name.lower()):
                found[name.lower()] = value
    for name, value in request.headers.items():
        if _signable(name.lower()):
            found[name.lower()] = value
    return {name: _unfold(value) for name, value in found.items()}


def _unfold(value: str) -> str:
    """The value trimmed, a header folded over several lines (obsolete since RFC 7230, still
    in the SigV2 rules) joined by single spaces."""
    if "\n" not in value:
        return value.strip()
    return " ".join(part.strip() for part in value.split("\n") if part.strip())


def _signable(name: str) -> bool:
    return name in ("content-md5", "content-type") or _amz(name)


def _amz(name: str) -> bool:
    return name.startswith("x-amz-")


def _canonical_resources(request: SignedRequest, host_bucket: str | None) -> list[str]:
    """The CanonicalizedResource: the path as sent (percent-encoded as on the wire; S3 does not
    re-encode it), with ``/bucket`` in front for virtual-hosted style, then the sub-resources
    sorted by name, their values decoded (the documentation: "must not be URL-encoded"), a
    blank one without '='.

    A path-style request on a bucket itself ("/bucket") has the resource "/bucket/", as a
    virtual-hosted one has: botocore signs that (its ``auth_path``), because S3 does. The path
    as sent is the second candidate, for clients that sign it unchanged; both name the same
    resource, so accepting either grants nothing more.
    """
    path = request.raw_path or "/"
    if host_bucket is not None:
        paths = [f"/{host_bucket}{path if path.startswith('/') else '/' + path}"]
    elif len(path) > 1 and path.count("/") == 1 and path.startswith("/"):
        paths = [path + "/", path]
    else:
        paths = [path]
    subresources = sorted(
        ((name, value) for name, value in request.query if name in SUBRESOURCES),
        key=lambda pair: pair[0],  # stable: repeated names keep the order they were sent in
    )
    suffix = "&".join(f"{name}={value}" if value else name for name, value in subresources)
    return [f"{path}?{suffix}" if suffix else path for path in paths]
