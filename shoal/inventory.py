"""S3 Inventory as Shoal produces it: the fields a configuration may ask for, the columns
of a report, each object's values, and when a configuration's next report is due.

Shared by the gateway (shoal/s3/inventory.py validates configurations against FIELDS and
REFUSED_FIELDS) and the pipeline (shoal/pipeline/jobs/inventory.py writes the reports).
A stored configuration is a JSON document:

    {"id": "daily", "enabled": true, "prefix": "logs/" or null,
     "versions": "Current" | "All", "fields": ["Size", "ETag", ...], "frequency": "Daily",
     "destination": {"bucket": "reports", "prefix": "inv" or null, "format": "CSV",
                     "account_id": null, "encryption": "SSE-S3" or null}}
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote_plus

FORMATS = ("CSV", "Parquet")  # ORC is refused (the gateway says so)
FREQUENCIES = ("Daily", "Weekly")
VERSIONS = ("Current", "All")
STORAGE_CLASS = "STANDARD"  # Shoal's one storage class
ALL_USERS = "http://acs.amazonaws.com/groups/global/AllUsers"
ACL_VERSION = "2022-11-10"  # the version S3 gives its ObjectAccessControlList documents


@dataclass(frozen=True)
class InventoryObject:
    """What the report says of one live object."""

    bucket: str
    key: str
    size: int
    last_modified: datetime
    etag: str
    multipart: bool
    checksum_algorithm: str  # "" when none was stored
    public_read: bool
    owner: str  # the account id, which Shoal's ACLs give as the canonical user id


@dataclass(frozen=True)
class Column:
    """One column of a report: its CSV name (S3's field name), its Parquet name and type
    (as S3's Parquet schema names them), and its value for an object."""

    name: str
    parquet: str
    kind: str  # "string", "int64", "timestamp", "boolean"
    value: Callable[[InventoryObject], Any]
    required: bool = False


def _acl(item: InventoryObject) -> str:
    """S3's ObjectAccessControlList: base64 of a JSON document of the object's grants."""
    grants: list[dict[str, str]] = [
        {"permission": "FULL_CONTROL", "type": "CanonicalUser", "canonicalId": item.owner}
    ]
    if item.public_read:
        grants.append({"permission": "READ", "type": "Group", "uri": ALL_USERS})
    document = {"version": ACL_VERSION, "status": "AVAILABLE", "grants": grants}
    return base64.b64encode(json.dumps(document, separators=(",", ":")).encode()).decode()


def _empty(item: InventoryObject) -> None:
    return None


# Always first, in this order; then the version columns when all versions are asked for.
LEADING = (
    Column("Bucket", "bucket", "string", lambda o: o.bucket, required=True),
    Column("Key", "key", "string", lambda o: o.key, required=True),
)
# Buckets are unversioned: every object is its only, latest version, whose id is null.
VERSION_COLUMNS = (
    Column("VersionId", "version_id", "string", _empty),
    Column("IsLatest", "is_latest", "boolean", lambda o: True),
    Column("IsDeleteMarker", "is_delete_marker", "boolean", lambda o: False),
)
# The optional fields Shoal produces, in the order a report has them. A field for what Shoal
# does not have (replication, encryption keys, Object Lock, tiers) has the value S3 gives an
# object without it: empty, or NOT-SSE for encryption (the gateway does not encrypt data).
FIELDS = {
    column.name: column
    for column in (
        Column("Size", "size", "int64", lambda o: o.size),
        Column("LastModifiedDate", "last_modified_date", "timestamp", lambda o: o.last_modified),
        Column("ETag", "e_tag", "string", lambda o: o.etag),
        Column("StorageClass", "storage_class", "string", lambda o: STORAGE_CLASS),
        Column("IsMultipartUploaded", "is_multipart_uploaded", "boolean", lambda o: o.multipart),
        Column("ReplicationStatus", "replication_status", "string", _empty),
        Column("EncryptionStatus", "encryption_status", "string", lambda o: "NOT-SSE"),
        Column("ObjectLockRetainUntilDate", "object_lock_retain_until_date", "timestamp", _empty),
        Column("ObjectLockMode", "object_lock_mode", "string", _empty),
        Column("ObjectLockLegalHoldStatus", "object_lock_legal_hold_status", "string", _empty),
        Column("IntelligentTieringAccessTier", "intelligent_tiering_access_tier", "string", _empty),
        Column("BucketKeyStatus", "bucket_key_status", "string", _empty),
        Column("ChecksumAlgorithm", "checksum_algorithm", "string", lambda o: o.checksum_algorithm),
        Column("ObjectAccessControlList", "object_access_control_list", "string", _acl),
        Column("ObjectOwner", "object_owner", "string", lambda o: o.owner),
    )
}
# Fields S3 has that Shoal refuses, with why (a report that left them empty would be wrong).
REFUSED_FIELDS = {
    "LifecycleExpirationDate": "Shoal does not compute lifecycle expiration dates for inventory",
}


def columns(configuration: dict[str, Any]) -> list[Column]:
    """A report's columns, in order."""
    chosen = [FIELDS[name] for name in FIELDS if name in configuration["fields"]]
    versions = VERSION_COLUMNS if configuration["versions"] == "All" else ()
    return [*LEADING, *versions, *chosen]


def csv_value(column: Column, item: InventoryObject) -> str:
    """A value as S3's CSV reports write it (the writer quotes every value); the key
    URL-encoded (form encoding: a space is `+`, a `/` is `%2F`), which readers decode."""
    value = column.value(item)
    if value is None:
        return ""
    if column.name == "Key":
        return quote_plus(value, safe="*")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + (
            f"{value.microsecond // 1000:03d}Z"
        )
    return str(value)


_PARQUET_TYPES = {
    "string": "binary {name} (UTF8)",
    "int64": "int64 {name}",
    "timestamp": "int64 {name} (TIMESTAMP_MILLIS)",
    "boolean": "boolean {name}",
}


def parquet_schema_text(chosen: list[Column]) -> str:
    """The Parquet schema as a manifest's fileSchema gives it."""
    fields = " ".join(
        f"{'required' if c.required else 'optional'} "
        + _PARQUET_TYPES[c.kind].format(name=c.parquet)
        + ";"
        for c in chosen
    )
    return f"message s3.inventory {{ {fields} }}"


def is_due(frequency: str, delivered: datetime | None, now: datetime) -> bool:
    """Daily: once per UTC day; weekly: once 7 days have passed since the last delivery."""
    if delivered is None:
        return True
    if frequency == "Weekly":
        return now - delivered >= timedelta(days=7)
    return delivered.astimezone(UTC).date() < now.astimezone(UTC).date()
