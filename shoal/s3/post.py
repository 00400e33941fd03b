"""POST Object: a browser form's upload to a bucket, signed by a POST policy.

The form's fields before its `file` field carry the signature (SigV4: x-amz-algorithm,
x-amz-credential, x-amz-date, policy, x-amz-signature; SigV2: AWSAccessKeyId, policy,
signature): the policy, a base64 JSON document of an expiration and conditions, is what is
signed, and every field must meet its conditions.
The file is streamed to the storage nodes as a PutObject body is (docs/s3.md, "POST Object").
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import re
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from shoal.s3 import formdata, http, payload, sigv2, sigv4, tags
from shoal.s3 import headers as h
from shoal.s3 import xml as s3xml
from shoal.s3.app import Call, Gateway, handles
from shoal.s3.errors import (
    AccessDenied,
    EntityTooLarge,
    EntityTooSmall,
    IncorrectNumberOfFilesInPostRequest,
    InvalidArgument,
    InvalidPolicyDocument,
    PreconditionFailed,
    SignatureDoesNotMatch,
)
from shoal.s3.refusals import canned_acl, refuse_what_cannot_be_stored
from shoal.s3.router import Address, Endpoint

ALGORITHM = "AWS4-HMAC-SHA256"
V4_FIELDS = ("x-amz-algorithm", "x-amz-credential", "x-amz-date", "x-amz-signature")
SIGNATURE_FIELDS = (*V4_FIELDS, "awsaccesskeyid", "signature")
# Fields no condition needs to cover (S3's rule; a SigV2 form's key id and signature too);
# x-ignore-* too.
UNCHECKED_FIELDS = frozenset({"x-amz-signature", "file", "policy", "awsaccesskeyid", "signature"})
SUCCESS_STATUSES = {"200": 200, "201": 201, "204": 204}
EXPIRATION = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?Z", re.ASCII)


@dataclass
class Policy:
    expiration: datetime
    conditions: list[Any]
    length_range: tuple[int, int] | None = None


@dataclass
class PostedForm:
    """What authenticates a POST upload, in the place a signed request's `Verified` has in a
    Call: its fields, and its body is the form's file."""

    fields: dict[str, str]
    reader: formdata.FormReader
    policy: Policy
    trailers: dict[str, str] = field(default_factory=dict)

    def body(self, raw: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        return self.reader.file_chunks()


async def authenticated_call(
    gateway: Gateway,
    request: http.Request,
    request_id: str,
    where: Address,
    query: dict[str, str],
) -> Call:
    """A Call for a form upload: fields read up to the file, the policy's signature verified
    and every field held to its conditions."""
    boundary = formdata.boundary_of(request.headers.get("Content-Type", ""))
    if boundary is None:
        raise PreconditionFailed(
            "Bucket POST must be of the enclosure-type multipart/form-data",
            Condition="Bucket POST must be of the enclosure-type multipart/form-data",
        )
    reader = formdata.FormReader(request.body, boundary)
    fields = await reader.fields()
    account, policy = await _verify_signature(gateway, fields)
    if reader.file is None:
        raise IncorrectNumberOfFilesInPostRequest()
    _require(fields, "key")
    key = fields["key"].replace("${filename}", reader.file.filename)
    _check_conditions(policy, fields, where.bucket or "", key)
    form = PostedForm(fields, reader, policy)
    object_where = Address(where.bucket, key, where.virtual)
    return Call(
        gateway, request, request_id, Endpoint.PostObject, object_where, account, form, query
    )


async def _verify_signature(
    gateway: Gateway, fields: Mapping[str, str]
) -> tuple[uuid.UUID, Policy]:
    if not any(name in fields for name in SIGNATURE_FIELDS):
        # An anonymous upload, which S3 lets only into a bucket anyone may write to (Shoal
        # has no such bucket); S3 answers so to a form of only `key` and `policy`.
        raise AccessDenied()
    if "x-amz-algorithm" not in fields and ("awsaccesskeyid" in fields or "signature" in fields):
        return await _verify_v2_signature(gateway, fields)
    _require(
        fields, "Policy", "X-Amz-Algorithm", "X-Amz-Credential", "X-Amz-Date", "X-Amz-Signature"
    )
    if fields["x-amz-algorithm"] != ALGORITHM:
        raise InvalidArgument(f"The algorithm must be {ALGORITHM}.")
    try:
        access_key_id, scope_date, region = sigv4.parse_credential(
            fields["x-amz-credential"], "InvalidArgument"
        )
    except sigv4.SigV4Error as exc:
        raise InvalidArgument(exc.message) from None
    if not fields["x-amz-date"].startswith(scope_date):
        raise InvalidArgument("The x-amz-date must be the day of the credential's scope.")
    account, secret = await gateway.credentials.secret_of(access_key_id)
    signing_key = sigv4.signing_key(secret, sigv4.scope(scope_date, region))
    expected = hmac.new(signing_key, fields["policy"].encode(), "sha256").hexdigest()
    if not hmac.compare_digest(expected, fields["x-amz-signature"].lower()):
        raise SignatureDoesNotMatch()
    return account, _parse_policy(fields["policy"])


async def _verify_v2_signature(
    gateway: Gateway, fields: Mapping[str, str]
) -> tuple[uuid.UUID, Policy]:
    """A form signed with SigV2 (`AWSAccessKeyId`, `policy`, `signature`): what boto3's
    generate_presigned_post makes for a client in us-east-1 without a signature_version.
    Let in as SigV2 presigned URLs are (`[s3] signature_v2`)."""
    sigv2.refuse_form_if_off(gateway.config.signature_v2)
    _require(fields, "AWSAccessKeyId", "Policy", "Signature")
    account, secret = await gateway.credentials.secret_of(fields["awsaccesskeyid"])
    if not sigv2.policy_signature_holds(secret, fields["policy"], fields["signature"]):
        raise SignatureDoesNotMatch()
    return account, _parse_policy(fields["policy"])


def _require(fields: Mapping[str, str], *names: str) -> None:
    """InvalidArgument for the first of `names` the form lacks, named as S3 spells it
    (`X-Amz-Signature`, `AWSAccessKeyId`, but `key`); field names are compared in lowercase."""
    for name in names:
        if name.lower() not in fields:
            raise InvalidArgument(
                f"Bucket POST must contain a field named '{name}'.  If it is "
                "specified, please check the order of the fields.",
                ArgumentName=name,
                ArgumentValue="",
            )


def _parse_policy(encoded: str) -> Policy:
    try:
        document = json.loads(base64.b64decode(encoded, validate=True))
    except (binascii.Error, ValueError):
        raise InvalidPolicyDocument("Invalid Policy: Invalid JSON.") from None
    if not isinstance(document, dict) or not isinstance(document.get("expiration"), str):
        raise InvalidPolicyDocument("Invalid Policy: Policy missing expiration.")
    expiration, conditions = _expiration(document["expiration"]), document.get("conditions")
    if not isinstance(conditions, list):
        raise InvalidPolicyDocument("Invalid Policy: Policy missing conditions.")
    policy = Policy(expiration, conditions)
    for condition in conditions:
        if isinstance(condition, dict) and len(condition) != 1:
            raise InvalidPolicyDocument(
                "Invalid Policy: Invalid Simple-Condition: "
                "Simple-Conditions must have exactly one property specified."
            )
        if _operator(condition) == "content-length-range":
            policy.length_range = _length_range(condition)
        elif not _well_formed(condition):
            raise InvalidPolicyDocument(
                f"Invalid Policy: Invalid Condition: {json.dumps(condition)}"
            )
    return policy


def _expiration(text: str) -> datetime:
    """An ISO 8601 time in UTC, as S3 takes it: `YYYY-MM-DDThh:mm:ssZ`, with or without
    fractions of a second."""
    if not EXPIRATION.fullmatch(text):
        raise InvalidPolicyDocument("Invalid Policy: Invalid 'expiration' value.")
    try:
        return datetime.fromisoformat(text[:-1]).replace(tzinfo=UTC)
    except ValueError:  # a day or hour that does not exist
        raise InvalidPolicyDocument("Invalid Policy: Invalid 'expiration' value.") from None


def _operator(condition: object) -> str | None:
    """A list condition's operator, in lowercase (S3 takes `StArTs-WiTh`)."""
    if isinstance(condition, list) and condition and isinstance(condition[0], str):
        return condition[0].lower()
    return None


def _well_formed(condition: object) -> bool:
    if isinstance(condition, dict):
        return all(isinstance(v, str) for v in condition.values())
    return (
        _operator(condition) in ("eq", "starts-with")
        and isinstance(condition, list)
        and len(condition) == 3
        and all(isinstance(part, str) for part in condition)
    )


def _length_range(condition: list[Any]) -> tuple[int, int]:
    """`["content-length-range", low, high]`: numbers, or strings of digits (S3 takes "5"); a
    string that is not a number is a condition that fails."""
    if len(condition) != 3 or not all(
        isinstance(n, int | str) and not isinstance(n, bool) for n in condition[1:]
    ):
        raise InvalidPolicyDocument(
            f"Invalid Policy: Invalid 'content-length-range' condition: {json.dumps(condition)}"
        )
    low, high = (int(n) if isinstance(n, int) or _digits(n) else None for n in condition[1:])
    if low is None or high is None or low < 0:
        raise _failed(condition)
    return low, high


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _failed(condition: object) -> AccessDenied:
    return AccessDenied(
        f"Invalid according to Policy: Policy Condition failed: {json.dumps(condition)}"
    )


def _check_conditions(policy: Policy, fields: Mapping[str, str], bucket: str, key: str) -> None:
    if policy.expiration <= datetime.now(UTC):
        raise AccessDenied("Invalid according to Policy: Policy expired.")
    values = {**fields, "bucket": bucket, "key": key}
    covered = set()
    for condition in policy.conditions:
        operator = _operator(condition)
        if isinstance(condition, dict):
            ((name, wanted),) = condition.items()
            operator, name = "eq", name.lower()
        elif operator == "content-length-range":
            continue
        elif not condition[1].startswith("$"):  # S3: a condition that fails, not a bad one
            raise _failed(condition)
        else:
            name, wanted = condition[1][1:].lower(), condition[2]
        covered.add(name)
        if not _holds(operator or "", name, values.get(name, ""), wanted):
            raise _failed(condition)
    extra = [
        name
        for name in fields
        if name not in covered and name not in UNCHECKED_FIELDS and not name.startswith("x-ignore-")
    ]
    if extra:
        raise AccessDenied(f"Invalid according to Policy: Extra input fields: {extra[0]}")


def _holds(operator: str, name: str, value: str, wanted: str) -> bool:
    if operator == "eq":
        return value == wanted
    if name == "content-type":  # each of a list of types must start so
        return all(part.strip().startswith(wanted) for part in value.split(","))
    return value.startswith(wanted)


@handles(Endpoint.PostObject)
async def post_object(call: Call) -> http.Response:
    form = call.verified
    assert isinstance(form, PostedForm)
    from shoal.s3.objects import _commit, _object_write, check_key

    check_key(call.key)
    # Its fields ask for what a PutObject's headers would (names are lowercase in both),
    # but for the canned ACL: the form's field is `acl`, the header's `x-amz-acl`.
    asked = dict(form.fields)
    if "acl" in asked:
        asked["x-amz-acl"] = asked.pop("acl")
    refuse_what_cannot_be_stored(Endpoint.PutObject, asked)
    acl = canned_acl(asked)
    # S3's form field `tagging` is a Tagging document, as PutObjectTagging's body.
    tagging = form.fields.get("tagging")
    tag_set = tags.from_body(tagging.encode(), tags.MAX_OBJECT_TAGS) if tagging else {}
    await call.store.buckets.get(call.account, call.bucket)
    stored = await _store_file(call, form)
    kept = h.object_headers({k: v for k, v in form.fields.items() if k != "content-type"})
    content_type = form.fields.get("content-type") or None
    await _commit(call, _object_write(stored, content_type, kept, tag_set, acl), stored)
    response = _answer(call, form, f'"{stored.result.md5.hex()}"')
    response.headers |= {f"x-amz-checksum-{k}": v for k, v in stored.checksums.items()}
    return response


async def _store_file(call: Call, form: PostedForm) -> payload.Stored:
    """The form's file, stored as PutObject stores a body; a length outside the policy's
    content-length-range is refused, a too large one as soon as it is seen."""
    low, high = form.policy.length_range or (0, payload.MAX_PUT_BYTES)
    high = min(high, payload.MAX_PUT_BYTES)
    inline_limit = call.gateway.config.inline_max_bytes
    source = call.body()
    prefix = bytearray()
    async for chunk in source:
        prefix += chunk
        if len(prefix) > inline_limit:
            break
    ended = len(prefix) <= inline_limit
    if not ended:
        source = _with_limit(_chained(bytes(prefix), source), high)
    elif len(prefix) > high:
        raise EntityTooLarge(ProposedSize=str(len(prefix)), MaxSizeAllowed=str(high))
    else:
        source = _chained(bytes(prefix), _nothing())
    checksums = payload.requested_checksums(form.fields)
    stored = await payload.store_body(
        call.data,
        source,
        form.fields,
        {},
        len(prefix) if ended else None,
        checksums,
        inline_limit if ended else None,
    )
    if stored.result.size < low:
        await payload.discard(call.data, stored.version_id, stored.result)
        raise EntityTooSmall(ProposedSize=str(stored.result.size), MinSizeAllowed=str(low))
    return stored


async def _chained(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if first:
        yield first
    async for chunk in rest:
        yield chunk


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield


async def _with_limit(source: AsyncIterator[bytes], high: int) -> AsyncIterator[bytes]:
    size = 0
    async for chunk in source:
        size += len(chunk)
        if size > high:
            raise EntityTooLarge(ProposedSize=str(size), MaxSizeAllowed=str(high))
        yield chunk


def _answer(call: Call, form: PostedForm, etag: str) -> http.Response:
    headers = {"ETag": etag, "Location": call.object_url}
    redirect = form.fields.get("success_action_redirect") or form.fields.get("redirect")
    if redirect:
        parts = urlsplit(redirect)
        if parts.scheme in ("http", "https"):
            extra = urlencode({"bucket": call.bucket, "key": call.key, "etag": etag})
            query = f"{parts.query}&{extra}" if parts.query else extra
            headers["Location"] = urlunsplit(parts._replace(query=query))
            return http.Response(status=303, headers=headers)
    status = SUCCESS_STATUSES.get(form.fields.get("success_action_status", ""), 204)
    if status != 201:
        return http.Response(status=status, headers=headers)
    body = s3xml.document(
        "PostResponse",
        {"Location": headers["Location"], "Bucket": call.bucket, "Key": call.key, "ETag": etag},
    )
    return http.Response(status=201, headers=headers, body=body, content_type="application/xml")
