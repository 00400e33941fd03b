"""Headers that ask Shoal to store what it cannot: refused, never accepted and dropped.

S3's own answers where S3 has one for a feature a bucket lacks (AccessControlListNotSupported
for ACLs, InvalidRequest for Object Lock), NotImplemented otherwise. What Shoal accepts and
ignores, and why that stores nothing the client asked for, is listed in docs/s3.md.
"""

from __future__ import annotations

from collections.abc import Mapping

from shoal.s3.errors import AccessControlListNotSupported, InvalidRequest, NotImplementedByShoal
from shoal.s3.router import Endpoint

# Canned ACLs that give no one but the bucket's owner (who owns every object in it) access:
# what Shoal does anyway.
HARMLESS_ACLS = frozenset({"private", "bucket-owner-full-control", "bucket-owner-read"})
OBJECT_WRITES = frozenset({Endpoint.PutObject, Endpoint.CopyObject, Endpoint.CreateMultipartUpload})
_OBJECT_LOCK = (
    "x-amz-object-lock-mode",
    "x-amz-object-lock-retain-until-date",
    "x-amz-object-lock-legal-hold",
)
_KMS = ("aws:kms", "aws:kms:dsse")


def refuse_what_cannot_be_stored(endpoint: Endpoint, headers: Mapping[str, str]) -> None:
    """Raise the S3 error for a request whose headers ask for what Shoal does not keep."""
    if endpoint in OBJECT_WRITES:
        _refuse_object_write(headers)
    if endpoint in OBJECT_WRITES or endpoint is Endpoint.CreateBucket:
        _refuse_acl(headers)
    object_lock = headers.get("x-amz-bucket-object-lock-enabled", "").strip().lower() == "true"
    if endpoint is Endpoint.CreateBucket and object_lock:
        raise NotImplementedByShoal("Object Lock is not implemented by Shoal")


def _refuse_object_write(headers: Mapping[str, str]) -> None:
    if any(name in headers for name in _OBJECT_LOCK):
        raise InvalidRequest("Bucket is missing Object Lock Configuration")
    if "x-amz-website-redirect-location" in headers:
        raise NotImplementedByShoal(
            "Website redirects (x-amz-website-redirect-location) are not implemented by Shoal"
        )
    encryption = headers.get("x-amz-server-side-encryption", "").strip().lower()
    if (
        encryption in _KMS
        or "x-amz-server-side-encryption-aws-kms-key-id" in headers
        or "x-amz-server-side-encryption-context" in headers
        or "x-amz-server-side-encryption-customer-algorithm" in headers
    ):
        raise NotImplementedByShoal(
            "Server-side encryption with KMS or customer keys is not implemented by Shoal"
        )


def _refuse_acl(headers: Mapping[str, str]) -> None:
    acl = headers.get("x-amz-acl")
    if acl is not None and acl.strip().lower() not in HARMLESS_ACLS:
        raise AccessControlListNotSupported()
    if any(name.startswith("x-amz-grant-") for name in headers):  # names are lowercase
        raise AccessControlListNotSupported()
