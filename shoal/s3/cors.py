"""Cross-origin resource sharing: PutBucketCors, GetBucketCors, DeleteBucketCors, the
preflight (`OPTIONS`) a browser sends before a cross-origin request, and the
`Access-Control-*` headers of the requests that follow it.

A configuration is up to MAX_RULES rules, validated as S3 does; a request matches the first
rule that allows its origin and method (and, for a preflight, every header it asks for).
A gateway process keeps a bucket's rules for RULES_KEEP_SECONDS, and reads them only for a
request that carries an `Origin` header: a changed configuration reaches every process within
that time, and a request without `Origin` costs nothing more.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any
from xml.etree.ElementTree import Element

from shoal.metadata import Bucket, BucketNotFound, MetadataError, MetadataStore
from shoal.s3 import http, payload
from shoal.s3 import xml as s3xml
from shoal.s3.app import ANONYMOUS, Call, handles
from shoal.s3.errors import (
    AccessForbidden,
    BadRequest,
    InvalidArgument,
    InvalidRequest,
    MalformedXML,
    NoSuchCORSConfiguration,
)
from shoal.s3.router import Address, Endpoint

XML = "application/xml"
MAX_BODY = 64 * 1024
MAX_RULES = 100
MAX_ID_CHARS = 255
METHODS = ("GET", "PUT", "POST", "DELETE", "HEAD")
RULES_KEEP_SECONDS = 1.0
# An answer a CORS rule allowed varies with these request headers (S3 sends all three, so
# that a cache never serves one origin's answer to another); S3 sends no Vary when no rule
# matched.
VARY = "Origin, Access-Control-Request-Headers, Access-Control-Request-Method"
NOT_ENABLED = "CORSResponse: CORS is not enabled for this bucket."
NOT_ALLOWED = (
    "CORSResponse: This CORS request is not allowed. This is usually because the evalution of "
    "Origin, request method / Access-Control-Request-Method or Access-Control-Request-Headers "
    "are not whitelisted by the resource's CORS spec."
)

Rule = dict[str, Any]
# S3's schema of a <CORSRule>: the children it may have, how many.
RULE_CHILDREN = {
    "ID": 1,
    "AllowedOrigin": s3xml.MANY,
    "AllowedMethod": s3xml.MANY,
    "AllowedHeader": s3xml.MANY,
    "ExposeHeader": s3xml.MANY,
    "MaxAgeSeconds": 1,
}


@handles(Endpoint.PutBucketCors)
async def put_bucket_cors(call: Call) -> http.Response:
    await call.store.buckets.get(call.account, call.bucket)
    document = s3xml.parse(await call.read_body(MAX_BODY), "CORSConfiguration")
    s3xml.check_children(document, {"CORSRule": s3xml.MANY})
    rules = [parse_rule(rule) for rule in document.findall("CORSRule")]
    if not rules or len(rules) > MAX_RULES:
        raise MalformedXML(f"a CORS configuration has 1 to {MAX_RULES} rules")
    payload.require_digest(call.request.headers, call.verified.trailers)
    await call.store.buckets.put_cors(call.account, call.bucket, rules)
    _forget()
    return http.Response()


@handles(Endpoint.GetBucketCors)
async def get_bucket_cors(call: Call) -> http.Response:
    rules = await call.store.buckets.get_cors(call.account, call.bucket)
    if rules is None:
        raise NoSuchCORSConfiguration(BucketName=call.bucket)
    body = s3xml.document("CORSConfiguration", {"CORSRule": [render_rule(r) for r in rules]})
    return http.Response(body=body, content_type=XML)


@handles(Endpoint.DeleteBucketCors)
async def delete_bucket_cors(call: Call) -> http.Response:
    await call.store.buckets.delete_cors(call.account, call.bucket)
    _forget()
    return http.Response(status=204)


def parse_rule(rule: Element) -> Rule:
    """One <CORSRule> as stored, validated as S3 does."""
    s3xml.check_children(rule, RULE_CHILDREN)
    rule_id = s3xml.text_of(rule, "ID", required=False, stripped=True) or ""
    if len(rule_id) > MAX_ID_CHARS:
        raise InvalidArgument(f"ID length should not exceed allowed limit of {MAX_ID_CHARS}")
    origins = _texts(rule, "AllowedOrigin")
    methods = _texts(rule, "AllowedMethod")
    if not origins or not methods:
        raise MalformedXML("a CORSRule needs an AllowedOrigin and an AllowedMethod")
    for method in methods:
        if method not in METHODS:
            raise InvalidRequest(
                "Found unsupported HTTP method in CORS config. Unsupported method is " + method
            )
    for origin in origins:
        if origin.count("*") > 1:
            raise InvalidRequest(f'AllowedOrigin "{origin}" can not have more than one wildcard.')
    headers = _texts(rule, "AllowedHeader")
    for header in headers:
        if header.count("*") > 1:
            raise InvalidRequest(f'AllowedHeader "{header}" can not have more than one wildcard.')
    max_age = s3xml.text_of(rule, "MaxAgeSeconds", required=False, stripped=True)
    if max_age is not None and not (max_age.isascii() and max_age.isdigit()):
        raise MalformedXML("MaxAgeSeconds is a whole number of seconds")
    return {
        "id": rule_id,
        "origins": origins,
        "methods": methods,
        "headers": headers,
        "expose": _texts(rule, "ExposeHeader"),
        # A number too large to be meant is as good as forever to a browser.
        "max_age": None if max_age is None else min(int(max_age[:12]), 2**31 - 1),
    }


def render_rule(rule: Rule) -> dict[str, Any]:
    return {
        "ID": rule["id"] or None,
        "AllowedHeader": rule["headers"] or None,
        "AllowedMethod": rule["methods"],
        "AllowedOrigin": rule["origins"],
        "ExposeHeader": rule["expose"] or None,
        "MaxAgeSeconds": rule["max_age"],
    }


def _texts(rule: Element, tag: str) -> list[str]:
    return [(child.text or "").strip() for child in rule.findall(tag)]


# -- answering requests ----------------------------------------------------------------------


async def preflight(store: MetadataStore, request: http.Request, where: Address) -> http.Response:
    """The answer to `OPTIONS` on a bucket or object: unauthenticated, as in S3. A bucket that
    does not exist is answered as one without CORS, telling a stranger nothing more."""
    origin = request.headers.get("origin")
    if not origin:
        raise BadRequest("Insufficient information. Origin request header needed.")
    method = request.headers.get("access-control-request-method")
    rules = None if where.bucket is None else await _rules(store, None, where.bucket)
    if rules is None:
        # S3 names the bucket as the resource here, even for an object's URL.
        raise AccessForbidden(NOT_ENABLED, Method=method or "OPTIONS", ResourceType="BUCKET")
    if method not in METHODS:
        raise BadRequest(f"Invalid Access-Control-Request-Method: {method or 'null'}")
    fields = {"Method": method, "ResourceType": "OBJECT" if where.key else "BUCKET"}
    asked = _header_list(request.headers.get("access-control-request-headers", ""))
    rule = _first_match(rules, origin, method, asked)
    if rule is None:
        raise AccessForbidden(NOT_ALLOWED, **fields)
    headers = _allowing(rule, origin)
    headers["Vary"] = VARY
    headers["Access-Control-Allow-Methods"] = ", ".join(rule["methods"])
    if asked:
        headers["Access-Control-Allow-Headers"] = ", ".join(asked)
    if rule["max_age"] is not None:
        headers["Access-Control-Max-Age"] = str(rule["max_age"])
    return http.Response(headers=headers)


async def add_headers(call: Call) -> None:
    """The `Access-Control-*` headers of a request with an `Origin` header to a bucket whose
    rules allow it, on its answer whatever it is (an error's too, as S3 does). The rules
    are the bucket's, whoever asks: its owner, another account or an anonymous browser."""
    origin = call.request.headers.get("origin")
    if not origin or call.where.bucket is None:
        return
    try:
        rules = await _rules(call.store, call.account, call.where.bucket)
    except MetadataError:
        return  # the operation itself will say what is wrong
    if rules is None:
        return
    rule = _first_match(rules, origin, call.request.method, [])
    if rule is not None:
        call.request.response_headers.update(_allowing(rule, origin))
        call.request.response_headers["Vary"] = VARY
        call.request.response_headers["Access-Control-Allow-Methods"] = ", ".join(rule["methods"])
        if rule["max_age"] is not None:
            call.request.response_headers["Access-Control-Max-Age"] = str(rule["max_age"])


def _allowing(rule: Rule, origin: str) -> dict[str, str]:
    """What every allowed request gets: its origin (or `*` for a rule that allows any, which
    S3 answers without credentials), and the headers the page may read."""
    headers: dict[str, str] = {}
    if "*" in rule["origins"]:
        headers["Access-Control-Allow-Origin"] = "*"
    else:
        headers["Access-Control-Allow-Origin"] = origin
        headers["Access-Control-Allow-Credentials"] = "true"
    if rule["expose"]:
        headers["Access-Control-Expose-Headers"] = ", ".join(rule["expose"])
    return headers


def _first_match(rules: list[Rule], origin: str, method: str, asked: list[str]) -> Rule | None:
    for rule in rules:
        if (
            method in rule["methods"]
            and any(_matches(pattern, origin) for pattern in rule["origins"])
            and all(
                any(_matches(pattern.lower(), header) for pattern in rule["headers"])
                for header in asked
            )
        ):
            return rule
    return None


def _matches(pattern: str, value: str) -> bool:
    """Does `value` match `pattern`, which has at most one `*` (any run of characters)?"""
    head, star, tail = pattern.partition("*")
    if not star:
        return value == pattern
    return len(value) >= len(head) + len(tail) and value.startswith(head) and value.endswith(tail)


def _header_list(text: str) -> list[str]:
    return [name.strip().lower() for name in text.split(",") if name.strip()]


# A bucket incarnation's rules (None: no configuration), and until when they are trusted.
_rules_seen: dict[uuid.UUID, tuple[float, list[Rule] | None]] = {}
MAX_RULES_SEEN = 10_000


async def _rules(store: MetadataStore, caller: uuid.UUID | None, name: str) -> list[Rule] | None:
    """The rules of the bucket `name`, whoever asks (None: no configuration, or no such
    bucket)."""
    bucket = await _bucket_named(store, caller, name)
    if bucket is None:
        return None
    seen = _rules_seen.get(bucket.id)
    if seen is not None and time.monotonic() < seen[0]:
        return seen[1]
    rules = await store.buckets.cors_of(bucket)
    if len(_rules_seen) >= MAX_RULES_SEEN:
        _rules_seen.clear()
    _rules_seen[bucket.id] = (time.monotonic() + RULES_KEEP_SECONDS, rules)
    return rules


async def _bucket_named(store: MetadataStore, caller: uuid.UUID | None, name: str) -> Bucket | None:
    """The bucket `name`: first as the caller's own (the usual case, from the bucket cache),
    else as the bucket of whichever account holds the name."""
    if caller is not None and caller != ANONYMOUS:
        with contextlib.suppress(BucketNotFound):
            return await store.buckets.get(caller, name)
    owner = await store.buckets.owner_of(name)
    if owner is None or owner == caller:
        return None
    with contextlib.suppress(BucketNotFound):
        return await store.buckets.get(owner, name)
    return None


def _forget() -> None:
    """Drop this process's copies of rules, so that its next request sees a change at once
    (other processes see it within RULES_KEEP_SECONDS)."""
    _rules_seen.clear()
