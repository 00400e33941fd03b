"""Bucket lifecycle: PutBucketLifecycleConfiguration, GetBucketLifecycleConfiguration,
DeleteBucketLifecycle. The rules are applied by `shoal pipeline lifecycle`.

Supported, per rule: an ID, Status, a prefix filter (`Filter/Prefix` or the older `Prefix`),
`Expiration` by `Days` or `Date`, and `AbortIncompleteMultipartUpload`. Buckets are
unversioned, so noncurrent-version actions have nothing to act on, and Shoal has one storage
class, so transitions are refused with NotImplemented rather than silently ignored.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from xml.etree.ElementTree import Element

from shoal.s3 import http
from shoal.s3 import xml as s3xml
from shoal.s3.app import Call, handles
from shoal.s3.errors import (
    InvalidArgument,
    MalformedXML,
    NoSuchLifecycleConfiguration,
    NotImplementedByShoal,
)
from shoal.s3.router import Endpoint

XML = "application/xml"
MAX_RULES = 1000
MAX_BODY = 512 * 1024
UNSUPPORTED_ACTIONS = ("Transition", "NoncurrentVersionTransition")


@handles(Endpoint.PutBucketLifecycleConfiguration)
async def put_bucket_lifecycle(call: Call) -> http.Response:
    document = s3xml.parse(await call.read_body(MAX_BODY), "LifecycleConfiguration")
    rules = [parse_rule(rule) for rule in document.findall("Rule")]
    if not rules or len(rules) > MAX_RULES:
        raise MalformedXML(f"a lifecycle configuration has 1 to {MAX_RULES} rules")
    ids = [r["id"] for r in rules]
    if len(set(ids)) != len(ids):
        raise InvalidArgument("Rule ID must be unique. Found same ID for more than one rule")
    await call.store.buckets.put_lifecycle(call.account, call.bucket, rules)
    return http.Response()


@handles(Endpoint.GetBucketLifecycleConfiguration)
async def get_bucket_lifecycle(call: Call) -> http.Response:
    rules = await call.store.buckets.get_lifecycle(call.account, call.bucket)
    if rules is None:
        raise NoSuchLifecycleConfiguration(BucketName=call.bucket)
    body = s3xml.document("LifecycleConfiguration", {"Rule": [render_rule(r) for r in rules]})
    return http.Response(body=body, content_type=XML)


@handles(Endpoint.DeleteBucketLifecycle)
async def delete_bucket_lifecycle(call: Call) -> http.Response:
    await call.store.buckets.delete_lifecycle(call.account, call.bucket)
    return http.Response(status=204)


def parse_rule(rule: Element) -> dict[str, Any]:
    """One <Rule> as stored: id, enabled, prefix, expiration_days/date, abort_days."""
    for action in UNSUPPORTED_ACTIONS:
        if rule.find(action) is not None:
            raise NotImplementedByShoal(f"{action} is not supported: Shoal has one storage class")
    status = s3xml.text_of(rule, "Status")
    if status not in ("Enabled", "Disabled"):
        raise MalformedXML("Status must be Enabled or Disabled")
    parsed: dict[str, Any] = {
        "id": s3xml.text_of(rule, "ID", required=False) or "",
        "enabled": status == "Enabled",
        "prefix": _prefix(rule),
        "expiration_days": None,
        "expiration_date": None,
        "abort_days": None,
    }
    expiration = rule.find("Expiration")
    if expiration is not None:
        days = s3xml.text_of(expiration, "Days", required=False)
        date = s3xml.text_of(expiration, "Date", required=False)
        if (days is None) == (date is None):
            raise MalformedXML("Expiration needs exactly one of Days or Date")
        if days is not None:
            parsed["expiration_days"] = _positive(days, "Days")
        else:
            parsed["expiration_date"] = _date(date or "").isoformat()
    abort = rule.find("AbortIncompleteMultipartUpload")
    if abort is not None:
        parsed["abort_days"] = _positive(
            s3xml.text_of(abort, "DaysAfterInitiation") or "", "DaysAfterInitiation"
        )
    if (
        parsed["expiration_days"] is None
        and parsed["expiration_date"] is None
        and parsed["abort_days"] is None
    ):
        raise MalformedXML("a rule needs an Expiration or an AbortIncompleteMultipartUpload")
    return parsed


def render_rule(rule: dict[str, Any]) -> dict[str, Any]:
    expiration = None
    if rule["expiration_days"] is not None:
        expiration = {"Days": rule["expiration_days"]}
    elif rule["expiration_date"] is not None:
        expiration = {"Date": datetime.fromisoformat(rule["expiration_date"])}
    abort = None
    if rule["abort_days"] is not None:
        abort = {"DaysAfterInitiation": rule["abort_days"]}
    return {
        "ID": rule["id"] or None,
        "Filter": {"Prefix": rule["prefix"]},
        "Status": "Enabled" if rule["enabled"] else "Disabled",
        "Expiration": expiration,
        "AbortIncompleteMultipartUpload": abort,
    }


def _prefix(rule: Element) -> str:
    filter_ = rule.find("Filter")
    if filter_ is not None:
        if filter_.find("Tag") is not None or filter_.find("And/Tag") is not None:
            raise NotImplementedByShoal("lifecycle filters by tag are not supported")
        for path in ("Prefix", "And/Prefix"):
            node = filter_.find(path)
            if node is not None:
                return node.text or ""
        return ""
    return s3xml.text_of(rule, "Prefix", required=False) or ""


def _positive(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise MalformedXML(f"{what} must be an integer") from None
    if value < 1:
        raise InvalidArgument(f"'{what}' in a lifecycle rule must be a positive integer")
    return value


def _date(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise MalformedXML("Date must be an ISO 8601 date") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
