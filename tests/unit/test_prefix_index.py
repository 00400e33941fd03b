"""Which listings the '/' prefix index serves, and the dense listings a process remembers."""

from __future__ import annotations

import uuid

import pytest

from shoal.metadata import prefix_index
from shoal.metadata.prefix_index import DenseListings, segment_lower, serves


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
    monkeypatch.setattr(prefix_index, "ENABLED", False)
    assert not serves("", "/")


def test_segment_lower_is_the_lower_name_without_its_prefix() -> None:
    assert segment_lower("a/", "a/") == ""
    assert segment_lower("a/", "a/b0") == "b0"
    assert segment_lower("", "x\x01") == "x\x01"


def test_dense_listings_forget_the_least_recently_listed_first() -> None:
    bucket = uuid.uuid4()
    dense = DenseListings(size=2)
    dense.add((bucket, "a/"))
    dense.add((bucket, "b/"))
    assert (bucket, "a/") in dense  # listed again: now the most recent
    dense.add((bucket, "c/"))
    assert (bucket, "b/") not in dense
    assert (bucket, "a/") in dense and (bucket, "c/") in dense
    assert (uuid.uuid4(), "a/") not in dense  # another bucket (or incarnation)
