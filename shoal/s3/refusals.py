"""Headers that ask Shoal to store what it cannot: refused, never accepted and dropped.

S3's own answers where S3 has one for a feature a bucket lacks (AccessControlListNotSupported
for ACLs, InvalidRequest for Object Lock), NotImplemented otherwise. What Shoal accepts and
ignores, and why that stores nothing the client asked for, is listed in docs/s3.md.
"""

from __future__ import annotations

from collections.abc import Mapping

from shoal.s3.errors import (
    AccessControlListNotSupported,
    InvalidArgument,
    InvalidRequest,
    InvalidStorageClass,
    NotImplementedByShoal,
)
from shoal.s3.router import Endpoint

PRIVATE = "private"
PUBLIC_READ = "public-read"
# Canned ACLs that give no one but the bucket's owner (who owns every object in it) access:
# kept as private.
_PRIVATE_ALIASES = frozenset({PRIVATE, "bucket-owner-full-control", "bucket-owner-read"})
# Every canned ACL S3 knows; those Shoal does not keep are refused as not supported.
S3_CANNED_ACLS = _PRIVATE_ALIASES | {
    PUBLIC_READ,
    "public-read-write",
    "authenticated-read",
    "aws-exec-read",
    "log-delivery-write",
}
OBJECT_WRITES = frozenset({Endpoint.PutObject, Endpoint.CopyObject, Endpoint.CreateMultipartUpload})
_OBJECT_LOCK = (
    "x-amz-object-lock-mode",
    "x-amz-object-lock-retain-until-date",
    "x-amz-object-lock-legal-hold",
)
_KMS = ("aws:kms", "aws:kms:dsse")
# S3's storage classes: any is accepted and kept as Shoal's one class (docs/s3.md); another
# name is S3's InvalidStorageClass, not a typo stored as if it were a class.
STORAGE_CLASSES = frozenset(
    {
        "STANDARD",
        "REDUCED_REDUNDANCY",
        "STANDARD_IA",
        "ONEZONE_IA",
        "INTELLIGENT_TIERING",
        "GLACIER",
        "DEEP_ARCHIVE",
        "OUTPOSTS",
        "GLACIER_IR",
        "SNOW",
        "EXPRESS_ONEZONE",
        "FSX_OPENZFS",
    }
)


def refuse_what_cannot_be_stored(endpoint: Endpoint, headers: Mapping[str, str]) -> None:
    """Raise the S3 error for a request whose headers ask for what Shoal does not keep."""
    if endpoint in OBJECT_WRITES:
        _refuse_object_write(headers)
    if endpoint in OBJECT_WRITES or endpoint is Endpoint.CreateBucket:
        canned_acl(headers)  # refuses the ACLs Shoal does not keep
    object_lock = headers.get("x-amz-bucket-object-lock-enabled", "").strip().lower() == "true"
    if endpoint is Endpoint.CreateBucket and object_lock:
        raise NotImplementedByShoal("Object Lock is not implemented by Shoal")


def _refuse_object_write(headers: Mapping[str, str]) -> None:
    storage_class = headers.get("x-amz-storage-class")
    if storage_class is not None and storage_class not in STORAGE_CLASSES:
        raise InvalidStorageClass()
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


def canned_acl(headers: Mapping[str, str]) -> str | None:
    """The canned ACL a request's `x-amz-acl` asks for ("private" or "public-read"), None
    without one. Any other of S3's canned ACLs, or any `x-amz-grant-*`, is
    AccessControlListNotSupported; a value that is no canned ACL at all is InvalidArgument,
    and both a canned ACL and grants InvalidRequest, as S3 answers them."""
    acl = headers.get("x-amz-acl")
    if any(name.startswith("x-amz-grant-") for name in headers):  # names are lowercase
        if acl is not None:
            raise InvalidRequest("Specifying both Canned ACLs and Header Grants is not allowed")
        raise AccessControlListNotSupported(
            "Shoal keeps only the canned ACLs private and public-read: x-amz-grant-* headers "
            "are not supported"
        )
    if acl is None:
        return None
    wanted = acl.strip().lower()
    if wanted in _PRIVATE_ALIASES:
        return PRIVATE
    if wanted == PUBLIC_READ:
        return PUBLIC_READ
    if wanted not in S3_CANNED_ACLS:
        raise InvalidArgument(ArgumentName="x-amz-acl", ArgumentValue=acl)
    raise AccessControlListNotSupported(
        f"Shoal keeps only the canned ACLs private and public-read, not {wanted!r}"
    )
