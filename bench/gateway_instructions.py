"""Instructions the gateway runs per S3 operation, counted by valgrind's callgrind: a figure
that does not move with the machine's load, for judging a change to the request path.

    .venv/bin/python bench/gateway_instructions.py get             # ~2 min
    .venv/bin/python bench/gateway_instructions.py put --requests 500
    .venv/bin/python bench/gateway_instructions.py list --requests 50

Rates on this 2-core VM move by 10-20% from one run to the next (bench/RESULTS.md), more
than most single changes to the gateway gain; on a quiet, steady VM instruction counts repeat
to within a fraction of a percent (not on every VM: bench/RESULTS.md says where they did not).
`shoal serve` runs with one gateway process (`[s3] workers = 1`) under
callgrind; its storage nodes and PostgreSQL run natively (valgrind does not follow them).
The counters are zeroed after the fill and a warm-up and dumped after `--requests`
operations, so the figure is the gateway process's instructions per operation (its GC
daemon's upkeep, a few queries a second, included). It is not CPU time: a syscall counts
as the instructions of its user-space side only.

Workloads: put, get, head, delete (4 KiB objects; the first two also of a 1 MiB object with
`--size`), list (ListObjectsV2 pages of 1000 from a bucket of --keys). Needs valgrind
(Debian's package `valgrind`).

`--server uvicorn` or `--server granian` serves the gateway's handlers through that server
instead of shoal/s3/http.py (asgi_gateway.py's ASGI adapter; every thread of the gateway
process is counted, granian's Rust ones included). The serve runs through asgi_gateway.py
with the default `--server shoal` too, so that all three start alike.

    .venv/bin/python bench/gateway_instructions.py get --server uvicorn --requests 500
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from benchlib import ensure_package
from http_server_bench import SERVERS, VERSIONS, serve_with_command
from s3_bench import S3, S3Failure, Server, started_shoal

BUCKET = "instructions"
START_SECONDS = 600  # the gateway starts ~50x slower under callgrind
SET_UP_ATTEMPTS = 10


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workload", choices=["put", "get", "head", "delete", "list"])
    parser.add_argument("--requests", type=int, help="operations counted (default 1000; list 40)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--size", type=int, default=4096, help="object bytes (put, get, head)")
    parser.add_argument("--keys", type=int, default=2000, help="keys in the bucket (list)")
    parser.add_argument(
        "--keep", type=Path, help="copy the measured dump here (for callgrind_annotate)"
    )
    parser.add_argument(
        "--server", choices=SERVERS, default="shoal", help="the HTTP server (http_server_bench)"
    )
    return parser.parse_args()


async def run_all(
    numbers: range, concurrency: int, operation: Callable[[int], Awaitable[object]]
) -> None:
    """`operation` of each number, `concurrency` at a time."""
    numbers = iter(numbers)

    async def worker() -> None:
        for number in numbers:
            await operation(number)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def set_up(call: Callable[[], Awaitable[object]]) -> None:
    """A request before the counted ones, tried again on a 503: under callgrind on a busy
    machine the slowed gateway can run past its connect timeout or its wait for a pooled
    connection."""
    for attempt in range(SET_UP_ATTEMPTS):
        try:
            await call()
            return
        except S3Failure as exc:
            if " 503 " not in str(exc) or attempt == SET_UP_ATTEMPTS - 1:
                raise
            await asyncio.sleep(1.0)


async def measure(args: argparse.Namespace, server: Server) -> int:
    requests = args.requests or (40 if args.workload == "list" else 1000)
    body = os.urandom(args.size)
    async with S3(server, max(8, args.concurrency)) as s3:
        await set_up(lambda: s3.call("PUT", BUCKET))
        keys = args.keys if args.workload == "list" else requests + 100  # warm-up's 50 too
        filled = b"" if args.workload == "list" else body

        async def fill(n: int) -> None:
            await set_up(lambda: s3.call("PUT", BUCKET, f"key/{n:08d}", data=filled))

        await run_all(range(keys), args.concurrency, fill)
        operations: dict[str, Callable[[int], Awaitable[object]]] = {
            "put": lambda n: s3.call("PUT", BUCKET, f"new/{n:08d}", data=body),
            "get": lambda n: s3.call("GET", BUCKET, f"key/{n % keys:08d}"),
            "head": lambda n: s3.call("HEAD", BUCKET, f"key/{n % keys:08d}"),
            "delete": lambda n: s3.call("DELETE", BUCKET, f"key/{n:08d}"),  # each key once
            "list": lambda n: s3.call(
                "GET",
                BUCKET,
                query={"list-type": "2", "start-after": f"key/{n * 97 % (keys - 1000):08d}"},
            ),
        }
        operation = operations[args.workload]
        warm_up = 10 if args.workload == "list" else 50
        await run_all(range(warm_up), args.concurrency, operation)
        control(server, "--zero")
        await run_all(range(warm_up, warm_up + requests), args.concurrency, operation)
        control(server, "--dump")
    return requests


def control(server: Server, action: str) -> None:
    assert server.gateway_pid is not None
    subprocess.run(
        ["callgrind_control", action, str(server.gateway_pid)],
        check=True,
        capture_output=True,
    )


def last_dump(dumps: Path) -> Path:
    """The last dump: the one after the measured operations."""
    files = sorted(dumps.glob("callgrind.out.*.*"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise RuntimeError(f"no callgrind dump in {dumps}")
    return files[-1]


def counted_instructions(dumps: Path) -> int:
    """The instructions of the last dump."""
    dump = last_dump(dumps)
    found = re.search(r"^(?:summary|totals): (\d+)", dump.read_text(errors="replace"), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no totals in {dump}")
    return int(found[1])


def main() -> None:
    args = parse_args()
    valgrind = shutil.which("valgrind")
    if valgrind is None or shutil.which("callgrind_control") is None:
        sys.exit("gateway_instructions: needs valgrind (apt-get install valgrind)")
    dumps = Path(tempfile.mkdtemp(prefix="shoal-callgrind-"))
    try:
        wrapper = [valgrind, "--tool=callgrind", f"--callgrind-out-file={dumps}/callgrind.out.%p"]
        if args.server != "shoal":
            ensure_package(args.server, VERSIONS[args.server])
        wrapper += serve_with_command(args.server)  # for shoal too: every server starts alike
        with started_shoal(
            "shoal-instructions-", gateway_workers=1, wrapper=wrapper, start_timeout=START_SECONDS
        ) as server:
            requests = asyncio.run(measure(args, server))
            instructions = counted_instructions(dumps)
        if args.keep is not None:
            shutil.copy(last_dump(dumps), args.keep)
        unit = "page" if args.workload == "list" else "operation"
        size = "" if args.workload in ("list", "delete") else f" of {args.size} bytes"
        print(
            f"{args.workload}{size}, c={args.concurrency}, {args.server}: "
            f"{instructions / requests:,.0f} "
            f"gateway instructions per {unit} ({requests} counted)"
        )
    finally:
        shutil.rmtree(dumps, ignore_errors=True)


if __name__ == "__main__":
    main()
