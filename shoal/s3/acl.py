"""ACLs, the part clients use: Get/PutBucketAcl, Get/PutObjectAcl and `x-amz-acl` on writes.

Shoal keeps two canned ACLs: `private` (the owner's FULL_CONTROL, the default) and
`public-read` (also READ for everyone, anonymous requests included; what that allows is in
access.py). An object's ACL is kept with its version (`properties["acl"]`), a bucket's on
the catalog shard. Every other ACL, canned or granted, is refused, never stored in part.
"""

from __future__ import annotations

from collections.abc import Mapping
from xml.sax.saxutils import escape

from shoal.s3 import http
from shoal.s3 import xml as s3xml
from shoal.s3.app import Call, handles
from shoal.s3.errors import AccessControlListNotSupported, AccessDenied, MalformedACLError
from shoal.s3.objects import check_key, check_null_version
from shoal.s3.refusals import PRIVATE, PUBLIC_READ, canned_acl
from shoal.s3.router import Endpoint

XML = "application/xml"
ALL_USERS = "http://acs.amazonaws.com/groups/global/AllUsers"
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
            raise AccessControlListNotSupported(
                "Send either x-amz-acl or an AccessControlPolicy body, not both"
            )
        return header
    if not body.strip():
        raise MalformedACLError("An x-amz-acl header or an AccessControlPolicy body is required")
    return _from_body(call, body)


def _from_body(call: Call, body: bytes) -> str:
    policy = s3xml.parse(body, "AccessControlPolicy")
    # As S3: the policy names its owner (its schema requires it), and an ACL cannot give the
    # bucket or object away to another owner.
    owner = (policy.findtext("./Owner/ID") or "").strip()
    if not owner:
        raise MalformedACLError()
    if owner != str(call.account):
        raise AccessDenied()
    grants = policy.findall("./AccessControlList/Grant")
    owner_full_control = public_read = False
    for grant in grants:
        grantee = grant.find("Grantee")
        permission = s3xml.text_of(grant, "Permission", required=False, stripped=True)
        if grantee is None:
            raise MalformedACLError()
        kind = grantee.get(_XSI)
        if kind == "CanonicalUser" and permission == "FULL_CONTROL":
            if (grantee.findtext("ID") or "").strip() != str(call.account):
                raise AccessControlListNotSupported("Shoal grants access only to the owner")
            owner_full_control = True
        elif kind == "Group" and permission == "READ":
            if (grantee.findtext("URI") or "").strip() != ALL_USERS:
                raise AccessControlListNotSupported("Shoal grants READ only to AllUsers")
            public_read = True
        else:
            raise AccessControlListNotSupported(
                "Shoal keeps only the canned ACLs private and public-read"
            )
    if not owner_full_control or len(grants) != 1 + public_read:
        raise AccessControlListNotSupported(
            "Shoal keeps only the canned ACLs private and public-read: the owner's "
            "FULL_CONTROL, and READ for AllUsers"
        )
    return PUBLIC_READ if public_read else PRIVATE


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
