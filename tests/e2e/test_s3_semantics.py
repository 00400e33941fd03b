"""S3's answers where tools rely on them: deleting a bucket with open uploads, conditional
writes and deletes with `*` and ETags, a second CompleteMultipartUpload, DeleteObjects of many keys;
boto3 and the aws cli against `shoal serve`."""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

from botocore.exceptions import ClientError

from tests.e2e.test_awscli_and_pyarrow import aws
from tests.e2e.test_boto3 import error_code
from tests.e2e.test_errors_and_protocol import code_of
from tests.fixtures.postgres import unique
from tests.fixtures.serve import Served, raw_request


def test_delete_bucket_whose_only_contents_are_open_uploads(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="kept", Body=b"x")
    upload = s3.create_multipart_upload(Bucket=bucket, Key="big")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="big", UploadId=upload, PartNumber=1, Body=b"part")
    s3.create_multipart_upload(Bucket=bucket, Key="no-parts")
    assert error_code(s3.delete_bucket, Bucket=bucket) == "BucketNotEmpty"
    s3.delete_object(Bucket=bucket, Key="kept")
    s3.delete_bucket(Bucket=bucket)
    assert error_code(s3.head_bucket, Bucket=bucket) == "404"
    # A new bucket of the same name never sees the old uploads.
    s3.create_bucket(Bucket=bucket)
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert (
        error_code(
            s3.upload_part, Bucket=bucket, Key="big", UploadId=upload, PartNumber=2, Body=b"p"
        )
        == "NoSuchUpload"
    )


def test_aws_s3_rb_force_removes_a_bucket_with_an_open_upload(served: Served) -> None:
    s3 = served.client()
    bucket = unique("rb")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="a/b", Body=b"x")
    s3.create_multipart_upload(Bucket=bucket, Key="pending")
    aws(served, "s3", "rb", "--force", f"s3://{bucket}")
    assert bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]


def test_if_match_any_needs_the_key_and_if_none_match_an_etag_refuses_only_it(
    s3: Any, bucket: str
) -> None:
    assert error_code(s3.put_object, Bucket=bucket, Key="k", Body=b"0", IfMatch="*") == "NoSuchKey"
    first = s3.put_object(Bucket=bucket, Key="k", Body=b"1", IfNoneMatch='"' + "a" * 32 + '"')
    second = s3.put_object(Bucket=bucket, Key="k", Body=b"2", IfMatch="*")
    assert (
        error_code(s3.put_object, Bucket=bucket, Key="k", Body=b"3", IfNoneMatch=second["ETag"])
        == "PreconditionFailed"
    )
    s3.put_object(Bucket=bucket, Key="k", Body=b"4", IfNoneMatch=first["ETag"])
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"4"
    # A value that is neither `*` nor an ETag is refused as S3 refuses it, never ignored.
    for garbage in ('"not-an-etag"', "true"):
        assert (
            error_code(s3.put_object, Bucket=bucket, Key="k", Body=b"5", IfNoneMatch=garbage)
            == "NotImplemented"
        )
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"4"


def test_racing_conditional_puts_let_exactly_one_win(served: Served, bucket: str) -> None:
    body = b"the same body"
    etag = f'"{hashlib.md5(body).hexdigest()}"'
    clients = [served.client() for _ in range(2)]
    clients[0].put_object(Bucket=bucket, Key="race", Body=b"before")

    def put(client: Any) -> str:
        try:
            client.put_object(Bucket=bucket, Key="race", Body=body, IfNoneMatch=etag)
        except ClientError as exc:
            return str(exc.response["Error"]["Code"])
        return "ok"

    for _ in range(5):
        clients[0].put_object(Bucket=bucket, Key="race", Body=b"before")
        with ThreadPoolExecutor(2) as pool:
            outcomes = sorted(pool.map(put, clients))
        assert outcomes == ["PreconditionFailed", "ok"]


