"""What `shoal pipeline rebalance` moves: a draining node's every copy, or, without drains,
a bounded share from the fullest nodes to those below the average."""

from __future__ import annotations

from types import SimpleNamespace

from shoal.pipeline.jobs.rebalance import Registry, _moves_of, _what_moves
from shoal.storage import Node

GiB = 1024**3


def registry(fill: dict[str, float], draining: tuple[str, ...] = ()) -> Registry:
    targets = [Node(s.split(":")[1], s.split(":")[0], f"http://{s}", GiB) for s in fill]
    return Registry(
        urls={s: f"http://{s}" for s in [*fill, *draining]},
        targets=targets,
        draining=list(draining),
        fill=fill,
    )


def test_a_draining_node_gives_up_everything_to_the_active_nodes() -> None:
    leaving, targets, _ = _what_moves(registry({"a:1": 0.9, "b:2": 0.1}, ("a:0",)), 0.1, GiB)
    assert list(leaving) == ["a:0"] and leaving["a:0"] > 10**15
    assert {t.shark for t in targets} == {"a:1", "b:2"}


def test_without_drains_the_fullest_give_a_bounded_share_to_those_below_the_average() -> None:
    fill = {"a:0": 0.80, "b:1": 0.50, "a:2": 0.20, "b:3": 0.30}  # average 0.45
    leaving, targets, budget = _what_moves(registry(fill), 0.10, 4 * GiB)
    assert leaving == {"a:0": 4 * GiB}  # b:1 is within half the gap of the average
    assert {t.shark for t in targets} == {"a:2", "b:3"}
    assert budget == 4 * GiB


def test_nodes_within_the_gap_are_left_alone() -> None:
    assert _what_moves(registry({"a:0": 0.55, "b:1": 0.50}), 0.10, GiB) == ({}, [], 0)


def test_each_run_on_a_leaving_node_is_one_move() -> None:
    row = SimpleNamespace(
        vnode=3,
        owner="o",
        bucket_id="b",
        name="k",
        id="0190a0b0-0000-7000-8000-000000000001",
        content_length=10,
        sharks=["a:0", "b:1"],
        properties='{"parts": [{"id": "0190a0b0-0000-7000-8000-000000000002", "size": 4, '
        '"sharks": ["a:0", "b:1"]}, {"id": "0190a0b0-0000-7000-8000-000000000003", '
        '"size": 6, "sharks": ["b:1", "a:2"]}]}',
    )
    [move] = _moves_of(row, {"a:0": 1})
    assert move[4].endswith("0002") and move[8] == "a:0" and move[7] == ["a:0", "b:1"]


def test_without_drains_a_node_gives_no_more_than_brings_it_to_the_average() -> None:
    fill = {"a:0": 0.80, "b:1": 0.10, "a:2": 0.10, "b:3": 0.20}  # average 0.30
    capacity = {shark: 10 * GiB for shark in fill}
    plan = registry(fill)
    leaving, _, _ = _what_moves(
        Registry(plan.urls, plan.targets, plan.draining, fill, capacity), 0.10, 8 * GiB
    )
    assert leaving == {"a:0": int(0.50 * 10 * GiB)}
