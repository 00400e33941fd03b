"""GET and HEAD of one part (?partNumber=), and the checksums of multipart uploads: chosen at
CreateMultipartUpload, verified at Complete, returned by Complete, HEAD, GET and ListParts."""

from __future__ import annotations

import base64
import hashlib
import os
import zlib
from pathlib import Path
from typing import Any

import pytest
from awscrt import checksums as crt
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from tests.e2e.test_awscli_and_pyarrow import aws
from tests.fixtures.serve import Served, raw_request

MIB = 1024 * 1024


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def crc32(data: bytes) -> str:
    return b64(zlib.crc32(data).to_bytes(4, "big"))


def sha256(data: bytes) -> str:
    return b64(hashlib.sha256(data).digest())


def error_of(call: Any, **kwargs: Any) -> tuple[int, str]:
    with pytest.raises(ClientError) as caught:
        call(**kwargs)
    response = caught.value.response
    return response["ResponseMetadata"]["HTTPStatusCode"], response["Error"]["Code"]


def upload_in_parts(s3: Any, bucket: str, key: str, parts: list[bytes], **create: Any) -> str:
    """A multipart upload of these parts, completed; returns the Complete's ChecksumX."""
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key, **create)["UploadId"]
    algorithm = create.get("ChecksumAlgorithm")
    chosen = []
    for number, body in enumerate(parts, start=1):
        extra = {"ChecksumAlgorithm": algorithm} if algorithm else {}
        etag = s3.upload_part(
            Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=body, **extra
        )
        chosen.append({"PartNumber": number, "ETag": etag["ETag"]})
        if algorithm:
            field = f"Checksum{algorithm}"
            chosen[-1][field] = etag[field]
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": chosen}
    )
    return done.get(f"Checksum{algorithm}", "") if algorithm else ""


def test_get_and_head_of_one_part(s3: Any, bucket: str) -> None:
    parts = [os.urandom(5 * MIB), os.urandom(5 * MIB), b"tail"]
    upload_in_parts(s3, bucket, "mp", parts)
    offset = 0
    for number, body in enumerate(parts, start=1):
        got = s3.get_object(Bucket=bucket, Key="mp", PartNumber=number)
        assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
        assert got["Body"].read() == body
        assert got["PartsCount"] == 3
        assert got["ContentRange"] == f"bytes {offset}-{offset + len(body) - 1}/{10 * MIB + 4}"
        head = s3.head_object(Bucket=bucket, Key="mp", PartNumber=number)
        assert head["ContentLength"] == len(body) and head["PartsCount"] == 3
        offset += len(body)
    assert error_of(s3.get_object, Bucket=bucket, Key="mp", PartNumber=4) == (
        416,
        "InvalidPartNumber",
    )
    assert error_of(s3.head_object, Bucket=bucket, Key="mp", PartNumber=4)[0] == 416
    assert error_of(s3.get_object, Bucket=bucket, Key="mp", PartNumber=0)[1] == "InvalidArgument"
    assert error_of(s3.get_object, Bucket=bucket, Key="mp", PartNumber=1, Range="bytes=0-1") == (
        400,
        "InvalidRequest",
    )
    # The parts count comes only with a part.
    assert "PartsCount" not in s3.head_object(Bucket=bucket, Key="mp")


def test_a_part_is_found_by_its_number_when_the_numbers_have_gaps(s3: Any, bucket: str) -> None:
    upload = s3.create_multipart_upload(Bucket=bucket, Key="gaps")["UploadId"]
    bodies = {2: os.urandom(5 * MIB), 5: b"the last part"}
    chosen = [
        {
            "PartNumber": n,
            "ETag": s3.upload_part(
                Bucket=bucket, Key="gaps", UploadId=upload, PartNumber=n, Body=body
            )["ETag"],
        }
        for n, body in bodies.items()
    ]
    s3.complete_multipart_upload(
        Bucket=bucket, Key="gaps", UploadId=upload, MultipartUpload={"Parts": chosen}
    )
    got = s3.get_object(Bucket=bucket, Key="gaps", PartNumber=5)
    assert got["Body"].read() == bodies[5] and got["PartsCount"] == 2
    assert got["ContentRange"] == f"bytes {5 * MIB}-{5 * MIB + len(bodies[5]) - 1}/{5 * MIB + 13}"
    assert s3.head_object(Bucket=bucket, Key="gaps", PartNumber=2)["ContentLength"] == 5 * MIB
    for missing in (1, 3, 6):
        assert error_of(s3.head_object, Bucket=bucket, Key="gaps", PartNumber=missing)[0] == 416


