"""What the metadata tier can refuse, in its own words (the gateway maps these to S3 codes).

MetadataError
 +-- InvalidName              a bucket or object name breaks the rules
 +-- AccountNotFound
 +-- BucketNotFound
 +-- BucketAlreadyExists      someone else owns that bucket name
 +-- BucketAlreadyOwnedByYou
 +-- BucketNotEmpty           objects or open uploads remain
 +-- ObjectNotFound
 +-- PreconditionFailed       If-Match / If-None-Match did not hold
 +-- UploadNotFound
 +-- InvalidPart              a part to complete is missing or its ETag differs
 +-- InvalidPartOrder
 +-- EntityTooSmall           a part other than the last is under the minimum size
 +-- SchemaError              the database is not migrated, or the ring disagrees
"""

from __future__ import annotations


class MetadataError(Exception):
    """Base of every error the metadata tier raises on purpose."""


class InvalidName(MetadataError, ValueError):
    pass


class AccountNotFound(MetadataError):
    pass


class AccessKeyNotFound(MetadataError):
    pass


class BucketNotFound(MetadataError):
    pass


class BucketAlreadyExists(MetadataError):
    pass


class BucketAlreadyOwnedByYou(MetadataError):
    pass


class BucketNotEmpty(MetadataError):
    pass


class ObjectNotFound(MetadataError):
    pass


class PreconditionFailed(MetadataError):
    pass


class UploadNotFound(MetadataError):
    pass


class InvalidPart(MetadataError):
    pass


class InvalidPartOrder(MetadataError):
    pass


class EntityTooSmall(MetadataError):
    pass


class SchemaError(MetadataError):
    pass
