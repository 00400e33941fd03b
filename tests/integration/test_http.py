"""The gateway's HTTP/1.1 server (shoal/s3/http.py) on loopback, spoken to over raw sockets:
what a framework used to do for the gateway and S3 clients rely on."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop

from shoal.s3 import http

_servers: list[http.Server] = []


def server_connections() -> set[Any]:
    """The connections of the server `run` started last (to look at their state)."""
    return _servers[-1].connections


def run(handler: http.Handler, client: Callable[[int], Awaitable[Any]]) -> Any:
    """Serve `handler` on a loopback port and run `client(port)` against it."""

    async def main() -> Any:
        sock = socket.create_server(("127.0.0.1", 0))
        server = await http.serve(handler, sock)
        _servers.append(server)
        try:
            return await asyncio.wait_for(client(sock.getsockname()[1]), 60)
        finally:
            await server.close(grace=1)

    return uvloop.run(main())


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One response: status, headers (lowercase names) and the body its length says."""
    return await read_response_after(await reader.readuntil(b"\r\n\r\n"), reader)


async def read_response_after(
    head: bytes, reader: asyncio.StreamReader
) -> tuple[int, dict[str, str], bytes]:
    """The rest of a response whose head was read already."""
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    return int(status_line.split()[1]), headers, await reader.readexactly(length)


async def echo(request: http.Request) -> http.Response:
    """The method, path and the body's length and digest."""
    digest, size = hashlib.sha256(), 0
    async for chunk in request.body:
        digest.update(chunk)
        size += len(chunk)
    text = f"{request.method} {request.raw_path} {size} {digest.hexdigest()}"
    return http.Response(body=text.encode(), content_type="text/plain")


def request_bytes(method: str, path: str, body: bytes = b"", **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def test_keep_alive_and_pipelined_requests_are_answered_in_order() -> None:
    async def slow_first(request: http.Request) -> http.Response:
        if request.raw_path == "/first":
            await asyncio.sleep(0.2)
        return await echo(request)

    async def client(port: int) -> list[bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes("PUT", "/first", b"one") + request_bytes("GET", "/second?x=1"))
        bodies = [(await read_response(reader))[2] for _ in range(2)]
        writer.write(request_bytes("DELETE", "/third"))  # the same connection, kept alive
        bodies.append((await read_response(reader))[2])
        writer.close()
        return bodies

    first, second, third = run(slow_first, client)
    assert first.startswith(b"PUT /first 3 ")
    assert second.startswith(b"GET /second?x=1 0 ")
    assert third.startswith(b"DELETE /third 0 ")


def test_expect_100_continue_and_chunked_bodies() -> None:
    body = b"chunked body " * 1000

    async def client(port: int) -> tuple[bytes, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes("PUT", "/e", Expect="100-continue", Content_Length="5"))
        interim = await reader.readuntil(b"\r\n\r\n")
        writer.write(b"hello")
        expected = (await read_response(reader))[2]
        chunks = (
            b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:7], body[7:])) + b"0\r\n\r\n"
        )
        writer.write(request_bytes("PUT", "/c", Transfer_Encoding="chunked") + chunks)
        chunked = (await read_response(reader))[2]
        writer.close()
        assert interim.startswith(b"HTTP/1.1 100 Continue")
        return expected, chunked

    expected, chunked = run(echo, client)
    assert expected == f"PUT /e 5 {hashlib.sha256(b'hello').hexdigest()}".encode()
    assert chunked == f"PUT /c {len(body)} {hashlib.sha256(body).hexdigest()}".encode()


