"""What an anonymous request (one with no credentials at all), or another account in a
bucket it does not own, may do, as S3 allows it.

Only READ granted to everyone (AllUsers) by a public-read ACL opens anything: GetObject and
HeadObject of a public-read object (the object's own ACL decides, not its bucket's), and
HeadBucket and the listings (objects, versions, multipart uploads) of a public-read bucket.
Everything else is AccessDenied, also for a bucket or key that does not exist, so a stranger
learns no more than S3 tells it. An allowed request runs its handler as the bucket's owner,
who owns every object in it.
"""

from __future__ import annotations

import dataclasses
import uuid

from shoal.metadata import BucketNotFound, ObjectNotFound
from shoal.s3 import http
from shoal.s3.app import ANONYMOUS, HANDLERS, Call
from shoal.s3.errors import AccessDenied, InvalidRequest, NoSuchKey
from shoal.s3.refusals import PUBLIC_READ
from shoal.s3.router import Endpoint

OBJECT_READS = frozenset({Endpoint.GetObject, Endpoint.HeadObject})
# READ on a bucket is S3's s3:ListBucket, ListBucketVersions and ListBucketMultipartUploads;
# HeadBucket asks for s3:ListBucket.
BUCKET_READS = frozenset(
    {
        Endpoint.ListObjects,
        Endpoint.ListObjectsV2,
        Endpoint.ListObjectVersions,
        Endpoint.ListMultipartUploads,
        Endpoint.HeadBucket,
    }
)
OPEN_READS = OBJECT_READS | BUCKET_READS


async def serve_anonymous(call: Call) -> http.Response:
    """The handler's answer if a public-read ACL allows the request, else AccessDenied. Also
    what another account may do in a bucket it does not own: the same (AllUsers includes
    every account)."""
    if call.endpoint not in OPEN_READS or call.where.bucket is None:
        raise AccessDenied()
    owner = await call.store.buckets.owner_of(call.bucket)
    if owner is None:
        raise AccessDenied()
    try:
        bucket = await call.store.buckets.get(owner, call.bucket)
    except BucketNotFound:
        raise AccessDenied() from None
    listable = await call.store.buckets.acl_of(bucket) == PUBLIC_READ
    if call.endpoint in OBJECT_READS:
        await _check_object_is_public(call, owner, listable)
    elif not listable:
        raise AccessDenied()
    return await HANDLERS[call.endpoint](dataclasses.replace(call, account=owner, public_only=True))


async def _check_object_is_public(call: Call, owner: uuid.UUID, listable: bool) -> None:
    anonymous = call.account == ANONYMOUS
    if anonymous and any(name.startswith("response-") for name in call.query):
        raise InvalidRequest(
            "Request specific response headers cannot be used for anonymous GET requests."
        )
    try:
        version = await call.store.objects.get(owner, call.bucket, call.key, with_data=False)
    except ObjectNotFound:
        # As S3: a missing key is NoSuchKey only to whoever may list the bucket.
        raise (NoSuchKey() if listable else AccessDenied()) from None
    if version.properties.get("acl") != PUBLIC_READ:
        raise AccessDenied()
