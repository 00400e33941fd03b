"""The gateway's S3 handlers served by uvicorn or granian through a bare ASGI adapter: a
wrapper of `shoal serve` for http_server_bench.py and gateway_instructions.py.

    python bench/asgi_gateway.py uvicorn|granian|shoal /path/to/shoal serve --config ...

It replaces shoal.s3.http.serve with one that serves the handler it is given through the
named server (`shoal`: no replacement), then runs Shoal's CLI in this process; with
`[s3] workers = 1` the gateway is this process. It imports nothing but Shoal and the named
server, so that the gateway's heap is the same as under `shoal serve` but for the server.

The adapter builds the http.Request the handlers take from the ASGI scope, hands them the
request body whole (enough for small objects; a streamed upload would need a reader task),
and turns their Response or StreamResponse into ASGI messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator, MutableMapping, Sequence
from typing import Any, cast

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class _AsgiConnection:
    """What http.Request, its Body and StreamResponse ask of their connection, over one ASGI
    request: the head becomes `http.response.start`, the body `http.response.body`."""

    def __init__(self, send: Send, method: str) -> None:
        self.send = send
        self.method = method
        self.response: Any = None  # http.Response once its head is asked for
        self.started = False

    # A Body is fed whole before the handler runs: flow control has nothing to do.
    def body_wanted(self, body: object) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def head(self, request: Any, response: Any) -> bytes:
        self.response = response
        return b""  # the head goes out as ASGI's start message, with the first body part

    async def send_body(self, data: bytes | list[bytes]) -> None:
        await self.start(self.response)
        chunk = b"".join(data) if isinstance(data, list) else data
        if chunk and self.method != "HEAD":
            await self.send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def start(self, response: Any) -> None:
        if self.started:
            return
        self.started = True
        from shoal import httpdate

        headers = [(b"server", b"Shoal"), (b"date", httpdate.now().encode())]
        headers += [(k.encode(), v.encode()) for k, v in response.headers.items()]
        if response.status not in (204, 304) and not getattr(response, "chunked", False):
            length = response.content_length or 0
            headers.append((b"content-length", str(length).encode()))
        await self.send(
            {"type": "http.response.start", "status": response.status, "headers": headers}
        )


class AsgiGateway:
    """The gateway's handler (shoal.s3.app.make_handler) as a bare ASGI app."""

    def __init__(self, handler: Callable[[Any], Awaitable[Any]]) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        from shoal.s3 import http

        if scope["type"] != "http":
            return
        connection = _AsgiConnection(send, scope["method"])
        headers = http.Headers()
        for raw_name, raw_value in scope["headers"]:
            name = raw_name.decode("latin-1").lower()
            value = raw_value.decode("utf-8", "surrogateescape").strip()
            headers[name] = (
                f"{dict.__getitem__(headers, name)},{value}" if name in headers else value
            )
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        request = http.Request(
            cast(Any, connection),
            scope["method"],
            target.decode("utf-8", "surrogateescape"),
            headers,
            True,
        )
        while True:
            message = await receive()
            if message.get("body"):
                request.body._feed(message["body"])
            if not message.get("more_body"):
                break
        request.body._finish()
        try:
            response = await self.handler(request)
        except Exception:
            response = http.Response(500)
        for name, value in request.response_headers.items():
            response.headers.setdefault(name, value)
        if not (isinstance(response, http.StreamResponse) and response.prepared):
            await connection.start(response)
            if response.body and scope["method"] != "HEAD" and response.status not in (204, 304):
                await send({"type": "http.response.body", "body": response.body, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        if request.answered is not None:
            request.answered(response)


class _Stoppable:
    """What the gateway keeps of http.serve's Server: close()."""

    def __init__(self, stop: Callable[[], None], task: asyncio.Task[Any]) -> None:
        self._stop = stop
        self._task = task

    async def close(self, grace: float = 10.0) -> None:
        self._stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._task, grace)


async def _serve_uvicorn(handler: Any, sock: socket.socket, *args: Any, **kwargs: Any) -> Any:
    import uvicorn

    class Embedded(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # `shoal serve` owns SIGINT and SIGTERM

    config = uvicorn.Config(
        AsgiGateway(handler),
        http="httptools",
        loop="none",
        lifespan="off",
        access_log=False,
        log_config=None,
        log_level="warning",
        server_header=False,
        date_header=False,
        backlog=1024,
    )
    server = Embedded(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)

    def stop() -> None:
        server.should_exit = True

    return _Stoppable(stop, task)


async def _serve_granian(handler: Any, sock: socket.socket, *args: Any, **kwargs: Any) -> Any:
    from granian.constants import HTTPModes, Interfaces
    from granian.server.embed import Server as Granian

    host, port = sock.getsockname()[:2]
    sock.close()  # granian binds its own socket, on the same port
    server = Granian(
        AsgiGateway(handler),
        address=host,
        port=port,
        interface=Interfaces.ASGINL,
        http=HTTPModes.http1,
        websockets=False,
        runtime_threads=1,
        backlog=1024,
        log_enabled=False,
    )
    task = asyncio.create_task(server.serve())
    while not await _answers(host, port):
        if task.done():
            task.result()
        await asyncio.sleep(0.05)
    return _Stoppable(server.stop, task)


async def _answers(host: str, port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection(host, port)
    except OSError:
        return False
    writer.close()
    return True


def serve_with(name: str, command: Sequence[str]) -> int:
    """Run `shoal serve` (command: the shoal executable and its arguments) in this process,
    its gateway served by `name`."""
    import shoal.cli
    from shoal.s3 import http

    replacements = {"uvicorn": _serve_uvicorn, "granian": _serve_granian}
    if name in replacements:
        http.serve = replacements[name]
    exit_code: int = shoal.cli.main(list(command[1:]))
    return exit_code


if __name__ == "__main__":
    sys.exit(serve_with(sys.argv[1], sys.argv[2:]))
