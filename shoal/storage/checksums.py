"""The digests a write computes on the way: MD5 (the ETag) and S3's additional checksums."""

from __future__ import annotations

import base64
import hashlib
import zlib
from collections.abc import Iterable

from awscrt import checksums as crt

S3_CHECKSUMS = ("crc32", "crc32c", "crc64nvme", "sha1", "sha256")
_CRC_BYTES = {"crc32": 4, "crc32c": 4, "crc64nvme": 8}


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
        values |= {name: crc.to_bytes(_CRC_BYTES[name], "big") for name, crc in self._crcs.items()}
        return {name: base64.b64encode(raw).decode() for name, raw in sorted(values.items())}
