"""Bucket operations: ListBuckets, CreateBucket, HeadBucket, DeleteBucket, GetBucketLocation,
GetBucketVersioning."""

from __future__ import annotations

from shoal.metadata import BucketAlreadyOwnedByYou, InvalidName
from shoal.s3 import http
from shoal.s3 import xml as s3xml
from shoal.s3.app import Call, handles
from shoal.s3.errors import InvalidBucketName, InvalidLocationConstraint
from shoal.s3.router import Endpoint

XML = "application/xml"
MAX_CREATE_BUCKET_BODY = 64 * 1024


def owner_tree(call: Call) -> dict[str, str]:
    return {"ID": str(call.account), "DisplayName": str(call.account)}


@handles(Endpoint.ListBuckets)
async def list_buckets(call: Call) -> http.Response:
    prefix = call.query.get("prefix", "")
    buckets = await call.store.buckets.list(call.account, prefix=prefix, limit=10000)
    body = s3xml.document(
        "ListAllMyBucketsResult",
        {
            "Owner": owner_tree(call),
            "Buckets": {"Bucket": [{"Name": b.name, "CreationDate": b.created} for b in buckets]},
            "Prefix": prefix or None,
        },
    )
    return http.Response(body=body, content_type=XML)


@handles(Endpoint.CreateBucket)
async def create_bucket(call: Call) -> http.Response:
    body = await call.read_body(MAX_CREATE_BUCKET_BODY)
    if body.strip():
        config = s3xml.parse(body, "CreateBucketConfiguration")
        wanted = s3xml.text_of(config, "LocationConstraint", required=False)
        if wanted and wanted != call.gateway.config.region:
            raise InvalidLocationConstraint(
                f"The specified location-constraint is not valid: this endpoint serves "
                f"{call.gateway.config.region}"
            )
    try:
        await call.store.buckets.create(call.account, call.bucket)
    except InvalidName as exc:
        raise InvalidBucketName(str(exc), BucketName=call.bucket) from None
    except BucketAlreadyOwnedByYou:
        # As S3 in us-east-1: creating a bucket you already own succeeds.
        if call.gateway.config.region != "us-east-1":
            raise
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
