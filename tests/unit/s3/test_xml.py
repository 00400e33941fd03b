"""Rendered XML parses back to the tree it was given, with text escaped and S3's timestamps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from xml.etree import ElementTree

from shoal.s3 import xml

NS = "{" + xml.NAMESPACE + "}"


def test_a_listing_tree_renders_to_the_same_elements_and_text() -> None:
    modified = datetime(2026, 1, 31, 12, 0, 5, 678_901, tzinfo=UTC)
    body = {
        "Name": "bucket",
        "Prefix": "",
        "IsTruncated": False,
        "Contents": [
            {"Key": "a&b<c>\"'é☃😀", "LastModified": modified, "Size": 0},
            {"Key": "plain", "LastModified": modified, "Size": 12},
        ],
        "CommonPrefixes": [{"Prefix": "dir/"}],
        "NextContinuationToken": None,
    }
    rendered = xml.document("ListBucketResult", body)
    assert rendered.startswith(b'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult ')
    root = ElementTree.fromstring(rendered)
    assert root.tag == NS + "ListBucketResult"
    assert [child.tag.removeprefix(NS) for child in root] == [
        "Name", "Prefix", "IsTruncated", "Contents", "Contents", "CommonPrefixes",
    ]  # fmt: skip
    first = root.findall(NS + "Contents")[0]
    assert first.findtext(NS + "Key") == "a&b<c>\"'é☃😀"
    assert first.findtext(NS + "LastModified") == "2026-01-31T12:00:05.678Z"
    assert first.findtext(NS + "Size") == "0"
    assert root.findtext(NS + "IsTruncated") == "false"
    assert root.findtext(NS + "Prefix") == ""


def test_timestamps_are_utc_with_milliseconds() -> None:
    local = datetime(2026, 3, 1, 1, 2, 3, 4_000, tzinfo=timezone(timedelta(hours=2)))
    assert xml.timestamp(local) == "2026-02-28T23:02:03.004Z"
    # Sub-millisecond digits are cut, not rounded; a whole second still shows ".000".
    assert xml.timestamp(datetime(2026, 3, 1, 1, 2, 3, 4_999, tzinfo=UTC)).endswith("03.004Z")
    assert xml.timestamp(datetime(2026, 3, 1, 1, 2, 3, tzinfo=UTC)) == "2026-03-01T01:02:03.000Z"


def test_a_text_body_and_an_error_document() -> None:
    root = ElementTree.fromstring(xml.document("LocationConstraint", "eu-west-1"))
    assert root.text == "eu-west-1"
    error = ElementTree.fromstring(
        xml.error_document("NoSuchKey", "No <such> key", "/b/k", "req-1", {"Key": "k&"})
    )
    assert [(child.tag, child.text) for child in error] == [
        ("Code", "NoSuchKey"),
        ("Message", "No <such> key"),
        ("Key", "k&"),
        ("Resource", "/b/k"),
        ("RequestId", "req-1"),
    ]


def test_text_of_keeps_names_exact_and_strips_only_when_asked() -> None:
    parsed = xml.parse(b"<Object><Key> b </Key><Quiet>\n  true\n</Quiet></Object>", "Object")
    assert xml.text_of(parsed, "Key") == " b "
    assert xml.text_of(parsed, "Quiet", stripped=True) == "true"
    assert xml.text_of(parsed, "VersionId", required=False) is None
