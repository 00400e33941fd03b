"""Object and bucket tagging: Put/Get/DeleteObjectTagging, Put/Get/DeleteBucketTagging.

An object's tags are kept with its version (`properties["tags"]`): an overwrite brings its
own tags (none if it names none), and a tagging request changes only the version it read.
A bucket's tags are kept on the catalog shard, per incarnation. What tags S3 accepts is in
shoal/s3/tags.py.
"""

from __future__ import annotations

from shoal.s3 import http, tags
from shoal.s3.app import Call, handles
from shoal.s3.errors import NoSuchTagSet
from shoal.s3.objects import check_key, check_null_version
from shoal.s3.router import Endpoint

XML = "application/xml"
# 50 tags of 128 + 256 characters, 4 bytes each in UTF-8, and their elements fit in 100 KiB.
MAX_BODY = 100 * 1024


@handles(Endpoint.PutObjectTagging)
async def put_object_tagging(call: Call) -> http.Response:
    await _check_object_request(call)
    body = await call.read_body(MAX_BODY)
    await _set_object_tags(call, tags.from_body(body, tags.MAX_OBJECT_TAGS))
    return http.Response()


@handles(Endpoint.GetObjectTagging)
async def get_object_tagging(call: Call) -> http.Response:
    await _check_object_request(call)
    version = await call.store.objects.get(call.account, call.bucket, call.key, with_data=False)
    return http.Response(body=tags.document(tags.of_version(version.properties)), content_type=XML)


@handles(Endpoint.DeleteObjectTagging)
async def delete_object_tagging(call: Call) -> http.Response:
    await _check_object_request(call)
    await _set_object_tags(call, {})
    return http.Response(status=204)


async def _check_object_request(call: Call) -> None:
    check_key(call.key)
    check_null_version(call)


async def _set_object_tags(call: Call, wanted: tags.Tags) -> None:
    """Tag the live version as read. If another write replaced or deleted it meanwhile, the
    tagging took effect just before that write (which brought its own tags): nothing is
    changed, and the request still succeeded, as it would have a moment earlier."""
    version = await call.store.objects.get(call.account, call.bucket, call.key, with_data=False)
    await call.store.objects.set_tags(call.account, call.bucket, call.key, version.id, wanted)


@handles(Endpoint.PutBucketTagging)
async def put_bucket_tagging(call: Call) -> http.Response:
    await call.store.buckets.get(call.account, call.bucket)
    body = await call.read_body(MAX_BODY)
    wanted = tags.from_body(body, tags.MAX_BUCKET_TAGS)
    await call.store.buckets.put_tags(call.account, call.bucket, wanted)
    return http.Response(status=204)


@handles(Endpoint.GetBucketTagging)
async def get_bucket_tagging(call: Call) -> http.Response:
    found = await call.store.buckets.get_tags(call.account, call.bucket)
    if not found:
        raise NoSuchTagSet(BucketName=call.bucket)
    return http.Response(body=tags.document(found), content_type=XML)


@handles(Endpoint.DeleteBucketTagging)
async def delete_bucket_tagging(call: Call) -> http.Response:
    await call.store.buckets.delete_tags(call.account, call.bucket)
    return http.Response(status=204)