def test_conditional_deletes_delete_only_the_version_they_name(s3: Any, bucket: str) -> None:
    first = s3.put_object(Bucket=bucket, Key="k", Body=b"1")
    second = s3.put_object(Bucket=bucket, Key="k", Body=b"2")
    for stale in (first["ETag"], '"not-an-etag"'):
        assert (
            error_code(s3.delete_object, Bucket=bucket, Key="k", IfMatch=stale)
            == "PreconditionFailed"
        )
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"2"
    s3.delete_object(Bucket=bucket, Key="k", IfMatch=second["ETag"])
    assert error_code(s3.head_object, Bucket=bucket, Key="k") == "404"
    # A condition on a key with no live version is NoSuchKey; without one, a delete is 204.
    for condition in ("*", second["ETag"], '"not-an-etag"'):
        assert (
            error_code(s3.delete_object, Bucket=bucket, Key="k", IfMatch=condition) == "NoSuchKey"
        )
    s3.delete_object(Bucket=bucket, Key="k")
    s3.put_object(Bucket=bucket, Key="k", Body=b"3")
    s3.delete_object(Bucket=bucket, Key="k", IfMatch="*")
    assert error_code(s3.head_object, Bucket=bucket, Key="k") == "404"


def test_delete_objects_honours_each_object_s_etag(s3: Any, bucket: str) -> None:
    etags = {k: s3.put_object(Bucket=bucket, Key=k, Body=k.encode())["ETag"] for k in "abcd"}
    objects = [
        {"Key": "a", "ETag": etags["a"]},
        {"Key": "b", "ETag": etags["a"]},  # another object's ETag
        {"Key": "c"},
        {"Key": "gone", "ETag": etags["d"]},
    ]
    result = s3.delete_objects(Bucket=bucket, Delete={"Objects": objects})
    assert sorted(d["Key"] for d in result["Deleted"]) == ["a", "c"]
    assert {e["Key"]: e["Code"] for e in result["Errors"]} == {
        "b": "PreconditionFailed",
        "gone": "NoSuchKey",
    }
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["b", "d"]
    # A key named twice is answered twice: once deleted, once found gone.
    twice = [{"Key": "b"}, {"Key": "d", "ETag": etags["d"]}, {"Key": "d", "ETag": etags["d"]}]
    result = s3.delete_objects(Bucket=bucket, Delete={"Objects": twice})
    assert sorted(d["Key"] for d in result["Deleted"]) == ["b", "d"]
    assert [(e["Key"], e["Code"]) for e in result["Errors"]] == [("d", "NoSuchKey")]


def test_racing_conditional_deletes_let_exactly_one_delete(served: Served, bucket: str) -> None:
    clients = [served.client() for _ in range(2)]

    def delete(client: Any, etag: str) -> str:
        try:
            client.delete_object(Bucket=bucket, Key="race", IfMatch=etag)
        except ClientError as exc:
            return str(exc.response["Error"]["Code"])
        return "ok"

    for n in range(5):
        etag = clients[0].put_object(Bucket=bucket, Key="race", Body=b"%d" % n)["ETag"]
        with ThreadPoolExecutor(2) as pool:
            outcomes = sorted(pool.map(delete, clients, [etag, etag]))
        assert outcomes == ["NoSuchKey", "ok"]


def test_list_multipart_uploads_rolls_keys_up_by_the_delimiter(s3: Any, bucket: str) -> None:
    for key in ("m1", "m1", "m2", "m3/x", "m3/y", "m4"):
        s3.create_multipart_upload(Bucket=bucket, Key=key)
    listed = s3.list_multipart_uploads(Bucket=bucket, Delimiter="/")
    assert [u["Key"] for u in listed["Uploads"]] == ["m1", "m1", "m2", "m4"]
    assert listed["CommonPrefixes"] == [{"Prefix": "m3/"}] and listed["Delimiter"] == "/"
    # Paged two entries at a time, a common prefix counts as one and is never repeated.
    seen, markers = [], {}
    while True:
        page = s3.list_multipart_uploads(Bucket=bucket, Delimiter="/", MaxUploads=2, **markers)
        entries = [(u["Key"], u["UploadId"]) for u in page.get("Uploads", [])]
        entries += [(p["Prefix"], None) for p in page.get("CommonPrefixes", [])]
        seen.extend(sorted(entries))
        if not page["IsTruncated"]:
            break
        markers = {"KeyMarker": page["NextKeyMarker"]}
        if page.get("NextUploadIdMarker"):
            markers["UploadIdMarker"] = page["NextUploadIdMarker"]
    assert [key for key, _ in seen] == ["m1", "m1", "m2", "m3/", "m4"]
    assert len({upload for _, upload in seen if upload}) == 4


