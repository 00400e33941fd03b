"""S3 checksums: the catalogue check values of each algorithm, in S3's base64 form."""

import base64
import hashlib

import pytest

from shoal.storage.checksums import (
    FULL_OBJECT_CHECKSUMS,
    S3_CHECKSUMS,
    Digests,
    composite_checksum,
    full_object_crc,
)

CHECK = b"123456789"  # the CRC catalogue's check input


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("crc32", bytes.fromhex("cbf43926")),
        ("crc32c", bytes.fromhex("e3069283")),
        ("crc64nvme", bytes.fromhex("ae8b14860a799888")),
        ("sha1", hashlib.sha1(CHECK).digest()),
        ("sha256", hashlib.sha256(CHECK).digest()),
    ],
)
def test_check_values(name: str, raw: bytes) -> None:
    digests = Digests([name])
    digests.update(CHECK[:4])
    digests.update(CHECK[4:])
    assert digests.s3_values() == {name: base64.b64encode(raw).decode()}
    assert digests.md5 == hashlib.md5(CHECK).digest()


def test_unknown_algorithms_are_refused() -> None:
    with pytest.raises(ValueError, match="crc16"):
        Digests(["crc16"])
    assert set(Digests(S3_CHECKSUMS).s3_values()) == set(S3_CHECKSUMS)


def _value(name: str, data: bytes) -> str:
    digests = Digests([name])
    digests.update(data)
    return digests.s3_values()[name]


@pytest.mark.parametrize("name", FULL_OBJECT_CHECKSUMS)
def test_part_crcs_combine_into_the_crc_of_all_the_bytes(name: str) -> None:
    pieces = [b"", b"first piece", bytes(range(256)) * 40, b"x"]
    parts = [(_value(name, piece), len(piece)) for piece in pieces]
    assert full_object_crc(name, parts) == _value(name, b"".join(pieces))


@pytest.mark.parametrize("name", S3_CHECKSUMS)
def test_composite_is_the_checksum_of_the_part_checksums(name: str) -> None:
    pieces = [b"one", b"two", b"three"]
    binary = b"".join(base64.b64decode(_value(name, p)) for p in pieces)
    expected = f"{_value(name, binary)}-3"
    assert composite_checksum(name, [_value(name, p) for p in pieces]) == expected