def test_a_request_refused_before_its_body_is_read_gets_no_100_continue() -> None:
    async def refuse_or_echo(request: http.Request) -> http.Response:
        if request.raw_path == "/refused":
            return http.Response(status=404, body=b"no such bucket")
        return await echo(request)

    async def client(port: int) -> tuple[bytes, int, dict[str, str], bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = request_bytes("PUT", "/refused", Expect="100-continue", Content_Length="9000")
        writer.write(head)  # and, waiting for 100 Continue, no body
        first = await reader.readuntil(b"\r\n\r\n")
        status, headers, body = await read_response_after(first, reader)
        closed = await reader.read()  # the server ends the connection: no body is owed
        writer.close()
        return first, status, headers, body + closed

    first, status, headers, rest = run(refuse_or_echo, client)
    assert first.startswith(b"HTTP/1.1 404") and status == 404
    assert headers["connection"] == "close" and rest == b"no such bucket"


def test_no_100_continue_follows_an_answer_while_an_unasked_body_is_drained() -> None:
    """A client that stops waiting for 100 Continue sends its body unasked; when the answer
    came without reading it, the body is drained and no 100 follows the answer."""

    async def slow_refusal_or_echo(request: http.Request) -> http.Response:
        if request.raw_path == "/refused":
            await asyncio.sleep(0.3)  # the client gives up waiting meanwhile
            return http.Response(status=404, body=b"no")
        return await echo(request)

    async def client(port: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes("PUT", "/refused", Expect="100-continue", Content_Length="5"))
        await asyncio.sleep(0.1)
        writer.write(b"hel")  # unasked, and not all of it before the answer
        status, _, _ = await read_response(reader)
        assert status == 404
        writer.write(b"lo" + request_bytes("GET", "/next"))  # the connection goes on
        head = await reader.readuntil(b"\r\n\r\n")
        writer.close()
        return head

    assert run(slow_refusal_or_echo, client).startswith(b"HTTP/1.1 200 ")


def test_a_large_body_is_read_with_flow_control() -> None:
    body = bytes(range(256)) * (24 * 4096)  # 24 MiB, more than the buffer's high-water mark
    buffered: list[int] = []

    async def slow_reader(request: http.Request) -> http.Response:
        digest, size = hashlib.sha256(), 0
        async for chunk in request.body:
            buffered.append(request.body._buffered)
            digest.update(chunk)
            size += len(chunk)
            await asyncio.sleep(0.001)
        return http.Response(body=f"{size} {digest.hexdigest()}".encode())

    async def client(port: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes("PUT", "/big", body))
        await writer.drain()
        answer = (await read_response(reader))[2]
        writer.close()
        return answer

    assert run(slow_reader, client) == f"{len(body)} {hashlib.sha256(body).hexdigest()}".encode()
    # Reading paused at the high-water mark; what a read returns at once comes on top.
    assert max(buffered) < http.BODY_HIGH_WATER + 1024 * 1024


def test_a_body_the_handler_did_not_read_is_drained() -> None:
    async def refuse(request: http.Request) -> http.Response:
        return http.Response(status=403, body=b"no")

    async def client(port: int) -> list[int]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes("PUT", "/x", b"y" * 3_000_000))
        statuses = [(await read_response(reader))[0]]
        writer.write(request_bytes("GET", "/after"))
        statuses.append((await read_response(reader))[0])
        writer.close()
        return statuses

    assert run(refuse, client) == [403, 403]


def test_a_streamed_response_and_a_head() -> None:
    payload = b"z" * (8 * 1024 * 1024)

    async def stream(request: http.Request) -> http.Response:
        response = http.StreamResponse(headers={"ETag": '"e"'})
        response.content_length = len(payload)
        if request.method == "HEAD":
            return response
        await response.prepare(request)
        for start in range(0, len(payload), 1 << 20):
            await response.write(payload[start : start + (1 << 20)])
        await response.write_eof()
        return response

    async def client(port: int) -> tuple[Any, Any]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes("HEAD", "/o"))
        head = await reader.readuntil(b"\r\n\r\n")
        writer.write(request_bytes("GET", "/o"))
        got = await read_response(reader)
        writer.close()
        return head, got

    head, (status, headers, body) = run(stream, client)
    assert f"Content-Length: {len(payload)}".encode() in head
    assert status == 200 and headers["etag"] == '"e"' and body == payload


