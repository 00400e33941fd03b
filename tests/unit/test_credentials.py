"""Secret access keys at rest: AES-GCM under a key outside PostgreSQL, bound to the key id."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography.exceptions import InvalidTag

from shoal.credentials import NONCE_BYTES, Credentials, load_encryption_key

KEY = bytes(range(32))
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def credentials(key: bytes = KEY) -> Credentials:
    # Only the encryption is exercised here: nothing reaches the store.
    store: Any = None
    return Credentials(store, key)


def test_a_secret_comes_back_as_it_went_in() -> None:
    sealed = credentials()._encrypt("SHKEY1", SECRET)
    assert SECRET.encode() not in sealed
    assert credentials()._decrypt("SHKEY1", sealed) == SECRET


def test_each_encryption_has_its_own_nonce() -> None:
    first, second = (credentials()._encrypt("SHKEY1", SECRET) for _ in range(2))
    assert first[:NONCE_BYTES] != second[:NONCE_BYTES]
    assert first != second


def test_another_key_cannot_open_it() -> None:
    sealed = credentials()._encrypt("SHKEY1", SECRET)
    with pytest.raises(InvalidTag):
        credentials(bytes(32))._decrypt("SHKEY1", sealed)


def test_a_ciphertext_cannot_be_moved_to_another_access_key() -> None:
    sealed = credentials()._encrypt("SHKEY1", SECRET)
    with pytest.raises(InvalidTag):
        credentials()._decrypt("SHKEY2", sealed)


@pytest.mark.parametrize("where", [0, NONCE_BYTES, NONCE_BYTES + 5, -1])
def test_any_byte_changed_is_refused(where: int) -> None:
    sealed = bytearray(credentials()._encrypt("SHKEY1", SECRET))
    sealed[where] ^= 0x01
    with pytest.raises(InvalidTag):
        credentials()._decrypt("SHKEY1", bytes(sealed))


def test_a_truncated_ciphertext_is_refused() -> None:
    sealed = credentials()._encrypt("SHKEY1", SECRET)
    with pytest.raises(InvalidTag):
        credentials()._decrypt("SHKEY1", sealed[:-1])


def test_the_encryption_key_is_made_once_and_kept_private(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "credentials.key"
    key = load_encryption_key(path)
    assert len(key) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_encryption_key(path) == key  # read back, never replaced
    sealed = credentials(key)._encrypt("SHKEY1", SECRET)
    assert credentials(load_encryption_key(path))._decrypt("SHKEY1", sealed) == SECRET
