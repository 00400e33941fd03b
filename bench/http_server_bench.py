"""The gateway's own HTTP server (shoal/s3/http.py) against uvicorn and granian serving the same
S3 handlers through a bare ASGI adapter: 4 KiB PUT, GET and HEAD at --clients clients.

    PYTHONPATH=. .venv/bin/python bench/http_server_bench.py            # about 4 minutes
    PYTHONPATH=. .venv/bin/python bench/http_server_bench.py --quick    # about 1.5 minutes

One `shoal serve` per server, each with `[s3] workers = 1` (one gateway process: the serve
process itself) and its own embedded PostgreSQL and storage nodes, all started at once; the
load generator is this process (s3_bench.py's signed aiohttp client and phases). Rounds go
server by server and op by op, so that other work on the machine falls on all alike. Each
cell is the median over --rounds rounds: requests per second, and the gateway process's CPU
per request (its user + system time over the phase, the HTTP server's threads included).

  shoal     shoal/s3/http.py on httptools, as `shoal serve` runs it
  uvicorn   uvicorn with httptools (`http="httptools"`) on the gateway's own event loop
            (uvloop, as Shoal runs), serving `AsgiGateway` below
  granian   granian's embedded server (ASGI without lifespan, HTTP/1.1, one Rust runtime
            thread) on the same loop, serving the same adapter

The adapter builds the http.Request the handlers take from the ASGI scope, hands them the
request body whole (enough for 4 KiB objects; a streamed upload would need a reader task),
and turns their Response or StreamResponse into ASGI messages. The serve under uvicorn or
granian is this file run as a wrapper (`--serve-with NAME SHOAL serve ...`): it replaces
shoal.s3.http.serve, then runs Shoal's CLI in the same process. uvicorn and granian are
installed into this venv on first use (benchlib.ensure_package).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from benchlib import ensure_package, load_average, markdown_table, median
from s3_bench import S3, Phase, Server, ServerProcesses, run_phase, started_shoal

SERVERS = ("shoal", "uvicorn", "granian")
OPS = ("PUT", "GET", "HEAD")
VERSIONS = {"uvicorn": "0.54.0", "granian": "2.8.7"}
BUCKET = "http-bench"
OBJECT_BYTES = 4096
FILL_KEYS = 1000

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


# -- inside the serve: the ASGI adapter and the replaced http.serve ---------------------------


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
        http.serve = replacements[name]  # type: ignore[assignment]
    return shoal.cli.main(list(command[1:]))


# -- the load generator ------------------------------------------------------------------------


@dataclass
class Cell:
    phases: list[Phase] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return median([p.rate(p.ops) for p in self.phases])

    @property
    def gateway_us(self) -> float:
        return median([p.cpu.gateway * 1e6 / p.ops for p in self.phases if p.ops])

    @property
    def errors(self) -> int:
        return sum(len(p.errors) for p in self.phases)


def serve_with_command(name: str) -> list[str]:
    """The command that runs `shoal serve ...` (its arguments follow) with `name` serving the
    gateway."""
    return [sys.executable, str(Path(__file__).resolve()), "--serve-with", name]


async def measure(
    servers: dict[str, Server], args: argparse.Namespace
) -> dict[tuple[str, str], Cell]:
    body = os.urandom(OBJECT_BYTES)
    clients = {name: S3(server, args.clients) for name, server in servers.items()}
    processes = {name: ServerProcesses.find(s.gateway_pid) for name, s in servers.items()}
    cells: dict[tuple[str, str], Cell] = {}
    try:
        for name, s3 in clients.items():
            await s3.call("PUT", BUCKET)

            async def put_fill(n: int, s3: S3 = s3) -> float:
                await s3.call("PUT", BUCKET, f"key/{n:06d}", data=body)
                return 0

            await run_phase(f"fill {name}", args.clients, put_fill, FILL_KEYS, 120, processes[name])
        for number in range(args.rounds):
            order = list(servers) if number % 2 == 0 else list(reversed(servers))
            for op in OPS:
                for name in order:
                    phase = await run_phase(
                        f"{op} {name}",
                        args.clients,
                        operation(clients[name], op, body, number),
                        10**9,
                        args.seconds,
                        processes[name],
                    )
                    cells.setdefault((op, name), Cell()).phases.append(phase)
    finally:
        for s3 in clients.values():
            await s3.session.close()
    return cells


def operation(s3: S3, op: str, body: bytes, round_number: int) -> Callable[[int], Awaitable[float]]:
    rng = random.Random(round_number)

    async def put(n: int) -> float:
        await s3.call("PUT", BUCKET, f"new/{round_number}/{n:08d}", data=body)
        return 1

    async def read(n: int) -> float:
        got, _ = await s3.call(op, BUCKET, f"key/{rng.randrange(FILL_KEYS):06d}")
        if op == "GET" and got != body:
            raise RuntimeError("GET returned other bytes than the PUT")
        return 1

    return put if op == "PUT" else read


def report(cells: dict[tuple[str, str], Cell], names: Sequence[str], clients: int) -> str:
    headers = ["op", "clients"]
    for name in names:
        headers += [f"{name} req/s", f"{name} gateway us/req"]
    headers += [f"{name}/shoal" for name in names if name != "shoal"]
    headers.append("errors")
    rows = []
    for op in OPS:
        row: list[object] = [op, clients]
        for name in names:
            cell = cells[(op, name)]
            row += [f"{cell.rate:,.0f}", f"{cell.gateway_us:.0f}"]
        base = cells[(op, "shoal")].rate
        row += [f"{cells[(op, name)].rate / base:.0%}" for name in names if name != "shoal"]
        row.append(sum(cells[(op, name)].errors for name in names))
        rows.append(row)
    return markdown_table(headers, rows)


def main() -> None:
    if sys.argv[1:2] == ["--serve-with"]:
        sys.exit(serve_with(sys.argv[2], sys.argv[3:]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 3 s: a smoke run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0, help="length of one phase")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--servers", default=",".join(SERVERS), help="which, comma-separated")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 2, 3.0
    names = [n for n in args.servers.split(",") if n]
    if names[0] != "shoal":
        parser.error("--servers starts with shoal (the figures are relative to it)")
    for name in names[1:]:
        ensure_package(name, VERSIONS[name])
    print(load_average("at start"))
    with contextlib.ExitStack() as stack:
        servers = {
            name: stack.enter_context(
                started_shoal(
                    f"shoal-http-{name}-", gateway_workers=1, wrapper=serve_with_command(name)
                )
            )
            for name in names
        }
        import shoal.loop

        cells = shoal.loop.run(measure(servers, args))
    print(load_average("at end"))
    print()
    print(report(cells, names, args.clients))


if __name__ == "__main__":
    main()
