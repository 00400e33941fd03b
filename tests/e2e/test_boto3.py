"""boto3, unmodified and with its default checksum settings, against `shoal serve`."""

from __future__ import annotations

import base64
import email.header
import hashlib
import io
import os
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from tests.e2e.conftest import complete_upload
from tests.fixtures.postgres import unique
from tests.fixtures.serve import Served, raw_request

MiB = 1024 * 1024


def error_code(call: Any, **kwargs: Any) -> str:
    with pytest.raises(ClientError) as raised:
        call(**kwargs)
    return str(raised.value.response["Error"]["Code"])


def test_put_get_head_with_metadata(s3: Any, bucket: str) -> None:
    body = os.urandom(3 * MiB + 17)
    put = s3.put_object(
        Bucket=bucket,
        Key="a/b c/ü.bin",
        Body=body,
        ContentType="application/x-test",
        Metadata={"colour": "blue"},
        CacheControl="max-age=60",
        ContentDisposition='attachment; filename="x.bin"',
        ContentEncoding="identity",
        Expires=datetime(2030, 1, 1, tzinfo=UTC),
    )
    assert put["ETag"] == f'"{hashlib.md5(body).hexdigest()}"'
    got = s3.get_object(Bucket=bucket, Key="a/b c/ü.bin")
    assert got["Body"].read() == body
    assert got["ContentType"] == "application/x-test"
    assert got["Metadata"] == {"colour": "blue"}
    assert got["CacheControl"] == "max-age=60"
    assert got["ContentDisposition"] == 'attachment; filename="x.bin"'
    assert got["ContentEncoding"] == "identity"
    assert got["ContentLength"] == len(body)
    head = s3.head_object(Bucket=bucket, Key="a/b c/ü.bin")
    assert head["ETag"] == put["ETag"] and head["ContentLength"] == len(body)


def test_user_metadata_is_at_most_2_kib_of_utf_8(served: Served, s3: Any, bucket: str) -> None:
    name = "x-amz-meta-k"  # counted with its prefix: 12 bytes
    fits = {name: "v" * (2048 - len(name))}
    assert raw_request(served, "PUT", f"/{bucket}/meta", b"x", headers=fits).status == 200
    assert s3.head_object(Bucket=bucket, Key="meta")["Metadata"] == {"k": fits[name]}
    # The same number of characters, one of them two bytes in UTF-8.
    over = {name: "é" + "v" * (2047 - len(name))}
    refused = raw_request(served, "PUT", f"/{bucket}/meta2", b"x", headers=over)
    assert refused.status == 400 and b"<Code>MetadataTooLarge</Code>" in refused.body
    assert b"<Size>2049</Size><MaxSizeAllowed>2048</MaxSizeAllowed>" in refused.body


def test_metadata_that_is_not_ascii_comes_back_as_an_rfc_2047_encoded_word(
    served: Served, s3: Any, bucket: str
) -> None:
    encoded = "=?UTF-8?B?w6nDqQ==?="  # sent encoded already: kept and answered as it is
    headers = {"x-amz-meta-name": "café ☕", "x-amz-meta-plain": "tea", "x-amz-meta-sent": encoded}
    stored = raw_request(served, "PUT", f"/{bucket}/utf8", b"x", headers=headers)
    assert stored.status == 200, stored.body
    answered = raw_request(served, "HEAD", f"/{bucket}/utf8")
    assert all(value.isascii() for value in answered.headers.values())
    metadata = s3.head_object(Bucket=bucket, Key="utf8")["Metadata"]
    assert metadata["plain"] == "tea" and metadata["sent"] == encoded
    ((raw, charset),) = email.header.decode_header(metadata["name"])
    assert (raw.decode(charset), charset) == ("café ☕", "utf-8")
    got = s3.get_object(Bucket=bucket, Key="utf8")
    assert got["Metadata"] == metadata


