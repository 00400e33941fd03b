"""The floor under a 4 KiB GET, HEAD and DELETE on this machine: what the parts every Shoal
request goes through cost per operation, each measured alone, and the highest rate their sum
allows.

    .venv/bin/python bench/small_ops_floor.py                              # ~1 min
    .venv/bin/python bench/small_ops_floor.py --seaweedfs GET=4610,HEAD=4124,DELETE=3490
    .venv/bin/python bench/small_ops_floor.py --concurrency 64 --seconds 8
    .venv/bin/python bench/small_ops_floor.py --weed       # SeaweedFS in the same run, ~2 min

The parts, CPU microseconds per operation:
  load generator  peer_bench.py's client (s3_bench.S3: aiohttp, botocore SigV4 with
                  UNSIGNED-PAYLOAD; this process) sending GETs, HEADs and DELETEs to a
                  server that answers at once: shoal/s3/http.py in a child process, with a
                  handler that returns a 4 KiB body, a HEAD's headers or a 204 without
                  looking at the request.
  HTTP server     that child's CPU: httptools' parse, the Request, the answer written
                  (the gateway's own HTTP layer with nothing behind it).
  SigV4           sigv4.parse + sigv4.verify of one request botocore signed (the signing
                  key cached, as the gateway keeps it), in a loop.
  metadata call   Objects.get (a GET's statement: the row with its 4 KiB, as the gateway
                  keeps small objects), Objects.get(with_data=False) (a HEAD's) and
                  Objects.remove (a DELETE's) through the metadata API, from --concurrency
                  tasks, on a scratch embedded PostgreSQL as `shoal serve` runs it (one
                  shard, 64 vnodes): the caller's CPU (batching, libpq, the row) and
                  PostgreSQL's (every backend).

What no server code of Shoal's can skip is the load generator's part (SeaweedFS is driven by
the same one) and PostgreSQL's part of the statement; the HTTP server and SigV4 parts are
the least the gateway's Python can do for a request. The sum is the floor: on N cores, no
run can go faster than N * 1e6 / floor op/s, the load generator included, even with the
machine doing nothing else. With --seaweedfs (rates from a peer_bench.py run of the same
minutes), the report says what 1.5x those rates would leave per operation, and by how much
the floor alone exceeds it. With --weed, SeaweedFS (peer_bench.py's `weed server -s3`, a
bucket with fsync) is driven by the same load generator in the same run, its rates replace
--seaweedfs, and the floor is also set against SeaweedFS's own CPU per operation (load
generator + weed): where CPU bounds both servers, 1.5x its rate needs at most 1/1.5 of it,
whatever else the machine is doing, so that comparison holds on a loaded machine too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from benchlib import (
    cpu_model,
    exit_on_sigterm,
    load_average,
    markdown_table,
    open_store,
    per_call,
    scratch_shard,
)
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from peer_bench import (
    FSYNC_PREFIX,
    SEAWEEDFS,
    Target,
    create_buckets,
    ensure_tool,
    process_tree,
    started_seaweedfs,
)
from s3_bench import (
    REGION,
    S3,
    Server,
    ServerProcesses,
    UnsignedPayloadAuth,
    children_of,
    cpu_seconds,
    own_cpu_seconds,
    tree_cpu_seconds,
)

import shoal.loop
from shoal.ids import uuid7
from shoal.metadata import MetadataStore, ObjectWrite
from shoal.metadata.embedded import EmbeddedPostgres
from shoal.s3 import http, sigv4
from shoal.workers import listening_socket

OPS = ("GET", "HEAD", "DELETE")
SMALL_BYTES = 4096
SMALL_BODY = os.urandom(SMALL_BYTES)  # what the bare server answers a GET
VNODES = 64  # `shoal serve`'s default
READ_KEYS = 2000  # read by GET and HEAD
WEED_DELETE_KEYS = 5000  # PUT first, with fsync: a DELETE phase may end when they run out
SIGV4_CALLS = 20_000
ACCESS_KEY = "FLOORBENCHKEY"
SECRET_KEY = "floor-bench-secret"
BUCKET = "floor"
GOAL = 1.5  # the multiple of SeaweedFS's rate wanted at many clients
# What the bare server answers a HEAD: the headers the gateway's HEAD of a 4 KiB object has.
HEAD_HEADERS = {
    "ETag": '"0f343b0931126a20f133d67c2b018a3b"',
    "Last-Modified": "Fri, 27 Nov 2026 12:00:00 GMT",
    "Content-Type": "binary/octet-stream",
    "Accept-Ranges": "bytes",
    "x-amz-request-id": "0123456789ABCDEF",
}


@dataclass(frozen=True)
class Split:
    """Operations done and the CPU seconds of two sides (caller, callee) over them."""

    ops: int
    seconds: float
    caller: float
    callee: float

    def us(self, cpu: float) -> float:
        return cpu * 1e6 / self.ops if self.ops else 0.0

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds else 0.0


async def timed(
    operation: Callable[[int], Awaitable[object]],
    concurrency: int,
    seconds: float,
    callee_cpu: Callable[[], float],
    limit: int | None = None,
) -> Split:
    """`concurrency` tasks run `operation` on numbers 0, 1, ... for `seconds` (or until
    `limit` numbers are used)."""
    numbers = iter(range(limit if limit is not None else 1 << 62))
    deadline = time.perf_counter() + seconds
    done = 0

    async def worker() -> None:
        nonlocal done
        for number in numbers:
            if time.perf_counter() > deadline:
                return
            await operation(number)
            done += 1

    caller, callee, started = own_cpu_seconds(), callee_cpu(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Split(
        done,
        time.perf_counter() - started,
        own_cpu_seconds() - caller,
        callee_cpu() - callee,
    )


# -- the load generator against a server that answers at once ---------------------------------


async def answer_at_once(request: http.Request) -> http.Response:
    if request.method == "GET":
        return http.Response(headers=HEAD_HEADERS, body=SMALL_BODY)
    if request.method == "HEAD":
        response = http.StreamResponse(headers=HEAD_HEADERS)
        response.content_length = SMALL_BYTES
        return response
    return http.Response(status=204, headers={"x-amz-request-id": "0123456789ABCDEF"})


async def serve_bare() -> None:
    """The child: http.py with `answer_at_once` on a port the kernel picks, which it prints
    ("ready PORT"), until killed."""
    sock = listening_socket("127.0.0.1", 0)
    await http.serve(answer_at_once, sock)
    print(f"ready {sock.getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


@contextlib.contextmanager
def bare_server() -> Iterator[tuple[Server, int]]:
    child = subprocess.Popen(
        [sys.executable, __file__, "--bare-server"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        word, _, port = child.stdout.readline().strip().partition(" ")
        if word != "ready" or not port.isdigit():
            raise RuntimeError("the bare HTTP server did not start")
        yield Server(f"http://127.0.0.1:{port}", ACCESS_KEY, SECRET_KEY, child.pid), child.pid
    finally:
        child.terminate()
        child.wait(10)


async def client_and_http(concurrency: int, seconds: float) -> dict[str, Split]:
    splits = {}
    with bare_server() as (server, pid):
        async with S3(server, concurrency) as s3:
            for op in OPS:

                async def call(n: int, op: str = op) -> None:
                    await s3.call(op, BUCKET, f"k{n}")

                await timed(call, concurrency, 0.5, lambda: 0.0)  # connections opened
                splits[op] = await timed(call, concurrency, seconds, lambda: cpu_seconds(pid))
    return splits


# -- SeaweedFS, driven by the same load generator in the same minutes -------------------------


async def seaweedfs_ops(concurrency: int, seconds: float) -> dict[str, Split]:
    """GET, HEAD and DELETE of 4 KiB objects in a bucket of SeaweedFS's with fsync (peer_bench.py's
    headline configuration): the load generator's CPU and the weed process tree's."""
    with started_seaweedfs(ensure_tool(*SEAWEEDFS)) as weed:
        pid = weed.server.gateway_pid
        assert pid is not None
        bucket = f"{FSYNC_PREFIX}floor"
        processes = ServerProcesses.find(None)
        await create_buckets(Target("SeaweedFS fsync", weed.server, processes, "", False), [bucket])
        body = os.urandom(SMALL_BYTES)

        def weed_cpu() -> float:
            return sum(cpu_seconds(p) for p in process_tree(pid))

        async with S3(weed.server, concurrency) as s3:

            async def put(n: int, prefix: str = "read") -> None:
                await s3.call("PUT", bucket, f"{prefix}/{n:07d}", data=body)

            await timed(put, concurrency, 600, weed_cpu, READ_KEYS)
            rng = random.Random(1)
            splits = {}
            for op in ("GET", "HEAD"):

                async def read(n: int, op: str = op) -> None:
                    await s3.call(op, bucket, f"read/{rng.randrange(READ_KEYS):07d}")

                await timed(read, concurrency, 0.5, weed_cpu)
                splits[op] = await timed(read, concurrency, seconds, weed_cpu)

            async def put_doomed(n: int) -> None:
                await put(n, "delete")

            await timed(put_doomed, concurrency, 600, weed_cpu, WEED_DELETE_KEYS)

            async def delete(n: int) -> None:
                await s3.call("DELETE", bucket, f"delete/{n:07d}")

            splits["DELETE"] = await timed(delete, concurrency, seconds, weed_cpu, WEED_DELETE_KEYS)
    return splits


# -- SigV4 ------------------------------------------------------------------------------------


def sigv4_us(op: str) -> float:
    """parse + verify of one botocore-signed request, as the gateway sees it."""
    signer = UnsignedPayloadAuth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", REGION)
    signed = AWSRequest(method=op, url="http://127.0.0.1:9000/floor/small/c16/00001234")
    signer.add_auth(signed)  # as S3.open signs the load generator's requests
    headers = {name.lower(): value for name, value in signed.headers.items()}
    headers["host"] = "127.0.0.1:9000"
    request = sigv4.SignedRequest(op, "/floor/small/c16/00001234", [], headers)
    now = datetime.now(UTC)

    def once() -> None:
        sigv4.verify(sigv4.parse(request, now), request, SECRET_KEY)

    once()  # raises if the signature does not hold
    return per_call(once, SIGV4_CALLS) * 1e6


# -- the metadata call ------------------------------------------------------------------------


async def fill(store: MetadataStore, owner: object, names: list[str], writers: int) -> None:
    data = os.urandom(SMALL_BYTES)
    md5 = hashlib.md5(data).digest()
    gate = asyncio.Semaphore(writers)

    async def one(name: str) -> None:
        async with gate:
            write = ObjectWrite(
                id=uuid7(),
                content_length=len(data),
                content_md5=md5,
                data=data,
                properties={"inline": True},
            )
            await store.objects.put(owner, BUCKET, name, write)  # type: ignore[arg-type]

    await asyncio.gather(*(one(name) for name in names))


async def metadata_calls(
    shard_dsn_and_pid: tuple[object, int], concurrency: int, seconds: float
) -> dict[str, Split]:
    shard, postmaster = shard_dsn_and_pid
    store = await open_store(shard, VNODES, pool_max_size=concurrency + 4)  # type: ignore[arg-type]
    try:
        owner = (await store.accounts.create(f"floor-{uuid7().hex[:8]}")).id
        await store.buckets.create(owner, BUCKET)
        reads = [f"read/{n:06d}" for n in range(READ_KEYS)]
        await fill(store, owner, reads, 64)
        rng = random.Random(1)

        def postgres() -> float:
            # Backends that exited count through the postmaster, which reaped them.
            live = sum(tree_cpu_seconds(child) for child in children_of(postmaster))
            return cpu_seconds(postmaster, reaped_children=True) + live

        splits = {}
        for op in ("GET", "HEAD"):

            async def read(n: int, with_data: bool = op == "GET") -> None:
                name = rng.choice(reads)
                await store.objects.get(owner, BUCKET, name, with_data=with_data)

            await timed(read, concurrency, 0.5, lambda: 0.0)
            splits[op] = await timed(read, concurrency, seconds, postgres)
        doomed = [f"delete/{n:07d}" for n in range(int(splits["HEAD"].rate * seconds))]
        await fill(store, owner, doomed, 64)

        async def delete(n: int) -> None:
            if await store.objects.remove(owner, BUCKET, doomed[n]) is None:
                raise RuntimeError(f"{doomed[n]} was not there to delete")

        splits["DELETE"] = await timed(delete, concurrency, seconds, postgres, len(doomed))
        return splits
    finally:
        await store.close()


@contextlib.contextmanager
def scratch_postgres() -> Iterator[tuple[object, int]]:
    """A scratch shard on an embedded PostgreSQL started here, and its postmaster's pid."""
    with tempfile.TemporaryDirectory(prefix="shoal-floor-") as scratch, exit_on_sigterm():
        server = EmbeddedPostgres(Path(scratch) / "postgres")
        server.start()
        try:
            admin = server.dsn("postgres")
            with psycopg.connect(admin, autocommit=True) as conn:
                row = conn.execute("SHOW data_directory").fetchone()
            assert row is not None
            pid = int((Path(row[0]) / "postmaster.pid").read_text().split()[0])
            with scratch_shard(admin) as shard:
                yield shard, pid
        finally:
            server.stop()


