"""Who may use the admin API and the console: whoever holds the admin token.

The token is a random string in a file only Shoal's user can read (`<data_dir>/admin.token`,
made on first use, or `[admin] token_file`). A program sends it as `Authorization: Bearer
<token>`. A browser sends it once, through the console's login form, and gets a session
cookie in exchange: the token never travels in a URL, where proxies and histories keep it.

The cookie holds an expiry time and a MAC of it keyed with the token, so that any process
holding the token can check it, no session is stored anywhere, and a new token ends every
session made with the old one. S3 access keys open nothing here.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from pathlib import Path

SESSION_COOKIE = "shoal_admin"
SESSION_SECONDS = 12 * 3600
# The token's length in bytes of randomness: as hard to guess as a 256-bit key.
TOKEN_BYTES = 32


def load_or_create_token(path: Path) -> str:
    """The admin token kept in `path`, made there (readable by this user only) if absent."""
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        token = ""
    if token:
        return token
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(token + "\n")
    return token


class AdminToken:
    """Checks a bearer token or a session cookie against the admin token."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    def accepts_bearer(self, authorization: str | None) -> bool:
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not given:
            return False
        return hmac.compare_digest(given.strip().encode(), self._token)

    def accepts_token(self, given: str) -> bool:
        """What a login form sent."""
        return hmac.compare_digest(given.strip().encode(), self._token)

    def new_session(self, now: float | None = None) -> str:
        expires = int((now if now is not None else time.time()) + SESSION_SECONDS)
        return f"{expires}.{self._mac(expires)}"

    def accepts_session(self, cookie: str | None, now: float | None = None) -> bool:
        expires_text, _, mac = (cookie or "").partition(".")
        if not expires_text.isdigit() or not mac:
            return False
        expires = int(expires_text)
        if expires < (now if now is not None else time.time()):
            return False
        return hmac.compare_digest(mac, self._mac(expires))

    def _mac(self, expires: int) -> str:
        return hmac.new(self._token, f"session {expires}".encode(), hashlib.sha256).hexdigest()
