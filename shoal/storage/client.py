"""The storage nodes' client: every call a Shoal process makes to a node goes through here.

HTTP/1.1 on asyncio protocols, with a pool of kept-alive connections per node. Nodes speak
one dialect (server.py: Content-Length bodies, no redirects, no compression), so a client
that writes one request head and reads one response head costs a fraction of a general one:
against aiohttp's client on the same node, about a third of its CPU per small block and half
per MiB (docs/decisions.md, "The node client"; bench/storage_bench.py prints the client's
CPU per MiB).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import urlencode, urlsplit

from shoal.storage import auth
from shoal.storage.blockfile import CHECKSUM_HEADER, MAX_BLOCK_BYTES, BlockInfo, checksum_of
from shoal.storage.tls import client_context

CONNECT_TIMEOUT_SECONDS = 5
# A block transfer that stalls this long is a failed replica, not a slow one.
READ_TIMEOUT_SECONDS = 60
# Idle connections older than this are closed rather than reused: nodes close theirs after
# 75 s (server.IDLE_SECONDS), and a request must not race a node closing its connection.
KEEP_IDLE_SECONDS = 15
MAX_HEAD_BYTES = 64 * 1024
# The largest body read whole: a block (blockfile.MAX_BLOCK_BYTES) or a page of inventory.
MAX_BODY_BYTES = MAX_BLOCK_BYTES + 1024 * 1024
# A node is asked its /status this often while calls to it run under `while_answering`, as
# the gateway's readiness check asks every node; each check gives it this long to answer.
WATCH_SECONDS = 1.0
WATCH_ANSWER_SECONDS = 1.0
# Checks in a row a node must miss before the calls waiting on it are given up: one missed
# check alone is a node busy for a moment.
SILENT_CHECKS_TO_GIVE_UP = 2

T = TypeVar("T")

# CPython's constructor of a bytearray from a pointer and a length: with no pointer, it
# leaves the new bytearray's bytes as its memory held them.
_bytearray_from = ctypes.pythonapi.PyByteArray_FromStringAndSize
_bytearray_from.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)
_bytearray_from.restype = ctypes.py_object


class NodeError(Exception):
    """A storage node failed a request; `retryable` when another replica may succeed."""

    retryable = True

    def __init__(self, node: str, message: str) -> None:
        super().__init__(f"{node}: {message}")
        self.node = node


class NodeUnavailable(NodeError):
    """Connection refused or reset, a timeout, or a 5xx."""


class NodeUnreachable(NodeUnavailable):
    """No whole answer came: the connection was refused, reset or timed out (a node that is
    down, or stopped in the middle of a request), as opposed to a node that answered 5xx."""


class BlockMissing(NodeError):
    pass


class BlockCorrupted(NodeError):
    """The bytes a node returned do not match the block's checksum."""


class NodeRefused(NodeError):
    """The node refused the request itself (bad name, bad token, conflict): no retry helps."""

    retryable = False


@dataclass(frozen=True)
class NodeStatus:
    name: str
    datacenter: str
    shark: str
    capacity_bytes: int
    free_bytes: int
    block_count: int


