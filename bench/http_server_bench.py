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

The adapter and the serve under uvicorn or granian are in asgi_gateway.py, which runs as a
wrapper of `shoal serve` (`asgi_gateway.py NAME SHOAL serve ...`); the serve under shoal/s3/
http.py runs through the same wrapper, so all three start alike. uvicorn and granian are
installed into this venv on first use (benchlib.ensure_package).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchlib import (
    ensure_package,
    load_average,
    markdown_table,
    median,
    parsed_rounds,
    rounds_parser,
)
from s3_bench import S3, Phase, Server, ServerProcesses, run_phase, started_shoal

SERVERS = ("shoal", "uvicorn", "granian")
OPS = ("PUT", "GET", "HEAD")
VERSIONS = {"uvicorn": "0.54.0", "granian": "2.8.7"}
BUCKET = "http-bench"
OBJECT_BYTES = 4096
FILL_KEYS = 1000

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
    gateway (asgi_gateway.py)."""
    return [sys.executable, str(Path(__file__).resolve().parent / "asgi_gateway.py"), name]


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
    parser = rounds_parser(__doc__.split("\n\n")[0], rounds=3, seconds=6.0, quick=(2, 3.0))
    parser.add_argument("--servers", default=",".join(SERVERS), help="which, comma-separated")
    args = parsed_rounds(parser)
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