def test_list_objects_v1_gives_a_next_marker_only_with_a_delimiter(s3: Any, bucket: str) -> None:
    for key in ("a", "b/1", "b/2", "c"):
        s3.put_object(Bucket=bucket, Key=key, Body=b"")
    flat = s3.list_objects(Bucket=bucket, MaxKeys=2)
    assert flat["IsTruncated"] and "NextMarker" not in flat  # the last key is the marker
    assert [o["Key"] for o in flat["Contents"]] == ["a", "b/1"]
    rolled = s3.list_objects(Bucket=bucket, MaxKeys=2, Delimiter="/")
    assert rolled["IsTruncated"] and rolled["NextMarker"] == "b/"
    rest = s3.list_objects(Bucket=bucket, Marker=rolled["NextMarker"], Delimiter="/")
    assert [o["Key"] for o in rest["Contents"]] == ["c"] and not rest["IsTruncated"]


LIFECYCLE = (
    b"<LifecycleConfiguration><Rule><ID>r</ID><Filter><Prefix>tmp/</Prefix></Filter>"
    b"<Status>Enabled</Status><Expiration><Days>1</Days></Expiration></Rule>"
    b"</LifecycleConfiguration>"
)
CORS = (
    b"<CORSConfiguration><CORSRule><AllowedOrigin>*</AllowedOrigin>"
    b"<AllowedMethod>GET</AllowedMethod></CORSRule></CORSConfiguration>"
)


def test_every_xml_body_is_checked_against_its_digests(served: Served, bucket: str) -> None:
    tagging = b"<Tagging><TagSet><Tag><Key>k</Key><Value>v</Value></Tag></TagSet></Tagging>"
    bodies = {
        f"/{bucket}?lifecycle": LIFECYCLE,
        f"/{bucket}?cors": CORS,
        f"/{bucket}?tagging": tagging,
    }
    wrong_md5 = base64.b64encode(hashlib.md5(b"another body").digest()).decode()
    wrong_crc = base64.b64encode(b"\0\0\0\0").decode()
    for path, body in bodies.items():
        for headers, code in (
            ({"Content-MD5": wrong_md5}, "BadDigest"),
            ({"Content-MD5": "not base64!"}, "InvalidDigest"),
            ({"x-amz-checksum-crc32": wrong_crc}, "BadDigest"),
        ):
            refused = raw_request(served, "PUT", path, body, headers=headers)
            assert (refused.status, code_of(refused.body)) == (400, code), (path, headers)
        right = base64.b64encode(hashlib.md5(body).digest()).decode()
        stored = raw_request(served, "PUT", path, body, headers={"Content-MD5": right})
        assert stored.status in (200, 204), (path, stored.body)
    new_bucket = raw_request(
        served, "PUT", f"/{unique('md5')}", b"", headers={"Content-MD5": wrong_md5}
    )
    assert (new_bucket.status, code_of(new_bucket.body)) == (400, "BadDigest")


def test_cors_lifecycle_and_delete_objects_need_a_digest(
    served: Served, s3: Any, bucket: str
) -> None:
    """S3 refuses these three without Content-MD5 or an x-amz-checksum-* (botocore issue 1888,
    aws-cli issue 229: AWS's answer); boto3 and the aws cli as installed send one."""
    delete = b"<Delete><Object><Key>k</Key></Object></Delete>"
    for method, path, body in (
        ("PUT", f"/{bucket}?lifecycle", LIFECYCLE),
        ("PUT", f"/{bucket}?cors", CORS),
        ("POST", f"/{bucket}?delete", delete),
    ):
        refused = raw_request(served, method, path, body)
        assert (refused.status, code_of(refused.body)) == (400, "InvalidRequest"), path
        assert b"<Message>Missing required header for this request: Content-MD5</Message>" in (
            refused.body
        )
        crc32 = base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()
        taken = raw_request(served, method, path, body, headers={"x-amz-checksum-crc32": crc32})
        assert taken.status in (200, 204), (path, taken.body)
    rules = [
        {"ID": "r", "Filter": {"Prefix": "t/"}, "Status": "Enabled", "Expiration": {"Days": 2}}
    ]
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": rules})
    cors_rules = [{"AllowedOrigins": ["*"], "AllowedMethods": ["HEAD"]}]
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration={"CORSRules": cors_rules})
    aws(
        served,
        "s3api",
        "put-bucket-cors",
        "--bucket",
        bucket,
        "--cors-configuration",
        json.dumps({"CORSRules": cors_rules}),
    )
    aws(
        served,
        "s3api",
        "put-bucket-lifecycle-configuration",
        "--bucket",
        bucket,
        "--lifecycle-configuration",
        json.dumps({"Rules": rules}),
    )
    assert s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"][0]["ID"] == "r"