class BlockClient:
    """One pool of connections per node, for all the nodes a process talks to.

    Connections belong to the event loop that opened them: close() the client in that loop
    when done with it. Used from another loop afterwards, it opens new connections.

    Nodes at https:// URLs are reached over TLS and their certificate checked against
    `tls_ca` (a PEM bundle; the system's CAs without it).
    """

    def __init__(
        self, secret: bytes, connections_per_node: int = 32, *, tls_ca: Path | None = None
    ) -> None:
        self.secret = secret
        self.tls_ca = tls_ca
        # Made now when a CA is named, so that a missing or bad file fails at start.
        self._tls = client_context(tls_ca) if tls_ca is not None else None
        self._connections = connections_per_node
        self._pools: dict[str, _Pool] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    async def close(self) -> None:
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.close()

    async def put_block(
        self, url: str, name: str, data: bytes | bytearray, checksum: str | None = None
    ) -> bool:
        """Store a block on one node; True if it was new there."""
        headers = {CHECKSUM_HEADER: checksum or checksum_of(data)}
        async with self._request("PUT", url, f"/blocks/{name}", data, headers) as response:
            return response.status == 201

    async def get_block(self, url: str, name: str) -> bytearray:
        """A whole block, verified against its checksum."""
        async with self._request("GET", url, f"/blocks/{name}") as response:
            expected = response.headers.get(CHECKSUM_HEADER.lower(), "")
            data = await response.read()
        if checksum_of(data) != expected:
            raise BlockCorrupted(url, f"block {name} does not match its checksum")
        return data

    async def delete_block(self, url: str, name: str) -> None:
        async with self._request("DELETE", url, f"/blocks/{name}"):
            pass

    async def delete_blocks(self, url: str, names: Sequence[str]) -> int:
        """Delete many blocks in one request; returns how many were there."""
        body = json.dumps({"names": list(names)}).encode()
        headers = {"Content-Type": "application/json"}
        async with self._request("POST", url, "/blocks/delete", body, headers) as response:
            return int((await response.json())["deleted"])

    async def inventory(self, url: str, page_size: int = 1000) -> AsyncIterator[BlockInfo]:
        """Every block a node holds, a page at a time."""
        after = ""
        while True:
            query = urlencode({"after": after, "limit": str(page_size)})
            async with self._request("GET", url, "/inventory", query=query) as response:
                page = await response.json()
            for block in page["blocks"]:
                yield BlockInfo(**block)
            if page["next"] is None:
                return
            after = page["next"]

    async def status(self, url: str) -> NodeStatus:
        """The node's /status, on a connection of its own: a health check must not wait
        behind the block transfers that hold the node's connections (a busy node would be
        taken for a silent one)."""
        async with self._request("GET", url, "/status", apart=True) as response:
            return NodeStatus(**(await response.json()))

    async def status_within(
        self, url: str, seconds: float, shark: str | None = None
    ) -> NodeStatus | None:
        """The node's /status if it answers within `seconds` (as node `shark`, when given:
        after a restart another process may listen at a node's old address), else None.
        Refused, timed out, anything else: it does not answer."""
        try:
            async with asyncio.timeout(seconds):
                status = await self.status(url)
        except Exception:
            return None
        return status if shark is None or status.shark == shark else None

    async def answering(self, urls: Mapping[str, str], seconds: float) -> set[str]:
        """The sharks of `urls` (shark: url) whose node answers its /status within `seconds`,
        as itself (`status_within`), all asked at once."""
        asked = [self.status_within(url, seconds, shark) for shark, url in urls.items()]
        statuses = await asyncio.gather(*asked)
        return {shark for shark, status in zip(urls, statuses, strict=True) if status is not None}

    async def while_answering(self, url: str, work: Awaitable[T], shark: str | None = None) -> T:
        """`work` (calls to the node at `url`), with the node asked its /status every
        WATCH_SECONDS meanwhile. Once it misses SILENT_CHECKS_TO_GIVE_UP checks in a row, the
        calls waiting on it are given up (`abandon`: each raises NodeUnreachable), so that a
        node that hangs costs the work a few seconds, not READ_TIMEOUT_SECONDS a call. For
        work that no readiness check watches (GC, the pipeline's tasks); a call that ends
        within WATCH_SECONDS costs no check."""
        task = asyncio.ensure_future(work)
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=WATCH_SECONDS)
                missed = 0
                while (
                    not task.done()
                    and await self.status_within(url, WATCH_ANSWER_SECONDS, shark) is None
                ):
                    missed += 1
                    if missed >= SILENT_CHECKS_TO_GIVE_UP:
                        self.abandon(url, f"storage node {url} did not answer {missed} checks")
                        break
            return task.result()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    def abandon(self, url: str, reason: str) -> None:
        """Give up every request waiting on the node at `url` (each raises NodeUnreachable
        now, and is not sent again) and close its connections: a node found silent, which
        may be hung, must not hold the requests that wait on it for READ_TIMEOUT_SECONDS.
        Requests made after this go to it as before."""
        pool = self._pools.get(url)
        if pool is not None:
            pool.abandon(reason)

    def _request(
        self,
        method: str,
        url: str,
        path: str,
        body: bytes | bytearray = b"",
        headers: dict[str, str] | None = None,
        query: str = "",
        *,
        apart: bool = False,
    ) -> _Call:
        headers = headers or {}
        pool = self._pool(url)
        signed = auth.Signed.request(
            pool.host_header,
            method,
            path,
            query=query,
            body=body,
            checksum=headers.get(CHECKSUM_HEADER),
            range=headers.get("Range", ""),
        )
        target = f"{path}?{query}" if query else path
        return _Call(
            pool, method, target, body, headers, lambda: auth.sign(self.secret, signed), apart=apart
        )

    def _pool(self, url: str) -> _Pool:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to the loop that opened them
            for stale in self._pools.values():
                stale.close()
            self._pools, self._loop = {}, loop
        pool = self._pools.get(url)
        if pool is None:
            pool = self._pools[url] = _Pool(url, self._connections, self._tls_context)
        return pool

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = client_context(self.tls_ca)
        return self._tls


