"""Which S3 operation a request is: addressing (path or virtual-hosted style) and routing.

Operations are named as AWS names them (Endpoint.PutObject); the handlers carry the same names.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from shoal.s3.errors import MethodNotAllowed, NotImplementedByShoal


class Endpoint(enum.Enum):
    ListBuckets = enum.auto()
    CreateBucket = enum.auto()
    HeadBucket = enum.auto()
    DeleteBucket = enum.auto()
    GetBucketLocation = enum.auto()
    GetBucketVersioning = enum.auto()
    ListObjects = enum.auto()
    ListObjectsV2 = enum.auto()
    ListObjectVersions = enum.auto()
    ListMultipartUploads = enum.auto()
    DeleteObjects = enum.auto()
    PutObject = enum.auto()
    CopyObject = enum.auto()
    GetObject = enum.auto()
    HeadObject = enum.auto()
    DeleteObject = enum.auto()
    CreateMultipartUpload = enum.auto()
    UploadPart = enum.auto()
    UploadPartCopy = enum.auto()
    CompleteMultipartUpload = enum.auto()
    AbortMultipartUpload = enum.auto()
    ListParts = enum.auto()
    GetObjectAttributes = enum.auto()
    PutBucketLifecycleConfiguration = enum.auto()
    GetBucketLifecycleConfiguration = enum.auto()
    DeleteBucketLifecycle = enum.auto()
    PutBucketCors = enum.auto()
    GetBucketCors = enum.auto()
    DeleteBucketCors = enum.auto()
    PutObjectTagging = enum.auto()
    GetObjectTagging = enum.auto()
    DeleteObjectTagging = enum.auto()
    PutBucketTagging = enum.auto()
    GetBucketTagging = enum.auto()
    DeleteBucketTagging = enum.auto()
    PostObject = enum.auto()  # a browser form's upload to the bucket (post.py)
    GetBucketAcl = enum.auto()
    PutBucketAcl = enum.auto()
    GetObjectAcl = enum.auto()
    PutObjectAcl = enum.auto()
    PutBucketInventoryConfiguration = enum.auto()
    GetBucketInventoryConfiguration = enum.auto()
    ListBucketInventoryConfigurations = enum.auto()
    DeleteBucketInventoryConfiguration = enum.auto()

    # Members are singletons: hashed by identity, in C. Every request looks its endpoint up
    # in a few dicts and sets, and Enum's own __hash__ is Python code.
    __hash__ = object.__hash__


# Sub-resources S3 has and Shoal does not (yet): answered NotImplemented, never misrouted.
UNSUPPORTED = frozenset(
    {
        "policy",
        "policyStatus",
        "cors",
        "website",
        "logging",
        "notification",
        "replication",
        "encryption",
        "object-lock",
        "retention",
        "legal-hold",
        "requestPayment",
        "accelerate",
        "analytics",
        "inventory",  # a bucket's are implemented (below); an object has none
        "metrics",
        "ownershipControls",
        "publicAccessBlock",
        "intelligent-tiering",
        "restore",
        "select",
        "torrent",
        "attributes",
        # Newer ones, which would otherwise be taken for the plain operation: a DELETE of a
        # bucket's metadata configuration for DeleteBucket, a rename or an annotation of an
        # object for a PutObject or DeleteObject of it.
        "metadataTable",
        "metadataConfiguration",
        "metadataInventoryTable",
        "metadataJournalTable",
        "metadataAnnotationTable",
        "annotation",
        "renameObject",
        "abac",
        "session",
    }
)


@dataclass(frozen=True)
class Address:
    bucket: str | None
    key: str | None
    virtual: bool = False  # the bucket came from the Host header


def address(host: str, raw_path: str, domains: Sequence[str]) -> Address:
    """Bucket and key of a request: `bucket.<domain>/key` or `/bucket/key`.

    Keys are percent-decoded as UTF-8; bytes that are not UTF-8 stay as surrogates, which
    the metadata tier refuses with a clear error.
    """
    hostname = host.rsplit(":", 1)[0].lower() if host and not host.startswith("[") else ""
    path = raw_path[1:] if raw_path.startswith("/") else raw_path
    bucket = _virtual_bucket(hostname, domains)
    if bucket is not None:
        return Address(bucket, _decoded(path) or None, virtual=True)
    bucket, _, key = path.partition("/")
    return Address(_decoded(bucket) or None, _decoded(key) or None)


def route(method: str, where: Address, query: Mapping[str, str], copy_source: bool) -> Endpoint:
    unsupported = UNSUPPORTED.intersection(query)
    if method == "GET" and where.key is not None:
        unsupported -= {"attributes"}  # GetObjectAttributes; S3 has no other ?attributes
    if where.key is None:
        # A bucket's CORS and inventory configurations; objects have none.
        unsupported -= {"cors", "inventory"}
    if unsupported:
        raise NotImplementedByShoal(f"?{sorted(unsupported)[0]} is not implemented by Shoal")
    if where.bucket is None:
        if method == "GET":
            return Endpoint.ListBuckets
        raise MethodNotAllowed()
    if where.key is None:
        return _bucket_endpoint(method, query)
    return _object_endpoint(method, query, copy_source)


# How S3 names the operation of a sub-resource, where it is not Verb + Bucket|Object + the
# sub-resource's own name (PutObjectAcl, GetBucketAcl, ...).
_OPERATION_NOUNS = {
    "cors": "Cors",
    "object-lock": "ObjectLockConfiguration",
    "legal-hold": "LegalHold",
    "notification": "NotificationConfiguration",
    "publicAccessBlock": "PublicAccessBlock",
    "requestPayment": "RequestPayment",
    "ownershipControls": "OwnershipControls",
    "intelligent-tiering": "IntelligentTieringConfiguration",
    "analytics": "AnalyticsConfiguration",
    "inventory": "InventoryConfiguration",
    "metrics": "MetricsConfiguration",
    "accelerate": "AccelerateConfiguration",
    "metadataTable": "MetadataTableConfiguration",
    "metadataConfiguration": "MetadataConfiguration",
}
_OPERATION_NAMES = {
    "restore": "RestoreObject",
    "select": "SelectObjectContent",
    "renameObject": "RenameObject",
    "session": "CreateSession",
}
_VERBS = {"GET": "Get", "PUT": "Put", "DELETE": "Delete", "HEAD": "Head", "POST": "Post"}


def operation_name(method: str, where: Address, query: Mapping[str, str], copy_source: bool) -> str:
    """The operation's name (for the access log), also for one Shoal does not implement;
    "-" for a request that names none."""
    try:
        return route(method, where, query, copy_source).name
    except MethodNotAllowed:
        return "-"
    except NotImplementedByShoal:
        pass
    unsupported = sorted(UNSUPPORTED.intersection(query)) or ["versioning"]
    resource = unsupported[0]
    if resource in _OPERATION_NAMES:
        return _OPERATION_NAMES[resource]
    noun = _OPERATION_NOUNS.get(resource, resource[:1].upper() + resource[1:])
    scope = "Object" if where.key is not None else "Bucket"
    return f"{_VERBS.get(method, method.title())}{scope}{noun}"


# Bucket sub-resources read, replaced and removed whole: their endpoint by method.
_CONFIGURATIONS = {
    "lifecycle": {
        "PUT": Endpoint.PutBucketLifecycleConfiguration,
        "GET": Endpoint.GetBucketLifecycleConfiguration,
        "DELETE": Endpoint.DeleteBucketLifecycle,
    },
    "cors": {
        "PUT": Endpoint.PutBucketCors,
        "GET": Endpoint.GetBucketCors,
        "DELETE": Endpoint.DeleteBucketCors,
    },
}


# The sub-resources of a bucket and of an object that name an operation of their own, with
# the methods that have one. Any other method on them is 405: a DELETE /bucket?uploads is
# never a DeleteBucket, nor a PUT /bucket/key?uploads a PutObject.
_BUCKET_SUBRESOURCE_METHODS = {
    "location": {"GET"},
    "versioning": {"GET", "PUT"},
    "versions": {"GET"},
    "uploads": {"GET"},
    "list-type": {"GET"},
    "delete": {"POST"},
}
_OBJECT_SUBRESOURCE_METHODS = {
    "uploads": {"POST"},
    "attributes": {"GET"},
    "partNumber": {"GET", "HEAD", "PUT"},
}


def _check_method(method: str, query: Mapping[str, str], allowed: Mapping[str, set[str]]) -> None:
    for resource, methods in allowed.items():
        if resource in query and method not in methods:
            raise MethodNotAllowed()


def _bucket_endpoint(method: str, query: Mapping[str, str]) -> Endpoint:
    if "acl" in query:
        return _tagging_endpoint(method, _BUCKET_ACL)
    if "tagging" in query:
        return _tagging_endpoint(method, _BUCKET_TAGGING)
    if "inventory" in query:
        # Without an id, a GET lists them all; the others name one (or are refused for
        # lacking its id, by the handler).
        if method == "GET" and "id" not in query:
            return Endpoint.ListBucketInventoryConfigurations
        return _tagging_endpoint(method, _BUCKET_INVENTORY)
    for resource, endpoints in _CONFIGURATIONS.items():
        if resource in query:
            if method not in endpoints:
                raise MethodNotAllowed()
            return endpoints[method]
    _check_method(method, query, _BUCKET_SUBRESOURCE_METHODS)
    if method == "HEAD":
        return Endpoint.HeadBucket
    if method == "GET":
        for parameter, endpoint in (
            ("location", Endpoint.GetBucketLocation),
            ("versioning", Endpoint.GetBucketVersioning),
            ("versions", Endpoint.ListObjectVersions),
            ("uploads", Endpoint.ListMultipartUploads),
        ):
            if parameter in query:
                return endpoint
        return Endpoint.ListObjectsV2 if query.get("list-type") == "2" else Endpoint.ListObjects
    if method == "PUT" and "versioning" in query:
        raise NotImplementedByShoal("Shoal's buckets are unversioned")
    simple = {"PUT": Endpoint.CreateBucket, "DELETE": Endpoint.DeleteBucket}
    if method in simple:
        return simple[method]
    if method == "POST":
        return Endpoint.DeleteObjects if "delete" in query else Endpoint.PostObject
    raise MethodNotAllowed()


def _object_endpoint(method: str, query: Mapping[str, str], copy_source: bool) -> Endpoint:
    if "acl" in query:
        return _tagging_endpoint(method, _OBJECT_ACL)
    if "tagging" in query:
        return _tagging_endpoint(method, _OBJECT_TAGGING)
    _check_method(method, query, _OBJECT_SUBRESOURCE_METHODS)
    upload = "uploadId" in query
    if method == "GET":
        if "attributes" in query:
            return Endpoint.GetObjectAttributes
        return Endpoint.ListParts if upload else Endpoint.GetObject
    if method == "HEAD":
        return Endpoint.HeadObject
    if method == "PUT":
        if upload or "partNumber" in query:
            return Endpoint.UploadPartCopy if copy_source else Endpoint.UploadPart
        return Endpoint.CopyObject if copy_source else Endpoint.PutObject
    if method == "POST":
        if "uploads" in query:
            return Endpoint.CreateMultipartUpload
        if upload:
            return Endpoint.CompleteMultipartUpload
    if method == "DELETE":
        return Endpoint.AbortMultipartUpload if upload else Endpoint.DeleteObject
    raise MethodNotAllowed()


_OBJECT_TAGGING = {
    "PUT": Endpoint.PutObjectTagging,
    "GET": Endpoint.GetObjectTagging,
    "DELETE": Endpoint.DeleteObjectTagging,
}
_BUCKET_TAGGING = {
    "PUT": Endpoint.PutBucketTagging,
    "GET": Endpoint.GetBucketTagging,
    "DELETE": Endpoint.DeleteBucketTagging,
}


_BUCKET_INVENTORY = {
    "PUT": Endpoint.PutBucketInventoryConfiguration,
    "GET": Endpoint.GetBucketInventoryConfiguration,
    "DELETE": Endpoint.DeleteBucketInventoryConfiguration,
}


_BUCKET_ACL = {"PUT": Endpoint.PutBucketAcl, "GET": Endpoint.GetBucketAcl}
_OBJECT_ACL = {"PUT": Endpoint.PutObjectAcl, "GET": Endpoint.GetObjectAcl}


def _tagging_endpoint(method: str, endpoints: Mapping[str, Endpoint]) -> Endpoint:
    if method not in endpoints:
        raise MethodNotAllowed()
    return endpoints[method]


def _virtual_bucket(hostname: str, domains: Sequence[str]) -> str | None:
    """The bucket a host name carries before the longest domain it ends with (with
    `localhost` and `s3.localhost`, `b.s3.localhost` is bucket `b`, not `b.s3`); None for
    a domain itself or a host outside them (path style)."""
    for domain in _longest_first(tuple(domains)):
        if hostname == domain:
            return None
        if hostname.endswith("." + domain):
            return hostname[: -len(domain) - 1]
    return None


@functools.lru_cache(maxsize=8)
def _longest_first(domains: tuple[str, ...]) -> tuple[str, ...]:
    """The configured domains, longest first (sorted once, not per request)."""
    return tuple(sorted(domains, key=len, reverse=True))


def _decoded(text: str) -> str:
    if "%" not in text:
        return text  # most keys: nothing to decode (unquote's own check comes after its setup)
    return unquote(text, encoding="utf-8", errors="surrogateescape")
