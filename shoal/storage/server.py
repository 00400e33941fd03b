"""The storage node: an HTTP service for the blocks of one disk.

    PUT    /blocks/{name}       store a block (X-Shoal-Checksum, Content-Length); never overwrites
    GET    /blocks/{name}       the block's data, or a byte range of it (Range: bytes=a-b)
    HEAD   /blocks/{name}       its size and checksum
    DELETE /blocks/{name}       remove it (a missing block is already deleted: 204)
    POST   /blocks/delete       remove many: {"names": [...]} -> {"deleted": n, "missing": m}
    GET    /inventory?after=&limit=   a page of {name, size, mtime, checksum}, in a stable order
    GET    /status              name, datacenter, capacity, free bytes, block count

Every request carries a token signed with the cluster secret that binds the whole request and
is accepted once (auth.py). With a certificate and key (tls.py) the node speaks HTTPS. The HTTP
layer only translates: the disk is blockfile.BlockStore's business. Each process counts the
blocks it reads, writes and deletes, and the checksum failures it meets, in the node's
metrics (metrics.py).

A thread per connection, not an event loop: every request ends in blocking disk work (a write
and two fsyncs, an open and a sendfile), so the thread that parsed the request does it, where
an event loop hands each block to a thread and back. Against the aiohttp service this
replaced, 1 MiB and 4 KiB writes both went markedly faster, and reads go from the page cache
to the socket by sendfile (docs/decisions.md, "The storage node: a thread per connection";
bench/storage_bench.py). Clients keep a bounded
pool of connections per node (client.py), which bounds the threads.
"""

from __future__ import annotations

import contextlib
import http
import io
import json
import logging
import multiprocessing
import re
import socket
import socketserver
import ssl
import struct
import threading
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from shoal import httpdate
from shoal.storage import auth
from shoal.storage.blockfile import (
    CHECKSUM_HEADER,
    HEADER,
    BlockCorrupt,
    BlockError,
    BlockExists,
    BlockNotFound,
    BlockReader,
    BlockStore,
    ChecksumMismatch,
    DiskNotWritable,
    InvalidBlockName,
    OutOfSpace,
)
from shoal.storage.metrics import metrics
from shoal.storage.tls import ServerFiles

log = logging.getLogger("shoal.storage")

MAX_BATCH_DELETE = 10000
MAX_BATCH_DELETE_BODY_BYTES = 1024 * 1024
MAX_INVENTORY_PAGE = 10000
# A refused request's body up to this size is read and dropped rather than the connection
# closed (for requests with a valid token only): the client then reads the refusal instead of
# a reset, and keeps its connection.
MAX_DISCARD_BYTES = 64 * 1024 * 1024
# An idle kept-alive connection is closed after this long; clients drop theirs sooner (aiohttp:
# 15 s), so a client never sends on a connection the node is closing. A transfer that stalls
# this long fails the same way.
IDLE_SECONDS = 75
# How long a stopping node lets requests in progress finish.
DRAIN_SECONDS = 30
MAX_HEAD_LINE_BYTES = 8192
MAX_HEADERS = 64
_REASONS = {status.value: status.phrase for status in http.HTTPStatus}
# A client that closed its connection, or stalled past IDLE_SECONDS (EAGAIN), or broke TLS.
_GONE = (ConnectionError, TimeoutError, BlockingIOError, ssl.SSLError)
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
_CHECKSUM = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class NodeIdentity:
    name: str
    datacenter: str

    @property
    def shark(self) -> str:
        """How object rows name this node (RFD 149's sharks: datacenter and storage id)."""
        return f"{self.datacenter}:{self.name}"


class BlockCount:
    """Blocks held, and the bytes of their files, counted once at start and kept current by
    writes and deletes.

    A node's processes (workers.py) share it: each adds to its own slots of shared memory, so
    no process waits for another, and every process reports the sum of the slots.
    """

    def __init__(self, value: int, processes: int = 1, stored_bytes: int = 0) -> None:
        # Slot i counts process i's blocks, slot processes + i their bytes.
        self._processes = processes
        self._slots = multiprocessing.get_context("spawn").RawArray("q", 2 * processes)
        self._slots[0] = value
        self._slots[processes] = stored_bytes
        self.slot = 0  # this process's: 0 in the node process, its number in a worker

    @property
    def value(self) -> int:
        return sum(self._slots[: self._processes])

    @property
    def stored_bytes(self) -> int:
        return sum(self._slots[self._processes :])

    def add(self, blocks: int, stored_bytes: int = 0) -> None:
        with _COUNT_LOCK:  # the threads of one process share its slots
            self._slots[self.slot] += blocks
            self._slots[self._processes + self.slot] += stored_bytes