@dataclass(frozen=True)
class ClientSettings:
    """What a process needs to make a BlockClient: the cluster secret and the CA that signed
    the nodes' certificates. Picklable, for the pipeline's executors."""

    secret: bytes = field(repr=False)  # in no log line or error, should one show these
    tls_ca: Path | None = None

    def client(self, connections_per_node: int = 32) -> BlockClient:
        return BlockClient(self.secret, connections_per_node, tls_ca=self.tls_ca)


class _Connection(asyncio.BufferedProtocol):
    """One connection to a node. Received bytes land straight in the buffer of what is being
    read: a response head in the connection's small buffer, a block's body in the bytearray
    that becomes the block. (asyncio's streams appended every piece to their own buffer and
    copied the body out again: two copies per block, a quarter of a gateway's time while it
    served large GETs; docs/decisions.md, "The node client".)"""

    def __init__(self) -> None:
        self.idle_since = time.monotonic()
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray(MAX_HEAD_BYTES)
        self._start = self._end = 0  # the unread bytes: _buffer[_start:_end]
        self._body: memoryview | None = None  # where bytes go while a body is read into it
        self._filled = 0
        self._waiter: asyncio.Future[None] | None = None
        self._lost: BaseException | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._drained: asyncio.Future[None] | None = None
        self.abandoned = False  # given up by the client: its request is not sent again
        self.apart = False  # outside the pool's count, for one request (_Pool.acquire)

    @classmethod
    async def open(cls, host: str, port: int, tls: ssl.SSLContext | None) -> _Connection:
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(
            cls, host, port, ssl=tls, server_hostname=host if tls else None
        )
        return connection

    # -- what the client does -------------------------------------------------------------

    async def send(self, head: bytes, body: bytes | bytearray) -> None:
        if self._transport is None or self._transport.is_closing():
            raise ConnectionResetError("the connection to the node is closed")
        self._transport.writelines((head, body) if body else (head,))
        while self._writing_paused:  # the transport holds more than its high-water mark
            self._drained = asyncio.get_running_loop().create_future()
            await self._drained

    async def read_head(self) -> bytes:
        """Bytes up to and including the blank line that ends a response head."""
        while True:
            end = self._buffer.find(b"\r\n\r\n", self._start, self._end)
            if end >= 0:
                head = bytes(self._buffer[self._start : end + 4])
                self._start = end + 4
                return head
            if self._start == 0 and self._end == len(self._buffer):
                raise ValueError("response head too long")
            await self._more()

    async def read_exactly(self, size: int) -> bytearray:
        """The next `size` bytes, received into the bytearray returned."""
        if size > MAX_BODY_BYTES:  # allocated up front: a confused node must not get that far
            raise ValueError(f"a response body of {size} bytes is over {MAX_BODY_BYTES}")
        body = _unfilled_bytearray(size)
        view = memoryview(body)
        taken = min(size, self._end - self._start)
        view[:taken] = memoryview(self._buffer)[self._start : self._start + taken]
        self._start += taken
        self._body, self._filled = view, taken
        try:
            while self._filled < size:
                await self._more()
        finally:
            self._body = None
        return body

    def close(self) -> None:
        # A connection of a loop that has been closed cannot schedule its own closing; its
        # socket goes with the transport.
        if self._transport is not None:
            with contextlib.suppress(RuntimeError):
                self._transport.close()

    def abandon(self, reason: str) -> None:
        """Fail what waits on this connection now (with ConnectionAbortedError), and close it."""
        self.abandoned = True
        self._lost = ConnectionAbortedError(reason)
        self._wake()
        self.resume_writing()
        self.close()

    async def _more(self) -> None:
        """Wait until more bytes arrive (or raise why none will)."""
        if self._lost is not None:
            raise ConnectionResetError(f"the node closed the connection: {self._lost!r}")
        self._compact()
        if self._reading_paused and self._has_room():
            self._reading_paused = False
            assert self._transport is not None
            self._transport.resume_reading()
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _receiving_body(self) -> bool:
        return self._body is not None and self._filled < len(self._body)

    def _has_room(self) -> bool:
        return self._receiving_body() or self._end < len(self._buffer)

    def _compact(self) -> None:
        """Move the unread bytes to the front of the buffer, to make room after them."""
        if self._start:
            unread = self._end - self._start
            self._buffer[:unread] = self._buffer[self._start : self._end]
            self._start, self._end = 0, unread

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- what the event loop calls --------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._receiving_body():
            assert self._body is not None
            return self._body[self._filled :]
        if self._end == len(self._buffer):
            self._compact()
        return memoryview(self._buffer)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._receiving_body():
            self._filled += nbytes
        else:
            self._end += nbytes
        if not self._has_room():  # until the reader takes some
            assert self._transport is not None
            self._transport.pause_reading()
            self._reading_paused = True
        self._wake()

    def eof_received(self) -> bool:
        self._lost = EOFError("end of stream")
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = exc or EOFError("connection closed")
        self._wake()
        self.resume_writing()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)


