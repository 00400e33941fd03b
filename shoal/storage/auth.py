"""Request tokens between Shoal processes and storage nodes: HMAC of the cluster secret.

A token binds the whole request: the node it is for (the Host), the method, the path, the
query, the Range asked for, what the body holds, an expiry a few seconds ahead and a random
nonce. A node accepts a nonce once (ReplayCache), so a captured request can neither be sent
again nor turned into another one. Header:
`Authorization: Shoal-Token <expires>:<nonce>:<hex hmac>`.

What "the body" means: a block PUT binds the block's XXH3-128 checksum (the X-Shoal-Checksum
header) and its length, which the node checks the bytes against before it keeps them; every
other body is bound by its SHA-256. SHA-256 of a 1 MiB block costs ~30 times XXH3-128
(bench/token_bench.py), paid again by every replica, where the checksum is already computed by
the writer and checked by the node (docs/storage.md, "Request tokens").
"""

from __future__ import annotations

import fcntl
import hmac
import multiprocessing
import os
import re
import struct
import threading
import time
from dataclasses import dataclass
from hashlib import sha256
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

SCHEME = "Shoal-Token"
# A token is signed as its request leaves (each attempt signs anew) and checked when its head
# arrives, so it needs to live only as long as a request head's trip plus the clocks'
# disagreement.
TOKEN_LIFETIME_SECONDS = 15
# How far ahead of the node's clock a signer's may be (NTP keeps a cluster within far less).
CLOCK_SKEW_SECONDS = 15
_NONCE = re.compile(r"[0-9a-f]{32}")
# What a node answers (401) for a token it read after its expiry.
EXPIRED = "expired token"
_EMPTY_SHA256 = sha256(b"").hexdigest()


class InvalidToken(Exception):
    pass


class ReplayCacheFull(Exception):
    """Too many tokens alive at once to remember them all: the request is refused (and may
    be sent again with a new token)."""


def body_content(body: bytes | bytearray) -> str:
    """What a token binds of a request body: its SHA-256."""
    return f"sha256:{sha256(body).hexdigest() if body else _EMPTY_SHA256}"


def block_content(checksum: str, length: int) -> str:
    """What a token binds of a block PUT's body: its checksum header and its length (the node
    refuses bytes that do not match them)."""
    return f"xxh3-128:{checksum}:{length}"


def canonical_query(query: str) -> str:
    """A query string in one spelling: its parameters sorted, blank values kept."""
    if not query:
        return ""
    return urlencode(sorted(parse_qsl(query, keep_blank_values=True)))


@dataclass(frozen=True)
class Signed:
    """What a token binds: the request as the node will see it."""

    host: str  # the node, as the client addresses it (host:port)
    method: str
    path: str
    query: str = ""  # canonical_query()
    content: str = f"sha256:{_EMPTY_SHA256}"  # body_content() or block_content()
    range: str = ""  # the Range header, if any

    @classmethod
    def request(
        cls,
        host: str,
        method: str,
        path: str,
        *,
        query: str = "",
        body: bytes | bytearray = b"",
        checksum: str | None = None,
        range: str = "",
    ) -> Signed:
        """What a client signs: a block PUT (with its `checksum`) binds the checksum and the
        length of `body`, any other request the SHA-256 of `body`."""
        content = block_content(checksum, len(body)) if checksum is not None else None
        return cls(
            host=host,
            method=method,
            path=path,
            query=canonical_query(query),
            content=content or body_content(body),
            range=range,
        )

    def message(self, expires: int, nonce: str) -> bytes:
        parts = (self.host, self.method.upper(), self.path, self.query, self.content, self.range)
        return "\n".join((*parts, str(expires), nonce)).encode()


def sign(secret: bytes, request: Signed, now: float | None = None) -> str:
    expires = int((time.time() if now is None else now) + TOKEN_LIFETIME_SECONDS)
    nonce = os.urandom(16).hex()
    return f"{SCHEME} {expires}:{nonce}:{_mac(secret, request, expires, nonce)}"


