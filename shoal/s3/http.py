"""HTTP/1.1 for the gateway: requests parsed by httptools (llhttp, the parser of Node.js),
answered by one handler coroutine each, in as few Python calls and writes as we can.

Why not a framework: a 4 KiB answer cost the gateway more than twice the CPU in aiohttp's
request and response objects as in a bare protocol on the same parser (docs/decisions.md,
"The gateway's own HTTP server"; `bench/gateway_instructions.py get`). The gateway needs little
of a framework: one route (router.py is S3's own), no sessions, no cookies, and one form
(POST Object's, read by post.py). What it does need is here and tested in
tests/integration/test_http.py: keep-alive, pipelined requests answered in order,
`Expect: 100-continue`, chunked request bodies, flow control both ways, a body that the
handler did not read drained (or the connection closed), and a lost connection surfacing as
ConnectionResetError to whoever reads the body or writes the response.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from http import HTTPStatus
from typing import TypeVar, cast, overload
from urllib.parse import unquote

import httptools

from shoal import httpdate
from shoal.loop import TIMER_SLACK_SECONDS
from shoal.workers import LISTEN_BACKLOG

# Query parameters of presigned URLs (SigV4, SigV2) that let whoever holds the URL send it.
_QUERY_SECRET = re.compile(
    r"(?<![^&])(?P<name>X-Amz-Signature|Signature|X-Amz-Security-Token)=[^&]*", re.IGNORECASE
)
log = logging.getLogger("shoal.http")

# A connection stops reading from its socket while this much of a request body waits to be
# consumed, and reads again below the low mark: a slow disk never makes the gateway buffer a
# whole upload.
BODY_HIGH_WATER = 4 * 1024 * 1024
BODY_LOW_WATER = 1024 * 1024
# A request line and headers larger than this are refused (431), as most servers do at 8-64 KiB.
MAX_HEAD_BYTES = 64 * 1024
# A request with more header lines than this is refused (431): S3 requests carry a few dozen.
MAX_HEADER_LINES = 256
# A request head (its line and all its headers) must arrive within this long of its first
# byte, or the connection is answered 400 RequestTimeout and closed: a client that sends one
# header line now and then never holds a connection for long ([s3] request_head_seconds).
HEAD_SECONDS = 20.0
# Its answer: S3's error for a client too slow, which SDKs retry on a new connection.
REQUEST_TIMEOUT_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>RequestTimeout</Code><Message>Your '
    b"socket connection to the server was not read from or written to within the timeout "
    b"period.</Message></Error>"
)
# An idle keep-alive connection is closed after this long (aiohttp's and nginx's 75 s).
KEEPALIVE_SECONDS = 75.0
# After its response, the part of a request body nobody read is read and dropped for this
# long, so that the client sees the response rather than a reset while it still sends.
LINGER_SECONDS = 10.0
# How long a stopping server waits for requests in progress before it closes their sockets.
SHUTDOWN_GRACE_SECONDS = 10.0
# After its last answer, a connection closed for a bad request reads and drops for this long.
REFUSAL_LINGER_SECONDS = 2.0
# A request body that brings no byte for this long fails its reader (S3's RequestTimeout).
BODY_IDLE_SECONDS = 60.0
# A connection stops reading while this many requests wait for their answers (pipelining):
# a client that sends and never reads holds a bounded amount of the gateway's memory.
MAX_QUEUED_REQUESTS = 16

_NO_BODY_STATUSES = frozenset({204, 304})
_REASONS = {status.value: status.phrase for status in HTTPStatus}


_T = TypeVar("_T")


class Headers(dict[str, str]):
    """Request headers by lowercase name; a repeated header is its values joined by commas
    (RFC 9110, 5.3; SigV4 canonicalizes them the same way). Lookups take any case. Values
    (and the request target) are decoded as UTF-8, bytes that are not kept as surrogates,
    so that SigV4 signs what the client sent and a stored value goes back out as it came."""

    @overload
    def get(self, name: str, default: None = None, /) -> str | None: ...
    @overload
    def get(self, name: str, default: str, /) -> str: ...
    @overload
    def get(self, name: str, default: _T, /) -> str | _T: ...
    def get(self, name: str, default: object = None, /) -> object:
        return dict.get(self, name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return dict.__getitem__(self, name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and dict.__contains__(self, name.lower())


class Body:
    """A request body as it arrives: an async iterator of chunks, whole once `complete`.

    Reading it after the connection was lost raises ConnectionResetError, so a truncated
    upload can never look like a whole one.
    """

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self.complete = False
        self._error: BaseException | None = None
        self.received = 0  # bytes of the body that arrived (after any HTTP chunked framing)
        # `Expect: 100-continue`, and no 100 sent yet: it goes out when the handler first
        # wants the body, so a request refused before that sends no body.
        self.continue_expected = False

    @property
    def awaiting_continue(self) -> bool:
        """The client waits for a 100 Continue that was not sent, and has sent nothing."""
        return self.continue_expected and not self.complete and self.received == 0

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self.complete:
                raise StopAsyncIteration
            self._connection.body_wanted(self)
            loop = asyncio.get_running_loop()
            self._waiter = loop.create_future()
            timer = loop.call_later(BODY_IDLE_SECONDS, self._time_out)
            try:
                await self._waiter
            finally:
                timer.cancel()
                self._waiter = None
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        if self._buffered < BODY_LOW_WATER:
            self._connection.resume_reading()
        return chunk

    def _feed(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        self.received += len(chunk)
        if self._buffered > BODY_HIGH_WATER:
            self._connection.pause_reading()
        self._wake()

    def _finish(self) -> None:
        self.complete = True
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if not self.complete:
            self._error = error
            self._wake()

    def _time_out(self) -> None:
        self._fail(BodyTimeout(f"no request body bytes for {BODY_IDLE_SECONDS:.0f} s"))

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class BodyTimeout(ConnectionResetError):
    """The client stopped sending a request body it had announced."""


class BodyIncomplete(ConnectionResetError):
    """The client half-closed or closed the connection before the end of a request body."""


class Request:
    """One request as the handler sees it: method, target, headers and the body stream."""

    __slots__ = (
        "_connection",
        "answered",
        "body",
        "headers",
        "keep_alive",
        "method",
        "raw_path",
        "response_headers",
        "response_started",
        "stream",
    )

    def __init__(
        self,
        connection: _Connection,
        method: str,
        raw_path: str,
        headers: Headers,
        keep_alive: bool,
    ) -> None:
        self._connection = connection
        self.method = method
        self.raw_path = raw_path  # path and query, as sent (percent-encoded)
        self.headers = headers
        self.keep_alive = keep_alive
        self.body = Body(connection)
        # Headers every response to this request carries (a request id, say).
        self.response_headers: dict[str, str] = {}
        self.response_started = False
        # Called once the answer is out (or cut short) and the unread body drained: the
        # handler's account of the request (the access log), with every byte counted.
        self.answered: Callable[[Response | None], None] | None = None
        self.stream: StreamResponse | None = None  # the streamed answer, once prepared

    @property
    def host(self) -> str:
        return self.headers.get("host", "")

    @property
    def path(self) -> str:
        """The path, percent-decoded."""
        return unquote(self.raw_path.partition("?")[0])

    @property
    def shown_path(self) -> str:
        """The path and query for a log line: a presigned URL's signature (and session
        token) hidden, since the URL is a credential of its own until it expires."""
        path, question, query = self.raw_path.partition("?")
        if not question:
            return path
        return f"{path}?{_QUERY_SECRET.sub(lambda m: m['name'] + '=***', query)}"

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("content-length")
        return int(value) if value is not None and value.isdigit() else None


class Response:
    """A response sent whole: status, headers and (unless the request was a HEAD) the body."""

    def __init__(
        self,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
    ) -> None:
        self.status = status
        self.headers: dict[str, str] = dict(headers) if headers else {}
        self.body = body
        self.content_length: int | None = len(body) if body is not None else 0
        if content_type is not None:
            self.headers["Content-Type"] = content_type

    @property
    def body_bytes_sent(self) -> int:
        return len(self.body) if self.body is not None else 0


class StreamResponse(Response):
    """A response whose body is written in parts: set `content_length`, `prepare`, `write`
    each part, then `write_eof`. The head goes out with the first part, so a handler that
    fails before it has written anything can still answer with an error. A handler may also
    return it unprepared (a HEAD's answer): it is then sent as a head alone.

    `chunked`: a body of a length not known when it starts, sent with Transfer-Encoding:
    chunked (`content_length` stays None); `flush` sends the head at once."""

    def __init__(
        self, status: int = 200, headers: Mapping[str, str] | None = None, chunked: bool = False
    ) -> None:
        super().__init__(status, headers)
        self.content_length = None
        self.chunked = chunked
        if chunked:
            self.headers["Transfer-Encoding"] = "chunked"
        self._request: Request | None = None
        self._head: bytes | None = None  # prepared, not yet sent
        self._written = 0
        self.finished = False

    @property
    def prepared(self) -> bool:
        return self._request is not None

    async def prepare(self, request: Request) -> None:
        """Commit to this status and these headers (checked here, sent with the body)."""
        if self.content_length is None and not self.chunked:
            raise ValueError("a streamed response declares its length before it starts")
        self._head = request._connection.head(request, self)
        self._request = request
        request.stream = self

    async def write(self, chunk: bytes | bytearray) -> None:
        assert self._request is not None, "prepare() first"
        if self.chunked:
            if chunk:
                self._written += len(chunk)
                await self._send(_joined(self._head, b"%x\r\n" % len(chunk) + chunk + b"\r\n"))
            return
        assert self.content_length is not None
        if self._written + len(chunk) > self.content_length:
            raise ValueError("a response body longer than its Content-Length")
        self._written += len(chunk)
        await self._send(_joined(self._head, chunk))

    async def flush(self) -> None:
        """Send the head now, before any of the body."""
        if self._head is not None:
            await self._send(self._head)

    async def write_eof(self) -> None:
        if self.chunked:
            await self._send(_joined(self._head, b"0\r\n\r\n"))
        elif self._head is not None:
            await self._send(self._head)
        self.finished = True

    async def _send(self, data: _Outgoing) -> None:
        assert self._request is not None
        self._head = None
        self._request.response_started = True
        await self._request._connection.send_body(data)

    @property
    def body_bytes_sent(self) -> int:
        return self._written


Handler = Callable[[Request], Awaitable[Response]]

# What is written to the socket: one piece, or pieces written together (a head and a body
# too large to copy onto it). A block read from the storage nodes is a bytearray.
_Outgoing = bytes | bytearray | list[bytes | bytearray]

# A body up to this size goes out in one write with its head; a larger one is not copied.
JOIN_BODY_BYTES = 64 * 1024


def _joined(head: bytes | None, body: bytes | bytearray) -> _Outgoing:
    if head is None:
        return body
    return head + body if len(body) <= JOIN_BODY_BYTES else [head, body]


class _Connection(asyncio.Protocol):
    """One client connection: parses requests as bytes arrive and answers them in order."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self._loop = server.loop
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._closed = False
        self._reading_paused = False
        self._writable: asyncio.Future[None] | None = None
        self._write_paused = False
        self._waiting: collections.deque[Request] = collections.deque()
        self._responder: asyncio.Task[None] | None = None
        # When an idle connection is closed, and when a request head still arriving is too
        # slow (None: not now). Every request moves them, and one timer serves both: armed
        # for the earliest, it finds a deadline moved later not yet reached and arms itself
        # again. Timers made and cancelled twice per request cost about 8 us of a HEAD
        # (docs/decisions.md, "Small cuts per request").
        self._idle_deadline: float | None = None
        self._head_deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        # No more requests will be read: the client half-closed, or sent what cannot be
        # parsed (then `_refusal` is the answer, sent after those before it).
        self._done_reading = False
        self._refusal: bytes | None = None
        # The request being parsed.
        self._in_head = True
        self._head_received = 0
        self._url = b""
        self._head_bytes = 0
        self._header_pairs: list[tuple[bytes, bytes]] = []
        self._current: Request | None = None
        self._latest: Request | None = None

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._server.connections.add(self)
        self._set_idle_deadline()

    def data_received(self, data: bytes) -> None:
        if self._done_reading:
            return
        if self._in_head:
            # httptools hands a header over only when its line ends: count what arrives.
            self._head_received += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._ignore_upgrade()
            return
        except httptools.HttpParserError as exc:
            # An exception in a callback reaches here wrapped as a parser error.
            if self._head_bytes > MAX_HEAD_BYTES or len(self._header_pairs) > MAX_HEADER_LINES:
                self._refuse(431, "request head too large")
            else:
                self._refuse(400, f"malformed request: {exc}")
            return
        if self._in_head and self._head_received > MAX_HEAD_BYTES:
            self._refuse(431, "request head too large")

    def eof_received(self) -> bool:
        """The client will send no more: answer what it asked, then close."""
        self._done_reading = True
        self._clear_head_deadline()
        self._abandon_current(BodyIncomplete("the client stopped sending mid-request"))
        return self._responder is not None  # False closes the transport: nothing to answer

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._server.connections.discard(self)
        self._stop_timer()
        lost = BodyIncomplete("the client closed the connection")
        for request in (self._current, *self._waiting):
            if request is not None:
                request.body._fail(lost)
        if self._writable is not None and not self._writable.done():
            self._writable.set_exception(lost)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    # -- httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._head_bytes = 0
        self._header_pairs = []
        self._set_head_deadline()

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        # Called for every header line of every request: _count_head's check, inline.
        self._header_pairs.append((name, value))
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > MAX_HEAD_BYTES:
            raise ValueError("request head too large")
        if len(self._header_pairs) > MAX_HEADER_LINES:
            raise ValueError("too many header lines")

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._clear_idle_deadline()
        self._clear_head_deadline()
        headers = Headers()
        for raw_name, raw_value in self._header_pairs:
            name = raw_name.decode("latin-1").lower()
            value = raw_value.decode("utf-8", "surrogateescape").strip()
            # The names are lowercase already: dict's own lookup, not Headers' any-case one.
            earlier = dict.get(headers, name)
            headers[name] = value if earlier is None else f"{earlier},{value}"
        method = self._parser.get_method().decode("ascii")
        request = Request(
            self,
            method,
            self._url.decode("utf-8", "surrogateescape"),
            headers,
            self._parser.should_keep_alive(),
        )
        self._current = self._latest = request
        self._waiting.append(request)
        if len(self._waiting) >= MAX_QUEUED_REQUESTS:
            self.pause_reading()
        if self._responder is None:
            self._responder = self._loop.create_task(self._respond_in_order())

    def on_body(self, chunk: bytes) -> None:
        assert self._current is not None
        self._current.body._feed(chunk)

    def on_message_complete(self) -> None:
        assert self._current is not None
        self._current.body._finish()
        self._current = None
        self._in_head = True
        self._head_received = 0

    # -- flow control, used by Body ---------------------------------------------------------

    def pause_reading(self) -> None:
        if not self._reading_paused and self._transport is not None and not self._closed:
            self._reading_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused and self._transport is not None and not self._closed:
            self._reading_paused = False
            self._transport.resume_reading()

    def body_wanted(self, body: Body) -> None:
        """A handler waits for body bytes: the client is told to go on if it waits for that,
        and a paused socket must read again (a pipelined request's body may have filled the
        buffer while this one was parsed)."""
        if body.continue_expected:
            body.continue_expected = False
            self._write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.resume_reading()

    # -- answering --------------------------------------------------------------------------

    async def _respond_in_order(self) -> None:
        try:
            while self._waiting and not self._closed:
                request = self._waiting.popleft()
                if len(self._waiting) < MAX_QUEUED_REQUESTS:
                    self.resume_reading()
                carry_on = await self._respond(request)
                if carry_on is None:
                    self._close()  # an answer cut short: nothing may follow it
                    return
                if not carry_on:
                    self._end()
                    return
            if self._done_reading:
                self._end()
            elif not self._closed:
                self._set_idle_deadline()
        finally:
            self._responder = None
            while self._waiting:  # never to be answered: the connection closed before them
                self._server.tell_unanswered(self._waiting.popleft())

    async def _respond(self, request: Request) -> bool | None:
        """Answer one request; whether the connection can carry another (None: the answer
        was cut short)."""
        if request.headers.get("expect", "").lower() == "100-continue":
            request.body.continue_expected = True
        try:
            response = await self._server.handler(request)
        except Exception:
            if request.response_started:
                # The handler logged it; a half-sent body can only be cut off.
                _tell_answered(request, request.stream)
                return None
            log.exception("%s %s failed", request.method, request.shown_path)
            response = Response(500)
            request.keep_alive = False
        # Answered: a 100 Continue may no longer go out, not even while what the client sends
        # unasked is drained below.
        awaiting = request.body.awaiting_continue
        request.body.continue_expected = False
        if isinstance(response, StreamResponse) and response.prepared:
            whole = response.finished and (
                response.chunked or response.body_bytes_sent == response.content_length
            )
            if not whole:
                _tell_answered(request, response)
                return None  # only closing the connection tells the client
        else:
            if awaiting:
                # Answered without its body, which the client has not sent: it is told the
                # connection ends rather than left to guess whether to send the body now.
                request.keep_alive = False
            await self._send_whole(request, response)
        # What the client sent of this request and nobody read is read and dropped, also
        # before a close: closing on unread bytes makes the kernel reset the connection,
        # which can destroy the answer on its way. A body never asked for is never waited for.
        drained = not awaiting and await _drained(request.body)
        _tell_answered(request, response)
        return drained and request.keep_alive and not self._done_reading and not self._closed

    async def _send_whole(self, request: Request, response: Response) -> None:
        if not request.keep_alive:
            response.headers["Connection"] = "close"
        try:
            head = self.head(request, response)
        except ValueError:
            log.exception("%s %s: response not sent", request.method, request.shown_path)
            request.keep_alive = False
            response = Response(500, {"Connection": "close"})
            head = self.head(request, response)
        request.response_started = True
        with_body = request.method != "HEAD" and response.status not in _NO_BODY_STATUSES
        try:  # noqa: SIM105 - contextlib.suppress is three Python calls on every response
            await self.send_body(
                _joined(head, response.body) if with_body and response.body else head
            )
        except ConnectionResetError:
            pass  # the client left: nobody to tell

    def head(self, request: Request, response: Response) -> bytes:
        """The status line and headers of `response` (Content-Length, Date and Server
        added). ValueError for a header value with a line break (it would split the
        response)."""
        status = response.status
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\nServer: Shoal\r\n"]
        lines.append(f"Date: {httpdate.now()}\r\n")
        for name, value in request.response_headers.items():
            if name not in response.headers:
                lines.append(f"{name}: {value}\r\n")
        for name, value in response.headers.items():
            if "\n" in value or "\r" in value:
                raise ValueError(f"header {name} has a line break")
            lines.append(f"{name}: {value}\r\n")
        chunked = isinstance(response, StreamResponse) and response.chunked
        if status not in _NO_BODY_STATUSES and status >= 200 and not chunked:
            length = response.content_length
            lines.append(f"Content-Length: {length if length is not None else 0}\r\n")
        lines.append("\r\n")
        return "".join(lines).encode("utf-8", "surrogateescape")

    async def send_body(self, data: _Outgoing) -> None:
        """Write, then wait while the socket's buffer is full."""
        if self._closed:
            raise ConnectionResetError("the client closed the connection")
        self._write(data)
        if self._write_paused:
            self._writable = self._loop.create_future()
            try:
                await self._writable
            finally:
                self._writable = None

    def _write(self, data: _Outgoing) -> None:
        if self._transport is not None and not self._closed:
            if isinstance(data, list):
                self._transport.writelines(data)
            else:
                self._transport.write(data)

    def _refuse(self, status: int, reason: str, xml_body: bytes | None = None) -> None:
        """Bytes that cannot be parsed (or came too slowly): the requests before them are
        answered, then this answer (plain `reason`, or an S3 XML error), then the connection
        is closed."""
        log.info("refused a request: %s", reason)
        self._done_reading = True
        self._clear_head_deadline()
        if self._abandon_current(BodyIncomplete(reason)):
            return  # that request is being answered; its answer is the last
        body = xml_body if xml_body is not None else reason.encode() + b"\n"
        content_type = "application/xml" if xml_body is not None else "text/plain"
        self._refusal = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Bad Request')}\r\nServer: Shoal\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + body
        )
        if self._responder is None:
            self._end()

    def _end(self) -> None:
        """The last answer is out: send the refusal if there is one, then close. The
        connection first stops sending and reads (and drops) what the client still sends,
        for up to REFUSAL_LINGER_SECONDS: closing with unread bytes resets the connection,
        and a reset can destroy the answer before the client reads it."""
        if self._closed or self._transport is None:
            return
        if self._refusal is not None:
            self._write(self._refusal)
            self._refusal = None
        self._done_reading = True
        if self._transport.can_write_eof():
            self._transport.write_eof()
            self._loop.call_later(REFUSAL_LINGER_SECONDS, self._close)
        else:
            self._close()

    def _abandon_current(self, error: ConnectionResetError) -> bool:
        """Fail the body of the request being received, which will never be whole; drop the
        request if it is still queued. Whether it is being answered already."""
        current, self._current = self._current, None
        if current is None:
            return False
        current.body._fail(error)
        current.keep_alive = False
        if current in self._waiting:
            self._waiting.remove(current)
            self._server.tell_unanswered(current)
            return False
        return True

    def _ignore_upgrade(self) -> None:
        """`Upgrade:` (h2c, websocket) is ignored, as RFC 9110 allows: the request is
        answered in HTTP/1.1, and since the parser stops at an upgrade, the connection is
        closed after the answer."""
        self._done_reading = True
        if self._latest is not None:
            self._latest.keep_alive = False
        self._abandon_current(ConnectionResetError("an upgrade request's body"))
        if self._responder is None:
            self._end()

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            raise ValueError("request head too large")

    def _close(self) -> None:
        if self._transport is not None and not self._closed:
            self._transport.close()

    def _set_idle_deadline(self) -> None:
        self._idle_deadline = self._loop.time() + KEEPALIVE_SECONDS
        self._arm_timer(self._idle_deadline)

    def _clear_idle_deadline(self) -> None:
        self._idle_deadline = None

    def _set_head_deadline(self) -> None:
        self._head_deadline = self._loop.time() + self._server.head_seconds
        self._arm_timer(self._head_deadline)

    def _clear_head_deadline(self) -> None:
        self._head_deadline = None

    def _arm_timer(self, deadline: float) -> None:
        """Have the timer fire no later than `deadline`."""
        if deadline < self._timer_at:
            self._stop_timer()
            self._timer = self._loop.call_at(deadline, self._deadline_reached)
            self._timer_at = deadline

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, math.inf

    def _deadline_reached(self) -> None:
        self._timer, self._timer_at = None, math.inf
        now = self._loop.time() + TIMER_SLACK_SECONDS
        if self._head_deadline is not None and now >= self._head_deadline:
            self._head_deadline = None
            self._head_too_slow()
        if self._idle_deadline is not None and now >= self._idle_deadline:
            self._idle_deadline = None
            self._close()
        for deadline in (self._head_deadline, self._idle_deadline):
            if deadline is not None and not self._closed:
                self._arm_timer(deadline)

    def _head_too_slow(self) -> None:
        if self._reading_paused:
            self._set_head_deadline()  # the gateway is not reading: not the client's delay
            return
        self._refuse(400, "request head not received in time", REQUEST_TIMEOUT_BODY)

    @property
    def busy(self) -> bool:
        return self._responder is not None


