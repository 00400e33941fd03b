"""Which listings the '/' directory serves, and where they start in it."""

from __future__ import annotations

import pytest

from shoal.metadata import directory
from shoal.metadata.directory import segment_lower, serves, starts_inside_a_prefix


@pytest.mark.parametrize(
    ("prefix", "delimiter", "served"),
    [
        ("", "/", True),
        ("a/", "/", True),
        ("a//", "/", True),
        ("é/ü/", "/", True),
        ("a", "/", False),  # a common prefix may start mid-segment ("a" over "ab/c": "ab/")
        ("a/b", "/", False),
        ("", "", False),
        ("", "|", False),
        ("a/", "//", False),
        ("a|", "|", False),
    ],
)
def test_serves_slash_listings_of_whole_directories(
    prefix: str, delimiter: str, served: bool
) -> None:
    assert serves(prefix, delimiter) is served


def test_serves_nothing_when_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(directory, "ENABLED", False)
    assert not serves("", "/")


def test_segment_lower_is_the_lower_name_without_its_prefix() -> None:
    assert segment_lower("a/", "a/") == ""
    assert segment_lower("a/", "a/b0") == "b0"
    assert segment_lower("", "x\x01") == "x\x01"


def test_a_start_after_key_under_a_common_prefix_starts_inside_it() -> None:
    assert starts_inside_a_prefix("", "a/b")
    assert starts_inside_a_prefix("a/", "a/b/")
    assert not starts_inside_a_prefix("a/", "a/b")
    assert not starts_inside_a_prefix("", "a0")  # past every name under "a/"