def test_part_one_of_a_single_part_object_is_all_of_it(s3: Any, bucket: str) -> None:
    for key, body in [("small", b"tiny body"), ("large", os.urandom(2 * MIB))]:
        s3.put_object(Bucket=bucket, Key=key, Body=body)
        got = s3.get_object(Bucket=bucket, Key=key, PartNumber=1)
        assert got["Body"].read() == body
        assert "PartsCount" not in got  # as in S3: a parts count is a multipart object's
        assert got["ContentRange"] == f"bytes 0-{len(body) - 1}/{len(body)}"
        assert "PartsCount" not in s3.get_object(Bucket=bucket, Key=key)
        assert error_of(s3.get_object, Bucket=bucket, Key=key, PartNumber=2) == (
            416,
            "InvalidPartNumber",
        )


def test_composite_checksum_stored_verified_and_returned(s3: Any, bucket: str) -> None:
    parts = [os.urandom(5 * MIB), b"last part"]
    composite = sha256(b"".join(hashlib.sha256(p).digest() for p in parts)) + "-2"
    assert upload_in_parts(s3, bucket, "sha", parts, ChecksumAlgorithm="SHA256") == composite
    head = s3.head_object(Bucket=bucket, Key="sha", ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == composite and head["ChecksumType"] == "COMPOSITE"
    got = s3.get_object(Bucket=bucket, Key="sha", ChecksumMode="ENABLED")
    assert got["ChecksumSHA256"] == composite
    assert got["Body"].read() == b"".join(parts)
    part = s3.get_object(Bucket=bucket, Key="sha", PartNumber=2, ChecksumMode="ENABLED")
    assert part["ChecksumSHA256"] == sha256(parts[1])
    assert "ChecksumSHA256" not in s3.head_object(Bucket=bucket, Key="sha")


def test_list_parts_and_wrong_checksums_at_complete(s3: Any, bucket: str) -> None:
    upload = s3.create_multipart_upload(Bucket=bucket, Key="k", ChecksumAlgorithm="CRC32")
    assert upload["ChecksumAlgorithm"] == "CRC32"
    uid = upload["UploadId"]
    body = b"only part"
    part = s3.upload_part(
        Bucket=bucket, Key="k", UploadId=uid, PartNumber=1, Body=body, ChecksumAlgorithm="CRC32"
    )
    listed = s3.list_parts(Bucket=bucket, Key="k", UploadId=uid)
    assert listed["Parts"][0]["ChecksumCRC32"] == crc32(body)
    assert listed["ChecksumAlgorithm"] == "CRC32"

    def complete(**part_fields: str) -> Any:
        chosen = {"PartNumber": 1, "ETag": part["ETag"], **part_fields}
        return s3.complete_multipart_upload(
            Bucket=bucket, Key="k", UploadId=uid, MultipartUpload={"Parts": [chosen]}
        )

    assert error_of(complete) == (400, "InvalidRequest")  # composite: each part's is needed
    assert error_of(complete, ChecksumCRC32=crc32(b"other")) == (400, "BadDigest")
    assert error_of(complete, ETag='"' + "0" * 32 + '"') == (400, "InvalidPart")
    assert complete(ChecksumCRC32=crc32(body))["ChecksumCRC32"] == crc32(crc32_raw(body)) + "-1"


def test_upload_part_copy_stores_the_uploads_checksum(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="source", Body=b"copied bytes")
    uid = s3.create_multipart_upload(Bucket=bucket, Key="k", ChecksumAlgorithm="SHA1")["UploadId"]
    copied = s3.upload_part_copy(
        Bucket=bucket, Key="k", UploadId=uid, PartNumber=1, CopySource=f"{bucket}/source"
    )
    sha1 = b64(hashlib.sha1(b"copied bytes").digest())
    assert copied["CopyPartResult"]["ChecksumSHA1"] == sha1
    listed = s3.list_parts(Bucket=bucket, Key="k", UploadId=uid)
    assert listed["Parts"][0]["ChecksumSHA1"] == sha1 and listed["ChecksumType"] == "COMPOSITE"
    (upload,) = s3.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert (upload["ChecksumAlgorithm"], upload["ChecksumType"]) == ("SHA1", "COMPOSITE")


def crc32_raw(data: bytes) -> bytes:
    return zlib.crc32(data).to_bytes(4, "big")


@pytest.mark.parametrize(
    ("algorithm", "compute"),
    [
        ("CRC32", lambda data: zlib.crc32(data).to_bytes(4, "big")),
        ("CRC32C", lambda data: crt.crc32c(data).to_bytes(4, "big")),
        ("CRC64NVME", lambda data: crt.crc64nvme(data).to_bytes(8, "big")),
    ],
)
def test_full_object_crc_of_parts(s3: Any, bucket: str, algorithm: str, compute: Any) -> None:
    parts = [os.urandom(5 * MIB), os.urandom(5 * MIB), os.urandom(1000)]
    whole = b64(compute(b"".join(parts)))
    create = {"ChecksumAlgorithm": algorithm, "ChecksumType": "FULL_OBJECT"}
    assert upload_in_parts(s3, bucket, "full", parts, **create) == whole
    head = s3.head_object(Bucket=bucket, Key="full", ChecksumMode="ENABLED")
    assert head[f"Checksum{algorithm}"] == whole and head["ChecksumType"] == "FULL_OBJECT"
    # boto3 checks a full-object checksum against the body it reads.
    got = s3.get_object(Bucket=bucket, Key="full", ChecksumMode="ENABLED")
    assert got["Body"].read() == b"".join(parts)


def test_wrong_full_object_checksum_and_bad_types(s3: Any, bucket: str) -> None:
    assert error_of(
        s3.create_multipart_upload,
        Bucket=bucket,
        Key="x",
        ChecksumAlgorithm="SHA256",
        ChecksumType="FULL_OBJECT",
    ) == (400, "InvalidRequest")
    assert error_of(
        s3.create_multipart_upload,
        Bucket=bucket,
        Key="x",
        ChecksumAlgorithm="CRC64NVME",
        ChecksumType="COMPOSITE",
    ) == (400, "InvalidRequest")
    create = {"ChecksumAlgorithm": "CRC32C", "ChecksumType": "FULL_OBJECT"}
    uid = s3.create_multipart_upload(Bucket=bucket, Key="x", **create)["UploadId"]
    upload = {"Bucket": bucket, "Key": "x", "UploadId": uid, "PartNumber": 1, "Body": b"data"}
    # A part's checksum is of the upload's algorithm, as in S3 (boto3 sends CRC32 unasked).
    assert error_of(s3.upload_part, **upload) == (400, "InvalidRequest")
    part = s3.upload_part(**upload, ChecksumAlgorithm="CRC32C")
    chosen = {"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]}
    wrong = b64(crt.crc32c(b"not it").to_bytes(4, "big"))
    assert error_of(
        s3.complete_multipart_upload,
        Bucket=bucket,
        Key="x",
        UploadId=uid,
        MultipartUpload=chosen,
        ChecksumCRC32C=wrong,
        ChecksumType="FULL_OBJECT",
    ) == (400, "BadDigest")
    right = b64(crt.crc32c(b"data").to_bytes(4, "big"))
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key="x", UploadId=uid, MultipartUpload=chosen, ChecksumCRC32C=right
    )
    assert done["ChecksumCRC32C"] == right


def test_transfer_manager_default_crc32_comes_back(s3: Any, bucket: str) -> None:
    body = os.urandom(12 * MIB)
    config = TransferConfig(multipart_threshold=5 * MIB, multipart_chunksize=5 * MIB)
    s3.upload_fileobj(_Readable(body), bucket, "tm", Config=config)
    head = s3.head_object(Bucket=bucket, Key="tm", ChecksumMode="ENABLED")
    sizes = [5 * MIB, 5 * MIB, 2 * MIB]
    pieces = [body[sum(sizes[:i]) : sum(sizes[: i + 1])] for i in range(3)]
    assert head["ChecksumCRC32"] == crc32(b"".join(crc32_raw(p) for p in pieces)) + "-3"


class _Readable:
    def __init__(self, data: bytes) -> None:
        self._data, self._at = data, 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size < 0 else self._at + size
        chunk, self._at = self._data[self._at : end], min(end, len(self._data))
        return chunk


@pytest.mark.slow
def test_aws_cli_cp_with_sha256_checksum(
    served: Served, s3: Any, bucket: str, tmp_path: Path
) -> None:
    source = tmp_path / "big"
    source.write_bytes(os.urandom(24 * MIB))
    target = f"s3://{bucket}/big"
    # The cli's default parts are 8 MiB.
    aws(served, "s3", "cp", "--checksum-algorithm", "SHA256", str(source), target)
    head = s3.head_object(Bucket=bucket, Key="big", ChecksumMode="ENABLED")
    data = source.read_bytes()
    pieces = [data[i : i + 8 * MIB] for i in range(0, len(data), 8 * MIB)]
    composite = sha256(b"".join(hashlib.sha256(p).digest() for p in pieces)) + f"-{len(pieces)}"
    assert head["ChecksumSHA256"] == composite
    back = tmp_path / "back"
    aws(served, "s3", "cp", target, str(back))
    assert back.read_bytes() == data


def test_get_object_attributes(s3: Any, bucket: str) -> None:
    parts = [os.urandom(5 * MIB), os.urandom(5 * MIB), b"end"]
    composite = upload_in_parts(s3, bucket, "mp", parts, ChecksumAlgorithm="SHA256")
    everything = ["ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize"]
    got = s3.get_object_attributes(Bucket=bucket, Key="mp", ObjectAttributes=everything, MaxParts=2)
    assert got["ETag"] == s3.head_object(Bucket=bucket, Key="mp")["ETag"].strip('"')
    # Without the "-3" that HeadObject gives, as S3 answers it.
    value, _, count = composite.rpartition("-")
    assert count == "3"
    assert got["Checksum"] == {"ChecksumSHA256": value, "ChecksumType": "COMPOSITE"}
    assert got["StorageClass"] == "STANDARD" and got["ObjectSize"] == 10 * MIB + 3
    page = got["ObjectParts"]
    assert page["TotalPartsCount"] == 3 and page["IsTruncated"]
    assert [(p["PartNumber"], p["Size"]) for p in page["Parts"]] == [(1, 5 * MIB), (2, 5 * MIB)]
    assert page["Parts"][0]["ChecksumSHA256"] == sha256(parts[0])
    rest = s3.get_object_attributes(
        Bucket=bucket,
        Key="mp",
        ObjectAttributes=["ObjectParts"],
        PartNumberMarker=page["NextPartNumberMarker"],
    )
    assert [p["PartNumber"] for p in rest["ObjectParts"]["Parts"]] == [3]
    assert not rest["ObjectParts"]["IsTruncated"] and "ETag" not in rest
    empty = s3.get_object_attributes(
        Bucket=bucket, Key="mp", ObjectAttributes=["ObjectParts"], MaxParts=0, PartNumberMarker=1
    )["ObjectParts"]
    assert empty["IsTruncated"] and empty["NextPartNumberMarker"] == 1  # where to go on from

    s3.put_object(Bucket=bucket, Key="one", Body=b"single", ChecksumAlgorithm="CRC32")
    single = s3.get_object_attributes(Bucket=bucket, Key="one", ObjectAttributes=everything)
    assert single["Checksum"] == {"ChecksumCRC32": crc32(b"single"), "ChecksumType": "FULL_OBJECT"}
    assert "ObjectParts" not in single and single["ObjectSize"] == 6
    assert error_of(
        s3.get_object_attributes, Bucket=bucket, Key="one", ObjectAttributes=["Colour"]
    ) == (400, "InvalidArgument")
    assert error_of(
        s3.get_object_attributes, Bucket=bucket, Key="none", ObjectAttributes=["ETag"]
    ) == (404, "NoSuchKey")


def test_a_request_names_one_well_formed_checksum_as_s3_checks_it(
    served: Served, s3: Any, bucket: str
) -> None:
    body = b"hello"
    sha1 = b64(hashlib.sha1(body).digest())
    refused = [
        ({"x-amz-checksum-crc32": crc32(body), "x-amz-checksum-sha1": sha1}, "Expecting a single"),
        (
            {"x-amz-sdk-checksum-algorithm": "SHA256", "x-amz-checksum-crc32": crc32(body)},
            "Value for x-amz-sdk-checksum-algorithm header is invalid.",
        ),
        ({"x-amz-sdk-checksum-algorithm": "MD4"}, "x-amz-sdk-checksum-algorithm"),
        ({"x-amz-checksum-sha256a": "x"}, "The algorithm type you specified"),
        ({"x-amz-checksum-crc32": ""}, "Value for x-amz-checksum-crc32 header is invalid."),
        ({"x-amz-checksum-crc32": "not base64!"}, "x-amz-checksum-crc32 header is invalid"),
        ({"x-amz-checksum-crc32": "AAAA"}, "x-amz-checksum-crc32 header is invalid"),
        ({"x-amz-checksum-sha1": crc32(body)}, "x-amz-checksum-sha1 header is invalid"),
    ]
    for headers, message in refused:
        answer = raw_request(served, "PUT", f"/{bucket}/one", body, headers=headers)
        assert answer.status == 400 and b"<Code>InvalidRequest</Code>" in answer.body, headers
        assert message.encode() in answer.body, (headers, answer.body)
    assert error_of(s3.head_object, Bucket=bucket, Key="one") == (404, "404")  # none stored
    agreeing = {"x-amz-sdk-checksum-algorithm": "crc32", "x-amz-checksum-crc32": crc32(body)}
    stored = raw_request(served, "PUT", f"/{bucket}/one", body, headers=agreeing)
    assert stored.status == 200, stored.body
    head = s3.head_object(Bucket=bucket, Key="one", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32"] == crc32(body) and "ChecksumSHA1" not in head


def test_a_part_s_checksum_is_of_its_upload_s_algorithm(s3: Any, bucket: str) -> None:
    sha1 = s3.create_multipart_upload(Bucket=bucket, Key="p", ChecksumAlgorithm="SHA1")
    part = {"Bucket": bucket, "Key": "p", "PartNumber": 1, "Body": b"x" * 100}
    mismatch = s3.upload_part
    with pytest.raises(ClientError) as refused:
        mismatch(**part, UploadId=sha1["UploadId"], ChecksumAlgorithm="CRC32")
    error = refused.value.response["Error"]
    assert error["Code"] == "InvalidRequest"
    assert error["Message"] == (
        "Checksum Type mismatch occurred, expected checksum Type: sha1, actual checksum Type: crc32"
    )
    kept = s3.upload_part(**part, UploadId=sha1["UploadId"], ChecksumAlgorithm="SHA1")
    assert kept["ChecksumSHA1"] == b64(hashlib.sha1(b"x" * 100).digest())
    # An upload created without an algorithm keeps whichever checksum a part sends (the SDKs
    # send CRC32 unasked): Shoal's choice, documented in docs/s3.md.
    plain = s3.create_multipart_upload(Bucket=bucket, Key="p")
    sent = s3.upload_part(**part, UploadId=plain["UploadId"], ChecksumAlgorithm="CRC32")
    assert sent["ChecksumCRC32"] == crc32(b"x" * 100)
    for upload in (sha1, plain):
        s3.abort_multipart_upload(Bucket=bucket, Key="p", UploadId=upload["UploadId"])


def test_a_copy_takes_the_checksum_algorithm_it_asks_for(
    served: Served, s3: Any, bucket: str
) -> None:
    body = os.urandom(3000)
    put = s3.put_object(Bucket=bucket, Key="src", Body=body, ChecksumAlgorithm="SHA256")
    assert put["ChecksumSHA256"] == sha256(body) and put["ChecksumType"] == "FULL_OBJECT"
    source = {"Bucket": bucket, "Key": "src"}
    kept = s3.copy_object(Bucket=bucket, Key="same", CopySource=source)["CopyObjectResult"]
    assert kept["ChecksumSHA256"] == sha256(body) and kept["ChecksumType"] == "FULL_OBJECT"
    copied = s3.copy_object(Bucket=bucket, Key="c", CopySource=source, ChecksumAlgorithm="CRC32C")
    crc32c = b64(crt.crc32c(body).to_bytes(4, "big"))
    assert copied["CopyObjectResult"]["ChecksumCRC32C"] == crc32c
    head = s3.head_object(Bucket=bucket, Key="c", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32C"] == crc32c and "ChecksumSHA256" not in head
    # In place, a new algorithm is the change a copy onto itself needs.
    s3.copy_object(Bucket=bucket, Key="src", CopySource=source, ChecksumAlgorithm="CRC64NVME")
    head = s3.head_object(Bucket=bucket, Key="src", ChecksumMode="ENABLED")
    assert "ChecksumCRC64NVME" in head and "ChecksumSHA256" not in head
    headers = {"x-amz-copy-source": f"/{bucket}/src", "x-amz-checksum-algorithm": "BOGUS"}
    refused = raw_request(served, "PUT", f"/{bucket}/bogus", headers=headers)
    assert refused.status == 400 and b"<Code>InvalidRequest</Code>" in refused.body
    assert error_of(s3.head_object, Bucket=bucket, Key="bogus") == (404, "404")
