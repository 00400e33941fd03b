"""Bucket operations: ListBuckets, CreateBucket, HeadBucket, DeleteBucket, GetBucketLocation,
GetBucketVersioning."""

from __future__ import annotations

import base64
import binascii

from shoal.metadata import Bucket, BucketAlreadyOwnedByYou, InvalidName
from shoal.s3 import http
from shoal.s3 import xml as s3xml
from shoal.s3.app import Call, handles
from shoal.s3.errors import InvalidArgument, InvalidBucketName, InvalidLocationConstraint
from shoal.s3.refusals import PUBLIC_READ, canned_acl
from shoal.s3.router import Endpoint

XML = "application/xml"
MAX_CREATE_BUCKET_BODY = 64 * 1024
MAX_BUCKETS = 10_000  # S3's largest ListBuckets page, and its page when paging is asked


def owner_tree(call: Call) -> dict[str, str]:
    return {"ID": str(call.account), "DisplayName": str(call.account)}


@handles(Endpoint.ListBuckets)
async def list_buckets(call: Call) -> http.Response:
    """All of the caller's buckets, or, as S3 since 2024, a page of them: `max-buckets`,
    `continuation-token` (the last name of the page before, encoded), `prefix`,
    `bucket-region` (every bucket is in the gateway's region)."""
    query = call.query
    prefix = query.get("prefix", "")
    token = query.get("continuation-token")
    after = decode_token(token) if token else ""
    limit = max_buckets(query.get("max-buckets"))
    region = call.gateway.config.region
    wanted_region = query.get("bucket-region")
    found: list[Bucket] = []
    if wanted_region in (None, region):
        # One past the page, to know whether another follows.
        found = await call.store.buckets.list(
            call.account, prefix=prefix, after=after, limit=limit + 1
        )
    page = found[:limit]
    body = s3xml.document(
        "ListAllMyBucketsResult",
        {
            "Owner": owner_tree(call),
            "Buckets": {
                "Bucket": [
                    {"Name": b.name, "CreationDate": b.created, "BucketRegion": region}
                    for b in page
                ]
            },
            "ContinuationToken": encode_token(page[-1].name) if len(found) > limit else None,
            "Prefix": prefix or None,
        },
    )
    return http.Response(body=body, content_type=XML)


def max_buckets(text: str | None) -> int:
    """`max-buckets`: 1 to 10,000 (InvalidArgument otherwise), 10,000 when not given."""
    if text is None:
        return MAX_BUCKETS
    digits = text.isascii() and text.isdigit() and len(text) <= len(str(MAX_BUCKETS))
    if not digits or not 1 <= int(text) <= MAX_BUCKETS:
        raise InvalidArgument(
            f"max-buckets must be an integer between 1 and {MAX_BUCKETS}",
            ArgumentName="max-buckets",
            ArgumentValue=text,
        )
    return int(text)


def encode_token(marker: str | None) -> str | None:
    """A continuation token: where a listing (of keys or buckets) goes on, opaque."""
    if marker is None:
        return None
    return base64.urlsafe_b64encode(marker.encode("utf-8", "surrogateescape")).decode()


def decode_token(token: str) -> str:
    """The marker a continuation token names (encode_token's). Strict: b64decode would skip
    bytes outside the alphabet, and a damaged token would restart the listing."""
    try:
        raw = base64.b64decode(token.encode(), altchars=b"-_", validate=True)
        return raw.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidArgument(
            "The continuation token provided is incorrect",
            ArgumentName="continuation-token",
            ArgumentValue=token,
        ) from None


@handles(Endpoint.CreateBucket)
async def create_bucket(call: Call) -> http.Response:
    body = await call.read_body(MAX_CREATE_BUCKET_BODY)
    if body.strip():
        config = s3xml.parse(body, "CreateBucketConfiguration")
        wanted = s3xml.text_of(config, "LocationConstraint", required=False, stripped=True)
        if wanted and wanted != call.gateway.config.region:
            raise InvalidLocationConstraint(
                f"The specified location-constraint is not valid: this endpoint serves "
                f"{call.gateway.config.region}"
            )
    acl = canned_acl(call.request.headers)
    try:
        created = await call.store.buckets.create(call.account, call.bucket)
    except InvalidName as exc:
        raise InvalidBucketName(str(exc), BucketName=call.bucket) from None
    except BucketAlreadyOwnedByYou:
        # As S3 in us-east-1: creating a bucket you already own succeeds.
        if call.gateway.config.region != "us-east-1":
            raise
    else:
        if acl == PUBLIC_READ:
            # Created private first: a crash in between leaves the bucket closed, not open.
            await call.store.buckets.set_acl_of(created, acl)
    return http.Response(headers={"Location": f"/{call.bucket}"})


@handles(Endpoint.HeadBucket)
async def head_bucket(call: Call) -> http.Response:
    await call.store.buckets.get(call.account, call.bucket)
    return http.Response(headers={"x-amz-bucket-region": call.gateway.config.region})


@handles(Endpoint.DeleteBucket)
async def delete_bucket(call: Call) -> http.Response:
    await call.store.buckets.delete(call.account, call.bucket)
    return http.Response(status=204)


@handles(Endpoint.GetBucketLocation)
async def get_bucket_location(call: Call) -> http.Response:
    await call.store.buckets.get(call.account, call.bucket)
    region = call.gateway.config.region
    # S3 answers an empty constraint for us-east-1.
    body = s3xml.document("LocationConstraint", "" if region == "us-east-1" else region)
    return http.Response(body=body, content_type=XML)


@handles(Endpoint.GetBucketVersioning)
async def get_bucket_versioning(call: Call) -> http.Response:
    await call.store.buckets.get(call.account, call.bucket)
    # Buckets are unversioned: S3 answers a configuration without Status.
    return http.Response(body=s3xml.document("VersioningConfiguration", {}), content_type=XML)