_COUNT_LOCK = threading.Lock()


class Refused(Exception):
    """A request the node answers with an error status (and no change on disk)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


# Block-store refusals to HTTP statuses, in one place (the first match wins).
_STATUS_OF_ERROR: list[tuple[type[BlockError], int]] = [
    (InvalidBlockName, 400),
    (BlockNotFound, 404),
    (BlockExists, 409),
    (ChecksumMismatch, 422),
    (OutOfSpace, 507),
    (DiskNotWritable, 503),  # writers go to another node; the node's /ready says the same
    (BlockCorrupt, 500),
    (BlockError, 400),
]


class NodeServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    """The node's HTTP service on a listening socket it is given (shared by its processes).

    `addresses` are the host:port values under which clients reach this node (a token names
    the node it is for, so that a request to one node cannot be replayed to another); by
    default the address it listens on and, on loopback, its aliases. `replays` remembers the
    tokens accepted (give every process of a node the same one); `tls` makes it HTTPS.
    """

    daemon_threads = True  # an idle kept-alive connection must not hold a stopping node

    def __init__(
        self,
        sock: socket.socket,
        store: BlockStore,
        secret: bytes,
        identity: NodeIdentity,
        count: BlockCount,
        *,
        addresses: Collection[str] = (),
        replays: auth.ReplayCache | None = None,
        tls: ServerFiles | None = None,
    ) -> None:
        super().__init__(sock.getsockname()[:2], _Handler, bind_and_activate=False)
        self.socket.close()
        # Non-blocking: the node's processes all wake for a connection that one of them takes,
        # and the others must go back to waiting rather than block in accept().
        sock.setblocking(False)
        self.socket = sock
        self.store = store
        self.secret = secret
        self.identity = identity
        self.count = count
        self.addresses = frozenset(addresses) | own_addresses(sock)
        self.replays = replays or auth.ReplayCache(None)  # this process's alone
        self.tls = tls.context() if tls is not None else None
        self.metrics = metrics()
        self._in_progress = 0
        self._idle = threading.Condition()

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, address = self.socket.accept()
        if self.tls is not None:  # the handshake happens in the connection's thread
            connection = self.tls.wrap_socket(
                connection, server_side=True, do_handshake_on_connect=False
            )
        return connection, address

    def serve_in_thread(self) -> None:
        threading.Thread(target=self.serve_forever, name="node-accept", daemon=True).start()

    def stop(self) -> None:
        """Accept no more connections, and let requests in progress finish (a while)."""
        self.shutdown()
        with self._idle:
            self._idle.wait_for(lambda: self._in_progress == 0, timeout=DRAIN_SECONDS)
        self.store.close()

    def request_started(self) -> None:
        with self._idle:
            self._in_progress += 1

    def request_finished(self) -> None:
        with self._idle:
            self._in_progress -= 1
            self._idle.notify_all()


class _Handler(socketserver.StreamRequestHandler):
    """One connection; its requests one after the other (HTTP/1.1 keep-alive).

    Requests are read here rather than by http.server's handler, whose header parsing (the
    email package) and per-response logging and date formatting were a third of a node's
    Python time per request: nodes speak to Shoal's own client, in one dialect.
    """

    server: NodeServer
    command = ""
    path = ""
    headers: dict[str, str]
    close_connection = False

    def setup(self) -> None:
        # A blocking socket whose kernel timeouts end a stalled receive or send (the error is
        # EAGAIN), rather than Python's socket timeout: that one polls before every recv and
        # send, a system call and a wake-up more for each piece of a block.
        # Over TLS, Python's socket timeout instead: the ssl module ends a read or write on
        # a timeout it set itself, not on the EAGAIN of a kernel one.
        connection: socket.socket = self.request
        if isinstance(connection, ssl.SSLSocket):
            connection.settimeout(IDLE_SECONDS)
        else:
            connection.setblocking(True)
            timeval = struct.pack("ll", IDLE_SECONDS, 0)
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().setup()

    def handle(self) -> None:
        # The client went away, stalled past IDLE_SECONDS or failed the TLS handshake: drop
        # the connection.
        with contextlib.suppress(*_GONE):
            if isinstance(self.request, ssl.SSLSocket):
                self.request.do_handshake()
            while not self.close_connection and self._read_request():
                self._serve()
                if self.command == "PUT":  # a writer: more blocks are likely to come
                    self.server.store.make_spare()

    def _read_request(self) -> bool:
        """The next request's line and headers; False when the connection is over."""
        line = self.rfile.readline(MAX_HEAD_LINE_BYTES + 1)
        if not line:
            return False  # the client closed a kept-alive connection
        parts = line.decode("latin-1").rstrip("\r\n").split(" ")
        self.command, self.headers = "", {}
        self.body = _Body(self.rfile, 0)
        self.authenticated = False
        if len(line) > MAX_HEAD_LINE_BYTES or len(parts) != 3 or parts[2] != "HTTP/1.1":
            self._refuse(400, "expected an HTTP/1.1 request line", close=True)
            return False
        self.command, self.path = parts[0], parts[1]
        for _ in range(MAX_HEADERS):
            line = self.rfile.readline(MAX_HEAD_LINE_BYTES + 1)
            if line in (b"\r\n", b"\n"):
                break
            name, colon, value = line.decode("latin-1").partition(":")
            if not colon or len(line) > MAX_HEAD_LINE_BYTES:
                self._refuse(400, "malformed header line", close=True)
                return False
            self.headers[name.strip().lower()] = value.strip()
        else:
            self._refuse(431, f"more than {MAX_HEADERS} header lines", close=True)
            return False
        self.close_connection = self.headers.get("connection", "").lower() == "close"
        return True

    def _serve(self) -> None:
        self.server.request_started()
        self.body = _Body(self.rfile, self._content_length())
        self.replying = False
        try:
            self._answer()
        except _GONE:
            self.close_connection = True
        finally:
            self.server.request_finished()

    def _answer(self) -> None:
        try:
            url = urlsplit(self.path)
            path = unquote(url.path)
            self._authenticate(path, url.query)
            self._route(path, parse_qs(url.query))
        except Refused as refusal:
            self._refuse(refusal.status, str(refusal), refusal.headers)
        except BlockError as exc:
            status = next(s for kind, s in _STATUS_OF_ERROR if isinstance(exc, kind))
            if isinstance(exc, (ChecksumMismatch, BlockCorrupt)):
                self.server.metrics.checksum_failures.inc()
            if isinstance(exc, BlockCorrupt):
                log.error("corrupt block on this node: %s", exc)
            self._refuse(status, str(exc) if status != 404 else f"no block {exc}")
        except _GONE:
            raise
        except Exception:
            log.exception("%s %s failed", self.command, self.path)
            if self.replying:  # too late for an error status: the client sees a cut response
                self.close_connection = True
            else:
                self._refuse(500, "internal error")

    def _authenticate(self, path: str, query: str) -> None:
        """Check the token against the whole request: the node it names, method, path,
        query, range and body (a block by its checksum and length, which the write checks the
        bytes against; any other body by its SHA-256, so it is read first)."""
        host = self.headers.get("host", "")
        if host not in self.server.addresses:
            raise Refused(401, f"a request for another node ({host[:80]!r})")
        if self.command == "PUT" and path.startswith("/blocks/"):
            checksum = self.headers.get(CHECKSUM_HEADER.lower(), "")
            content = auth.block_content(checksum, self.body.length or 0)
        else:
            content = auth.body_content(self._small_body())
        signed = auth.Signed(
            host=host,
            method=self.command,
            path=path,
            query=auth.canonical_query(query),
            content=content,
            range=self.headers.get("range", ""),
        )
        try:
            auth.verify(
                self.server.secret, signed, self.headers.get("authorization"), self.server.replays
            )
        except auth.InvalidToken as exc:
            raise Refused(401, str(exc)) from None
        except auth.ReplayCacheFull as exc:
            raise Refused(503, str(exc)) from None
        self.authenticated = True

    def _small_body(self) -> bytes:
        """The body of a request other than a block PUT (a batch of names at most), read
        whole before the token is checked, since the token binds its digest."""
        length = self.body.length
        if not length:
            return b""  # no body (a GET), or a chunked one, refused as it is routed
        if length > MAX_BATCH_DELETE_BODY_BYTES:
            raise Refused(413, f"a body of at most {MAX_BATCH_DELETE_BODY_BYTES} bytes")
        return self.body.read_all()

    def _route(self, path: str, query: dict[str, list[str]]) -> None:
        method = self.command
        if path.startswith("/blocks/") and path != "/blocks/delete":
            name = path[len("/blocks/") :]
            if method == "PUT":
                return self._put_block(name)
            if method in ("GET", "HEAD"):
                return self._get_block(name)
            if method == "DELETE":
                return self._delete_block(name)
        if path == "/blocks/delete" and method == "POST":
            return self._delete_blocks()
        if path == "/inventory" and method == "GET":
            return self._inventory(query)
        if path == "/status" and method == "GET":
            return self._status()
        raise Refused(404, f"no resource {method} {path}")

    # The resources.

    def _put_block(self, name: str) -> None:
        checksum = self.headers.get(CHECKSUM_HEADER.lower(), "")
        if not _CHECKSUM.fullmatch(checksum):
            raise Refused(400, f"{CHECKSUM_HEADER} must be 32 hex digits")
        if self.body.length is None:
            raise Refused(411, "Content-Length is required")
        created = self.server.store.write(name, self.body, self.body.length, checksum)
        if created:
            self.server.count.add(1, HEADER.size + self.body.length)
        self.server.metrics.writes.inc()
        self.server.metrics.bytes_written.inc(self.body.length)
        self._reply(201 if created else 200)

    def _get_block(self, name: str) -> None:
        range_header = self.headers.get("range")
        partial = range_header is not None
        with self.server.store.open(name, lambda size: _byte_range(range_header, size)) as reader:
            self._reply_headers(206 if partial else 200, _block_headers(reader, partial))
            if self.command == "GET":
                reader.send(self.connection)
                self.server.metrics.reads.inc()
                self.server.metrics.bytes_read.inc(reader.end - reader.start)

    def _delete_block(self, name: str) -> None:
        size = self.server.store.remove(name)
        if size is not None:
            self.server.count.add(-1, -size)
        self.server.metrics.deletes.inc()
        self._reply(204)

    def _delete_blocks(self) -> None:
        names = self._json_body().get("names")
        if not isinstance(names, list) or len(names) > MAX_BATCH_DELETE:
            raise Refused(400, f"names must be a list of at most {MAX_BATCH_DELETE}")
        try:
            sizes = self.server.store.remove_many(names)  # an invalid name refuses them all
        except DiskNotWritable as refusal:
            self.server.count.add(-len(refusal.removed), -sum(refusal.removed))
            raise
        removed = [size for size in sizes if size is not None]
        deleted = len(removed)
        self.server.count.add(-deleted, -sum(removed))
        self.server.metrics.deletes.inc(len(names))
        self._reply_json({"deleted": deleted, "missing": len(names) - deleted})

    def _inventory(self, query: dict[str, list[str]]) -> None:
        after = query.get("after", [""])[0]
        try:
            limit = int(query.get("limit", ["1000"])[0])
        except ValueError:
            raise Refused(400, "limit must be an integer") from None
        if not 1 <= limit <= MAX_INVENTORY_PAGE:
            raise Refused(400, f"limit must be between 1 and {MAX_INVENTORY_PAGE}")
        page = self.server.store.inventory(after, limit)
        self._reply_json(
            {
                "blocks": [b.__dict__ for b in page],
                "next": page[-1].name if len(page) == limit else None,
            }
        )

    def _status(self) -> None:
        capacity, free = self.server.store.usage()
        identity = self.server.identity
        self._reply_json(
            {
                "name": identity.name,
                "datacenter": identity.datacenter,
                "shark": identity.shark,
                "capacity_bytes": capacity,
                "free_bytes": free,
                "block_count": self.server.count.value,
            }
        )

    # Requests and responses.

    def _content_length(self) -> int | None:
        if "transfer-encoding" in self.headers:
            return None  # blocks are sent with their length; chunked bodies are refused
        try:
            length = int(self.headers.get("content-length", "0"))
        except ValueError:
            return None
        return length if length >= 0 else None

    def _json_body(self) -> dict[str, Any]:
        length = self.body.length
        if length is None or length > MAX_BATCH_DELETE_BODY_BYTES:
            raise Refused(400, f"a JSON body of at most {MAX_BATCH_DELETE_BODY_BYTES} bytes")
        try:
            value = json.loads(self.body.data)
        except ValueError:
            raise Refused(400, 'body must be {"names": [...]}') from None
        if not isinstance(value, dict):
            raise Refused(400, 'body must be {"names": [...]}')
        return value

    def _reply(self, status: int) -> None:
        self._reply_headers(status, {"Content-Length": "0"})

    def _reply_json(self, value: object) -> None:
        body = json.dumps(value).encode()
        headers = {"Content-Type": "application/json", "Content-Length": str(len(body))}
        self._reply_headers(200, headers, body)

    def _refuse(
        self,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        close: bool = False,
    ) -> None:
        body = message.encode()
        headers = {
            **(headers or {}),
            "Content-Type": "text/plain; charset=utf-8",
            "Content-Length": str(len(body)),
        }
        keep = self.authenticated and self.body.discard(MAX_DISCARD_BYTES)
        if close or not (self.body.consumed or keep):
            # What the client still sends of this body would be read as the next request.
            self.close_connection = True
        self._reply_headers(status, headers, body if self.command != "HEAD" else b"")

    def _reply_headers(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        """The status line and headers (and a short body) in one write."""
        self.replying = True
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, '')}", f"Date: {httpdate.now()}"]
        lines += [f"{key}: {value}" for key, value in headers.items()]
        if self.close_connection:
            lines.append("Connection: close")
        self.wfile.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)


