"""Names are exact: keys with leading, trailing and only spaces through every operation that
names a key; `x-amz-copy-source` decoded as S3 does; virtual-hosted style under the longest
domain; an empty delimiter left out; ListBuckets paged. boto3 against `shoal serve`, with raw
signed requests where boto3 cannot send the case."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.e2e.conftest import complete_upload
from tests.fixtures.postgres import unique
from tests.fixtures.serve import Served, raw_request

# Each has a twin without its spaces ("b" for "b "), which must never be touched in its stead.
SPACED = [" ", "   ", "  a", "b ", "_ ", " c d "]
TWINS = ["a", "b", "_", "c d"]


def names(listed: dict[str, Any]) -> list[str]:
    return [o["Key"] for o in listed.get("Contents", [])]


def put_all(s3: Any, bucket: str, keys: list[str]) -> None:
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=f"<{key}>".encode())


def body_of(s3: Any, bucket: str, key: str) -> bytes:
    return bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def test_spaced_keys_put_get_head_and_delete_exactly(s3: Any, bucket: str) -> None:
    put_all(s3, bucket, SPACED + TWINS)
    for key in SPACED:
        assert body_of(s3, bucket, key) == f"<{key}>".encode()
        assert s3.head_object(Bucket=bucket, Key=key)["ContentLength"] == len(key) + 2
    assert names(s3.list_objects_v2(Bucket=bucket)) == sorted(SPACED + TWINS)
    for key in SPACED:
        s3.delete_object(Bucket=bucket, Key=key)
    assert names(s3.list_objects_v2(Bucket=bucket)) == sorted(TWINS)


@pytest.mark.parametrize("quiet", [False, True], ids=["verbose", "quiet"])
def test_delete_objects_deletes_the_keys_named_not_their_stripped_twins(
    s3: Any, bucket: str, quiet: bool
) -> None:
    put_all(s3, bucket, SPACED + TWINS)
    answer = s3.delete_objects(
        Bucket=bucket, Delete={"Objects": [{"Key": k} for k in SPACED], "Quiet": quiet}
    )
    assert answer.get("Errors", []) == []
    reported = sorted(d["Key"] for d in answer.get("Deleted", []))
    assert reported == ([] if quiet else sorted(SPACED))
    assert names(s3.list_objects_v2(Bucket=bucket)) == sorted(TWINS)


def test_delete_objects_with_pretty_printed_xml_keeps_key_text(
    served: Served, s3: Any, bucket: str
) -> None:
    put_all(s3, bucket, ["b ", "b"])
    body = (
        b"<Delete>\n  <Quiet>\n    false\n  </Quiet>\n"
        b"  <Object>\n    <Key>b </Key>\n  </Object>\n</Delete>\n"
    )
    response = raw_request(
        served, "POST", f"/{bucket}?delete", body, headers={"x-amz-checksum-sha256": sha(body)}
    )
    assert response.status == 200, response.body
    assert b"<Deleted><Key>b </Key></Deleted>" in response.body
    assert names(s3.list_objects_v2(Bucket=bucket)) == ["b"]


def test_delete_objects_with_a_quiet_neither_true_nor_false_deletes_nothing(
    served: Served, s3: Any, bucket: str
) -> None:
    put_all(s3, bucket, ["b"])
    body = b"<Delete><Quiet>maybe</Quiet><Object><Key>b</Key></Object></Delete>"
    response = raw_request(
        served, "POST", f"/{bucket}?delete", body, headers={"x-amz-checksum-sha256": sha(body)}
    )
    assert response.status == 400 and b"<Code>MalformedXML</Code>" in response.body
    assert names(s3.list_objects_v2(Bucket=bucket)) == ["b"]


def sha(body: bytes) -> str:
    return base64.b64encode(hashlib.sha256(body).digest()).decode()


def test_copy_object_with_spaced_keys_as_source_and_target(s3: Any, bucket: str) -> None:
    put_all(s3, bucket, [" ", "b "])
    s3.copy_object(Bucket=bucket, Key="  a", CopySource={"Bucket": bucket, "Key": " "})
    s3.copy_object(Bucket=bucket, Key="   ", CopySource={"Bucket": bucket, "Key": "b "})
    assert body_of(s3, bucket, "  a") == b"< >"
    assert body_of(s3, bucket, "   ") == b"<b >"
    assert names(s3.list_objects_v2(Bucket=bucket)) == sorted([" ", "   ", "  a", "b "])


def test_multipart_upload_of_spaced_keys(s3: Any, bucket: str) -> None:
    uploads = {k: s3.create_multipart_upload(Bucket=bucket, Key=k)["UploadId"] for k in SPACED}
    listed = s3.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert sorted(u["Key"] for u in listed) == sorted(SPACED)
    after_space = s3.list_multipart_uploads(Bucket=bucket, KeyMarker=" ")["Uploads"]
    assert sorted(u["Key"] for u in after_space) == sorted(k for k in SPACED if k > " ")
    for key in ("_ ", "   "):
        part = s3.upload_part(
            Bucket=bucket, Key=key, UploadId=uploads[key], PartNumber=1, Body=key.encode()
        )
        parts = s3.list_parts(Bucket=bucket, Key=key, UploadId=uploads[key])
        assert parts["Key"] == key and len(parts["Parts"]) == 1
        complete_upload(s3, bucket, key, uploads[key], [part["ETag"]])
        assert body_of(s3, bucket, key) == key.encode()
    s3.abort_multipart_upload(Bucket=bucket, Key="b ", UploadId=uploads["b "])
    left = s3.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert sorted(u["Key"] for u in left) == sorted(set(SPACED) - {"_ ", "   ", "b "})
    assert names(s3.list_objects_v2(Bucket=bucket)) == ["   ", "_ "]


def test_listing_with_spaced_start_after_marker_and_prefix(s3: Any, bucket: str) -> None:
    everything = sorted(SPACED + TWINS)
    put_all(s3, bucket, SPACED + TWINS)
    for marker in (" ", "  a", "b", "b "):
        later = [k for k in everything if k > marker]
        assert names(s3.list_objects_v2(Bucket=bucket, StartAfter=marker)) == later
        assert names(s3.list_objects(Bucket=bucket, Marker=marker)) == later
    for prefix in (" ", "  ", "b ", " c d "):
        starting = [k for k in everything if k.startswith(prefix)]
        listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix)
        assert (listed["Prefix"], names(listed)) == (prefix, starting)
    paged = s3.get_paginator("list_objects").paginate(
        Bucket=bucket, PaginationConfig={"PageSize": 2}
    )
    assert [k for page in paged for k in names(page)] == everything


def test_copy_source_plus_is_a_space_and_percent_2b_a_plus(
    served: Served, s3: Any, bucket: str
) -> None:
    put_all(s3, bucket, ["a b", "a+b", " x "])
    cases = [("a+b", "a b"), ("a%2Bb", "a+b"), ("+x+", " x "), ("a%20b", "a b")]
    for sent, source in cases:
        target = unique("copy")
        response = raw_request(
            served,
            "PUT",
            f"/{bucket}/{target}",
            headers={"x-amz-copy-source": f"/{bucket}/{sent}"},
        )
        assert response.status == 200, (sent, response.body)
        assert body_of(s3, bucket, target) == f"<{source}>".encode()


def test_virtual_hosted_style_takes_the_longest_domain(
    served: Served, s3: Any, bucket: str
) -> None:
    s3.put_object(Bucket=bucket, Key="k y", Body=b"found")
    for domain in ("s3.localhost", "localhost"):
        host = f"{bucket}.{domain}:{served.port}"
        response = raw_request(served, "GET", "/k%20y", host=host)
        assert (response.status, response.body) == (200, b"found"), domain
    # The domain itself is path style, not a bucket `s3` under `localhost`.
    response = raw_request(served, "GET", f"/{bucket}/k%20y", host=f"s3.localhost:{served.port}")
    assert (response.status, response.body) == (200, b"found")


def test_an_empty_delimiter_is_left_out_of_the_listing(served: Served, bucket: str) -> None:
    for query in ("delimiter=", "list-type=2&delimiter=", "versions&delimiter="):
        response = raw_request(served, "GET", f"/{bucket}?{query}")
        assert response.status == 200 and b"Delimiter" not in response.body, query
    response = raw_request(served, "GET", f"/{bucket}?list-type=2&delimiter=%2F")
    assert b"<Delimiter>/</Delimiter>" in response.body


def test_list_buckets_pages_by_max_buckets_and_continuation_token(s3: Any) -> None:
    prefix = unique("lb")
    made = sorted(f"{prefix}-{n}" for n in range(5))
    for name in made:
        s3.create_bucket(Bucket=name)
    first = s3.list_buckets(Prefix=prefix, MaxBuckets=2)
    assert [b["Name"] for b in first["Buckets"]] == made[:2]
    assert first["Prefix"] == prefix and "ContinuationToken" in first
    assert {b["BucketRegion"] for b in first["Buckets"]} == {s3.meta.region_name}
    second = s3.list_buckets(
        Prefix=prefix, MaxBuckets=3, ContinuationToken=first["ContinuationToken"]
    )
    assert [b["Name"] for b in second["Buckets"]] == made[2:]
    assert "ContinuationToken" not in second  # the last page, exactly full
    pages = s3.get_paginator("list_buckets").paginate(
        Prefix=prefix, PaginationConfig={"PageSize": 2}
    )
    assert [[b["Name"] for b in p["Buckets"]] for p in pages] == [made[:2], made[2:4], made[4:]]
    here = s3.list_buckets(Prefix=prefix, BucketRegion=s3.meta.region_name)["Buckets"]
    assert [b["Name"] for b in here] == made
    assert s3.list_buckets(Prefix=prefix, BucketRegion="xx-nowhere-1")["Buckets"] == []
    everyone = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert set(made) <= set(everyone)


@pytest.mark.parametrize(
    "query",
    [
        "max-buckets=0",
        "max-buckets=10001",
        "max-buckets=x",
        pytest.param("max-buckets=" + "9" * 5000, id="max-buckets=9x5000"),
        "continuation-token=_w%3D%3D",  # not UTF-8,
    ],
)
def test_list_buckets_refuses_bad_paging(served: Served, query: str) -> None:
    response = raw_request(served, "GET", f"/?{query}")
    assert response.status == 400 and b"<Code>InvalidArgument</Code>" in response.body


def test_lifecycle_prefix_is_kept_exactly(s3: Any, bucket: str) -> None:
    rule = {
        "ID": "r",
        "Status": "Enabled",
        "Filter": {"Prefix": " logs/ "},
        "Expiration": {"Days": 3},
    }
    s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [rule]})
    got = s3.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"]
    assert got[0]["Filter"] == {"Prefix": " logs/ "}


def test_a_spaced_key_not_there_is_no_such_key(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="b", Body=b"x")
    with pytest.raises(ClientError) as raised:
        s3.get_object(Bucket=bucket, Key="b ")
    assert raised.value.response["Error"]["Code"] == "NoSuchKey"