class _Pool:
    """Kept-alive connections to one node, at most `size` at a time, the last used first."""

    def __init__(self, url: str, size: int, tls: Callable[[], ssl.SSLContext]) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"a node URL is http(s)://host:port, not {url!r}")
        self.url = url
        self.host = parts.hostname
        self.tls = tls() if parts.scheme == "https" else None
        self.port = parts.port or (443 if self.tls else 80)
        self.host_header = parts.netloc
        self._idle: list[_Connection] = []
        self._busy: set[_Connection] = set()
        self._slots = asyncio.Semaphore(size)

    async def acquire(self, fresh: bool, apart: bool = False) -> tuple[_Connection, bool]:
        """A connection (a new one if `fresh`), and whether it was used before (and so may
        have been closed by the node). `apart`: a new connection outside the pool's count,
        closed after its one request, that waits for no other."""
        if apart:
            async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
                connection = await _Connection.open(self.host, self.port, self.tls)
            connection.apart = True
            self._busy.add(connection)
            return connection, False
        await self._slots.acquire()
        try:
            connection, reused = await self._take(fresh)
        except BaseException:
            self._slots.release()
            raise
        self._busy.add(connection)
        return connection, reused

    async def _take(self, fresh: bool) -> tuple[_Connection, bool]:
        now = time.monotonic()
        while self._idle and not fresh:
            connection = self._idle.pop()
            if now - connection.idle_since < KEEP_IDLE_SECONDS:
                return connection, True
            connection.close()
        async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
            return await _Connection.open(self.host, self.port, self.tls), False

    def release(self, connection: _Connection, reusable: bool) -> None:
        self._busy.discard(connection)
        if connection.apart:
            connection.close()
            return
        if reusable and not connection.abandoned:
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
        else:
            connection.close()
        self._slots.release()

    def abandon(self, reason: str) -> None:
        """Fail the requests in flight on this node's connections, and close them all."""
        self.close()
        for connection in list(self._busy):
            connection.abandon(reason)

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


class _Response:
    """A response's status and head; its body is read (or streamed) once."""

    def __init__(
        self,
        connection: _Connection,
        status: int,
        headers: dict[str, str],
        has_body: bool,
        node: str,
        where: str,
    ) -> None:
        self.connection = connection
        self.node = node  # the node's URL and the request, for errors
        self.where = where
        self.status = status
        self.headers = headers
        self.length = int(headers.get("content-length", "0"))
        self.remaining = self.length if has_body else 0  # a HEAD's length has no body
        self.keep_alive = headers.get("connection", "").lower() != "close"

    @property
    def reusable(self) -> bool:
        """Whether the connection can carry another request: the body was read to its end."""
        return self.keep_alive and self.remaining == 0

    async def read(self) -> bytearray:
        try:
            async with asyncio.timeout(READ_TIMEOUT_SECONDS):
                data = await self.connection.read_exactly(self.remaining)
        except _BROKEN as exc:
            raise self._broken(exc) from None
        self.remaining = 0
        return data

    def _broken(self, exc: BaseException) -> NodeUnreachable:
        return NodeUnreachable(self.node, f"{self.where}: reading the body: {exc!r}")

    async def json(self) -> Any:
        return json.loads(await self.read())

    async def text(self) -> str:
        return (await self.read()).decode("utf-8", "replace")


# What a node that went away looks like to a reader or writer of its connection.
_BROKEN = (OSError, EOFError, ValueError)


