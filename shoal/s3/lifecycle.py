"""Bucket lifecycle: PutBucketLifecycleConfiguration, GetBucketLifecycleConfiguration,
DeleteBucketLifecycle. The rules are applied by `shoal pipeline lifecycle`.

Supported, per rule: an ID (made up when a rule has none, as S3 does), Status, a filter by
prefix and tags (`Filter` with `Prefix`, `Tag`, or `And` of a prefix and tags; or the older
`Prefix`), `Expiration` by `Days` or `Date`, and `AbortIncompleteMultipartUpload`, validated as
S3 does (its schema: no unknown or repeated element; days at most shoal.lifecycle.MAX_DAYS).
Buckets are unversioned, so `NoncurrentVersionExpiration` has no version to act on: it is kept
and answered back, as S3 does on an unversioned bucket. Shoal has one storage class, so
transitions are refused with NotImplemented rather than silently ignored, as are filters by
object size.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from typing import Any, NoReturn
from xml.etree.ElementTree import Element

from shoal.lifecycle import (
    MAX_DAYS,
    MAX_ID_CHARS,
    MAX_NEWER_VERSIONS,
    MAX_RULES,
    expiration_date_problem,
    problem_with,
)
from shoal.s3 import http, payload, tags
from shoal.s3 import xml as s3xml
from shoal.s3.app import Call, handles
from shoal.s3.errors import (
    InvalidArgument,
    InvalidRequest,
    MalformedXML,
    NoSuchLifecycleConfiguration,
    NotImplementedByShoal,
)
from shoal.s3.router import Endpoint

XML = "application/xml"
MAX_BODY = 512 * 1024
UNSUPPORTED_ACTIONS = ("Transition", "NoncurrentVersionTransition")
# S3's schema of a lifecycle configuration: the children each element may have, how many.
RULE_CHILDREN = {
    "ID": 1,
    "Status": 1,
    "Filter": 1,
    "Prefix": 1,
    "Expiration": 1,
    "AbortIncompleteMultipartUpload": 1,
    "Transition": s3xml.MANY,
    "NoncurrentVersionTransition": s3xml.MANY,
    "NoncurrentVersionExpiration": 1,
}
SIZES = {"ObjectSizeGreaterThan": 1, "ObjectSizeLessThan": 1}
FILTER_CHILDREN = {"Prefix": 1, "Tag": 1, "And": 1, **SIZES}
AND_CHILDREN = {"Prefix": 1, "Tag": s3xml.MANY, **SIZES}
TAG_CHILDREN = {"Key": 1, "Value": 1}
EXPIRATION_CHILDREN = {"Days": 1, "Date": 1, "ExpiredObjectDeleteMarker": 1}
ABORT_CHILDREN = {"DaysAfterInitiation": 1}
NONCURRENT_CHILDREN = {"NoncurrentDays": 1, "NewerNoncurrentVersions": 1}


@handles(Endpoint.PutBucketLifecycleConfiguration)
async def put_bucket_lifecycle(call: Call) -> http.Response:
    await call.store.buckets.get(call.account, call.bucket)
    document = s3xml.parse(await call.read_body(MAX_BODY), "LifecycleConfiguration")
    s3xml.check_children(document, {"Rule": s3xml.MANY})
    rules = [parse_rule(rule) for rule in document.findall("Rule")]
    if not rules or len(rules) > MAX_RULES:
        raise MalformedXML(f"a lifecycle configuration has 1 to {MAX_RULES} rules")
    ids = [r["id"] for r in rules if r["id"]]
    if len(set(ids)) != len(ids):
        raise InvalidArgument("Rule ID must be unique. Found same ID for more than one rule")
    for rule in rules:
        if not rule["id"]:
            rule["id"] = _generated_id()
    assert problem_with(rules) is None, problem_with(rules)  # what the lifecycle job accepts
    payload.require_digest(call.request.headers, call.verified.trailers)
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
    """One <Rule> as stored (shoal/lifecycle.py), validated as S3 does."""
    s3xml.check_children(rule, RULE_CHILDREN)
    for action in UNSUPPORTED_ACTIONS:
        if rule.find(action) is not None:
            raise NotImplementedByShoal(f"{action} is not supported: Shoal has one storage class")
    status = s3xml.text_of(rule, "Status", stripped=True)
    if status not in ("Enabled", "Disabled"):
        raise MalformedXML("Status must be Enabled or Disabled")
    rule_id = s3xml.text_of(rule, "ID", required=False, stripped=True) or ""
    if len(rule_id) > MAX_ID_CHARS:
        raise InvalidArgument(f"ID length should not exceed allowed limit of {MAX_ID_CHARS}")
    prefix, rule_tags, shape = _filter(rule)
    parsed: dict[str, Any] = {
        "id": rule_id,
        "prefix": prefix,
        "tags": rule_tags,
        "filter": shape,
        "enabled": status == "Enabled",
        "expiration_days": None,
        "expiration_date": None,
        "abort_days": None,
    }
    expiration = rule.find("Expiration")
    if expiration is not None:
        s3xml.check_children(expiration, EXPIRATION_CHILDREN)
        days = s3xml.text_of(expiration, "Days", required=False, stripped=True)
        date = s3xml.text_of(expiration, "Date", required=False, stripped=True)
        delete_marker = expiration.find("ExpiredObjectDeleteMarker") is not None
        if delete_marker and (days is not None or date is not None):
            raise MalformedXML()  # S3's answer: its schema allows one of the three
        if delete_marker:
            raise NotImplementedByShoal(
                "ExpiredObjectDeleteMarker is not supported: buckets are unversioned"
            )
        if (days is None) == (date is None):
            raise MalformedXML(
                "Expiration needs exactly one of Days, Date or ExpiredObjectDeleteMarker"
            )
        if days is not None:
            parsed["expiration_days"] = _days(days, "'Days' for Expiration action")
        else:
            parsed["expiration_date"] = _date(date or "")
    abort = rule.find("AbortIncompleteMultipartUpload")
    if abort is not None:
        s3xml.check_children(abort, ABORT_CHILDREN)
        parsed["abort_days"] = _days(
            s3xml.text_of(abort, "DaysAfterInitiation", stripped=True) or "",
            "'DaysAfterInitiation' for AbortIncompleteMultipartUpload action",
        )
    noncurrent = rule.find("NoncurrentVersionExpiration")
    if noncurrent is not None:
        parsed["noncurrent_expiration"] = _noncurrent_expiration(noncurrent)
    if (
        parsed["expiration_days"] is None
        and parsed["expiration_date"] is None
        and parsed["abort_days"] is None
        and noncurrent is None
    ):
        raise InvalidRequest("At least one action needs to be specified in a rule")
    if rule_tags and parsed["abort_days"] is not None:
        raise InvalidRequest("AbortIncompleteMultipartUpload cannot be specified with Tags.")
    return parsed


def _noncurrent_expiration(element: Element) -> dict[str, int | None]:
    """Kept to be answered back, as S3 keeps it on an unversioned bucket, where it has no
    version to act on: every Shoal bucket is unversioned."""
    s3xml.check_children(element, NONCURRENT_CHILDREN)
    days = s3xml.text_of(element, "NoncurrentDays", stripped=True) or ""
    newer = s3xml.text_of(element, "NewerNoncurrentVersions", required=False, stripped=True)
    what = "'NewerNoncurrentVersions' for NoncurrentVersionExpiration action"
    if newer is not None and not (
        newer.isascii() and newer.isdigit() and 1 <= int(newer[:4]) <= MAX_NEWER_VERSIONS
    ):
        raise InvalidArgument(f"{what} must be from 1 to {MAX_NEWER_VERSIONS}")
    return {
        "days": _days(days, "'NoncurrentDays' for NoncurrentVersionExpiration action"),
        "newer_versions": None if newer is None else int(newer),
    }


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
        **_rendered_filter(rule),
        "Status": "Enabled" if rule["enabled"] else "Disabled",
        "Expiration": expiration,
        "NoncurrentVersionExpiration": _render_noncurrent(rule.get("noncurrent_expiration")),
        "AbortIncompleteMultipartUpload": abort,
    }


def _rendered_filter(rule: dict[str, Any]) -> dict[str, Any]:
    """The rule's prefix and tags in the shape they were put in; a rule stored without its
    shape in the shortest one that holds them."""
    prefix, rule_tags = rule["prefix"], rule.get("tags", {})
    shape = rule.get("filter")
    if shape is None:
        shape = "Filter/Prefix" if not rule_tags else "Filter/And"
        if len(rule_tags) == 1 and not prefix:
            shape = "Filter/Tag"
    pairs = [{"Key": k, "Value": v} for k, v in rule_tags.items()]
    if shape == "Prefix":
        return {"Prefix": prefix}
    if shape == "Filter":
        return {"Filter": {}}
    if shape == "Filter/Prefix":
        return {"Filter": {"Prefix": prefix}}
    if shape == "Filter/Tag":
        return {"Filter": {"Tag": pairs[0]}}
    return {"Filter": {"And": {"Prefix": prefix or None, "Tag": pairs}}}


def _render_noncurrent(kept: dict[str, int | None] | None) -> dict[str, Any] | None:
    if kept is None:
        return None
    return {"NoncurrentDays": kept["days"], "NewerNoncurrentVersions": kept["newer_versions"]}


def _generated_id() -> str:
    """The ID of a rule put without one: S3 makes one up (48 characters), so that every rule
    can be named in a GET and in the lifecycle job's report."""
    return secrets.token_urlsafe(36)