def test_default_checksums_are_verified_and_returned(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="k", Body=b"checked", ChecksumAlgorithm="SHA256")
    head = s3.head_object(Bucket=bucket, Key="k", ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == base64.b64encode(hashlib.sha256(b"checked").digest()).decode()


def test_ranges(s3: Any, bucket: str) -> None:
    body = os.urandom(2 * MiB + 5)
    s3.put_object(Bucket=bucket, Key="r", Body=body)
    for header, expected in [
        ("bytes=0-0", body[:1]),
        (f"bytes={MiB - 2}-{MiB + 2}", body[MiB - 2 : MiB + 3]),
        ("bytes=-7", body[-7:]),
        (f"bytes={2 * MiB}-", body[2 * MiB :]),
    ]:
        got = s3.get_object(Bucket=bucket, Key="r", Range=header)
        assert got["Body"].read() == expected
        assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
        assert got["ContentRange"].endswith(f"/{len(body)}")
    assert (
        error_code(s3.get_object, Bucket=bucket, Key="r", Range=f"bytes={len(body)}-")
        == "InvalidRange"
    )


def test_get_conditionals_and_response_overrides(s3: Any, bucket: str) -> None:
    put = s3.put_object(Bucket=bucket, Key="c", Body=b"x")
    etag = put["ETag"]
    with pytest.raises(ClientError) as raised:
        s3.get_object(Bucket=bucket, Key="c", IfNoneMatch=etag)
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304
    assert (
        error_code(s3.get_object, Bucket=bucket, Key="c", IfMatch='"0000"') == "PreconditionFailed"
    )
    past = datetime.now(UTC) - timedelta(days=1)
    assert (
        error_code(s3.get_object, Bucket=bucket, Key="c", IfUnmodifiedSince=past)
        == "PreconditionFailed"
    )
    assert s3.get_object(Bucket=bucket, Key="c", IfModifiedSince=past)["Body"].read() == b"x"
    got = s3.get_object(
        Bucket=bucket,
        Key="c",
        ResponseContentType="text/x-override",
        ResponseContentDisposition="inline",
    )
    got["Body"].close()
    assert got["ContentType"] == "text/x-override" and got["ContentDisposition"] == "inline"


def test_response_overrides_replace_the_stored_headers(served: Served, bucket: str) -> None:
    s3 = served.client()
    stored = {"ContentDisposition": "inline", "ContentLanguage": "en", "CacheControl": "no-cache"}
    s3.put_object(Bucket=bucket, Key="d", Body=b"hello", **stored)
    url = s3.generate_presigned_url(
        "get_object",
        Params={
            "Bucket": bucket,
            "Key": "d",
            "ResponseContentDisposition": 'attachment; filename="x.txt"',
            "ResponseContentLanguage": "fr",
            "ResponseCacheControl": "max-age=5",
        },
    )
    with urllib.request.urlopen(url, timeout=30) as response:
        sent = response.headers
        assert sent.get_all("Content-Disposition") == ['attachment; filename="x.txt"']
        assert sent.get_all("Content-Language") == ["fr"]
        assert sent.get_all("Cache-Control") == ["max-age=5"]
    # A value no header can carry is the client's mistake, not the server's.
    assert (
        error_code(s3.get_object, Bucket=bucket, Key="d", ResponseContentType="a\r\nX-Evil: 1")
        == "InvalidArgument"
    )


def test_conditional_writes(s3: Any, bucket: str) -> None:
    first = s3.put_object(Bucket=bucket, Key="once", Body=b"1", IfNoneMatch="*")
    assert (
        error_code(s3.put_object, Bucket=bucket, Key="once", Body=b"2", IfNoneMatch="*")
        == "PreconditionFailed"
    )
    assert (
        error_code(
            s3.put_object, Bucket=bucket, Key="once", Body=b"2", IfMatch='"' + "0" * 32 + '"'
        )
        == "PreconditionFailed"
    )
    s3.put_object(Bucket=bucket, Key="once", Body=b"3", IfMatch=first["ETag"])
    assert s3.get_object(Bucket=bucket, Key="once")["Body"].read() == b"3"


def test_list_with_delimiter_and_pagination(s3: Any, bucket: str) -> None:
    keys = [f"dir{d}/file{f:03d}" for d in range(3) for f in range(40)] + ["top1", "top2"]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=b"")
    v2 = s3.get_paginator("list_objects_v2")
    listed = [
        o["Key"]
        for page in v2.paginate(Bucket=bucket, PaginationConfig={"PageSize": 7})
        for o in page.get("Contents", [])
    ]
    assert listed == sorted(keys)
    pages = list(v2.paginate(Bucket=bucket, Delimiter="/", PaginationConfig={"PageSize": 2}))
    prefixes = [p["Prefix"] for page in pages for p in page.get("CommonPrefixes", [])]
    top = [o["Key"] for page in pages for o in page.get("Contents", [])]
    assert prefixes == ["dir0/", "dir1/", "dir2/"] and top == ["top1", "top2"]
    v1 = s3.get_paginator("list_objects")
    listed_v1 = [
        o["Key"]
        for page in v1.paginate(Bucket=bucket, Prefix="dir1/", PaginationConfig={"PageSize": 9})
        for o in page.get("Contents", [])
    ]
    assert listed_v1 == [k for k in sorted(keys) if k.startswith("dir1/")]
    encoded = s3.list_objects_v2(Bucket=bucket, Prefix="top", EncodingType="url")
    assert [o["Key"] for o in encoded["Contents"]] == ["top1", "top2"]


