"""The gateway applies conditional and Range headers as S3 does: conditions first (a 304 or
412 is answered whatever the Range), then the Range (416, or ignored when unreadable)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest

from tests.fixtures.serve import Served, raw_request


def http_date(moment: datetime) -> str:
    return format_datetime(moment, usegmt=True)


PAST = http_date(datetime.now(UTC) - timedelta(days=1))
FUTURE = http_date(datetime.now(UTC) + timedelta(days=1))
BODY = bytes(range(100))


@pytest.fixture
def etag(s3: Any, bucket: str) -> str:
    return str(s3.put_object(Bucket=bucket, Key="k", Body=BODY)["ETag"])


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        # If-Match true and If-Unmodified-Since false: 200.
        ({"If-Match": "{etag}", "If-Unmodified-Since": PAST}, 200),
        # If-None-Match false and If-Modified-Since true: 304.
        ({"If-None-Match": "{etag}", "If-Modified-Since": PAST}, 304),
        ({"If-None-Match": '"0"', "If-Modified-Since": FUTURE}, 200),
        # Conditions are judged before the Range: 304 and 412 beat a 416.
        ({"If-None-Match": "{etag}", "Range": "bytes=500-"}, 304),
        ({"If-Match": '"0"', "Range": "bytes=500-"}, 412),
        ({"If-Match": "{etag}", "Range": "bytes=500-"}, 416),
        ({"If-Match": "{etag}", "Range": "bytes=-10"}, 206),
    ],
)
def test_conditions_then_range(
    served: Served, bucket: str, etag: str, headers: dict[str, str], status: int
) -> None:
    sent = {name: value.format(etag=etag) for name, value in headers.items()}
    for method in ("GET", "HEAD"):
        response = raw_request(served, method, f"/{bucket}/k", headers=sent)
        assert response.status == status, (method, response.body[:300])
        if status == 304:
            assert response.headers["ETag"] == etag and not response.body
            assert "Last-Modified" in response.headers


@pytest.mark.parametrize(
    ("range_header", "status", "body", "content_range"),
    [
        ("bytes=90-", 206, BODY[90:], "bytes 90-99/100"),
        ("bytes=-5", 206, BODY[-5:], "bytes 95-99/100"),
        ("bytes=50-1000", 206, BODY[50:], "bytes 50-99/100"),
        ("bytes=9-5", 200, BODY, None),  # unreadable: ignored
        ("bytes=0-1,5-6", 200, BODY, None),
        ("bytes=100-", 416, None, "bytes */100"),  # the size, for the next try
    ],
)
def test_ranges_as_s3_reads_them(
    served: Served,
    bucket: str,
    etag: str,
    range_header: str,
    status: int,
    body: bytes | None,
    content_range: str | None,
) -> None:
    response = raw_request(served, "GET", f"/{bucket}/k", headers={"Range": range_header})
    assert response.status == status
    if body is not None:
        assert response.body == body
    assert response.headers.get("Content-Range") == content_range


def test_ranges_of_an_empty_object(s3: Any, served: Served, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    tail = raw_request(served, "GET", f"/{bucket}/empty", headers={"Range": "bytes=-5"})
    assert (tail.status, tail.body, tail.headers.get("Content-Range")) == (200, b"", None)
    first = raw_request(served, "GET", f"/{bucket}/empty", headers={"Range": "bytes=0-"})
    assert (first.status, first.headers.get("Content-Range")) == (416, "bytes */0")


def test_a_copy_source_s_conditions_fail_with_412(served: Served, bucket: str, etag: str) -> None:
    source = {"x-amz-copy-source": f"/{bucket}/k"}
    for conditions, status in [
        ({"x-amz-copy-source-if-none-match": etag}, 412),
        ({"x-amz-copy-source-if-modified-since": FUTURE}, 412),
        ({"x-amz-copy-source-if-match": etag, "x-amz-copy-source-if-unmodified-since": PAST}, 200),
    ]:
        response = raw_request(served, "PUT", f"/{bucket}/copy", headers=source | conditions)
        assert response.status == status, (conditions, response.body[:300])


def test_if_range_sends_the_range_only_of_the_version_it_names(
    served: Served, s3: Any, bucket: str
) -> None:
    s3.put_object(Bucket=bucket, Key="resume", Body=b"0123456789")
    head = s3.head_object(Bucket=bucket, Key="resume")
    modified = head["LastModified"].astimezone(UTC)
    same_date = http_date(modified)
    ranged = {"Range": "bytes=4-"}
    for validator in (head["ETag"], same_date):
        got = raw_request(
            served, "GET", f"/{bucket}/resume", headers={**ranged, "If-Range": validator}
        )
        assert (got.status, got.body) == (206, b"456789"), validator
    other_date = http_date(modified - timedelta(seconds=1))
    for validator in ('"0123456789abcdef0123456789abcdef"', f"W/{head['ETag']}", other_date):
        got = raw_request(
            served, "GET", f"/{bucket}/resume", headers={**ranged, "If-Range": validator}
        )
        assert (got.status, got.body) == (200, b"0123456789"), validator
        assert "Content-Range" not in got.headers