def test_no_content_and_header_injection() -> None:
    async def answer(request: http.Request) -> http.Response:
        if request.raw_path == "/inject":
            return http.Response(headers={"X-Bad": "a\r\nSet-Cookie: b"})
        return http.Response(status=204)

    async def client(port: int) -> tuple[bytes, tuple[int, dict[str, str], bytes]]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes("DELETE", "/gone"))
        no_content = await reader.readuntil(b"\r\n\r\n")
        writer.write(request_bytes("GET", "/inject"))
        injected = await read_response(reader)
        writer.close()
        return no_content, injected

    no_content, (status, headers, _) = run(answer, client)
    assert no_content.startswith(b"HTTP/1.1 204 ") and b"Content-Length" not in no_content
    assert status == 500 and "set-cookie" not in headers


@pytest.mark.parametrize(
    ("sent", "status"),
    [
        (b"NOT HTTP AT ALL\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * (http.MAX_HEAD_BYTES + 1) + b"\r\n\r\n", 431),
    ],
)
def test_bad_requests_are_refused_and_the_connection_closed(sent: bytes, status: int) -> None:
    async def client(port: int) -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(sent)
        answer = await read_response(reader)
        rest = await reader.read()  # the server closed the connection
        writer.close()
        return answer[0], rest

    assert run(echo, client) == (status, b"")


def test_a_lost_connection_fails_the_body_reader() -> None:
    outcome: asyncio.Future[str] | None = None
    reading = asyncio.Event()

    async def reader_of_body(request: http.Request) -> http.Response:
        assert outcome is not None
        reading.set()
        try:
            async for _ in request.body:
                pass
            outcome.set_result("complete")
        except ConnectionResetError:
            outcome.set_result("reset")
        return http.Response()

    async def client(port: int) -> str:
        nonlocal outcome
        outcome = asyncio.get_running_loop().create_future()
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"PUT /cut HTTP/1.1\r\nHost: h\r\nContent-Length: 100000\r\n\r\nonly part")
        await reading.wait()  # cut while its handler reads the body
        writer.close()
        return await outcome

    # The declared length is not what was sent: reading must fail, never end as if whole.
    assert run(reader_of_body, client) == "reset"


def test_close_waits_for_requests_in_progress() -> None:
    in_progress = asyncio.Event()

    async def slow(request: http.Request) -> http.Response:
        in_progress.set()
        await asyncio.sleep(0.3)  # the work the close must wait for
        return http.Response(body=b"done")

    async def main() -> bytes:
        sock = socket.create_server(("127.0.0.1", 0))
        server = await http.serve(slow, sock)
        reader, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
        writer.write(request_bytes("GET", "/slow"))
        await in_progress.wait()
        closing = asyncio.create_task(server.close(grace=5))
        answer = (await read_response(reader))[2]
        await closing
        writer.close()
        return answer

    assert uvloop.run(main()) == b"done"