def test_listed_keys_and_prefixes_are_escaped_encoded_and_owned(s3: Any, bucket: str) -> None:
    keys = ["a&b <c>/one", "a&b <c>/two", "plain", "ünï cödé & more"]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=b"12345")
    # botocore asks for url-encoded keys and decodes them; asked for explicitly, it does not.
    page = s3.list_objects_v2(Bucket=bucket, Delimiter="/", FetchOwner=True)
    assert [p["Prefix"] for p in page["CommonPrefixes"]] == ["a&b <c>/"]
    assert [o["Key"] for o in page["Contents"]] == ["plain", "ünï cödé & more"]
    for listed in page["Contents"]:
        assert listed["Size"] == 5 and listed["ETag"] == '"827ccb0eea8a706c4c34a16891f84e7b"'
        assert listed["Owner"]["ID"] and listed["StorageClass"] == "STANDARD"
    raw = s3.list_objects_v2(Bucket=bucket, Delimiter="/", EncodingType="url")
    assert [p["Prefix"] for p in raw["CommonPrefixes"]] == [quote("a&b <c>/", safe="/")]
    assert [o["Key"] for o in raw["Contents"]] == ["plain", quote("ünï cödé & more")]
    without_owner = s3.list_objects_v2(Bucket=bucket, Prefix="plain")["Contents"]
    assert "Owner" not in without_owner[0]
    v1 = s3.list_objects(Bucket=bucket, Prefix="a&b <c>/")["Contents"]
    assert [o["Key"] for o in v1] == ["a&b <c>/one", "a&b <c>/two"] and v1[0]["Owner"]["ID"]


def test_multipart_upload_of_30_mib_through_the_transfer_manager(
    s3: Any, bucket: str, tmp_path: Any
) -> None:
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(30 * MiB))
    config = TransferConfig(
        multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB, max_concurrency=4
    )
    s3.upload_file(str(source), bucket, "big.bin", Config=config)
    head = s3.head_object(Bucket=bucket, Key="big.bin")
    assert head["ContentLength"] == 30 * MiB and head["ETag"].endswith('-4"')
    for delimiter in ("", "/"):  # both kinds of listing show the multipart ETag
        listed = s3.list_objects_v2(Bucket=bucket, Delimiter=delimiter)["Contents"]
        assert [(o["Key"], o["ETag"]) for o in listed] == [("big.bin", head["ETag"])]
    target = tmp_path / "back.bin"
    s3.download_file(bucket, "big.bin", str(target), Config=config)
    assert target.read_bytes() == source.read_bytes()


def test_multipart_errors_parts_and_abort(s3: Any, bucket: str) -> None:
    upload = s3.create_multipart_upload(Bucket=bucket, Key="mp")["UploadId"]
    small = s3.upload_part(Bucket=bucket, Key="mp", UploadId=upload, PartNumber=1, Body=b"a" * 100)
    last = s3.upload_part(Bucket=bucket, Key="mp", UploadId=upload, PartNumber=2, Body=b"b" * 100)
    parts = s3.list_parts(Bucket=bucket, Key="mp", UploadId=upload)["Parts"]
    assert [(p["PartNumber"], p["Size"]) for p in parts] == [(1, 100), (2, 100)]
    uploads = s3.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in uploads] == [("mp", upload)]

    def complete(chosen: list[dict[str, Any]]) -> str:
        return error_code(
            s3.complete_multipart_upload,
            Bucket=bucket,
            Key="mp",
            UploadId=upload,
            MultipartUpload={"Parts": chosen},
        )

    one = {"PartNumber": 1, "ETag": small["ETag"]}
    two = {"PartNumber": 2, "ETag": last["ETag"]}
    assert complete([one, two]) == "EntityTooSmall"
    assert complete([two, one]) == "InvalidPartOrder"
    assert complete([{"PartNumber": 3, "ETag": last["ETag"]}]) == "InvalidPart"
    s3.abort_multipart_upload(Bucket=bucket, Key="mp", UploadId=upload)
    assert error_code(s3.list_parts, Bucket=bucket, Key="mp", UploadId=upload) == "NoSuchUpload"


