"""Where one S3 operation's CPU goes: its rate against a fresh `shoal serve`, and the CPU
milliseconds per operation of the load generator, the gateway, the storage nodes and
PostgreSQL, measured apart; optionally a py-spy profile of the gateway during the phase.

    .venv/bin/python bench/cpu_split.py get --concurrency 16
    .venv/bin/python bench/cpu_split.py list --concurrency 4 --gateway-workers 1
    .venv/bin/python bench/cpu_split.py list --concurrency 1 --shards 4
    .venv/bin/python bench/cpu_split.py part --profile part-profile   # ~1 min each
    .venv/bin/python bench/cpu_split.py part --concurrency 1 --block-kib 1024
    .venv/bin/python bench/cpu_split.py big-get --concurrency 4

Workloads (the bucket is filled first through the S3 API):
  put, get, head  4 KiB objects (GET and HEAD of random ones of --objects keys)
  delete          DELETE of 4 KiB objects, each of a key filled before (the phase ends when
                  the --objects keys run out, if it has not ended before)
  list            ListObjectsV2 pages of 1000 keys from a random start-after, over --objects keys
  part            UploadPart of 8 MiB into one multipart upload (MiB are the units)
  big-put         PUT of 64 MiB objects by multipart, 8 MiB parts one after another, as
                  peer_bench.py's `big` does (MiB)
  big-get         GET of 64 MiB objects (4, uploaded in 8 MiB parts first), each byte
                  compared with what was written, as peer_bench.py's `big` does (MiB)

For the workloads that write blocks (part, big-put) the report adds the storage nodes' fsyncs,
read from each node's own metrics (shoal_node_fsync_duration_seconds) around the phase: the
fsync time per block written (its file's and its folder's), against the phase's time per MiB.
At one client a part's blocks are fsynced together, so their wait is the disk's share of a
part's round.

The peer comparison (peer_bench.py) says how Shoal compares; this says which process to look
at, with the figures that the choices in docs/decisions.md were measured by. With --profile, the
gateway (with --gateway-workers 1, the only gateway process) is sampled by py-spy; the phase's
figures then include py-spy's cost to the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import re
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from peer_bench import PY_SPY, ProfiledProcesses, Profiler, ensure_tool, profile_report
from s3_bench import (
    S3,
    Pattern,
    Phase,
    Server,
    ServerProcesses,
    children_of,
    command_line,
    read_back_whole,
    run_phase,
    started_shoal,
    upload_pattern,
    xml_value,
)

SMALL_BYTES = 4096
DELETE_KEYS = 40000
WARM_UP_OPS = 200
BIG_PUT_WARM_UP = 4  # objects: 200 of 64 MiB would fill gigabytes before the phase
MiB = 1024 * 1024
PART_MIB = 8
PART_BYTES = PART_MIB * MiB
BIG_OBJECTS = 4
BIG_MIB = 64
BUCKET = "cpu-split"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "workload",
        choices=["put", "get", "head", "delete", "list", "part", "big-put", "big-get"],
    )
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the measured phase")
    parser.add_argument(
        "--objects", type=int, help="keys to fill (get/head: 2000, list: 20000, delete: 40000)"
    )
    parser.add_argument("--gateway-workers", type=int, help="Shoal's [s3] workers")
    parser.add_argument("--shards", type=int, help="Shoal's [metadata] embedded_shards")
    parser.add_argument("--block-kib", type=int, help="Shoal's [storage] block_size, in KiB")
    parser.add_argument(
        "--direct-writes",
        action="store_true",
        help="[storage] direct_writes = true: nodes write blocks by O_DIRECT",
    )
    parser.add_argument("--profile", metavar="DIR", type=Path, help="py-spy the gateway")
    return parser.parse_args()


async def fill(s3: S3, processes: ServerProcesses, keys: int, size: int) -> None:
    body = os.urandom(size)

    async def put(number: int) -> float:
        await s3.call("PUT", BUCKET, f"key/{number:08d}", data=body)
        return 0

    await run_phase("fill", 32, put, keys, 600, processes)


async def operation(
    args: argparse.Namespace, s3: S3, processes: ServerProcesses
) -> Callable[[int], Awaitable[float]]:
    """The measured operation (after filling what it reads); it returns its units."""
    rng = random.Random(7)
    body = os.urandom(SMALL_BYTES)
    if args.workload == "put":
        return lambda n: put_small(s3, f"new/{n:08d}", body)
    if args.workload in ("get", "head"):
        keys = args.objects or 2000
        await fill(s3, processes, keys, SMALL_BYTES)
        method = args.workload.upper()
        return lambda n: read_small(s3, method, f"key/{rng.randrange(keys):08d}")
    if args.workload == "delete":
        keys = args.objects or DELETE_KEYS
        await fill(s3, processes, keys, SMALL_BYTES)
        # Each DELETE removes a key that exists (a key already gone is a cheaper 204).
        order = iter(range(keys))
        return lambda n: delete_small(s3, f"key/{next(order):08d}")
    if args.workload == "list":
        keys = args.objects or 20000
        await fill(s3, processes, keys, 0)
        return lambda n: list_page(s3, f"key/{rng.randrange(max(1, keys - 1000)):08d}")
    if args.workload == "big-put":
        pattern, tags = Pattern(), itertools.count()  # a new key each time, warm-up included
        return lambda n: put_big(s3, pattern, next(tags))
    if args.workload == "big-get":
        pattern = Pattern()
        for tag in range(BIG_OBJECTS):
            await upload_pattern(s3, BUCKET, f"big/{tag}", pattern, tag, BIG_MIB, PART_MIB)
        return lambda n: get_big(s3, pattern, n % BIG_OBJECTS)
    reply, _ = await s3.call("POST", BUCKET, "big", query={"uploads": ""})
    upload_id = xml_value(reply, "UploadId")
    part = os.urandom(PART_BYTES)
    return lambda n: upload_part(s3, upload_id, n % 10000 + 1, part)


async def put_small(s3: S3, key: str, body: bytes) -> float:
    await s3.call("PUT", BUCKET, key, data=body)
    return 1


async def read_small(s3: S3, method: str, key: str) -> float:
    await s3.call(method, BUCKET, key)
    return 1


async def delete_small(s3: S3, key: str) -> float:
    await s3.call("DELETE", BUCKET, key)
    return 1


async def list_page(s3: S3, start_after: str) -> float:
    query = {"list-type": "2", "max-keys": "1000", "start-after": start_after}
    await s3.call("GET", BUCKET, query=query)
    return 1


async def upload_part(s3: S3, upload_id: str, number: int, part: bytes) -> float:
    query = {"partNumber": str(number), "uploadId": upload_id}
    headers = {"Content-Length": str(len(part))}
    await s3.call("PUT", BUCKET, "big", query=query, data=part, headers=headers)
    return len(part) / (1024 * 1024)


async def put_big(s3: S3, pattern: Pattern, tag: int) -> float:
    await upload_pattern(s3, BUCKET, f"big/put-{tag}", pattern, tag, BIG_MIB, PART_MIB)
    return BIG_MIB


async def get_big(s3: S3, pattern: Pattern, tag: int) -> float:
    await read_back_whole(s3, BUCKET, f"big/{tag}", pattern, tag, BIG_MIB * MiB)
    return BIG_MIB


@dataclass(frozen=True)
class Fsyncs:
    """The storage nodes' fsync histograms summed: how many, and their seconds."""

    count: float
    seconds: float

    def __sub__(self, before: Fsyncs) -> Fsyncs:
        return Fsyncs(self.count - before.count, self.seconds - before.seconds)


