"""The digests a write computes on the way: MD5 (the ETag) and S3's additional checksums."""

from __future__ import annotations

import base64
import hashlib
import zlib
from collections.abc import Iterable

from awscrt import checksums as crt

S3_CHECKSUMS = ("crc32", "crc32c", "crc64nvme", "sha1", "sha256")
# Each checksum's size in bytes: its S3 value is the base64 of that many.
CHECKSUM_BYTES = {"crc32": 4, "crc32c": 4, "crc64nvme": 8, "sha1": 20, "sha256": 32}


class Digests:
    """Running MD5 plus any of CRC32, CRC32C, CRC64NVME, SHA1, SHA256 over one stream."""

    def __init__(self, checksums: Iterable[str] = S3_CHECKSUMS) -> None:
        wanted = list(checksums)
        unknown = set(wanted) - set(S3_CHECKSUMS)
        if unknown:
            raise ValueError(f"unknown checksum(s): {', '.join(sorted(unknown))}")
        self._md5 = hashlib.md5(usedforsecurity=False)
        self._hashes = {name: hashlib.new(name) for name in wanted if name.startswith("sha")}
        self._crcs = {name: 0 for name in wanted if name.startswith("crc")}

    def update(self, data: bytes) -> None:
        self._md5.update(data)
        for digest in self._hashes.values():
            digest.update(data)
        if "crc32" in self._crcs:
            self._crcs["crc32"] = zlib.crc32(data, self._crcs["crc32"])
        if "crc32c" in self._crcs:
            self._crcs["crc32c"] = crt.crc32c(data, self._crcs["crc32c"])
        if "crc64nvme" in self._crcs:
            self._crcs["crc64nvme"] = crt.crc64nvme(data, self._crcs["crc64nvme"])

    @property
    def md5(self) -> bytes:
        return self._md5.digest()

    def s3_values(self) -> dict[str, str]:
        """Each checksum as S3 shows it (x-amz-checksum-*): base64 of the big-endian bytes."""
        values = {name: d.digest() for name, d in self._hashes.items()}
        values |= {
            name: crc.to_bytes(CHECKSUM_BYTES[name], "big") for name, crc in self._crcs.items()
        }
        return {name: base64.b64encode(raw).decode() for name, raw in sorted(values.items())}


def is_s3_value(name: str, value: str) -> bool:
    """Whether `value` could be checksum `name` as S3 shows it: base64 of its size in bytes."""
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except ValueError:
        return False
    return len(raw) == CHECKSUM_BYTES[name]


# CRCs of two adjacent pieces combine into the CRC of both without rereading the bytes.
_COMBINE = {
    "crc32": crt.combine_crc32,
    "crc32c": crt.combine_crc32c,
    "crc64nvme": crt.combine_crc64nvme,
}
FULL_OBJECT_CHECKSUMS = tuple(_COMBINE)


def composite_checksum(name: str, part_values: list[str]) -> str:
    """S3's composite checksum of a multipart object: the checksum of the parts' binary
    checksums one after another, then `-N` for N parts (values in S3 form, base64)."""
    digests = Digests([name])
    for value in part_values:
        digests.update(base64.b64decode(value))
    return f"{digests.s3_values()[name]}-{len(part_values)}"


def full_object_crc(name: str, parts: list[tuple[str, int]]) -> str:
    """The CRC of a whole object from its parts' (CRC in S3 form, size), in order."""
    combine = _COMBINE[name]
    crc = 0  # the CRC of no bytes
    for value, size in parts:
        crc = combine(crc, int.from_bytes(base64.b64decode(value), "big"), size)
    return base64.b64encode(crc.to_bytes(CHECKSUM_BYTES[name], "big")).decode()