# -- report -----------------------------------------------------------------------------------


def parse_seaweedfs(text: str | None) -> dict[str, float]:
    rates: dict[str, float] = {}
    for item in (text or "").split(","):
        if item.strip():
            op, _, rate = item.partition("=")
            rates[op.strip().upper()] = float(rate)
    return rates


def report(
    bare: dict[str, Split],
    auth: dict[str, float],
    meta: dict[str, Split],
    cores: int,
    seaweedfs: dict[str, float],
    concurrency: int,
) -> str:
    rows: list[list[object]] = []
    floors = {}
    for op in OPS:
        parts = [
            bare[op].us(bare[op].caller),
            bare[op].us(bare[op].callee),
            auth[op],
            meta[op].us(meta[op].caller),
            meta[op].us(meta[op].callee),
        ]
        floors[op] = sum(parts)
        rows.append([op, *(f"{p:.0f}" for p in parts), f"{floors[op]:.0f}"])
    table = markdown_table(
        [
            "op",
            "load generator",
            "HTTP server",
            "SigV4",
            "metadata call: caller",
            "PostgreSQL",
            "floor (sum)",
        ],
        rows,
    )
    lines = [
        "CPU us per operation, each part measured alone:",
        "",
        table,
        "",
        "rates of the parts measured alone: "
        + "; ".join(
            f"{op} bare HTTP {bare[op].rate:,.0f}/s, metadata call {meta[op].rate:,.0f}/s"
            for op in OPS
        ),
    ]
    if concurrency == 1:
        lines += ["", *one_client_bound(bare, auth, meta, seaweedfs)]
    else:
        lines += ["", *cpu_budget(floors, cores, seaweedfs)]
    return "\n".join(lines)


