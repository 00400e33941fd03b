"""Secrets at rest (access keys, added shards' DSNs): AES-GCM under a key outside PostgreSQL,
bound to the name they were sealed for."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from shoal.credentials import load_encryption_key
from shoal.sealing import NONCE_BYTES, SealBroken, seal, unseal

KEY = bytes(range(32))
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def test_a_secret_comes_back_as_it_went_in() -> None:
    sealed = seal(KEY, "SHKEY1", SECRET)
    assert SECRET.encode() not in sealed
    assert unseal(KEY, "SHKEY1", sealed) == SECRET


def test_each_encryption_has_its_own_nonce() -> None:
    first, second = (seal(KEY, "SHKEY1", SECRET) for _ in range(2))
    assert first[:NONCE_BYTES] != second[:NONCE_BYTES]
    assert first != second


def test_another_key_cannot_open_it() -> None:
    sealed = seal(KEY, "SHKEY1", SECRET)
    with pytest.raises(SealBroken, match=r"give back the credentials\.key backed up"):
        unseal(bytes(32), "SHKEY1", sealed)


def test_a_ciphertext_cannot_be_moved_to_another_access_key() -> None:
    sealed = seal(KEY, "SHKEY1", SECRET)
    with pytest.raises(SealBroken):
        unseal(KEY, "SHKEY2", sealed)


@pytest.mark.parametrize("where", [0, NONCE_BYTES, NONCE_BYTES + 5, -1])
def test_any_byte_changed_is_refused(where: int) -> None:
    sealed = bytearray(seal(KEY, "SHKEY1", SECRET))
    sealed[where] ^= 0x01
    with pytest.raises(SealBroken):
        unseal(KEY, "SHKEY1", bytes(sealed))


def test_a_truncated_ciphertext_is_refused() -> None:
    sealed = seal(KEY, "SHKEY1", SECRET)
    with pytest.raises(SealBroken):
        unseal(KEY, "SHKEY1", sealed[:-1])


def test_the_encryption_key_is_made_once_and_kept_private(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "credentials.key"
    key = load_encryption_key(path)
    assert len(key) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_encryption_key(path) == key  # read back, never replaced
    sealed = seal(key, "SHKEY1", SECRET)
    assert unseal(load_encryption_key(path), "SHKEY1", sealed) == SECRET