def test_upload_part_copy(s3: Any, bucket: str) -> None:
    body = os.urandom(6 * MiB)
    s3.put_object(Bucket=bucket, Key="src", Body=body)
    upload = s3.create_multipart_upload(Bucket=bucket, Key="dst")["UploadId"]
    first = s3.upload_part_copy(
        Bucket=bucket,
        Key="dst",
        UploadId=upload,
        PartNumber=1,
        CopySource={"Bucket": bucket, "Key": "src"},
        CopySourceRange=f"bytes=0-{5 * MiB - 1}",
    )
    second = s3.upload_part_copy(
        Bucket=bucket,
        Key="dst",
        UploadId=upload,
        PartNumber=2,
        CopySource={"Bucket": bucket, "Key": "src"},
        CopySourceRange=f"bytes={5 * MiB}-{6 * MiB - 1}",
    )
    for past_the_source in (f"bytes=0-{6 * MiB}", f"bytes={6 * MiB}-{6 * MiB + 1}", "bytes=2-1"):
        with pytest.raises(ClientError) as refused:
            s3.upload_part_copy(
                Bucket=bucket,
                Key="dst",
                UploadId=upload,
                PartNumber=3,
                CopySource={"Bucket": bucket, "Key": "src"},
                CopySourceRange=past_the_source,
            )
        error = refused.value.response["Error"]
        assert (error["Code"], error["Message"]) == (
            "InvalidArgument",
            f"Range specified is not valid for source object of size: {6 * MiB}",
        )
    etags = [first["CopyPartResult"]["ETag"], second["CopyPartResult"]["ETag"]]
    complete_upload(s3, bucket, "dst", upload, etags)
    assert s3.get_object(Bucket=bucket, Key="dst")["Body"].read() == body


def test_copy_object(s3: Any, bucket: str) -> None:
    other = unique("copyto")
    s3.create_bucket(Bucket=other)
    s3.put_object(
        Bucket=bucket, Key="orig", Body=b"payload", ContentType="text/plain", Metadata={"m": "1"}
    )
    s3.copy_object(Bucket=other, Key="same", CopySource={"Bucket": bucket, "Key": "orig"})
    copied = s3.get_object(Bucket=other, Key="same")
    assert copied["Body"].read() == b"payload" and copied["Metadata"] == {"m": "1"}
    assert copied["ContentType"] == "text/plain"
    s3.copy_object(
        Bucket=bucket,
        Key="orig",
        CopySource={"Bucket": bucket, "Key": "orig"},
        MetadataDirective="REPLACE",
        Metadata={"m": "2"},
        ContentType="text/csv",
    )
    replaced = s3.head_object(Bucket=bucket, Key="orig")
    assert replaced["Metadata"] == {"m": "2"} and replaced["ContentType"] == "text/csv"
    assert (
        error_code(
            s3.copy_object, Bucket=bucket, Key="orig", CopySource={"Bucket": bucket, "Key": "orig"}
        )
        == "InvalidRequest"
    )
    assert (
        error_code(
            s3.copy_object,
            Bucket=bucket,
            Key="x",
            CopySource={"Bucket": bucket, "Key": "orig"},
            CopySourceIfMatch='"nope"',
        )
        == "PreconditionFailed"
    )


