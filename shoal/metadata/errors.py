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
 +-- MetadataUnavailable      a shard cannot be reached now; nothing was written
 |    +-- VnodeMoved          the shard no longer holds the vnode (it moved): reload the ring
 +-- CommitUnknown            a write was sent and its answer lost: it may have committed
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
    def __init__(self, part_number: int, size: int, minimum: int) -> None:
        super().__init__(
            f"part {part_number} is {size} bytes; every part but the last must be at least "
            f"{minimum}"
        )
        self.part_number, self.size, self.minimum = part_number, size, minimum


class SchemaError(MetadataError):
    pass


class MetadataUnavailable(MetadataError):
    """A shard could not be reached (down, refusing connections, out of connections) before
    anything of the request was written. Nothing happened; the caller may try again."""


class VnodeMoved(MetadataUnavailable):
    """The shard refused a statement because it no longer holds the vnode the statement
    names: the vnode moved to another shard (its schema there was renamed at the switch,
    in the same transaction as the move's write fence). Nothing was written; the caller
    reloads the ring and tries the new owner (shards.ShardSet.follow_ring)."""


class CommitUnknown(MetadataError):
    """The connection to a shard broke after a write was sent and before its answer came
    back: the write may have committed or not. Whatever the write names (its blocks) must
    be kept; the orphan job reclaims them if the write did not commit.

    Deliberately not a MetadataUnavailable: code that cleans up after a refused write
    catches that one, and must never catch this."""


class TooManyConfigurations(MetadataError):
    """A bucket already has as many configurations of a kind as it may (S3's limit)."""
