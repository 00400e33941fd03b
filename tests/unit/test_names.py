"""Bucket and object name rules."""

import pytest

from shoal.metadata.errors import InvalidName
from shoal.metadata.names import check_bucket_name, check_object_name

INVALID_UTF8 = b"caf\xe9".decode("utf-8", "surrogateescape")


@pytest.mark.parametrize("name", ["abc", "my-bucket.2024", "a" * 63, "1.2.3"])
def test_valid_bucket_names(name: str) -> None:
    check_bucket_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "ab",
        "a" * 64,
        "Upper",
        "under_score",
        "-start",
        "end-",
        "a..b",
        "a.-b",
        "192.168.1.1",
        "xn--punycode",
        "name-s3alias",
        "sp ace",
        "",
        "bucket\n",  # `$` would let a final line break through
    ],
)
def test_invalid_bucket_names(name: str) -> None:
    with pytest.raises(InvalidName):
        check_bucket_name(name)


@pytest.mark.parametrize("name", ["a", "é" * 512, "x" * 1024, "%_/\\*?", "\U0010ffff"])
def test_valid_object_names(name: str) -> None:
    check_object_name(name)


@pytest.mark.parametrize("name", ["", "x" * 1025, "é" * 513, "a\x00b", INVALID_UTF8])
def test_invalid_object_names(name: str) -> None:
    with pytest.raises(InvalidName):
        check_object_name(name)
