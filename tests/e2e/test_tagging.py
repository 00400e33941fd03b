"""Object and bucket tagging as S3 has it, through boto3 against `shoal serve`: the tagging
operations, tags set by PutObject, CreateMultipartUpload and CopyObject, the tag count on
GET and HEAD, and S3's limits and errors."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.e2e.conftest import complete_upload
from tests.fixtures.serve import Served, raw_request


def tag_set(tags: dict[str, str]) -> dict[str, Any]:
    return {"TagSet": [{"Key": k, "Value": v} for k, v in tags.items()]}


def tags_of(s3: Any, bucket: str, key: str) -> dict[str, str]:
    found = s3.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]
    return {t["Key"]: t["Value"] for t in found}


def refused(call: Any, **arguments: Any) -> tuple[int, str, str]:
    with pytest.raises(ClientError) as error:
        call(**arguments)
    response = error.value.response
    status = response["ResponseMetadata"]["HTTPStatusCode"]
    return status, response["Error"]["Code"], response["Error"].get("Message", "")


def test_put_get_delete_object_tagging(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"data")
    before = s3.head_object(Bucket=bucket, Key="k")
    assert "TagCount" not in before
    assert tags_of(s3, bucket, "k") == {}
    # Keys and values are exact strings: spaces and non-ASCII letters count.
    wanted = {"a": "1", " spaced key ": " v ", "ключ": "значение", "empty": "", "x:y/z": "+=.-_@"}
    s3.put_object_tagging(Bucket=bucket, Key="k", Tagging=tag_set(wanted))
    assert tags_of(s3, bucket, "k") == wanted
    after = s3.head_object(Bucket=bucket, Key="k")
    assert after["TagCount"] == len(wanted)
    # Tagging changes neither the data, nor the ETag, nor Last-Modified (as in S3).
    assert after["ETag"] == before["ETag"]
    assert after["LastModified"] == before["LastModified"]
    got = s3.get_object(Bucket=bucket, Key="k")
    assert got["TagCount"] == len(wanted) and got["Body"].read() == b"data"
    # A put replaces the whole set.
    s3.put_object_tagging(Bucket=bucket, Key="k", Tagging=tag_set({"b": "2"}))
    assert tags_of(s3, bucket, "k") == {"b": "2"}
    s3.delete_object_tagging(Bucket=bucket, Key="k")
    assert tags_of(s3, bucket, "k") == {}
    assert "TagCount" not in s3.head_object(Bucket=bucket, Key="k")
    # An overwrite brings its own tags: none here.
    s3.put_object_tagging(Bucket=bucket, Key="k", Tagging=tag_set({"old": "1"}))
    s3.put_object(Bucket=bucket, Key="k", Body=b"new")
    assert tags_of(s3, bucket, "k") == {}


def test_tagging_a_missing_object_or_another_version(s3: Any, bucket: str) -> None:
    assert refused(s3.get_object_tagging, Bucket=bucket, Key="nothing")[:2] == (404, "NoSuchKey")
    assert refused(
        s3.put_object_tagging, Bucket=bucket, Key="nothing", Tagging=tag_set({"a": "1"})
    )[:2] == (404, "NoSuchKey")
    assert refused(s3.delete_object_tagging, Bucket=bucket, Key="nothing")[:2] == (
        404,
        "NoSuchKey",
    )
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    s3.put_object_tagging(Bucket=bucket, Key="k", VersionId="null", Tagging=tag_set({"a": "1"}))
    assert s3.get_object_tagging(Bucket=bucket, Key="k", VersionId="null")["TagSet"]
    other = refused(s3.get_object_tagging, Bucket=bucket, Key="k", VersionId="v2")
    assert other[:2] == (400, "InvalidArgument")


@pytest.mark.parametrize(
    ("tags", "code", "message"),
    [
        # S3's code for this one is BadRequest, not InvalidTag.
        ({f"k{i}": "v" for i in range(11)}, "BadRequest", "Object tags cannot be greater than 10"),
        ({"k" * 129: "v"}, "InvalidTag", "The TagKey you have provided is too long, max 128"),
        ({"k": "v" * 257}, "InvalidTag", "The TagValue you have provided is too long, max 256"),
        ({"a*b": "v"}, "InvalidTag", "The TagKey you have provided is invalid"),
        ({"k": "a*b"}, "InvalidTag", "The TagValue you have provided is invalid"),
        ({"aws:k": "v"}, "InvalidTag", "Your TagKey cannot be prefixed with aws:"),
    ],
)
def test_tags_past_s3s_limits_are_invalid(
    s3: Any, bucket: str, tags: dict[str, str], code: str, message: str
) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    status, got, said = refused(
        s3.put_object_tagging, Bucket=bucket, Key="k", Tagging=tag_set(tags)
    )
    assert (status, got, said) == (400, code, message)
    # At the limits exactly: accepted.
    s3.put_object_tagging(
        Bucket=bucket, Key="k", Tagging=tag_set({f"k{i}": "v" for i in range(10)})
    )
    s3.put_object_tagging(Bucket=bucket, Key="k", Tagging=tag_set({"k" * 128: "v" * 256}))


def test_duplicate_keys_and_malformed_tagging(served: Served, s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    twice = {"TagSet": [{"Key": "a", "Value": "1"}, {"Key": "a", "Value": "2"}]}
    status, code, message = refused(s3.put_object_tagging, Bucket=bucket, Key="k", Tagging=twice)
    assert (status, code, message) == (
        400,
        "InvalidTag",
        "Cannot provide multiple Tags with the same key",
    )
    for body in (
        b"<Tagging/>",
        b"<Tagging><TagSet><Tag><Key>a</Key></Tag></TagSet></Tagging>",
        b"<",
    ):
        response = raw_request(served, "PUT", f"/{bucket}/k?tagging", body)
        assert response.status == 400 and b"MalformedXML" in response.body
    empty_key = b"<Tagging><TagSet><Tag><Key></Key><Value>v</Value></Tag></TagSet></Tagging>"
    response = raw_request(served, "PUT", f"/{bucket}/k?tagging", empty_key)
    assert response.status == 400 and b"InvalidTag" in response.body
    too_big = b"<Tagging>" + b" " * 200_000 + b"</Tagging>"
    response = raw_request(served, "PUT", f"/{bucket}/k?tagging", too_big)
    assert response.status == 400 and b"MaxMessageLengthExceeded" in response.body
    assert tags_of(s3, bucket, "k") == {}
    response = raw_request(served, "POST", f"/{bucket}/k?tagging", b"")
    assert response.status == 405


def test_tagging_header_on_put_multipart_and_copy(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="put", Body=b"x", Tagging="a=1&b=two%20words&empty=")
    assert tags_of(s3, bucket, "put") == {"a": "1", "b": "two words", "empty": ""}
    assert s3.head_object(Bucket=bucket, Key="put")["TagCount"] == 3
    s3.put_object(Bucket=bucket, Key="untagged", Body=b"x", Tagging="")
    assert tags_of(s3, bucket, "untagged") == {}

    upload = s3.create_multipart_upload(Bucket=bucket, Key="mp", Tagging="part=yes")["UploadId"]
    part = s3.upload_part(Bucket=bucket, Key="mp", UploadId=upload, PartNumber=1, Body=b"p")
    complete_upload(s3, bucket, "mp", upload, [part["ETag"]])
    assert tags_of(s3, bucket, "mp") == {"part": "yes"}

    source = {"Bucket": bucket, "Key": "put"}
    s3.copy_object(CopySource=source, Bucket=bucket, Key="copied")
    assert tags_of(s3, bucket, "copied") == tags_of(s3, bucket, "put")
    s3.copy_object(CopySource=source, Bucket=bucket, Key="kept", TaggingDirective="COPY")
    assert tags_of(s3, bucket, "kept") == tags_of(s3, bucket, "put")
    s3.copy_object(
        CopySource=source, Bucket=bucket, Key="replaced", TaggingDirective="REPLACE", Tagging="c=3"
    )
    assert tags_of(s3, bucket, "replaced") == {"c": "3"}
    s3.copy_object(CopySource=source, Bucket=bucket, Key="none", TaggingDirective="REPLACE")
    assert tags_of(s3, bucket, "none") == {}


def test_bad_tagging_headers_store_nothing(s3: Any, bucket: str) -> None:
    too_many = "&".join(f"k{i}=v" for i in range(11))
    assert refused(s3.put_object, Bucket=bucket, Key="k", Body=b"x", Tagging=too_many)[:2] == (
        400,
        "BadRequest",  # as the Tagging body's count (S3's code for it)
    )
    assert refused(s3.put_object, Bucket=bucket, Key="k", Body=b"x", Tagging="a=1&a=2")[:2] == (
        400,
        "InvalidArgument",
    )
    assert refused(s3.create_multipart_upload, Bucket=bucket, Key="k", Tagging="%ff=1")[:2] == (
        400,
        "InvalidArgument",
    )
    assert refused(s3.head_object, Bucket=bucket, Key="k")[0] == 404
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    s3.put_object(Bucket=bucket, Key="src", Body=b"x")
    source = {"Bucket": bucket, "Key": "src"}
    unknown = refused(
        s3.copy_object, CopySource=source, Bucket=bucket, Key="k", TaggingDirective="MERGE"
    )
    assert unknown[:2] == (400, "InvalidArgument")


def test_bucket_tagging(s3: Any, bucket: str) -> None:
    assert refused(s3.get_bucket_tagging, Bucket=bucket)[:2] == (404, "NoSuchTagSet")
    wanted = {f"k{i}": f"v{i}" for i in range(50)}
    s3.put_bucket_tagging(Bucket=bucket, Tagging=tag_set(wanted))
    found = s3.get_bucket_tagging(Bucket=bucket)["TagSet"]
    assert {t["Key"]: t["Value"] for t in found} == wanted
    too_many = tag_set({f"k{i}": "v" for i in range(51)})
    status, code, message = refused(s3.put_bucket_tagging, Bucket=bucket, Tagging=too_many)
    assert (status, code, message) == (
        400,
        "InvalidTag",
        "Bucket tag count cannot be greater than 50",
    )
    s3.delete_bucket_tagging(Bucket=bucket)
    assert refused(s3.get_bucket_tagging, Bucket=bucket)[:2] == (404, "NoSuchTagSet")
    # A re-created bucket starts without the old one's tags.
    s3.put_bucket_tagging(Bucket=bucket, Tagging=tag_set({"a": "1"}))
    s3.delete_bucket(Bucket=bucket)
    assert refused(s3.get_bucket_tagging, Bucket=bucket)[:2] == (404, "NoSuchBucket")
    s3.create_bucket(Bucket=bucket)
    assert refused(s3.get_bucket_tagging, Bucket=bucket)[:2] == (404, "NoSuchTagSet")
