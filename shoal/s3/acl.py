"""ACLs, the part clients use: Get/PutBucketAcl, Get/PutObjectAcl and `x-amz-acl` on writes.

Shoal keeps two canned ACLs: `private` (the owner's FULL_CONTROL, the default) and
`public-read` (also READ for everyone, anonymous requests included; what that allows is in
access.py). An object's ACL is kept with its version (`properties["acl"]`), a bucket's on
the catalog shard. Every other ACL, canned or granted, is refused, never stored in part.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from xml.etree.ElementTree import Element
from xml.sax.saxutils import escape

from shoal.s3 import http
from shoal.s3 import xml as s3xml
from shoal.s3.app import Call, handles
from shoal.s3.errors import (
    AccessControlListNotSupported,
    AccessDenied,
    InvalidArgument,
    MalformedACLError,
    MissingSecurityHeader,
    UnexpectedContent,
)
from shoal.s3.objects import check_key, check_null_version
from shoal.s3.refusals import PRIVATE, PUBLIC_READ, canned_acl
from shoal.s3.router import Endpoint

XML = "application/xml"
ALL_USERS = "http://acs.amazonaws.com/groups/global/AllUsers"
# What S3's schema and groups allow in a grant; Shoal keeps only two combinations of them.
GROUPS = frozenset(
    {
        ALL_USERS,
        "http://acs.amazonaws.com/groups/global/AuthenticatedUsers",
        "http://acs.amazonaws.com/groups/s3/LogDelivery",
    }
)
GRANTEE_TYPES = frozenset({"CanonicalUser", "Group", "AmazonCustomerByEmail"})
PERMISSIONS = frozenset({"FULL_CONTROL", "READ", "WRITE", "READ_ACP", "WRITE_ACP"})
_XSI = "{http://www.w3.org/2001/XMLSchema-instance}type"
MAX_BODY = 64 * 1024


def of_properties(properties: Mapping[str, object]) -> str:
    return PUBLIC_READ if properties.get("acl") == PUBLIC_READ else PRIVATE


async def document(call: Call, acl: str) -> bytes:
    """S3's AccessControlPolicy for a canned ACL: the owner's FULL_CONTROL (and READ for
    AllUsers when public-read). Written by hand: the Grantee's xsi:type is an attribute."""
    account = await call.store.accounts.get(call.account)
    owner = f"<ID>{account.id}</ID><DisplayName>{escape(account.name)}</DisplayName>"
    grants = [
        '<Grant><Grantee xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
        f'xsi:type="CanonicalUser">{owner}</Grantee><Permission>FULL_CONTROL</Permission></Grant>'
    ]
    if acl == PUBLIC_READ:
        grants.append(
            '<Grant><Grantee xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
            f'xsi:type="Group"><URI>{ALL_USERS}</URI></Grantee><Permission>READ</Permission>'
            "</Grant>"
        )
    text = (
        f'{s3xml.DECLARATION}<AccessControlPolicy xmlns="{s3xml.NAMESPACE}">'
        f"<Owner>{owner}</Owner><AccessControlList>{''.join(grants)}</AccessControlList>"
        "</AccessControlPolicy>"
    )
    return text.encode()


async def _wanted(call: Call) -> str:
    """The canned ACL a Put*Acl asks for: its `x-amz-acl`, or a body that is exactly one of
    the two Shoal keeps."""
    body = await call.read_body(MAX_BODY)
    header = canned_acl(call.request.headers)
    if header is not None:
        if body.strip():
            raise UnexpectedContent()
        return header
    if not body.strip():
        raise MissingSecurityHeader(
            "Your request was missing a required header", MissingHeaderName="x-amz-acl"
        )
    return _from_body(call, body)


def _from_body(call: Call, body: bytes) -> str:
    policy = s3xml.parse(body, "AccessControlPolicy")
    # As S3: the policy names its owner (its schema requires it), and an ACL cannot give the
    # bucket or object away to another owner.
    owner = _canonical_id((policy.findtext("./Owner/ID") or "").strip())
    if owner != str(call.account):
        raise AccessDenied()
    grants = sorted(_grant(grant) for grant in policy.findall("./AccessControlList/Grant"))
    owner_full_control = ("CanonicalUser", str(call.account), "FULL_CONTROL")
    public_read = ("Group", ALL_USERS, "READ")
    if grants not in ([owner_full_control], sorted([owner_full_control, public_read])):
        raise AccessControlListNotSupported(
            "Shoal keeps only the canned ACLs private and public-read: the owner's "
            "FULL_CONTROL, and READ for AllUsers"
        )
    return PUBLIC_READ if public_read in grants else PRIVATE


def _grant(grant: Element) -> tuple[str, str, str]:
    """A <Grant>'s grantee type, who (a canonical id, a group's URI or an email address)
    and permission, checked as S3 checks them: a type or permission outside S3's schema is
    MalformedACLError, an id or group S3 does not know InvalidArgument."""
    grantee = grant.find("Grantee")
    permission = s3xml.text_of(grant, "Permission", required=False, stripped=True)
    kind = grantee.get(_XSI) if grantee is not None else None
    if grantee is None or kind not in GRANTEE_TYPES or permission not in PERMISSIONS:
        raise MalformedACLError()
    if kind == "CanonicalUser":
        return kind, _canonical_id((grantee.findtext("ID") or "").strip()), permission
    if kind == "Group":
        uri = (grantee.findtext("URI") or "").strip()
        if uri not in GROUPS:
            raise InvalidArgument("Invalid group uri", ArgumentName="Group/URI", ArgumentValue=uri)
        return kind, uri, permission
    return kind, (grantee.findtext("EmailAddress") or "").strip(), permission


def _canonical_id(text: str) -> str:
    """An account's canonical id (a UUID in Shoal); anything else is S3's "Invalid id"."""
    if not text:
        raise MalformedACLError()
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise InvalidArgument(
            "Invalid id", ArgumentName="CanonicalUser/ID", ArgumentValue=text
        ) from None


@handles(Endpoint.GetBucketAcl)
async def get_bucket_acl(call: Call) -> http.Response:
    bucket = await call.store.buckets.get(call.account, call.bucket)
    acl = await call.store.buckets.acl_of(bucket)
    return http.Response(body=await document(call, acl), content_type=XML)


@handles(Endpoint.PutBucketAcl)
async def put_bucket_acl(call: Call) -> http.Response:
    await call.store.buckets.get(call.account, call.bucket)
    await call.store.buckets.put_acl(call.account, call.bucket, await _wanted(call))
    return http.Response()


@handles(Endpoint.GetObjectAcl)
async def get_object_acl(call: Call) -> http.Response:
    check_key(call.key)
    check_null_version(call)
    version = await call.store.objects.get(call.account, call.bucket, call.key, with_data=False)
    return http.Response(
        body=await document(call, of_properties(version.properties)), content_type=XML
    )


@handles(Endpoint.PutObjectAcl)
async def put_object_acl(call: Call) -> http.Response:
    check_key(call.key)
    check_null_version(call)
    wanted = await _wanted(call)
    # As tagging: an ACL on the version read; one that replaced it meanwhile keeps its own.
    version = await call.store.objects.get(call.account, call.bucket, call.key, with_data=False)
    await call.store.objects.set_acl(call.account, call.bucket, call.key, version.id, wanted)
    return http.Response()