class _Body:
    """A request's body: exactly Content-Length bytes of the connection, no more."""

    def __init__(self, stream: io.BufferedIOBase, length: int | None) -> None:
        self._stream = stream
        self.length = length
        self._remaining = length or 0
        self.data = b""  # what read_all() read

    @property
    def consumed(self) -> bool:
        return self._remaining == 0 and self.length is not None

    def readinto(self, buffer: memoryview) -> int:
        if self._remaining == 0:
            return 0
        count = self._stream.readinto(buffer[: self._remaining]) or 0
        if count == 0:
            raise ConnectionError("the client closed the connection in a request body")
        self._remaining -= count
        return count

    def discard(self, limit: int) -> bool:
        """Read and drop the rest of a body of known length up to `limit` bytes, so that the
        connection can carry the next request; False if there is more (or no length)."""
        if self.length is None or self._remaining > limit:
            return False
        while self._remaining:
            dropped = len(self._stream.read(min(self._remaining, 1024 * 1024)))
            if dropped == 0:
                raise ConnectionError("the client closed the connection in a request body")
            self._remaining -= dropped
        return True

    def read_all(self) -> bytes:
        data = self._stream.read(self._remaining)
        self._remaining -= len(data)
        if self._remaining:
            raise ConnectionError("the client closed the connection in a request body")
        self.data = data
        return data