def verify(
    secret: bytes,
    request: Signed,
    header: str | None,
    replays: ReplayCache | None = None,
    now: float | None = None,
) -> None:
    """Accept the token of `request` once (with `replays`), or raise InvalidToken."""
    if not header or not header.startswith(SCHEME + " "):
        raise InvalidToken("missing token")
    try:
        expires_text, nonce, mac = header[len(SCHEME) + 1 :].split(":")
        expires = int(expires_text)
    except ValueError:
        raise InvalidToken("malformed token") from None
    if not _NONCE.fullmatch(nonce):
        raise InvalidToken("malformed token")
    now = time.time() if now is None else now
    if expires < now:
        raise InvalidToken(EXPIRED)
    if expires > now + TOKEN_LIFETIME_SECONDS + CLOCK_SKEW_SECONDS:
        raise InvalidToken("token expires too far ahead")
    if not hmac.compare_digest(mac, _mac(secret, request, expires, nonce)):
        raise InvalidToken("bad signature")
    if replays is not None and not replays.first_use(nonce, expires, now):
        raise InvalidToken("token already used")


class ReplayCache:
    """The nonces of the tokens a node accepted that have not expired yet, shared by the
    node's processes (workers.py), so a token answered by one is refused by every other.

    A fixed table in shared memory: a nonce goes into one bucket of BUCKET slots chosen by its
    bits, in the slot whose token expired longest ago. A request costs a look at one bucket
    under a lock (a thread lock, and with `lock_file` a flock across processes, which the
    kernel releases when a process dies holding it; a node without worker processes has no
    need of it): O(1), and the memory is fixed
    (2 x 8 bytes x slots, 16 MiB by default). Tokens live at most
    TOKEN_LIFETIME_SECONDS + CLOCK_SKEW_SECONDS (30 s), so 2^20 slots hold 17,000 requests a
    second at half full; a bucket with no expired slot refuses the request (ReplayCacheFull)
    rather than forget a nonce that is still valid.
    """

    BUCKET = 64
    SLOTS = 1 << 20

    def __init__(self, lock_file: Path | None, slots: int = SLOTS) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.lock_file = lock_file
        self._keys: Any = spawn.RawArray("q", slots)
        self._expiries: Any = spawn.RawArray("q", slots)
        self._setup()

    def _setup(self) -> None:
        self._buckets = len(self._keys) // self.BUCKET
        self._format = struct.Struct(f"{self.BUCKET}q")
        self._thread_lock = threading.Lock()
        self._fd: int | None = None

    def __getstate__(self) -> dict[str, Any]:  # to a worker process: the same shared memory
        return {"lock_file": self.lock_file, "keys": self._keys, "expiries": self._expiries}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.lock_file = state["lock_file"]
        self._keys, self._expiries = state["keys"], state["expiries"]
        self._setup()

    def first_use(self, nonce: str, expires: int, now: float) -> bool:
        """Remember `nonce` until `expires`; False if it is remembered already."""
        key = int(nonce[:16], 16) - (1 << 63)  # a signed 64-bit slot
        start = int(nonce[16:24], 16) % self._buckets * self.BUCKET
        offset = start * 8
        with self._thread_lock:
            fd = self._lock_across_processes()
            try:
                keys = self._format.unpack_from(self._keys, offset)
                expiries = self._format.unpack_from(self._expiries, offset)
                if key in keys and any(
                    k == key and e >= now for k, e in zip(keys, expiries, strict=True)
                ):
                    return False
                oldest = min(expiries)
                if oldest >= now:
                    raise ReplayCacheFull("too many tokens alive at once")
                slot = start + expiries.index(oldest)
                self._keys[slot] = key
                self._expiries[slot] = expires
            finally:
                if fd is not None:
                    fcntl.flock(fd, fcntl.LOCK_UN)
        return True

    def _lock_across_processes(self) -> int | None:
        """Take the flock of `lock_file` (the thread lock is held); its descriptor, if any."""
        if self.lock_file is None:
            return None
        if self._fd is None:
            self._fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self._fd


def _mac(secret: bytes, request: Signed, expires: int, nonce: str) -> str:
    return hmac.digest(secret, request.message(expires, nonce), "sha256").hex()