def test_batch_delete(s3: Any, bucket: str) -> None:
    keys = [f"d/{i}" for i in range(120)]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=b"")
    result = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[:100]]})
    assert sorted(d["Key"] for d in result["Deleted"]) == sorted(keys[:100])
    quiet = s3.delete_objects(
        Bucket=bucket,
        Delete={"Quiet": True, "Objects": [{"Key": k, "VersionId": "null"} for k in keys[100:]]},
    )
    assert "Deleted" not in quiet and "Errors" not in quiet
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0


def test_versions_of_an_unversioned_bucket(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="v", Body=b"1")
    assert "Status" not in s3.get_bucket_versioning(Bucket=bucket)
    versions = s3.list_object_versions(Bucket=bucket)["Versions"]
    assert [(v["Key"], v["VersionId"], v["IsLatest"]) for v in versions] == [("v", "null", True)]
    assert (
        error_code(s3.list_object_versions, Bucket=bucket, VersionIdMarker="null")
        == "InvalidArgument"
    )  # a version id marker needs a key marker
    after_v = s3.list_object_versions(Bucket=bucket, KeyMarker="v", VersionIdMarker="null")
    assert "Versions" not in after_v
    s3.delete_object(Bucket=bucket, Key="v", VersionId="null")
    assert "Versions" not in s3.list_object_versions(Bucket=bucket)
    assert s3.delete_object(Bucket=bucket, Key="never")["ResponseMetadata"]["HTTPStatusCode"] == 204


def test_version_id_markers_are_refused_as_s3_refuses_them(s3: Any, bucket: str) -> None:
    """S3's answers (localstack's AWS snapshot of test_list_objects_versions_markers; Swift's
    s3api test_get_versioned_object_invalid_params): a key-marker must be given, even an
    empty one, and the marker must be a version id (here only "null" is one)."""

    def refusal(**markers: str) -> tuple[str, str, str, str]:
        with pytest.raises(ClientError) as raised:
            s3.list_object_versions(Bucket=bucket, **markers)
        error = raised.value.response["Error"]
        return error["Code"], error["Message"], error["ArgumentName"], error["ArgumentValue"]

    without_key_marker = "A version-id marker cannot be specified without a key marker."
    assert refusal(VersionIdMarker="null") == (
        "InvalidArgument",
        without_key_marker,
        "version-id-marker",
        "null",
    )
    for markers in ({"KeyMarker": "v"}, {"KeyMarker": ""}):
        assert refusal(**markers, VersionIdMarker="bogus") == (
            "InvalidArgument",
            "Invalid version id specified",
            "version-id-marker",
            "bogus",
        )
    s3.put_object(Bucket=bucket, Key="w", Body=b"1")
    listed = s3.list_object_versions(Bucket=bucket, KeyMarker="", VersionIdMarker="null")
    assert [v["Key"] for v in listed["Versions"]] == ["w"]


def test_presigned_get_and_put(s3: Any, bucket: str) -> None:
    put_url = s3.generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": "p"}, ExpiresIn=60
    )
    request = urllib.request.Request(put_url, data=b"presigned body", method="PUT")
    with urllib.request.urlopen(request) as response:
        assert response.status == 200
    get_url = s3.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "p"}, ExpiresIn=60
    )
    with urllib.request.urlopen(get_url) as response:
        assert response.read() == b"presigned body"


def test_a_presigned_put_cannot_be_turned_into_another_request_by_unsigned_headers(
    s3: Any, bucket: str
) -> None:
    s3.put_object(Bucket=bucket, Key="private", Body=b"confidential")
    url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "upload"})
    added = [
        {"x-amz-copy-source": f"/{bucket}/private"},  # a copy of another object
        {"x-amz-acl": "public-read"},
        {"x-amz-tagging": "owner=mallory"},
        {"x-amz-meta-evil": "1"},
    ]
    for headers in added:
        request = urllib.request.Request(url, data=b"", headers=headers, method="PUT")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request)
        body = refused.value.read().decode()
        refused.value.close()
        assert refused.value.code == 403 and "<Code>AccessDenied</Code>" in body, headers
        assert f"<HeadersNotSigned>{next(iter(headers))}</HeadersNotSigned>" in body
    assert error_code(s3.head_object, Bucket=bucket, Key="upload") == "404"
    # Signed with the URL, the same header is the signer's to give.
    signed = s3.generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": "upload", "ACL": "public-read"}
    )
    request = urllib.request.Request(
        signed, data=b"mine", headers={"x-amz-acl": "public-read"}, method="PUT"
    )
    with urllib.request.urlopen(request) as response:
        assert response.status == 200


