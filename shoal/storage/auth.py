"""Request tokens between Shoal processes and storage nodes: HMAC of the cluster secret.

A token signs the method, the path and an expiry time, so a captured token opens one resource
for a short while only. Header: `Authorization: Shoal-Token <expires>:<hex hmac>`.
"""

from __future__ import annotations

import hmac
import os
import secrets
import time
from hashlib import sha256
from pathlib import Path

SCHEME = "Shoal-Token"
# Tokens live long enough for a slow block transfer; clocks of one cluster agree to seconds.
TOKEN_LIFETIME_SECONDS = 300


class InvalidToken(Exception):
    pass


def sign(secret: bytes, method: str, path: str, now: float | None = None) -> str:
    expires = int((time.time() if now is None else now) + TOKEN_LIFETIME_SECONDS)
    return f"{SCHEME} {expires}:{_mac(secret, method, path, expires)}"


def verify(
    secret: bytes, method: str, path: str, header: str | None, now: float | None = None
) -> None:
    if not header or not header.startswith(SCHEME + " "):
        raise InvalidToken("missing token")
    try:
        expires_text, mac = header[len(SCHEME) + 1 :].split(":", 1)
        expires = int(expires_text)
    except ValueError:
        raise InvalidToken("malformed token") from None
    if expires < (time.time() if now is None else now):
        raise InvalidToken("expired token")
    if expires > (time.time() if now is None else now) + 2 * TOKEN_LIFETIME_SECONDS:
        raise InvalidToken("token expires too far ahead")
    if not hmac.compare_digest(mac, _mac(secret, method, path, expires)):
        raise InvalidToken("bad signature")


def load_or_create_secret(path: Path) -> bytes:
    """The cluster secret kept in a 0600 file (created on first use)."""
    try:
        return bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_hex(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return bytes.fromhex(path.read_text().strip())  # another process made it first
    with os.fdopen(fd, "w") as handle:
        handle.write(value + "\n")
    return bytes.fromhex(value)


def _mac(secret: bytes, method: str, path: str, expires: int) -> str:
    message = f"{method.upper()}\n{path}\n{expires}".encode()
    return hmac.new(secret, message, sha256).hexdigest()