RULE = "<Status>Enabled</Status><Filter><Prefix>a</Prefix></Filter>"
EXPIRE = "<Expiration><Days>1</Days></Expiration>"


def test_configurations_are_checked_against_s3_s_schema(served: Served, bucket: str) -> None:
    """A repeated or unknown element is MalformedXML, never read past (the first <Filter> of
    two kept, the second dropped)."""
    lifecycle = {
        "two filters": f"{RULE}<Filter><Prefix>b</Prefix></Filter>{EXPIRE}",
        "two statuses": f"{RULE}<Status>Disabled</Status>{EXPIRE}",
        "two expirations": f"{RULE}{EXPIRE}<Expiration><Days>2</Days></Expiration>",
        "two days": f"{RULE}<Expiration><Days>1</Days><Days>2</Days></Expiration>",
        "unknown element": f"{RULE}{EXPIRE}<Colour>red</Colour>",
        "unknown in filter": (
            "<Status>Enabled</Status><Filter><Prefix>a</Prefix><Suffix>z</Suffix></Filter>" + EXPIRE
        ),
    }
    for what, rule in lifecycle.items():
        body = f"<LifecycleConfiguration><Rule>{rule}</Rule></LifecycleConfiguration>".encode()
        refused = raw_request(served, "PUT", f"/{bucket}?lifecycle", body)
        assert (refused.status, code_of(refused.body)) == (400, "MalformedXML"), what
    cors_rule = "<AllowedOrigin>*</AllowedOrigin><AllowedMethod>GET</AllowedMethod>"
    for extra in ("<MaxAgeSeconds>1</MaxAgeSeconds>" * 2, "<Colour>red</Colour>"):
        body = f"<CORSConfiguration><CORSRule>{cors_rule}{extra}</CORSRule></CORSConfiguration>"
        refused = raw_request(served, "PUT", f"/{bucket}?cors", body.encode())
        assert (refused.status, code_of(refused.body)) == (400, "MalformedXML"), extra
    assert raw_request(served, "GET", f"/{bucket}?lifecycle").status == 404  # nothing stored
    assert raw_request(served, "GET", f"/{bucket}?cors").status == 404


def test_a_noncurrent_version_expiration_is_kept_and_answered_back(s3: Any, bucket: str) -> None:
    """As on an unversioned S3 bucket (every Shoal bucket is one): kept, with nothing to act
    on, so that a tool that sets it finds what it set."""
    rules = [
        {
            "ID": "both",
            "Filter": {"Prefix": "logs/"},
            "Status": "Enabled",
            "Expiration": {"Days": 30},
            "NoncurrentVersionExpiration": {"NoncurrentDays": 7, "NewerNoncurrentVersions": 3},
            "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 2},
        },
        {
            "ID": "only",
            "Filter": {"Prefix": "old/"},
            "Status": "Enabled",
            "NoncurrentVersionExpiration": {"NoncurrentDays": 1},
        },
    ]
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": rules})
    got = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    assert [r["NoncurrentVersionExpiration"] for r in got] == [
        {"NoncurrentDays": 7, "NewerNoncurrentVersions": 3},
        {"NoncurrentDays": 1},
    ]
    assert got[0]["Expiration"] == {"Days": 30} and "Expiration" not in got[1]
    bad = [{**rules[1], "NoncurrentVersionExpiration": {"NoncurrentDays": 0}}]
    assert (
        error_code(
            s3.put_bucket_lifecycle_configuration,
            Bucket=bucket,
            LifecycleConfiguration={"Rules": bad},
        )
        == "InvalidArgument"
    )