_FSYNC_LINE = re.compile(r"^shoal_node_fsync_duration_seconds_(sum|count) (\S+)$", re.MULTILINE)


def node_fsyncs(gateway_pid: int) -> Fsyncs:
    """Every storage node's fsyncs so far, from its admin listener's /metrics."""
    count = seconds = 0.0
    for child in children_of(gateway_pid):
        argv = command_line(child)
        if "storage-node" not in argv or "--admin-port" not in argv:
            continue
        port = argv[argv.index("--admin-port") + 1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        for kind, value in _FSYNC_LINE.findall(text):
            if kind == "sum":
                seconds += float(value)
            else:
                count += float(value)
    return Fsyncs(count, seconds)


def fsync_report(phase: Phase, fsyncs: Fsyncs) -> str:
    """The nodes' fsync time per block (a block's file and folder: two fsyncs) beside the
    phase's time per MiB."""
    blocks = fsyncs.count / 2
    if not blocks or not phase.units:
        return "storage nodes: no fsync in the phase"
    return (
        f"storage nodes: {blocks:,.0f} blocks fsynced (file and folder), "
        f"{fsyncs.seconds / blocks * 1000:.1f} ms of fsync a block; "
        f"the phase took {phase.seconds / phase.units * 1000:.2f} ms a MiB"
    )


def report(args: argparse.Namespace, phase: Phase) -> str:
    unit = (
        "MiB"
        if args.workload in ("part", "big-put", "big-get")
        else ("page" if args.workload == "list" else "op")
    )
    cpu, amount = phase.cpu, phase.units or 1
    per_unit = {
        "load generator": cpu.client,
        "gateway": cpu.gateway,
        "storage nodes": cpu.nodes,
        "PostgreSQL": cpu.postgres,
    }
    split = ", ".join(f"{name} {seconds / amount * 1000:.3f}" for name, seconds in per_unit.items())
    return (
        f"{args.workload} c={args.concurrency}: {phase.units / phase.seconds:,.1f} {unit}/s, "
        f"p50 {phase.ms(0.5):.2f} ms, {len(phase.errors)} errors; "
        f"CPU ms per {unit}: {split}"
    )


async def measure(args: argparse.Namespace, server: Server) -> None:
    assert server.gateway_pid is not None
    processes: ServerProcesses = ServerProcesses.find(server.gateway_pid)
    profiler = None
    async with S3(server, max(32, args.concurrency)) as s3:
        await s3.call("PUT", BUCKET)
        run = await operation(args, s3, processes)
        warm_up = BIG_PUT_WARM_UP if args.workload == "big-put" else WARM_UP_OPS
        await run_phase("warm-up", args.concurrency, run, warm_up, 5, processes)
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
            pids = {"gateway": server.gateway_pid}
            profiler = Profiler(ensure_tool(*PY_SPY), args.profile, pids)
            processes = ProfiledProcesses(processes.gateway, processes.postmaster, profiler)
        most = 10**9
        if args.workload == "delete":  # what the warm-up left to delete
            most = (args.objects or DELETE_KEYS) - WARM_UP_OPS
        writes_blocks = args.workload in ("part", "big-put")
        fsyncs_before = node_fsyncs(server.gateway_pid) if writes_blocks else None
        phase = await run_phase(args.workload, args.concurrency, run, most, args.seconds, processes)
    print(report(args, phase))
    if fsyncs_before is not None:
        print(fsync_report(phase, node_fsyncs(server.gateway_pid) - fsyncs_before))
    if profiler is not None:
        print(profile_report(profiler))


def main() -> None:
    args = parse_args()
    with started_shoal(
        "shoal-cpu-split-",
        gateway_workers=args.gateway_workers,
        shards=args.shards,
        block_size=args.block_kib * 1024 if args.block_kib else None,
        direct_writes=True if args.direct_writes else None,
    ) as server:
        asyncio.run(measure(args, server))


if __name__ == "__main__":
    main()