def _filter(rule: Element) -> tuple[str, dict[str, str], str]:
    """The rule's prefix and tags, and the shape they came in (shoal.lifecycle.FILTER_SHAPES):
    `Filter` (with one of Prefix, Tag or And; object sizes are not supported) or the older
    `Prefix` beside it, one of the two."""
    filter_ = rule.find("Filter")
    old_prefix = rule.find("Prefix")
    if (filter_ is None) == (old_prefix is None):
        raise MalformedXML("a rule has one of Filter or Prefix")
    if old_prefix is not None:
        return old_prefix.text or "", {}, "Prefix"
    assert filter_ is not None
    s3xml.check_children(filter_, FILTER_CHILDREN)
    conditions = list(filter_)
    if len(conditions) > 1:
        raise MalformedXML("Filter has one of Prefix, Tag, ObjectSizeGreaterThan, And, ...")
    if not conditions:
        return "", {}, "Filter"
    condition = conditions[0]
    if condition.tag == "Prefix":
        return condition.text or "", {}, "Filter/Prefix"
    if condition.tag == "Tag":
        return "", _tags([condition]), "Filter/Tag"
    if condition.tag == "And":
        s3xml.check_children(condition, AND_CHILDREN)
        for part in condition:
            if part.tag not in ("Prefix", "Tag"):
                _unsupported_filter(part.tag)
        prefixes = condition.findall("Prefix")
        if len(prefixes) > 1:
            raise MalformedXML("And has at most one Prefix")
        prefix = (prefixes[0].text or "") if prefixes else ""
        return prefix, _tags(condition.findall("Tag")), "Filter/And"
    _unsupported_filter(condition.tag)


