"""What the lifecycle job accepts of a bucket's stored rules (shoal.lifecycle.problem_with)."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.lifecycle import problem_with
from tests.unit.pipeline.test_job_rows import rule

BASE = rule()


def test_a_rule_with_only_a_noncurrent_version_expiration_is_applied_as_doing_nothing() -> None:
    kept = {"days": 7, "newer_versions": None}
    assert problem_with([{**BASE, "noncurrent_expiration": kept}]) is None
    assert problem_with([{**BASE, "expiration_days": 3, "noncurrent_expiration": kept}]) is None
    assert problem_with([BASE]) == "rule r: the rule has no action"


@pytest.mark.parametrize(
    "kept",
    [
        {"days": 0, "newer_versions": None},
        {"days": True, "newer_versions": None},
        {"days": 7, "newer_versions": 101},
        {"days": 7},
        "seven days",
    ],
)
def test_a_stored_noncurrent_version_expiration_of_the_wrong_shape_is_a_problem(kept: Any) -> None:
    problem = problem_with([{**BASE, "expiration_days": 1, "noncurrent_expiration": kept}])
    assert problem is not None and problem.startswith("rule r: noncurrent_expiration: ")


@pytest.mark.parametrize(
    ("shape", "prefix", "tags", "fits"),
    [
        ("Prefix", "logs/", {}, True),
        ("Filter", "", {}, True),
        ("Filter/Prefix", "", {}, True),
        ("Filter/Tag", "", {"k": "v"}, True),
        ("Filter/And", "logs/", {"k": "v"}, True),
        ("Prefix", "logs/", {"k": "v"}, False),
        ("Filter", "logs/", {}, False),
        ("Filter/Tag", "logs/", {"k": "v"}, False),
        ("Filter/Tag", "", {"k": "v", "l": "w"}, False),
        ("And", "", {}, False),
        (None, "", {}, False),
    ],
)
def test_a_stored_filter_shape_must_hold_the_rule_s_prefix_and_tags(
    shape: Any, prefix: str, tags: dict[str, str], fits: bool
) -> None:
    stored = {**BASE, "expiration_days": 1, "prefix": prefix, "tags": tags, "filter": shape}
    problem = problem_with([stored])
    assert (problem is None) == fits, problem
    assert problem_with([{**BASE, "expiration_days": 1}]) is None  # older rules have none