def test_headers_are_found_in_any_case_and_repeats_are_joined() -> None:
    async def show(request: http.Request) -> http.Response:
        headers = request.headers
        text = f"{headers['X-Thing']}|{headers.get('x-THING')}|{'X-THING' in headers}"
        return http.Response(body=text.encode())

    async def client(port: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: h\r\nx-thing: a \r\nX-Thing: b\r\n\r\n")
        answer = (await read_response(reader))[2]
        writer.close()
        return answer

    assert run(show, client) == b"a,b|a,b|True"


def test_header_bytes_that_are_not_ascii_round_trip() -> None:
    async def mirror(request: http.Request) -> http.Response:
        return http.Response(headers={"x-amz-meta-name": request.headers["x-amz-meta-name"]})

    async def client(port: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: h\r\nx-amz-meta-name: caf\xc3\xa9 \xff\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        writer.close()
        return head

    assert b"\r\nx-amz-meta-name: caf\xc3\xa9 \xff\r\n" in run(mirror, client)


def test_an_upgrade_request_is_answered_in_http_1_1_then_closed() -> None:
    async def client(port: int) -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"GET /h2c HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, HTTP2-Settings\r\n"
            b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n"
        )
        status, _, _ = await read_response(reader)
        rest = await reader.read()
        writer.close()
        return status, rest

    assert run(echo, client) == (200, b"")


def test_a_header_line_that_never_ends_is_refused() -> None:
    async def client(port: int) -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nX-Long: ")
        for _ in range(64):  # 4 MiB of one header value, no end of line
            writer.write(b"a" * 65536)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
        status = (await read_response(reader))[0]
        writer.close()
        return status

    assert run(echo, client) == 431


def test_a_streamed_response_cut_short_closes_the_connection() -> None:
    async def short(request: http.Request) -> http.Response:
        response = http.StreamResponse()
        response.content_length = 10
        await response.prepare(request)
        await response.write(b"12345")  # and no more: a read that failed, say
        await response.write_eof()
        return response

    async def client(port: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes("GET", "/short") + request_bytes("GET", "/next"))
        received = await reader.read()  # up to the server's close
        writer.close()
        return received

    received = run(short, client)
    assert received.endswith(b"\r\n\r\n12345") and received.count(b"HTTP/1.1") == 1


def test_a_failure_before_the_first_byte_is_still_answered() -> None:
    async def failing(request: http.Request) -> http.Response:
        response = http.StreamResponse()
        response.content_length = 10
        await response.prepare(request)
        raise RuntimeError("the data could not be read")

    async def client(port: int) -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes("GET", "/fails"))
        status = (await read_response(reader))[0]
        writer.close()
        return status

    assert run(failing, client) == 500


def test_a_half_closed_client_gets_its_answers() -> None:
    async def client(port: int) -> list[int]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes("GET", "/a") + request_bytes("GET", "/b"))
        writer.write_eof()
        statuses = [(await read_response(reader))[0] for _ in range(2)]
        assert await reader.read() == b""
        writer.close()
        return statuses

    assert run(echo, client) == [200, 200]


def test_garbage_after_a_good_request_is_refused_after_its_answer() -> None:
    async def client(port: int) -> list[int]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request_bytes("GET", "/ok") + b"NOT HTTP\r\n\r\n")
        statuses = [(await read_response(reader))[0] for _ in range(2)]
        writer.close()
        return statuses

    assert run(echo, client) == [200, 400]


def test_a_client_that_pipelines_and_never_reads_holds_bounded_memory() -> None:
    async def client(port: int) -> tuple[int, int]:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.transport.set_write_buffer_limits(high=1 << 30)  # send it all regardless
        writer.write(request_bytes("GET", "/x") * 20000)  # ~0.8 MiB of requests, never read
        # Until the server holds back on both sides: answers wait for the socket to drain,
        # and reading waits for the queue of requests to shrink.
        deadline = asyncio.get_running_loop().time() + 30
        while not (connections := server_connections()) or not all(
            (c._write_paused, c._reading_paused) for c in connections
        ):
            assert asyncio.get_running_loop().time() < deadline, "the server never held back"
            await asyncio.sleep(0.01)
        (connection,) = connections
        assert connection._transport is not None
        queued, buffered = len(connection._waiting), connection._transport.get_write_buffer_size()
        writer.close()
        return queued, buffered

    queued, buffered = run(echo, client)
    # Answers wait for the socket to drain and reading stops with a queue: neither grows with
    # what the client sent (20,000 answers are ~4 MiB; the kernel's buffers hold some).
    assert queued < 20000
    assert buffered < 2 * 1024 * 1024


def test_a_body_that_stops_coming_fails_its_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http, "BODY_IDLE_SECONDS", 0.3)
    failures: list[str] = []

    async def reader_of_body(request: http.Request) -> http.Response:
        try:
            async for _ in request.body:
                pass
        except http.BodyTimeout:
            failures.append("timeout")
            return http.Response(status=400)
        return http.Response()

    async def client(port: int) -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"PUT /slow HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\nten bytes!")
        status = (await read_response(reader))[0]
        writer.close()
        return status

    assert run(reader_of_body, client) == 400
    assert failures == ["timeout"]