def one_client_bound(
    bare: dict[str, Split],
    auth: dict[str, float],
    meta: dict[str, Split],
    seaweedfs: dict[str, float],
) -> list[str]:
    """One client waits for each part in turn: their latencies add up, whatever the cores."""
    rows: list[list[object]] = []
    for op in OPS:
        bound = 1e6 / (1e6 / bare[op].rate + auth[op] + 1e6 / meta[op].rate)
        rival = seaweedfs.get(op)
        rows.append([op, f"{bound:,.0f}", f"{rival:,.0f}" if rival else "-"])
        rows[-1].append(f"{bound / rival:.2f}" if rival else "-")
    headers = ["op", "highest rate the parts' latencies allow", "SeaweedFS op/s", "ratio"]
    return ["At one client (the goal: 1.0x SeaweedFS):", "", markdown_table(headers, rows)]


def cpu_budget(floors: dict[str, float], cores: int, seaweedfs: dict[str, float]) -> list[str]:
    """Many clients: the floor against what 1.5x SeaweedFS's rate leaves per operation."""
    rows: list[list[object]] = []
    for op in OPS:
        row: list[object] = [op, f"{floors[op]:.0f}", f"{cores * 1e6 / floors[op]:,.0f}"]
        rival = seaweedfs.get(op)
        if rival:
            budget = cores * 1e6 / (GOAL * rival)
            row += [f"{rival:,.0f}", f"{GOAL * rival:,.0f}", f"{budget:.0f}"]
            row.append(f"{floors[op] / budget:.2f}")
        else:
            row += ["-"] * 4
        rows.append(row)
    headers = [
        "op",
        "floor us/op",
        "highest rate the floor allows",
        "SeaweedFS op/s",
        f"{GOAL}x SeaweedFS",
        f"budget us/op at {GOAL}x",
        "floor / budget",
    ]
    title = f"The floor against the budget on {cores} cores (nothing else running):"
    return [title, "", markdown_table(headers, rows)]


