"""Secrets kept in PostgreSQL, sealed with AES-GCM under the credentials key.

The key never enters PostgreSQL (`<data-dir>/credentials.key`, 0600, or `[s3]
credentials_key_file`). `context` is the additional authenticated data: a sealed secret
opens only for the name it was sealed for (an access key id, a shard's name), so a
ciphertext cannot be moved to another row.
"""

from __future__ import annotations

import secrets

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

NONCE_BYTES = 12


def seal(key: bytes, context: str, text: str) -> bytes:
    nonce = secrets.token_bytes(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, text.encode(), context.encode())


class SealBroken(ValueError):
    """A sealed secret does not open with this key (another key sealed it, or it changed)."""


def unseal(key: bytes, context: str, blob: bytes) -> str:
    nonce, ciphertext = blob[:NONCE_BYTES], blob[NONCE_BYTES:]
    try:
        return AESGCM(key).decrypt(nonce, ciphertext, context.encode()).decode()
    except InvalidTag:
        raise SealBroken(
            f"the secret of {context} does not open with this key: the credentials key file"
            " is not the one that sealed it, or the sealed secret changed (after a restore,"
            " give back the credentials.key backed up with the metadata: docs/operations.md,"
            ' "Backups, restores and failover")'
        ) from None