def _tags(elements: list[Element]) -> dict[str, str]:
    """The tags of a filter's `Tag` elements, checked as an object's tags are."""
    pairs = []
    for element in elements:
        s3xml.check_children(element, TAG_CHILDREN)
        if element.find("Key") is None or element.find("Value") is None:
            raise MalformedXML("a Tag has a Key and a Value")
        key = s3xml.text_of(element, "Key", required=False) or ""
        pairs.append((key, s3xml.text_of(element, "Value", required=False) or ""))
    if len({key for key, _ in pairs}) != len(pairs):
        raise InvalidRequest("Duplicate Tag Keys are not allowed.")
    return tags.checked(pairs, tags.MAX_OBJECT_TAGS)


def _unsupported_filter(tag: str) -> NoReturn:
    if tag in ("ObjectSizeGreaterThan", "ObjectSizeLessThan"):
        raise NotImplementedByShoal(f"lifecycle filters by {tag} are not supported")
    raise MalformedXML(f"a lifecycle Filter has no <{tag}>")


def _days(text: str, what: str) -> int:
    """A number of days: a positive integer (S3's rule), at most MAX_DAYS (Shoal's)."""
    if not text.isascii() or not text.isdigit():
        raise InvalidArgument(f"{what} must be a positive integer")
    value = int(text) if len(text.lstrip("0")) <= len(str(MAX_DAYS)) else MAX_DAYS + 1
    if value < 1:
        raise InvalidArgument(f"{what} must be a positive integer")
    if value > MAX_DAYS:
        raise InvalidArgument(f"{what} must be at most {MAX_DAYS} days")
    return value


def _date(text: str) -> str:
    """An Expiration Date as stored: ISO 8601 at midnight UTC, as S3 requires."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidArgument("Invalid date: Date must be in ISO 8601 format") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    stored = moment.isoformat()
    if expiration_date_problem(stored) is not None:
        raise InvalidArgument(
            "'Date' must be at midnight GMT", ArgumentName="Date", ArgumentValue=text
        )
    return stored
