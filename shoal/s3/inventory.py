"""Bucket inventory configurations: PutBucketInventoryConfiguration,
GetBucketInventoryConfiguration, ListBucketInventoryConfigurations,
DeleteBucketInventoryConfiguration. `shoal pipeline inventory` delivers the reports
(docs/pipeline.md); what a report holds is shoal/inventory.py.

Validated as S3 does, and what Shoal cannot produce is refused, never stored to be ignored:
the ORC format, SSE-KMS encryption of the reports and the optional fields in
shoal.inventory.REFUSED_FIELDS (501 NotImplemented). The destination must be one of the
caller's own buckets: S3 delivers into another account's bucket when that bucket's policy
allows it, and Shoal has no bucket policies.
"""

from __future__ import annotations

import re
from typing import Any
from xml.etree.ElementTree import Element

from shoal import inventory
from shoal.metadata import BucketNotFound
from shoal.s3 import http
from shoal.s3 import xml as s3xml
from shoal.s3.app import Call, handles
from shoal.s3.bucket import decode_token, encode_token
from shoal.s3.errors import (
    AccessDenied,
    IdMismatch,
    InvalidArgument,
    InvalidS3DestinationBucket,
    MalformedXML,
    NoSuchConfiguration,
    NotImplementedByShoal,
)
from shoal.s3.router import Endpoint

XML = "application/xml"
MAX_BODY = 64 * 1024
MAX_ID_CHARS = 64
PAGE = 100  # configurations per ListBucketInventoryConfigurations page, as S3
ID_PATTERN = re.compile(r"[A-Za-z0-9._-]+")
ARN_PREFIX = "arn:aws:s3:::"


@handles(Endpoint.PutBucketInventoryConfiguration)
async def put_bucket_inventory(call: Call) -> http.Response:
    wanted_id = _config_id(call)
    await call.store.buckets.get(call.account, call.bucket)
    document = s3xml.parse(await call.read_body(MAX_BODY), "InventoryConfiguration")
    configuration = parse_configuration(document)
    if configuration["id"] != wanted_id:
        raise IdMismatch()
    await _check_destination(call, configuration["destination"])
    await call.store.inventories.put(call.account, call.bucket, configuration)
    return http.Response(status=204)


@handles(Endpoint.GetBucketInventoryConfiguration)
async def get_bucket_inventory(call: Call) -> http.Response:
    found = await call.store.inventories.get(call.account, call.bucket, _config_id(call))
    if found is None:
        raise NoSuchConfiguration()
    body = s3xml.document("InventoryConfiguration", render_configuration(found))
    return http.Response(body=body, content_type=XML)


@handles(Endpoint.ListBucketInventoryConfigurations)
async def list_bucket_inventories(call: Call) -> http.Response:
    token = call.query.get("continuation-token")
    after = decode_token(token) if token else ""
    found = await call.store.inventories.list(call.account, call.bucket, after, PAGE + 1)
    page = found[:PAGE]
    more = len(found) > PAGE
    body = s3xml.document(
        "ListInventoryConfigurationsResult",
        {
            "ContinuationToken": token or None,
            "InventoryConfiguration": [render_configuration(c) for c in page],
            "IsTruncated": more,
            "NextContinuationToken": encode_token(page[-1]["id"]) if more else None,
        },
    )
    return http.Response(body=body, content_type=XML)


@handles(Endpoint.DeleteBucketInventoryConfiguration)
async def delete_bucket_inventory(call: Call) -> http.Response:
    if not await call.store.inventories.delete(call.account, call.bucket, _config_id(call)):
        raise NoSuchConfiguration()
    return http.Response(status=204)


def _config_id(call: Call) -> str:
    config_id = call.query.get("id")
    if not config_id:
        raise InvalidArgument("The id parameter is required", ArgumentName="id")
    return config_id


async def _check_destination(call: Call, destination: dict[str, Any]) -> None:
    """The destination is a bucket of the caller's (no bucket policy can open another's)."""
    name = destination["bucket"]
    account_id = destination["account_id"]
    if account_id is not None and account_id != str(call.account):
        raise AccessDenied("Shoal delivers inventory reports only into the caller's own buckets")
    try:
        await call.store.buckets.get(call.account, name)
    except BucketNotFound:
        if await call.store.buckets.owner_of(name) is not None:
            raise AccessDenied(
                "Shoal delivers inventory reports only into the caller's own buckets"
            ) from None
        raise InvalidArgument(
            f"The destination bucket {name} does not exist",
            ArgumentName="Destination",
        ) from None


# S3's schema of an inventory configuration: the children each element may have, how many.
CONFIGURATION_CHILDREN = {
    "Id": 1,
    "IsEnabled": 1,
    "IncludedObjectVersions": 1,
    "Schedule": 1,
    "Filter": 1,
    "Destination": 1,
    "OptionalFields": 1,
}
SCHEDULE_CHILDREN = {"Frequency": 1}
DESTINATION_CHILDREN = {"S3BucketDestination": 1}
BUCKET_DESTINATION_CHILDREN = {
    "AccountId": 1,
    "Bucket": 1,
    "Format": 1,
    "Prefix": 1,
    "Encryption": 1,
}
ENCRYPTION_CHILDREN = {"SSE-S3": 1, "SSE-KMS": 1}


