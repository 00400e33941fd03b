"""ACLs: Get/Put*Acl, canned ACLs on writes, and what anonymous (unsigned) requests may do."""

from __future__ import annotations

import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.fixtures.postgres import unique
from tests.fixtures.serve import Served, raw_request

ALL_USERS = "http://acs.amazonaws.com/groups/global/AllUsers"


@pytest.fixture(scope="module")
def anonymous(served: Served) -> Iterator[Any]:
    client = boto3.client(
        "s3",
        endpoint_url=served.endpoint,
        region_name="us-east-1",
        config=Config(
            signature_version=UNSIGNED,
            s3={"addressing_style": "path"},
            retries={"total_max_attempts": 1},
        ),
    )
    yield client
    client.close()


def outcome(call: Callable[..., Any], **params: Any) -> int | tuple[int, str]:
    """200 for success, else (status, error code)."""
    try:
        call(**params)
    except ClientError as exc:
        error = exc.response["Error"]
        return exc.response["ResponseMetadata"]["HTTPStatusCode"], error.get("Code", "")
    return 200


def grants(answer: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (g["Grantee"].get("ID") or g["Grantee"].get("URI"), g["Permission"])
        for g in answer["Grants"]
    ]


def test_get_acls_answer_the_owners_full_control(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    owner = s3.list_buckets()["Owner"]["ID"]
    for answer in (s3.get_bucket_acl(Bucket=bucket), s3.get_object_acl(Bucket=bucket, Key="k")):
        assert answer["Owner"]["ID"] == owner
        assert answer["Owner"]["DisplayName"]
        assert grants(answer) == [(owner, "FULL_CONTROL")]
    s3.put_object_acl(Bucket=bucket, Key="k", ACL="public-read")
    s3.put_bucket_acl(Bucket=bucket, ACL="public-read")
    for answer in (s3.get_bucket_acl(Bucket=bucket), s3.get_object_acl(Bucket=bucket, Key="k")):
        assert grants(answer) == [(owner, "FULL_CONTROL"), (ALL_USERS, "READ")]
    # Back to private with a body, as SDKs send a full policy.
    policy = s3.get_object_acl(Bucket=bucket, Key="k")
    policy.pop("ResponseMetadata")
    policy["Grants"] = policy["Grants"][:1]
    s3.put_object_acl(Bucket=bucket, Key="k", AccessControlPolicy=policy)
    assert grants(s3.get_object_acl(Bucket=bucket, Key="k")) == [(owner, "FULL_CONTROL")]


def test_an_acl_body_names_its_owner_and_cannot_give_the_object_away(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    policy = s3.get_object_acl(Bucket=bucket, Key="k")
    policy.pop("ResponseMetadata")
    public = {"Grantee": {"Type": "Group", "URI": ALL_USERS}, "Permission": "READ"}
    given_away = {
        **policy,
        "Owner": {"ID": str(uuid.uuid4())},
        "Grants": [*policy["Grants"], public],
    }
    no_such_id = {**given_away, "Owner": {"ID": "0" * 64}}  # not an account's id at all
    no_owner = {"Grants": [*policy["Grants"], public]}
    for put in (s3.put_object_acl, s3.put_bucket_acl):
        where = {"Bucket": bucket, "Key": "k"} if put == s3.put_object_acl else {"Bucket": bucket}
        assert outcome(put, **where, AccessControlPolicy=given_away) == (403, "AccessDenied")
        assert outcome(put, **where, AccessControlPolicy=no_such_id) == (400, "InvalidArgument")
        assert outcome(put, **where, AccessControlPolicy=no_owner) == (400, "MalformedACLError")
    for answer in (s3.get_bucket_acl(Bucket=bucket), s3.get_object_acl(Bucket=bucket, Key="k")):
        assert len(answer["Grants"]) == 1  # still private


@pytest.mark.parametrize("bucket_acl", ["private", "public-read"])
@pytest.mark.parametrize("object_acl", ["private", "public-read"])
def test_anonymous_access_matrix(s3: Any, anonymous: Any, bucket_acl: str, object_acl: str) -> None:
    bucket = unique("acl")
    s3.create_bucket(Bucket=bucket, ACL=bucket_acl)
    s3.put_object(Bucket=bucket, Key="k", Body=b"data", ACL=object_acl)
    public_object = object_acl == "public-read"
    public_bucket = bucket_acl == "public-read"
    denied = (403, "AccessDenied")
    expected = {
        "GetObject": 200 if public_object else denied,
        "HeadObject": 200 if public_object else (403, "403"),
        "ListObjectsV2": 200 if public_bucket else denied,
        "ListObjects": 200 if public_bucket else denied,
        "ListObjectVersions": 200 if public_bucket else denied,
        "ListMultipartUploads": 200 if public_bucket else denied,
        "HeadBucket": 200 if public_bucket else (403, "403"),
        "PutObject": denied,
        "DeleteObject": denied,
        "GetBucketAcl": denied,
        "GetObjectAcl": denied,
        "CopyObject": denied,
        "DeleteBucket": denied,
        "PutBucketAcl": denied,
        "PutObjectAcl": denied,
        "GetObjectTagging": denied,
        "CreateMultipartUpload": denied,
        "HeadMissingKey": (404, "404") if public_bucket else (403, "403"),
    }
    found = {
        "GetObject": outcome(anonymous.get_object, Bucket=bucket, Key="k"),
        "HeadObject": outcome(anonymous.head_object, Bucket=bucket, Key="k"),
        "ListObjectsV2": outcome(anonymous.list_objects_v2, Bucket=bucket),
        "ListObjects": outcome(anonymous.list_objects, Bucket=bucket),
        "ListObjectVersions": outcome(anonymous.list_object_versions, Bucket=bucket),
        "ListMultipartUploads": outcome(anonymous.list_multipart_uploads, Bucket=bucket),
        "HeadBucket": outcome(anonymous.head_bucket, Bucket=bucket),
        "DeleteBucket": outcome(anonymous.delete_bucket, Bucket=bucket),
        "PutBucketAcl": outcome(anonymous.put_bucket_acl, Bucket=bucket, ACL="public-read"),
        "PutObjectAcl": outcome(
            anonymous.put_object_acl, Bucket=bucket, Key="k", ACL="public-read"
        ),
        "GetObjectTagging": outcome(anonymous.get_object_tagging, Bucket=bucket, Key="k"),
        "CreateMultipartUpload": outcome(anonymous.create_multipart_upload, Bucket=bucket, Key="m"),
        "PutObject": outcome(anonymous.put_object, Bucket=bucket, Key="new", Body=b"x"),
        "DeleteObject": outcome(anonymous.delete_object, Bucket=bucket, Key="k"),
        "GetBucketAcl": outcome(anonymous.get_bucket_acl, Bucket=bucket),
        "GetObjectAcl": outcome(anonymous.get_object_acl, Bucket=bucket, Key="k"),
        "CopyObject": outcome(
            anonymous.copy_object, Bucket=bucket, Key="copy", CopySource=f"{bucket}/k"
        ),
        "HeadMissingKey": outcome(anonymous.head_object, Bucket=bucket, Key="missing"),
    }
    assert found == expected
    if public_object:
        assert anonymous.get_object(Bucket=bucket, Key="k")["Body"].read() == b"data"
    # Nothing anonymous changed anything.
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["k"]
    assert len(s3.get_bucket_acl(Bucket=bucket)["Grants"]) == 1 + public_bucket
    assert len(s3.get_object_acl(Bucket=bucket, Key="k")["Grants"]) == 1 + public_object
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_anonymous_requests_to_missing_buckets_are_denied(anonymous: Any) -> None:
    name = unique("gone")
    assert outcome(anonymous.get_object, Bucket=name, Key="k") == (403, "AccessDenied")
    assert outcome(anonymous.list_objects_v2, Bucket=name) == (403, "AccessDenied")
    assert outcome(anonymous.list_buckets) == (403, "AccessDenied")
    assert outcome(anonymous.create_bucket, Bucket=name) == (403, "AccessDenied")
    refused = outcome(anonymous.create_bucket, Bucket=name, ACL="public-read-write")
    assert refused == (403, "AccessDenied")


def test_public_read_on_copy_and_multipart_and_put_acl(
    s3: Any, anonymous: Any, bucket: str
) -> None:
    s3.put_object(Bucket=bucket, Key="src", Body=b"source", ACL="public-read")
    s3.copy_object(Bucket=bucket, Key="copied", CopySource=f"{bucket}/src")
    s3.copy_object(Bucket=bucket, Key="public", CopySource=f"{bucket}/src", ACL="public-read")
    upload = s3.create_multipart_upload(Bucket=bucket, Key="mpu", ACL="public-read")["UploadId"]
    etag = s3.upload_part(Bucket=bucket, Key="mpu", UploadId=upload, PartNumber=1, Body=b"p")[
        "ETag"
    ]
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key="mpu",
        UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
    )
    s3.put_object(Bucket=bucket, Key="later", Body=b"x")
    assert outcome(anonymous.get_object, Bucket=bucket, Key="later") == (403, "AccessDenied")
    s3.put_object_acl(Bucket=bucket, Key="later", ACL="public-read")
    # A copy does not take its source's ACL (as S3); an overwrite brings its own.
    assert outcome(anonymous.get_object, Bucket=bucket, Key="copied") == (403, "AccessDenied")
    for key in ("src", "public", "mpu", "later"):
        assert outcome(anonymous.get_object, Bucket=bucket, Key=key) == 200
    s3.put_object(Bucket=bucket, Key="src", Body=b"private now")
    assert outcome(anonymous.get_object, Bucket=bucket, Key="src") == (403, "AccessDenied")


def test_other_acls_are_refused(s3: Any, bucket: str) -> None:
    refused = (400, "AccessControlListNotSupported")
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    owner = s3.list_buckets()["Owner"]["ID"]
    for acl in ("public-read-write", "authenticated-read"):
        assert outcome(s3.put_object, Bucket=bucket, Key="k2", Body=b"x", ACL=acl) == refused
        assert outcome(s3.create_bucket, Bucket=unique("acl"), ACL=acl) == refused
        assert outcome(s3.put_bucket_acl, Bucket=bucket, ACL=acl) == refused
        assert outcome(s3.put_object_acl, Bucket=bucket, Key="k", ACL=acl) == refused
        upload = s3.create_multipart_upload
        assert outcome(upload, Bucket=bucket, Key="m", ACL=acl) == refused
    grant = {"GrantRead": 'uri="http://acs.amazonaws.com/groups/global/AuthenticatedUsers"'}
    assert outcome(s3.put_object, Bucket=bucket, Key="k2", Body=b"x", **grant) == refused
    assert outcome(s3.put_bucket_acl, Bucket=bucket, **grant) == refused
    write_for_all = {
        "Owner": {"ID": owner},
        "Grants": [
            {"Grantee": {"Type": "CanonicalUser", "ID": owner}, "Permission": "FULL_CONTROL"},
            {"Grantee": {"Type": "Group", "URI": ALL_USERS}, "Permission": "WRITE"},
        ],
    }
    assert (
        outcome(s3.put_object_acl, Bucket=bucket, Key="k", AccessControlPolicy=write_for_all)
        == refused
    )
    assert s3.head_object(Bucket=bucket, Key="k")  # untouched
    assert outcome(s3.head_object, Bucket=bucket, Key="k2") == (404, "404")


def test_acl_requests_that_are_no_acl_are_refused_as_s3_refuses_them(
    served: Served, s3: Any, bucket: str
) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    owner = s3.list_buckets()["Owner"]["ID"]
    mine = {"Grantee": {"Type": "CanonicalUser", "ID": owner}, "Permission": "FULL_CONTROL"}

    def policy(*grants: dict[str, Any]) -> dict[str, Any]:
        return {"Owner": {"ID": owner}, "Grants": [mine, *grants]}

    for put, where in ((s3.put_object_acl, {"Key": "k"}), (s3.put_bucket_acl, {})):
        for asked, answer in (
            ({"ACL": "fake-acl"}, (400, "InvalidArgument")),
            ({"ACL": "private", "GrantRead": f'uri="{ALL_USERS}"'}, (400, "InvalidRequest")),
            (
                {
                    "AccessControlPolicy": policy(
                        {"Grantee": {"Type": "Group", "URI": "http://x/y"}, "Permission": "READ"}
                    )
                },
                (400, "InvalidArgument"),
            ),
            (
                {
                    "AccessControlPolicy": policy(
                        {
                            "Grantee": {"Type": "CanonicalUser", "ID": "wrong-id"},
                            "Permission": "READ",
                        }
                    )
                },
                (400, "InvalidArgument"),
            ),
            (
                {
                    "AccessControlPolicy": policy(
                        {"Grantee": {"Type": "Group", "URI": ALL_USERS}, "Permission": "WRONG"}
                    )
                },
                (400, "MalformedACLError"),
            ),
        ):
            assert outcome(put, Bucket=bucket, **where, **asked) == answer, asked
    assert outcome(s3.put_object, Bucket=bucket, Key="k3", Body=b"x", ACL="fake-acl") == (
        400,
        "InvalidArgument",
    )
    # Neither a header nor a body; both.
    for path in (f"/{bucket}?acl", f"/{bucket}/k?acl"):
        missing = raw_request(served, "PUT", path)
        assert missing.status == 400 and b"<Code>MissingSecurityHeader</Code>" in missing.body
        assert b"<MissingHeaderName>x-amz-acl</MissingHeaderName>" in missing.body
        body = b"<AccessControlPolicy/>"
        both = raw_request(served, "PUT", path, body, headers={"x-amz-acl": "private"})
        assert both.status == 400 and b"<Code>UnexpectedContent</Code>" in both.body
    assert len(s3.get_object_acl(Bucket=bucket, Key="k")["Grants"]) == 1  # still private


def test_another_account_is_still_denied(served: Served, s3: Any, bucket: str) -> None:
    other = served.client(served.other)
    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    denied = (403, "AccessDenied")
    assert outcome(other.get_bucket_acl, Bucket=bucket) == denied
    assert outcome(other.get_object_acl, Bucket=bucket, Key="k") == denied
    assert outcome(other.put_bucket_acl, Bucket=bucket, ACL="public-read") == denied
    assert outcome(other.put_object_acl, Bucket=bucket, Key="k", ACL="public-read") == denied
    assert outcome(other.get_object, Bucket=bucket, Key="k") == denied
    assert outcome(other.list_objects_v2, Bucket=bucket) == denied
    assert grants(s3.get_bucket_acl(Bucket=bucket))[0][1] == "FULL_CONTROL"
    assert len(grants(s3.get_bucket_acl(Bucket=bucket))) == 1
    # What public-read opens to everyone, it opens to every account too (as S3's AllUsers).
    s3.put_object(Bucket=bucket, Key="public", Body=b"open", ACL="public-read")
    assert other.get_object(Bucket=bucket, Key="public")["Body"].read() == b"open"
    assert outcome(other.put_object_acl, Bucket=bucket, Key="public", ACL="private") == denied
    assert outcome(other.list_objects_v2, Bucket=bucket) == denied
    s3.put_bucket_acl(Bucket=bucket, ACL="public-read")
    assert outcome(other.list_objects_v2, Bucket=bucket) == 200
    assert outcome(other.head_object, Bucket=bucket, Key="missing") == (404, "404")
    assert outcome(other.delete_object, Bucket=bucket, Key="public") == denied
    assert outcome(other.get_object, Bucket=unique("none"), Key="k") == (404, "NoSuchBucket")


def test_an_anonymous_read_gets_the_buckets_cors_headers(
    served: Served, s3: Any, bucket: str
) -> None:
    rule = {"AllowedOrigins": ["https://page.example"], "AllowedMethods": ["GET"]}
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration={"CORSRules": [rule]})
    s3.put_object(Bucket=bucket, Key="k", Body=b"x", ACL="public-read")
    request = urllib.request.Request(
        f"{served.endpoint}/{bucket}/k", headers={"Origin": "https://page.example"}
    )
    with urllib.request.urlopen(request) as response:
        assert response.read() == b"x"
        assert response.headers["Access-Control-Allow-Origin"] == "https://page.example"