async def measure(args: argparse.Namespace) -> str:
    print("load generator against a bare http.py server ...", file=sys.stderr, flush=True)
    bare = await client_and_http(args.concurrency, args.seconds)
    auth = {op: sigv4_us(op) for op in OPS}
    print("metadata calls on a scratch PostgreSQL ...", file=sys.stderr, flush=True)
    with scratch_postgres() as shard_and_pid:
        meta = await metadata_calls(shard_and_pid, args.concurrency, args.seconds)
    seaweedfs = parse_seaweedfs(args.seaweedfs)
    weed: dict[str, Split] = {}
    if args.weed:
        print("SeaweedFS with the same load generator ...", file=sys.stderr, flush=True)
        weed = await seaweedfs_ops(args.concurrency, args.seconds)
        seaweedfs = {op: split.rate for op, split in weed.items()}
    text = report(bare, auth, meta, os.cpu_count() or 1, seaweedfs, args.concurrency)
    return text + ("\n\n" + against_seaweedfs_cpu(bare, auth, meta, weed) if weed else "")


def floor_us(bare: Split, auth: float, meta: Split) -> float:
    return (
        bare.us(bare.caller)
        + bare.us(bare.callee)
        + auth
        + meta.us(meta.caller)
        + meta.us(meta.callee)
    )