def parse_configuration(document: Element) -> dict[str, Any]:
    """An <InventoryConfiguration> as stored (shoal/inventory.py), validated as S3 does."""
    s3xml.check_children(document, CONFIGURATION_CHILDREN)
    config_id = _required(document, "Id")
    if len(config_id) > MAX_ID_CHARS or not ID_PATTERN.fullmatch(config_id):
        raise InvalidArgument(
            f"The Id is 1 to {MAX_ID_CHARS} letters, digits, '.', '_' or '-'",
            ArgumentName="Id",
        )
    enabled = _required(document, "IsEnabled").lower()
    if enabled not in ("true", "false"):
        raise MalformedXML("IsEnabled must be true or false")
    versions = _one_of(document, "IncludedObjectVersions", inventory.VERSIONS)
    schedule = document.find("Schedule")
    if schedule is None:
        raise MalformedXML("<InventoryConfiguration> needs <Schedule>")
    s3xml.check_children(schedule, SCHEDULE_CHILDREN)
    frequency = _one_of(schedule, "Frequency", inventory.FREQUENCIES)
    prefix = None
    filtered = document.find("Filter")
    if filtered is not None:
        for child in filtered:
            if child.tag != "Prefix":
                raise NotImplementedByShoal(f"An inventory Filter by {child.tag} is not supported")
        s3xml.check_children(filtered, {"Prefix": 1})
        prefix = s3xml.text_of(filtered, "Prefix", required=False)
    return {
        "id": config_id,
        "enabled": enabled == "true",
        "prefix": prefix,
        "versions": versions,
        "fields": _fields(document),
        "frequency": frequency,
        "destination": _destination(document),
    }


def _destination(document: Element) -> dict[str, Any]:
    holder = document.find("Destination")
    if holder is not None:
        s3xml.check_children(holder, DESTINATION_CHILDREN)
    target = holder.find("S3BucketDestination") if holder is not None else None
    if target is None:
        raise MalformedXML("<InventoryConfiguration> needs <Destination><S3BucketDestination>")
    s3xml.check_children(target, BUCKET_DESTINATION_CHILDREN)
    arn = _required(target, "Bucket")
    if not arn.startswith(ARN_PREFIX) or len(arn) == len(ARN_PREFIX):
        raise InvalidS3DestinationBucket()
    file_format = _required(target, "Format")
    if file_format == "ORC":
        raise NotImplementedByShoal(
            "Inventory reports in ORC are not supported: use CSV or Parquet"
        )
    if file_format not in inventory.FORMATS:
        raise MalformedXML("Format must be CSV, ORC or Parquet")
    return {
        "bucket": arn[len(ARN_PREFIX) :],
        "prefix": s3xml.text_of(target, "Prefix", required=False),
        "format": file_format,
        "account_id": s3xml.text_of(target, "AccountId", required=False, stripped=True),
        "encryption": _encryption(target),
    }


def _encryption(target: Element) -> str | None:
    """SSE-S3 is accepted, as on PutObject: Shoal's gateway does not encrypt data at rest,
    which is the storage nodes' disks' business. SSE-KMS is refused."""
    encryption = target.find("Encryption")
    if encryption is None:
        return None
    s3xml.check_children(encryption, ENCRYPTION_CHILDREN)
    if encryption.find("SSE-KMS") is not None:
        raise NotImplementedByShoal("SSE-KMS encryption of inventory reports is not supported")
    if encryption.find("SSE-S3") is not None:
        return "SSE-S3"
    raise MalformedXML("Encryption names SSE-S3 or SSE-KMS")


def _fields(document: Element) -> list[str]:
    holder = document.find("OptionalFields")
    if holder is not None:
        s3xml.check_children(holder, {"Field": s3xml.MANY})
    names = [] if holder is None else [(f.text or "").strip() for f in holder.findall("Field")]
    for name in names:
        if name in inventory.REFUSED_FIELDS:
            raise NotImplementedByShoal(
                f"The inventory field {name} is not supported: {inventory.REFUSED_FIELDS[name]}"
            )
        if name not in inventory.FIELDS:
            raise MalformedXML(f"{name!r} is not an inventory field")
    return sorted(set(names), key=list(inventory.FIELDS).index)


def _required(element: Element, tag: str) -> str:
    text = s3xml.text_of(element, tag, stripped=True)
    assert text is not None  # required: MalformedXML otherwise
    if not text:
        raise MalformedXML(f"<{element.tag}> needs <{tag}>")
    return text


def _one_of(element: Element, tag: str, allowed: tuple[str, ...]) -> str:
    value = _required(element, tag)
    if value not in allowed:
        raise MalformedXML(f"{tag} must be {' or '.join(allowed)}")
    return value


def render_configuration(configuration: dict[str, Any]) -> dict[str, Any]:
    destination = configuration["destination"]
    encryption = destination.get("encryption")
    return {
        "Destination": {
            "S3BucketDestination": {
                "AccountId": destination.get("account_id"),
                "Bucket": ARN_PREFIX + destination["bucket"],
                "Format": destination["format"],
                "Prefix": destination.get("prefix"),
                "Encryption": {"SSE-S3": ""} if encryption == "SSE-S3" else None,
            }
        },
        "IsEnabled": configuration["enabled"],
        "Filter": (
            {"Prefix": configuration["prefix"]} if configuration.get("prefix") is not None else None
        ),
        "Id": configuration["id"],
        "IncludedObjectVersions": configuration["versions"],
        "OptionalFields": (
            {"Field": list(configuration["fields"])} if configuration["fields"] else None
        ),
        "Schedule": {"Frequency": configuration["frequency"]},
    }
