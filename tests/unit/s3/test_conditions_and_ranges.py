"""Conditional headers with S3's precedence, and Range headers as S3 reads them.

S3's GetObject and CopyObject reference state the rules: If-Match is judged before
If-Unmodified-Since (a matching ETag answers 200 whatever the date says) and If-None-Match
before If-Modified-Since (an ETag that differs is not 304, whatever the date says); a failed
If-Match or If-Unmodified-Since is 412, a failed If-None-Match or If-Modified-Since is 304 on
a GET and 412 on a copy's source. A Range that starts past the end is 416; one S3 cannot read
(several ranges, a last byte before the first, another unit) is ignored: the whole object.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from shoal.metadata import ObjectVersion
from shoal.s3.errors import InvalidArgument, InvalidRange, PreconditionFailed
from shoal.s3.headers import NotModified, byte_range, check_conditions, http_date
from shoal.s3.multipart import _copy_range

MODIFIED = datetime(2024, 5, 6, 7, 8, 9, 654321, tzinfo=UTC)  # stored with microseconds
MD5 = bytes.fromhex("0123456789abcdef0123456789abcdef")
ETAG = MD5.hex()
OTHER = '"ffffffffffffffffffffffffffffffff"'
BEFORE = http_date(MODIFIED - timedelta(days=1))
AT = http_date(MODIFIED)  # the same second: HTTP dates have no fractions
AFTER = http_date(MODIFIED + timedelta(days=1))
COPY = "x-amz-copy-source-"


def version(parts: int | None = None) -> ObjectVersion:
    properties = {"parts": [{}] * parts} if parts else {}
    return ObjectVersion(
        id=uuid.uuid4(),
        owner=uuid.uuid4(),
        bucket_id=uuid.uuid4(),
        name="k",
        created=MODIFIED,
        modified=MODIFIED,
        creator=None,
        content_length=10,
        content_md5=MD5,
        content_type=None,
        headers={},
        roles=[],
        sharks=[],
        properties=properties,
    )


def outcome(headers: dict[str, str], prefix: str = "", of: ObjectVersion | None = None) -> int:
    """The status the conditions give: 200 (go on), 304 or 412."""
    try:
        check_conditions(of or version(), headers, prefix)
    except NotModified:
        return 304
    except PreconditionFailed:
        return 412
    return 200


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 200),
        ({"If-Match": f'"{ETAG}"'}, 200),
        ({"If-Match": OTHER}, 412),
        ({"If-Match": "*"}, 200),
        ({"If-Match": f'{OTHER}, "{ETAG}"'}, 200),  # any of a list
        ({"If-Match": ETAG}, 200),  # unquoted, as some clients send it
        ({"If-None-Match": f'"{ETAG}"'}, 304),
        ({"If-None-Match": f'W/"{ETAG}"'}, 304),  # a weak tag compares by its value
        ({"If-None-Match": "*"}, 304),
        ({"If-None-Match": OTHER}, 200),
        ({"If-Unmodified-Since": AFTER}, 200),
        ({"If-Unmodified-Since": AT}, 200),
        ({"If-Unmodified-Since": BEFORE}, 412),
        ({"If-Modified-Since": BEFORE}, 200),
        ({"If-Modified-Since": AT}, 304),
        ({"If-Modified-Since": AFTER}, 304),
        # S3 ignores a date it cannot read.
        ({"If-Modified-Since": "yesterday"}, 200),
        ({"If-Unmodified-Since": "0"}, 200),
        # Header names are case-insensitive.
        ({"if-none-match": f'"{ETAG}"'}, 304),
        ({"IF-MATCH": OTHER}, 412),
    ],
)
def test_each_condition_alone(headers: dict[str, str], status: int) -> None:
    assert outcome(headers) == status


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        # If-Match true and If-Unmodified-Since false: 200, If-Match decides.
        ({"If-Match": f'"{ETAG}"', "If-Unmodified-Since": BEFORE}, 200),
        ({"If-Match": OTHER, "If-Unmodified-Since": AFTER}, 412),
        # If-None-Match false and If-Modified-Since true: 304, If-None-Match decides.
        ({"If-None-Match": f'"{ETAG}"', "If-Modified-Since": BEFORE}, 304),
        ({"If-None-Match": OTHER, "If-Modified-Since": AFTER}, 200),
        # A 412 is found before a 304.
        ({"If-Match": OTHER, "If-None-Match": f'"{ETAG}"'}, 412),
        ({"If-Unmodified-Since": BEFORE, "If-Modified-Since": AFTER}, 412),
        ({"If-Match": f'"{ETAG}"', "If-None-Match": f'"{ETAG}"'}, 304),
        ({"If-Match": f'"{ETAG}"', "If-Modified-Since": AFTER}, 304),
    ],
)
def test_s3_precedence_between_conditions(headers: dict[str, str], status: int) -> None:
    assert outcome(headers) == status


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"if-match": f'"{ETAG}"', "if-unmodified-since": BEFORE}, 200),
        ({"if-match": OTHER}, 412),
        ({"if-none-match": f'"{ETAG}"'}, 412),  # a copy has no 304: its source fails
        ({"if-modified-since": AFTER}, 412),
        ({"if-none-match": OTHER, "if-modified-since": AFTER}, 200),
    ],
)
def test_a_copy_source_s_conditions_fail_with_412_never_304(
    headers: dict[str, str], status: int
) -> None:
    copy_headers = {COPY + name: value for name, value in headers.items()}
    assert outcome(copy_headers, prefix=COPY) == status
    # The copy's own (unprefixed) headers are not its source's conditions.
    assert outcome(headers, prefix=COPY) == 200


def test_a_multipart_object_matches_its_dashed_etag() -> None:
    multipart = version(parts=3)
    assert outcome({"If-Match": f'"{ETAG}-3"'}, of=multipart) == 200
    assert outcome({"If-Match": f'"{ETAG}"'}, of=multipart) == 412
    assert outcome({"If-None-Match": f'"{ETAG}-3"'}, of=multipart) == 304


SIZE = 100


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("bytes=0-9", (0, 10)),
        ("bytes=0-0", (0, 1)),
        ("bytes=99-99", (99, 100)),
        ("bytes=90-", (90, 100)),
        ("bytes=0-", (0, 100)),
        (" bytes=5-6 ", (5, 7)),
        ("bytes=007-008", (7, 9)),  # leading zeros are still decimal
        # A last byte past the end is clipped to the end.
        ("bytes=50-1000", (50, 100)),
        ("bytes=0-" + "9" * 10_000, (0, 100)),  # however many digits it has
        # Suffix ranges: the last N bytes; more than the object is all of it.
        ("bytes=-10", (90, 100)),
        ("bytes=-100", (0, 100)),
        ("bytes=-1000", (0, 100)),
        # What S3 cannot read it ignores: the whole object, 200.
        ("bytes=9-5", None),
        ("bytes=1000-1", None),  # reversed, though its first byte is past the end
        ("bytes=0-1,5-6", None),
        ("bytes=-", None),
        ("bytes=a-b", None),
        ("bytes=1.5-2", None),
        ("bytes = 0-1", None),
        ("items=0-1", None),
        ("", None),
    ],
)
def test_ranges(header: str | None, expected: tuple[int, int] | None) -> None:
    assert byte_range(header, SIZE) == expected


def test_a_suffix_range_of_an_empty_object_is_the_whole_empty_object() -> None:
    # A 206 would need a Content-Range of no bytes ("bytes 0--1/0"), which HTTP cannot say.
    assert byte_range("bytes=-5", 0) is None
    with pytest.raises(InvalidRange):
        byte_range("bytes=-0", 0)


@pytest.mark.parametrize(
    ("header", "size"),
    [
        ("bytes=100-", 100),
        ("bytes=100-200", 100),
        ("bytes=" + "9" * 10_000 + "-", 100),
        ("bytes=-0", 100),  # the last zero bytes: nothing to send
        ("bytes=0-", 0),  # an empty object has no first byte
        ("bytes=0-0", 0),
    ],
)
def test_a_range_that_starts_past_the_end_is_416(header: str, size: int) -> None:
    with pytest.raises(InvalidRange) as raised:
        byte_range(header, size)
    assert raised.value.status == 416


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, (0, SIZE)),
        ("bytes=0-9", (0, 10)),
        ("bytes=99-99", (99, 100)),
        (" bytes=10-19 ", (10, 20)),
    ],
)
def test_a_part_copy_s_source_range(header: str | None, expected: tuple[int, int]) -> None:
    assert _copy_range(header, SIZE) == expected


@pytest.mark.parametrize("header", ["bytes=0-100", "bytes=10-9", "bytes=100-100"])
def test_a_part_copy_s_source_range_must_lie_within_the_source(header: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        _copy_range(header, SIZE)
    assert refused.value.status == 400
    assert (
        refused.value.message == f"Range specified is not valid for source object of size: {SIZE}"
    )


@pytest.mark.parametrize("header", ["bytes=0-", "bytes=-10", "bytes=0-1,2-3", "0-9"])
def test_a_part_copy_s_source_range_names_both_bytes(header: str) -> None:
    # Unlike a GET's Range, nothing here is ignored: the part would be other bytes.
    with pytest.raises(InvalidArgument):
        _copy_range(header, SIZE)


def test_a_condition_header_present_but_empty_is_still_judged() -> None:
    """No conditional header: nothing to judge. One sent empty is judged (an empty If-Match
    matches no ETag), not taken for absent."""
    check_conditions(version(), {"host": "h", "x-amz-date": "20240506T070809Z"})
    with pytest.raises(PreconditionFailed):
        check_conditions(version(), {"If-Match": ""})
    with pytest.raises(PreconditionFailed):
        check_conditions(version(), {COPY + "if-match": ""}, prefix=COPY)