def against_seaweedfs_cpu(
    bare: dict[str, Split], auth: dict[str, float], meta: dict[str, Split], weed: dict[str, Split]
) -> str:
    """The floor against SeaweedFS's own CPU per operation, load generator included, measured in
    the same minutes: where CPU bounds both, a rate of 1.5x SeaweedFS's needs at most its CPU
    per operation / 1.5, whatever else the machine runs."""
    rows: list[list[object]] = []
    for op in OPS:
        client, server = weed[op].us(weed[op].caller), weed[op].us(weed[op].callee)
        allowed = (client + server) / GOAL
        floor = floor_us(bare[op], auth[op], meta[op])
        rows.append(
            [
                op,
                f"{weed[op].rate:,.0f}",
                f"{client:.0f} + {server:.0f} = {client + server:.0f}",
                f"{allowed:.0f}",
                f"{floor:.0f}",
                f"{floor / allowed:.2f}",
            ]
        )
    headers = [
        "op",
        "SeaweedFS op/s",
        "its CPU us/op: load generator + weed",
        f"allowed at {GOAL}x",
        "Shoal's floor us/op",
        "floor / allowed",
    ]
    return "Against SeaweedFS's CPU per operation, same run:\n\n" + markdown_table(headers, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=6.0, help="length of each phase")
    parser.add_argument(
        "--seaweedfs",
        metavar="GET=R,HEAD=R,DELETE=R",
        help="SeaweedFS's op/s from a peer_bench run",
    )
    parser.add_argument(
        "--weed", action="store_true", help="drive SeaweedFS too, in the same run (fsync buckets)"
    )
    parser.add_argument("--bare-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_server:
        shoal.loop.run(serve_bare())
        return
    print(load_average("at start"))
    print(f"machine: {os.cpu_count()} cores ({cpu_model()}); concurrency {args.concurrency}, ")
    print(f"phases of {args.seconds:g} s; {datetime.now(UTC):%Y-%m-%d %H:%M} UTC\n")
    print(shoal.loop.run(measure(args)))
    print("\n" + load_average("at end"))


if __name__ == "__main__":
    main()