def test_buckets(served: Served, s3: Any) -> None:
    name = unique("bk")
    s3.create_bucket(Bucket=name)
    s3.create_bucket(Bucket=name)  # yours already: success, as S3 in us-east-1
    assert name in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    s3.head_bucket(Bucket=name)
    assert s3.get_bucket_location(Bucket=name).get("LocationConstraint") is None
    other = served.client(served.other)
    assert error_code(other.create_bucket, Bucket=name) == "BucketAlreadyExists"
    assert error_code(other.get_object, Bucket=name, Key="k") == "AccessDenied"
    assert name not in [b["Name"] for b in other.list_buckets()["Buckets"]]
    s3.put_object(Bucket=name, Key="k", Body=b"")
    assert error_code(s3.delete_bucket, Bucket=name) == "BucketNotEmpty"
    s3.delete_object(Bucket=name, Key="k")
    s3.delete_bucket(Bucket=name)
    assert error_code(s3.head_bucket, Bucket=name) == "404"
    assert error_code(s3.create_bucket, Bucket="Bad_Name") == "InvalidBucketName"


def test_missing_things(s3: Any, bucket: str) -> None:
    assert error_code(s3.get_object, Bucket=bucket, Key="none") == "NoSuchKey"
    assert error_code(s3.get_object, Bucket=unique("none"), Key="k") == "NoSuchBucket"
    assert error_code(s3.put_object, Bucket=bucket, Key="k" * 1025, Body=b"") == "KeyTooLongError"


def test_bad_content_md5(s3: Any, bucket: str) -> None:
    wrong = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    with pytest.raises(ClientError) as refused:
        s3.put_object(Bucket=bucket, Key="m", Body=b"data", ContentMD5=wrong)
    error = refused.value.response["Error"]
    # The two digests as S3 names them: the expected one in hex, the one received in base64.
    assert (error["Code"], error["ExpectedDigest"], error["CalculatedDigest"]) == (
        "BadDigest",
        hashlib.md5(b"other").hexdigest(),
        base64.b64encode(hashlib.md5(b"data").digest()).decode(),
    )
    assert (
        error_code(s3.put_object, Bucket=bucket, Key="m", Body=b"data", ContentMD5="bm90LW1kNQ==")
        == "InvalidDigest"
    )
    assert error_code(s3.head_object, Bucket=bucket, Key="m") == "404"


def test_streamed_body_from_a_file_object(s3: Any, bucket: str) -> None:
    body = os.urandom(5 * MiB)
    s3.upload_fileobj(
        io.BytesIO(body), bucket, "stream", Config=TransferConfig(multipart_threshold=64 * MiB)
    )
    assert s3.get_object(Bucket=bucket, Key="stream")["Body"].read() == body


def test_presigned_urls_of_a_client_with_default_settings(
    served: Served, s3: Any, bucket: str
) -> None:
    """boto3 with no signature_version signs presigned URLs with SigV2 in us-east-1."""
    import boto3

    default = boto3.client(
        "s3",
        endpoint_url=served.endpoint,
        region_name="us-east-1",
        aws_access_key_id=served.root.access_key_id,
        aws_secret_access_key=served.root.secret_access_key,
    )
    put_url = default.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "v2"})
    assert "Signature=" in put_url and "X-Amz-Signature" not in put_url
    # SigV2 signs Content-Type: send the (empty) one the URL was signed with, as S3 requires.
    upload = urllib.request.Request(
        put_url, data=b"v2 body", method="PUT", headers={"Content-Type": ""}
    )
    with urllib.request.urlopen(upload):
        pass
    get_url = default.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "v2"})
    with urllib.request.urlopen(get_url) as response:
        assert response.read() == b"v2 body"
    tampered = get_url.replace("Signature=", "Signature=A")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(tampered)
    refused.value.close()
    assert refused.value.code == 403


