"""The ring: which vnode holds a bucket or an object, and which shard holds a vnode.

Placement is a pure function of names (so the gateway, the CLI and Spark executors agree); the
vnode-to-shard assignment is data stored in the catalog shard with a version, so a vnode can
later move to another shard without a code change.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Ring:
    version: int
    assignment: tuple[str, ...]  # assignment[vnode] is the name of the shard holding it

    @property
    def vnodes(self) -> int:
        return len(self.assignment)

    @property
    def shards(self) -> tuple[str, ...]:
        """Shard names in order of first appearance."""
        return tuple(dict.fromkeys(self.assignment))

    def vnode_for_bucket(self, owner: uuid.UUID, name: str) -> int:
        return _hash_to_vnode(b"bucket", owner.bytes, name.encode(), self.vnodes)

    def vnode_for_object(self, owner: uuid.UUID, bucket_id: uuid.UUID, name: str) -> int:
        return _hash_to_vnode(b"object", owner.bytes + bucket_id.bytes, name.encode(), self.vnodes)

    def shard_of(self, vnode: int) -> str:
        return self.assignment[vnode]

    def vnodes_of(self, shard: str) -> list[int]:
        return [v for v, s in enumerate(self.assignment) if s == shard]


def initial_ring(shards: Sequence[str], vnodes: int) -> Ring:
    """Version 1: vnodes dealt round-robin over the shards."""
    if not shards:
        raise ValueError("a ring needs at least one shard")
    if vnodes < len(shards):
        raise ValueError(f"{vnodes} vnodes cannot cover {len(shards)} shards")
    return Ring(version=1, assignment=tuple(shards[v % len(shards)] for v in range(vnodes)))


VNODE_SCHEMA_PREFIX = "manta_bucket_"
# What a moved vnode's old copy on its source shard is renamed to, before this: it stays
# there, unused, for the move's grace period (moves.py).
MOVED_COPY_PREFIX = "moved_"


def vnode_schema(vnode: int) -> str:
    """The PostgreSQL schema of a vnode, as RFD 149's example names it (manta_bucket_0)."""
    return f"{VNODE_SCHEMA_PREFIX}{vnode}"


def vnode_of_schema(schema: str) -> int:
    """The vnode whose schema is `schema` (vnode_schema's inverse)."""
    number = schema.removeprefix("manta_bucket_")
    if number == schema or not number.isdigit():
        raise ValueError(f"{schema!r} is not a vnode's schema")
    return int(number)


def _hash_to_vnode(kind: bytes, key: bytes, name: bytes, vnodes: int) -> int:
    # Owner and bucket ids are fixed-width, so key + name is unambiguous without separators.
    digest = hashlib.blake2b(kind + b"\0" + key + name, digest_size=8).digest()
    return int.from_bytes(digest, "big") % vnodes