def _tell_answered(request: Request, response: Response | None) -> None:
    """Run the request's `answered` callback (None: no answer was sent)."""
    if request.answered is not None:
        try:
            request.answered(response)
        except Exception:
            log.exception("%s %s: after its answer", request.method, request.shown_path)


async def _drained(body: Body) -> bool:
    """Read what is left of a body nobody consumed; whether it ended in time."""
    if body.complete and not body._chunks:
        return True
    try:
        async with asyncio.timeout(LINGER_SECONDS):
            async for _ in body:
                pass
    except (TimeoutError, ConnectionResetError):
        return False
    return True


class Server:
    """Serves `handler` on listening sockets until `close`. `unanswered` is told of each
    request that was received (its head whole) and never handed to `handler`: its
    connection was lost or cut off before its turn."""

    def __init__(
        self,
        handler: Handler,
        head_seconds: float = HEAD_SECONDS,
        unanswered: Callable[[Request], None] | None = None,
    ) -> None:
        self.handler = handler
        self.head_seconds = head_seconds
        self.unanswered = unanswered
        self.loop = asyncio.get_running_loop()
        self.connections: set[_Connection] = set()
        self._listeners: list[asyncio.AbstractServer] = []

    async def listen(self, sock: socket.socket) -> None:
        # create_server listens on `sock` again, with its own backlog unless told the
        # socket's: every worker process does so on the one shared socket.
        listener = await self.loop.create_server(
            lambda: _Connection(self), sock=sock, backlog=LISTEN_BACKLOG
        )
        self._listeners.append(listener)

    def tell_unanswered(self, request: Request) -> None:
        if self.unanswered is not None:
            try:
                self.unanswered(request)
            except Exception:
                log.exception("%s %s: unanswered", request.method, request.shown_path)

    async def close(self, grace: float = SHUTDOWN_GRACE_SECONDS) -> None:
        """Stop accepting, let requests in progress finish (up to `grace`), close the rest."""
        for listener in self._listeners:
            listener.close()
        deadline = time.monotonic() + grace
        while any(c.busy for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for connection in list(self.connections):
            connection._close()
        for listener in self._listeners:
            with contextlib.suppress(Exception):
                await listener.wait_closed()


async def serve(
    handler: Handler,
    sock: socket.socket,
    head_seconds: float = HEAD_SECONDS,
    unanswered: Callable[[Request], None] | None = None,
) -> Server:
    server = Server(handler, head_seconds, unanswered)
    await server.listen(sock)
    return server