class _Call:
    """`async with` one request: connection failures and error statuses become NodeErrors.

    A request on a kept-alive connection that fails before any response arrives is sent again
    once on a new connection: the node may have closed the idle connection as the request
    left. Every node request is idempotent (a block PUT again with the same bytes is a 200).
    Each attempt carries a token of its own (`authorize`): a node accepts a token once.
    """

    def __init__(
        self,
        pool: _Pool,
        method: str,
        target: str,
        body: bytes | bytearray,
        headers: dict[str, str],
        authorize: Callable[[], str],
        *,
        apart: bool = False,
    ) -> None:
        self.pool = pool
        self.method = method
        self.target = target
        self.body = body
        self.headers = headers
        self.authorize = authorize
        self.response: _Response | None = None
        self.apart = apart  # on a connection of its own (_Pool.acquire)

    async def __aenter__(self) -> _Response:
        fresh = False
        while True:
            try:
                connection, reused = await self.pool.acquire(fresh, self.apart)
            except OSError as exc:  # refused, unreachable, timed out
                raise self._unavailable(exc) from None
            try:
                response = await self._exchange(connection)
            except _BROKEN as exc:
                self.pool.release(connection, reusable=False)
                # Only a kept-alive connection the node closed as the request left is worth
                # a second try; a node that took too long, or was given up, would be waited
                # for twice.
                if reused and not connection.abandoned and not isinstance(exc, TimeoutError):
                    fresh = True
                    continue
                raise self._unavailable(exc) from None
            except BaseException:
                self.pool.release(connection, reusable=False)
                raise
            try:
                await self._check_status(response)
            except BaseException:
                self.pool.release(connection, response.reusable)
                raise
            self.response = response
            return response

    async def __aexit__(self, exc_type: object, *exc: object) -> None:
        if self.response is not None:
            response, self.response = self.response, None
            self.pool.release(response.connection, exc_type is None and response.reusable)

    async def _exchange(self, connection: _Connection) -> _Response:
        head = [f"{self.method} {self.target} HTTP/1.1", f"Host: {self.pool.host_header}"]
        head += [f"{key}: {value}" for key, value in self.headers.items()]
        head.append(f"Authorization: {self.authorize()}")
        if self.body or self.method in ("PUT", "POST"):
            head.append(f"Content-Length: {len(self.body)}")
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
        async with asyncio.timeout(READ_TIMEOUT_SECONDS):
            await connection.send(request, self.body)
            status, headers = _parse_head(await connection.read_head())
        has_body = self.method != "HEAD"
        return _Response(connection, status, headers, has_body, self.pool.url, self._where())

    async def _check_status(self, response: _Response) -> None:
        """Error statuses as NodeErrors, with the start of what the node said."""
        status = response.status
        if status < 400:
            return
        where = self._where()
        text = (await response.text())[:200]  # read, so that the connection can be kept
        if status == 404:
            raise BlockMissing(self.pool.url, f"{where}: not found")
        if status == 401 and text.startswith(auth.EXPIRED):
            # The node read the request only after its token's lifetime: it did not answer
            # for that long (hung, or stopped), which no retry to it now would change.
            raise NodeUnreachable(self.pool.url, f"{where}: read too late ({text})")
        if status >= 500:
            raise NodeUnavailable(self.pool.url, f"{where}: {status} {text}")
        raise NodeRefused(self.pool.url, f"{where}: {status} {text}")

    def _unavailable(self, exc: BaseException) -> NodeUnreachable:
        return NodeUnreachable(self.pool.url, f"{self._where()}: {exc!r}")

    def _where(self) -> str:
        return f"{self.method} {self.target.split('?')[0]}"


def _unfilled_bytearray(size: int) -> bytearray:
    """A bytearray of `size` bytes, not zeroed first: only for a buffer that is filled to its
    end before it is read, as `read_exactly` fills a block (it returns one only whole). The
    zeroing that `bytearray(size)` does was 8% of a gateway's CPU (perf) while it served
    large GETs (docs/decisions.md, "Block buffers not zeroed"; bench/cpu_split.py big-get)."""
    body = _bytearray_from(None, size)
    assert isinstance(body, bytearray)
    return body


def _parse_head(raw: bytes) -> tuple[int, dict[str, str]]:
    """Status and headers (names in lower case) of a response head."""
    if len(raw) > MAX_HEAD_BYTES:
        raise ValueError("response head too long")
    lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1.x response: {lines[0][:80]!r}")
    status = int(rest[:3])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return status, headers
