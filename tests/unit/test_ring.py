"""The ring: stable placement, every vnode on a shard, spread over shards."""

import uuid
from collections import Counter

import pytest

from shoal.metadata.ring import MOVED_COPY_PREFIX, Ring, initial_ring, vnode_schema
from shoal.metadata.status import summarize_versions


def test_initial_ring_deals_vnodes_round_robin() -> None:
    ring = initial_ring(["a", "b", "c"], 64)
    assert ring.vnodes == 64 and ring.version == 1
    assert ring.shards == ("a", "b", "c")
    assert Counter(ring.assignment) == {"a": 22, "b": 21, "c": 21}
    assert ring.vnodes_of("b") == list(range(1, 64, 3))


def test_placement_is_stable_and_spread() -> None:
    ring = initial_ring(["only"], 64)
    owner, bucket = uuid.UUID(int=1), uuid.UUID(int=2)
    first = ring.vnode_for_object(owner, bucket, "photos/cat.jpg")
    assert first == Ring(version=9, assignment=ring.assignment).vnode_for_object(
        owner, bucket, "photos/cat.jpg"
    )
    used = Counter(ring.vnode_for_object(owner, bucket, f"key-{i}") for i in range(6400))
    assert len(used) == 64
    assert min(used.values()) > 50  # about 100 each


def test_buckets_and_objects_hash_differently() -> None:
    ring = initial_ring(["only"], 1024)
    owner = uuid.UUID(int=7)
    placed = {ring.vnode_for_bucket(owner, f"b{i}") for i in range(50)}
    assert len(placed) > 40


def test_ring_refuses_impossible_layouts() -> None:
    with pytest.raises(ValueError):
        initial_ring([], 64)
    with pytest.raises(ValueError):
        initial_ring(["a", "b"], 1)


def test_vnode_schema_matches_rfd_149() -> None:
    assert vnode_schema(0) == "manta_bucket_0"


def test_a_summary_of_schema_versions_leaves_out_the_old_copies_of_moved_vnodes() -> None:
    versions = {
        "shard": 3,
        "catalog": 12,
        vnode_schema(0): 6,
        vnode_schema(1): 5,
        f"{MOVED_COPY_PREFIX}{vnode_schema(1)}_m7": 5,
        f"{MOVED_COPY_PREFIX}{vnode_schema(2)}_m8": 4,
    }
    assert summarize_versions(versions) == {"shard": 3, "catalog": 12, "vnode": 5}