def test_second_complete_with_the_same_parts_answers_the_same(s3: Any, bucket: str) -> None:
    upload = s3.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    part = s3.upload_part(Bucket=bucket, Key="mp", UploadId=upload, PartNumber=1, Body=b"data")
    parts = {"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]}
    complete = {"Bucket": bucket, "Key": "mp", "UploadId": upload, "MultipartUpload": parts}
    first = s3.complete_multipart_upload(**complete)
    again = s3.complete_multipart_upload(**complete)
    assert again["ETag"] == first["ETag"]
    other = {"Parts": [{"PartNumber": 1, "ETag": '"' + "0" * 32 + '"'}]}
    assert (
        error_code(s3.complete_multipart_upload, **{**complete, "MultipartUpload": other})
        == "NoSuchUpload"
    )
    assert s3.get_object(Bucket=bucket, Key="mp")["Body"].read() == b"data"


def test_delete_objects_of_many_keys(s3: Any, bucket: str) -> None:
    keys = [f"d/{i:04d}" for i in range(300)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: s3.put_object(Bucket=bucket, Key=k, Body=k.encode()), keys))
    objects = [{"Key": k} for k in [*keys, "never-there"]]
    objects.append({"Key": "d/0000", "VersionId": "not-null"})
    answer = s3.delete_objects(Bucket=bucket, Delete={"Objects": objects})
    assert sorted(d["Key"] for d in answer["Deleted"]) == sorted([*keys, "never-there"])
    assert [(e["Key"], e["Code"]) for e in answer["Errors"]] == [("d/0000", "NoSuchKey")]
    assert s3.list_objects_v2(Bucket=bucket).get("Contents", []) == []


def test_complete_and_copy_answer_the_version_they_made_whatever_follows(
    s3: Any, bucket: str
) -> None:
    """A Complete or a CopyObject racing a delete or an overwrite of its key: its answer is
    the version it made (never NoSuchKey, never the other write's ETag)."""
    s3.put_object(Bucket=bucket, Key="source", Body=b"copied bytes")
    source_etag = s3.head_object(Bucket=bucket, Key="source")["ETag"]
    part = b"the only part"
    completed_etag = f'"{hashlib.md5(hashlib.md5(part).digest()).hexdigest()}-1"'

    def complete(upload: str, etag: str) -> str:
        done = s3.complete_multipart_upload(
            Bucket=bucket,
            Key="raced",
            UploadId=upload,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
        )
        return str(done["ETag"])

    def copy() -> str:
        done = s3.copy_object(Bucket=bucket, Key="raced", CopySource=f"{bucket}/source")
        return str(done["CopyObjectResult"]["ETag"])

    with ThreadPoolExecutor(2) as pool:
        for round_ in range(24):
            upload = s3.create_multipart_upload(Bucket=bucket, Key="raced")["UploadId"]
            etag = s3.upload_part(
                Bucket=bucket, Key="raced", UploadId=upload, PartNumber=1, Body=part
            )["ETag"]
            if round_ % 2:  # the other write: a delete of the key, or an overwrite
                other = pool.submit(s3.delete_object, Bucket=bucket, Key="raced")
            else:
                other = pool.submit(s3.put_object, Bucket=bucket, Key="raced", Body=b"x")
            assert complete(upload, etag) == completed_etag, round_
            other.result()
            racing = pool.submit(s3.put_object, Bucket=bucket, Key="raced", Body=b"y")
            assert copy() == source_etag, round_
            racing.result()


def test_a_completed_upload_s_location_is_its_url(served: Served, s3: Any, bucket: str) -> None:
    """CompleteMultipartUpload's Location is an absolute URL, its key percent-encoded."""
    key = "mp loc/é+%"
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    etag = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=b"x")["ETag"]
    done = s3.complete_multipart_upload(
        Bucket=bucket,
        Key=key,
        UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
    )
    assert done["Location"] == f"{served.endpoint}/{bucket}/{quote(key)}"
