"""What a client asks Shoal to store and Shoal cannot keep is refused, never accepted and
dropped: ACLs that grant access, Object Lock, website redirects, KMS encryption, a storage
class S3 does not have."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.fixtures.postgres import unique


def refused(call: Any, **arguments: Any) -> tuple[int, str]:
    with pytest.raises(ClientError) as error:
        call(**arguments)
    response = error.value.response
    return response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Code"]


def test_what_cannot_be_stored_is_refused(s3: Any, bucket: str) -> None:
    where = {"Bucket": bucket, "Key": "k", "Body": b"x"}
    no_acls = (400, "AccessControlListNotSupported")
    assert refused(s3.put_object, ACL="public-read-write", **where) == no_acls
    assert refused(s3.put_object, GrantRead='id="someone"', **where) == no_acls
    assert refused(s3.create_bucket, Bucket=unique("b3"), ACL="authenticated-read") == no_acls
    assert refused(s3.put_object, ObjectLockLegalHoldStatus="ON", **where) == (
        400,
        "InvalidRequest",
    )
    assert refused(s3.put_object, WebsiteRedirectLocation="/elsewhere", **where)[0] == 501
    assert refused(s3.put_object, ServerSideEncryption="aws:kms", **where)[0] == 501
    bogus = (400, "InvalidStorageClass")
    assert refused(s3.put_object, StorageClass="BOGUS", **where) == bogus
    assert refused(s3.create_multipart_upload, Bucket=bucket, Key="k", StorageClass="") == bogus
    assert refused(s3.create_bucket, Bucket=unique("b3"), ObjectLockEnabledForBucket=True)[0] == 501
    with pytest.raises(ClientError):
        s3.head_object(Bucket=bucket, Key="k")  # nothing was stored
    # What gives no one else access is what Shoal does anyway: accepted (and public-read,
    # test_acl.py).
    for acl in ("private", "bucket-owner-full-control"):
        s3.put_object(ACL=acl, **where)
    for storage_class in ("STANDARD", "GLACIER_IR"):  # S3's classes: kept as Shoal's one
        s3.put_object(StorageClass=storage_class, **where)
    assert s3.list_objects_v2(Bucket=bucket)["Contents"][0]["StorageClass"] == "STANDARD"
    s3.create_bucket(Bucket=unique("b3"), ACL="private")
