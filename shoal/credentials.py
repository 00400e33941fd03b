"""Accounts' access keys: made here, stored encrypted, looked up by the gateway.

Secrets are encrypted with AES-GCM under a key that never enters PostgreSQL: it lives in
`<data-dir>/credentials.key` (0600) or the file `[s3] credentials_key_file` names. The access
key id is the additional authenticated data, so a ciphertext cannot be moved to another key.
"""

from __future__ import annotations

import secrets
import string
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from shoal.keyfiles import load_or_create_secret
from shoal.metadata import AccessKeyNotFound, Account, MetadataStore
from shoal.sealing import seal, unseal

ACCESS_KEY_ALPHABET = string.ascii_uppercase + string.digits
# How long the gateway trusts a looked-up secret; a revoked key stops working within this.
CACHE_SECONDS = 30.0


@dataclass(frozen=True)
class KeyPair:
    account: Account
    access_key_id: str
    secret_access_key: str = field(repr=False)  # printed on purpose only (cli._print_key)


class Credentials:
    def __init__(self, store: MetadataStore, encryption_key: bytes) -> None:
        self.store = store
        self._key = encryption_key
        self._cache: dict[str, tuple[float, uuid.UUID, str]] = {}

    async def create_account(self, name: str) -> KeyPair:
        account = await self.store.accounts.create(name)
        return await self.add_key(account)

    async def add_key(self, account: Account) -> KeyPair:
        access_key_id = "SH" + "".join(secrets.choice(ACCESS_KEY_ALPHABET) for _ in range(18))
        secret = secrets.token_urlsafe(30)
        await self.store.keys.add(account.id, access_key_id, self._encrypt(access_key_id, secret))
        return KeyPair(account, access_key_id, secret)

    async def oldest_active_key(self, account: Account) -> KeyPair | None:
        """The account's oldest active key, decrypted (root's is the one `shoal serve` and
        `shoal account show-root` name); None if every key is revoked."""
        for key in await self.store.keys.list(account.id):
            if key.revoked is None:
                secret = self._decrypt(key.access_key_id, key.secret_encrypted)
                return KeyPair(account, key.access_key_id, secret)
        return None

    async def secret_of(self, access_key_id: str) -> tuple[uuid.UUID, str]:
        """(account id, secret) of an active key; AccessKeyNotFound otherwise."""
        cached = self._cache.get(access_key_id)
        if cached and time.monotonic() - cached[0] < CACHE_SECONDS:
            return cached[1], cached[2]
        key = await self.store.keys.get(access_key_id)
        if key.revoked is not None:
            raise AccessKeyNotFound(f"access key {access_key_id} is revoked")
        secret = self._decrypt(access_key_id, key.secret_encrypted)
        self._cache[access_key_id] = (time.monotonic(), key.account_id, secret)
        return key.account_id, secret

    def _encrypt(self, access_key_id: str, secret: str) -> bytes:
        return seal(self._key, access_key_id, secret)

    def _decrypt(self, access_key_id: str, blob: bytes) -> str:
        return unseal(self._key, access_key_id, blob)


def load_encryption_key(path: Path) -> bytes:
    """The 256-bit key that encrypts secrets, made on first use."""
    return load_or_create_secret(path)