def test_lifecycle_configuration(s3: Any, bucket: str) -> None:
    assert error_code(s3.get_bucket_lifecycle_configuration, Bucket=bucket) == (
        "NoSuchLifecycleConfiguration"
    )
    rules = [
        {
            "ID": "logs",
            "Filter": {"Prefix": "logs/"},
            "Status": "Enabled",
            "Expiration": {"Days": 30},
        },
        {
            "ID": "uploads",
            "Filter": {"Prefix": ""},
            "Status": "Enabled",
            "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 7},
        },
    ]
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": rules})
    got = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    assert [(r["ID"], r["Status"]) for r in got] == [("logs", "Enabled"), ("uploads", "Enabled")]
    assert got[0]["Expiration"] == {"Days": 30} and got[0]["Filter"] == {"Prefix": "logs/"}
    assert got[1]["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 7}
    transition = [
        {
            "ID": "t",
            "Filter": {"Prefix": ""},
            "Status": "Enabled",
            "Transitions": [{"Days": 1, "StorageClass": "GLACIER"}],
        }
    ]
    assert (
        error_code(
            s3.put_bucket_lifecycle_configuration,
            Bucket=bucket,
            LifecycleConfiguration={"Rules": transition},
        )
        == "NotImplemented"
    )
    s3.delete_bucket_lifecycle(Bucket=bucket)
    assert error_code(s3.get_bucket_lifecycle_configuration, Bucket=bucket) == (
        "NoSuchLifecycleConfiguration"
    )


def test_a_lifecycle_rule_put_without_an_id_is_given_one(s3: Any, bucket: str) -> None:
    unnamed = {"Filter": {"Prefix": "tmp/"}, "Status": "Enabled", "Expiration": {"Days": 1}}
    rules = [unnamed, {**unnamed, "ID": "named"}, dict(unnamed)]
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": rules})
    got = [r["ID"] for r in s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]]
    assert got[1] == "named"
    made_up = [got[0], got[2]]
    assert all(len(i) == 48 for i in made_up) and made_up[0] != made_up[1]
    # Put back as read, the IDs stay.
    again = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": again})
    kept = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    assert [r["ID"] for r in kept] == got


def test_a_lifecycle_rule_s_filter_is_answered_in_the_shape_it_was_put_in(
    s3: Any, bucket: str
) -> None:
    tag = {"Key": "temp", "Value": "yes"}
    filters = [
        {"Prefix": "old-style/"},  # the rule's own Prefix, before Filter existed
        {"Filter": {}},
        {"Filter": {"Prefix": ""}},
        {"Filter": {"Prefix": "logs/"}},
        {"Filter": {"Tag": tag}},
        {"Filter": {"And": {"Tags": [tag]}}},
        {"Filter": {"And": {"Prefix": "logs/", "Tags": [tag]}}},
    ]
    rules = [
        {"ID": str(i), "Status": "Enabled", "Expiration": {"Days": 1}, **shape}
        for i, shape in enumerate(filters)
    ]
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": rules})
    got = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    assert [{k: r[k] for k in ("Prefix", "Filter") if k in r} for r in got] == filters


def test_lifecycle_filters_by_tag(s3: Any, bucket: str) -> None:
    tag = {"Key": "temp", "Value": "yes"}
    rules = [
        {"ID": "tag", "Filter": {"Tag": tag}, "Status": "Enabled", "Expiration": {"Days": 1}},
        {
            "ID": "and",
            "Filter": {"And": {"Prefix": "logs/", "Tags": [tag, {"Key": "b", "Value": ""}]}},
            "Status": "Enabled",
            "Expiration": {"Days": 2},
        },
    ]
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": rules})
    got = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    assert got[0]["Filter"] == {"Tag": tag}
    both = got[1]["Filter"]["And"]
    assert both["Prefix"] == "logs/"
    assert sorted(both["Tags"], key=str) == sorted([tag, {"Key": "b", "Value": ""}], key=str)
    abort_with_tags = [
        {
            "ID": "x",
            "Filter": {"Tag": tag},
            "Status": "Enabled",
            "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1},
        }
    ]
    bad_tag = [{**rules[0], "Filter": {"Tag": {"Key": "k", "Value": "v" * 257}}}]
    for refused, code in ((abort_with_tags, "InvalidRequest"), (bad_tag, "InvalidTag")):
        assert (
            error_code(
                s3.put_bucket_lifecycle_configuration,
                Bucket=bucket,
                LifecycleConfiguration={"Rules": refused},
            )
            == code
        )