def own_addresses(sock: socket.socket) -> frozenset[str]:
    """The host:port values that name the node listening on `sock`: its address, and on
    loopback or a wildcard address the loopback names too."""
    host, port = sock.getsockname()[:2]
    names = {host}
    if host in ("0.0.0.0", "::") or host.startswith("127.") or host == "::1":
        names |= {"127.0.0.1", "localhost", "::1"}
    return frozenset(f"[{name}]:{port}" if ":" in name else f"{name}:{port}" for name in names)


def _block_headers(reader: BlockReader, partial: bool) -> dict[str, str]:
    headers = {
        "Content-Length": str(reader.end - reader.start),
        CHECKSUM_HEADER: reader.info.checksum,
        "Accept-Ranges": "bytes",
    }
    if partial:
        headers["Content-Range"] = f"bytes {reader.start}-{reader.end - 1}/{reader.info.size}"
    return headers


def _byte_range(header: str | None, size: int) -> tuple[int, int]:
    """[start, end) of a `Range: bytes=a-b` header (suffix and open-ended forms included)."""
    if header is None:
        return 0, size
    unsatisfiable = Refused(416, "range not satisfiable", {"Content-Range": f"bytes */{size}"})
    match = _RANGE.fullmatch(header.strip())
    if not match or match.groups() == ("", ""):
        raise unsatisfiable
    first, last = match.groups()
    if first == "":
        start, end = max(0, size - int(last)), size
    else:
        start = int(first)
        end = size if last == "" else min(size, int(last) + 1)
    if start >= size or start >= end:
        raise unsatisfiable
    return start, end
