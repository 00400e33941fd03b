"""S3 checksums: the catalogue check values of each algorithm, in S3's base64 form."""

import base64
import hashlib

import pytest

from shoal.storage.checksums import S3_CHECKSUMS, Digests

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
