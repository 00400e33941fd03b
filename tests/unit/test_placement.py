"""Placement: distinct nodes, distinct datacenters first, weighted by free space."""

import random
from collections import Counter

from shoal.storage.placement import (
    Node,
    choose,
    copy_targets,
    default_replicas,
    target_replicas,
)


def node(name: str, dc: str, free: int = 100) -> Node:
    return Node(name=name, datacenter=dc, url=f"http://{name}", free_bytes=free)


def test_replicas_land_on_distinct_datacenters_when_there_are_several() -> None:
    nodes = [node("a1", "a"), node("a2", "a"), node("a3", "a"), node("b1", "b")]
    for seed in range(200):
        chosen = choose(nodes, 2, random.Random(seed))
        assert {n.datacenter for n in chosen} == {"a", "b"}


def test_nodes_are_distinct_and_fall_back_to_one_datacenter() -> None:
    nodes = [node("a1", "a"), node("a2", "a"), node("a3", "a")]
    chosen = choose(nodes, 3, random.Random(1))
    assert sorted(n.name for n in chosen) == ["a1", "a2", "a3"]
    assert len(choose(nodes, 5, random.Random(1))) == 3


def test_choice_is_weighted_by_free_space() -> None:
    nodes = [node("big", "a", free=900), node("small", "a", free=100)]
    picks = Counter(choose(nodes, 1, random.Random(seed))[0].name for seed in range(2000))
    assert 0.85 < picks["big"] / 2000 < 0.95


def test_excluded_nodes_are_never_chosen() -> None:
    nodes = [node("a1", "a"), node("a2", "a")]
    assert [n.name for n in choose(nodes, 2, random.Random(0), exclude={"a:a1"})] == ["a2"]


def test_default_replicas() -> None:
    assert default_replicas(1) == 1
    assert default_replicas(2) == default_replicas(9) == 2


def test_target_is_the_configured_count_or_two_once_two_nodes_are_registered() -> None:
    assert target_replicas(3, 1) == 3
    assert target_replicas(0, 1) == target_replicas(None, 1) == 1
    assert target_replicas(0, 2) == target_replicas(0, 5) == 2


def test_new_copies_prefer_datacenters_without_one() -> None:
    nodes = [node("a2", "a"), node("a3", "a"), node("b1", "b")]
    for seed in range(100):
        [chosen] = choose(nodes, 1, random.Random(seed), used_datacenters={"a"})
        assert chosen.name == "b1"


def test_new_copies_go_to_a_datacenter_without_one_and_never_to_a_holder() -> None:
    """Re-replication's choice (no copy leaves): the datacenter that has none."""
    nodes = [node("a1", "a"), node("a2", "a"), node("b1", "b"), node("b2", "b")]
    for seed in range(200):
        [target] = copy_targets(nodes, ["a:a1"], 1, random.Random(seed))
        assert target.datacenter == "b"
        [target] = copy_targets(nodes, ["a:a1", "b:b1"], 1, random.Random(seed))
        assert target.name in ("a2", "b2")


def test_a_copy_moved_off_a_leaving_node_goes_where_no_other_copy_stays() -> None:
    """Rebalance's choice: the drained node's datacenter counts as empty once it leaves, so
    a move from a:a1 with the other copy in b lands in a again, never beside the other."""
    nodes = [node("a1", "a"), node("a2", "a"), node("b1", "b"), node("b2", "b")]
    for seed in range(200):
        [target] = copy_targets(nodes, ["a:a1", "b:b1"], 1, random.Random(seed), ["a:a1"])
        assert target.shark == "a:a2"
    # One datacenter only: any node but the holders.
    flat = [node("a1", "a"), node("a2", "a"), node("a3", "a")]
    assert copy_targets(flat, ["a:a1", "a:a2"], 1, random.Random(1), ["a:a1"])[0].name == "a3"
