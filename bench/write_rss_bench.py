"""Memory of a gateway-side write: a 2 GiB stream through DataPath, replicated on 2 nodes.

    .venv/bin/python bench/write_rss_bench.py            # 2 GiB, about a minute on 2 cores
    .venv/bin/python bench/write_rss_bench.py --quick    # 256 MiB
    options: --size-mib N, --chunk-kib N (stream piece size, default 64), --dir DIR,
             --checksums crc32,... (S3 checksums besides MD5; default all, as DataPath.write),
             --no-full-read, --dsn DSN (an existing PostgreSQL instead of the embedded)

Why: DataPath.write promises that memory stays a few blocks whatever the object size (4 blocks
in flight). The target: peak RSS of the writing process < 200 MiB for a 2 GiB object.

How: two real `shoal storage-node` processes on 127.0.0.1 register in a scratch metadata
shard; this process writes one object through DataPath(BlockClient, RegistryDirectory,
block_size=1 MiB, replicas=2) from a stream generated on the fly (never materialized): MiB n
of the object is a fixed random 1 MiB buffer whose first 8 bytes are n, cut into pieces of
`--chunk-kib` as a network body arrives.

Measured, for this process: RSS before the write (imports, metadata pool, connections), the
peak VmRSS sampled every 10 ms by a background thread during the write, VmHWM (the kernel's
peak, reset through /proc/self/clear_refs before the write when permitted), and ru_maxrss
(getrusage: the peak over the whole life of the process, so an upper bound); write throughput
(MiB/s of object data, each byte sent to 2 nodes) and CPU (user + system milliseconds per MiB
of object: the cost, which other work on a shared machine hardly changes; and cores busy).
For each node: VmHWM (its peak RSS over its life) and CPU. Then verification: the
WriteResult's size and MD5 against the generator's, a few byte ranges read back and compared,
and (unless --no-full-read) the whole object read back through DataPath.read with its MD5
compared and that read's throughput and peak RSS reported.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import random
import resource
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from benchlib import machine_summary, markdown_table, postgres_server, scratch_shard
from storage_bench import (
    NodeCluster,
    NodeProcess,
    filesystem_line,
    install_sigterm_handler,
    load_line,
    node_cluster,
    scratch_dir,
    self_cpu_seconds,
    status_field_kib,
    wait_until_serving,
)

from shoal.cluster import RegistryDirectory
from shoal.config import ShardConfig
from shoal.ids import uuid7
from shoal.metadata import MetadataStore
from shoal.storage import BlockClient, BlockRun, DataPath
from shoal.storage.checksums import S3_CHECKSUMS

KiB = 1024
MiB = 1024 * KiB
BLOCK_SIZE = MiB
REPLICAS = 2
TARGET_RSS_MIB = 200
SAMPLE_SECONDS = 0.01
HEARTBEAT_DEADLINE = timedelta(seconds=30)
REGISTER_TIMEOUT_SECONDS = 60


# -- the generated object ------------------------------------------------------------------


@dataclass(frozen=True)
class Content:
    """The object: MiB n is `seed` with its first 8 bytes replaced by n (big-endian)."""

    seed: bytes
    size: int

    @classmethod
    def random(cls, size: int) -> Content:
        return cls(os.urandom(MiB), size)

    def mib(self, n: int) -> bytes:
        return n.to_bytes(8, "big") + self.seed[8:]

    def bytes_at(self, start: int, end: int) -> bytes:
        """Bytes [start, end) of the object, made for comparison (small ranges only)."""
        first, last = start // MiB, (end - 1) // MiB
        joined = b"".join(self.mib(n) for n in range(first, last + 1))
        return joined[start - first * MiB : end - first * MiB]

    async def stream(self, chunk: int) -> AsyncIterator[bytes]:
        """The object in pieces of `chunk` bytes (the last one shorter), as a body arrives."""
        for n in range(-(-self.size // MiB)):
            piece = memoryview(self.mib(n))[: min(MiB, self.size - n * MiB)]
            for offset in range(0, len(piece), chunk):
                yield bytes(piece[offset : offset + chunk])
            await asyncio.sleep(0)

    def md5(self) -> bytes:
        digest = hashlib.md5(usedforsecurity=False)
        for n in range(-(-self.size // MiB)):
            digest.update(memoryview(self.mib(n))[: min(MiB, self.size - n * MiB)])
        return digest.digest()


# -- memory ---------------------------------------------------------------------------------


def rss_mib() -> float:
    return status_field_kib("self", "VmRSS") / 1024


def hwm_mib() -> float:
    return status_field_kib("self", "VmHWM") / 1024


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def reset_hwm() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False when not permitted."""
    try:
        Path("/proc/self/clear_refs").write_text("5\n")
    except OSError:
        return False
    return True


class RssSampler:
    """Peak VmRSS of this process, sampled by a thread (the event loop may be busy)."""

    def __init__(self) -> None:
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> RssSampler:
        self.peak = rss_mib()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mib())

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            self.peak = max(self.peak, rss_mib())


# -- the run --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transfer:
    """One timed transfer through the data path, with the memory and CPU it took."""

    nbytes: int
    seconds: float
    rss_before: float
    rss_peak: float  # sampled
    hwm: float | None  # VmHWM after a reset, None when the reset is not permitted
    cpu: float  # this process, CPU seconds per wall second
    node_cpu: list[float]

    @property
    def mib_s(self) -> float:
        return self.nbytes / MiB / self.seconds

    def cpu_cell(self, cores: float) -> str:
        """CPU milliseconds per MiB of object, and (in brackets) cores busy."""
        return f"{cores * 1000 / self.mib_s:.1f} ({cores:.2f})"


@dataclass(frozen=True)
class Report:
    write: Transfer
    read: Transfer | None
    maxrss: float
    ranges_checked: int
    md5_ok: bool
    nodes: list[tuple[str, float]]  # name, VmHWM MiB


class Meter:
    """`with Meter(nodes) as meter:` around a transfer; then `meter.transfer(nbytes)`."""

    def __init__(self, nodes: Sequence[NodeProcess]) -> None:
        self.nodes = nodes
        self.sampler = RssSampler()

    def __enter__(self) -> Meter:
        self.rss_before = rss_mib()
        self.hwm_reset = reset_hwm()
        self.node_cpu = [n.cpu_seconds() for n in self.nodes]
        self.cpu = self_cpu_seconds()
        self.started = time.perf_counter()
        self.sampler.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sampler.__exit__(*exc)
        self.seconds = time.perf_counter() - self.started
        self.cpu = (self_cpu_seconds() - self.cpu) / self.seconds
        self.node_cpu = [
            (n.cpu_seconds() - before) / self.seconds
            for n, before in zip(self.nodes, self.node_cpu, strict=True)
        ]
        self.hwm = hwm_mib() if self.hwm_reset else None

    def transfer(self, nbytes: int) -> Transfer:
        return Transfer(
            nbytes,
            self.seconds,
            self.rss_before,
            self.sampler.peak,
            self.hwm,
            self.cpu,
            self.node_cpu,
        )


async def wait_until_registered(store: MetadataStore, nodes: Sequence[NodeProcess]) -> None:
    expected = {n.name for n in nodes}
    deadline = time.monotonic() + REGISTER_TIMEOUT_SECONDS
    while expected - {n.name for n in await store.nodes.list(HEARTBEAT_DEADLINE) if n.alive}:
        if time.monotonic() > deadline:
            raise TimeoutError("storage nodes did not register in time")
        await asyncio.sleep(0.2)


async def collect(stream: AsyncIterator[bytes]) -> bytes:
    return b"".join([chunk async for chunk in stream])


def ranges_to_check(size: int, rng: random.Random) -> list[tuple[int, int]]:
    """The first and last bytes, block boundaries, a run of several blocks, random ranges."""
    ranges = [(0, 100), (size - 1000, size), (MiB - 10, MiB + 10), (size // 2, size // 2 + 3 * MiB)]
    for _ in range(4):
        start = rng.randrange(size)
        ranges.append((start, min(size, start + rng.randint(1, 2 * MiB))))
    return [(max(0, a), min(size, b)) for a, b in ranges if a < b]


async def check_ranges(path: DataPath, runs: list[BlockRun], content: Content) -> int:
    ranges = ranges_to_check(content.size, random.Random(7))
    for start, end in ranges:
        got = await collect(path.read(runs, start, end))
        if got != content.bytes_at(start, end):
            raise AssertionError(f"read-back of [{start}, {end}) differs from what was written")
    return len(ranges)


async def read_all(path: DataPath, runs: list[BlockRun]) -> tuple[int, bytes]:
    digest = hashlib.md5(usedforsecurity=False)
    size = 0
    async for chunk in path.read(runs):
        digest.update(chunk)
        size += len(chunk)
    return size, digest.digest()


async def benchmark(
    cluster: NodeCluster, store: MetadataStore, content: Content, args: argparse.Namespace
) -> Report:
    client = BlockClient(cluster.secret)
    try:
        await wait_until_serving(client, cluster.nodes)
        await wait_until_registered(store, cluster.nodes)
        directory = RegistryDirectory(store, HEARTBEAT_DEADLINE, client)
        path = DataPath(client, directory, block_size=BLOCK_SIZE, replicas=REPLICAS)
        await path.write(uuid7(), Content.random(4 * MiB).stream(args.chunk_kib * KiB))  # warm-up
        version = uuid7()
        with Meter(cluster.nodes) as meter:
            result = await path.write(version, content.stream(args.chunk_kib * KiB), args.checksums)
        write = meter.transfer(content.size)
        print(f"write: {write.mib_s:,.0f} MiB/s, peak RSS {write.rss_peak:,.0f} MiB", flush=True)
        maxrss = maxrss_mib()
        if result.size != content.size or len(set(result.sharks)) != REPLICAS:
            raise AssertionError(f"unexpected WriteResult {result.size} {result.sharks}")
        md5_ok = result.md5 == content.md5()
        runs = [BlockRun(version, result.size, result.block_size, result.sharks)]
        checked = await check_ranges(path, runs, content)
        read = None
        if not args.no_full_read:
            with Meter(cluster.nodes) as meter:
                size, md5 = await read_all(path, runs)
            read = meter.transfer(size)
            md5_ok = md5_ok and size == content.size and md5 == result.md5
        nodes = [(n.name, n.peak_rss_mib()) for n in cluster.nodes]
        return Report(write, read, maxrss, checked, md5_ok, nodes)
    finally:
        await client.close()


async def run_with_store(
    cluster: NodeCluster, shard: ShardConfig, args: argparse.Namespace
) -> Report:
    content = Content.random(args.size_mib * MiB)
    store = await MetadataStore.open([shard], pool_max_size=2)
    try:
        return await benchmark(cluster, store, content, args)
    finally:
        await store.close()


# -- the report ------------------------------------------------------------------------------


def mib(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def transfer_table(report: Report) -> str:
    headers = [
        "phase",
        "MiB",
        "MiB/s",
        "RSS before",
        "peak RSS (sampled)",
        "VmHWM (reset before)",
        "CPU ms/MiB (cores)",
        "each node CPU ms/MiB (cores)",
    ]
    transfers = [("write (x2 replicas)", report.write), ("full read", report.read)]
    rows = [
        [
            name,
            f"{t.nbytes // MiB:,}",
            f"{t.mib_s:,.0f}",
            mib(t.rss_before),
            mib(t.rss_peak),
            mib(t.hwm),
            t.cpu_cell(t.cpu),
            ", ".join(t.cpu_cell(c) for c in t.node_cpu),
        ]
        for name, t in transfers
        if t is not None
    ]
    return markdown_table(headers, rows)


def verdict(report: Report) -> str:
    peak = max(report.write.rss_peak, report.write.hwm or 0.0)
    met = "met" if peak < TARGET_RSS_MIB else "NOT met"
    return f"target peak RSS < {TARGET_RSS_MIB} MiB during the write: {met} ({peak:,.0f} MiB)"


def print_report(report: Report) -> None:
    print("\nthis process (MiB; CPU: user + system milliseconds per MiB of object, cores busy)")
    print(transfer_table(report))
    print(f"ru_maxrss (peak over the whole process life): {report.maxrss:,.0f} MiB")
    nodes = ", ".join(f"{name} {peak:,.0f} MiB" for name, peak in report.nodes)
    print(f"storage nodes, VmHWM (peak RSS over their life): {nodes}")
    print(
        f"verification: {report.ranges_checked} ranges read back equal; "
        f"MD5 {'equal' if report.md5_ok else 'DIFFERENT'}"
    )
    print(verdict(report))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="256 MiB instead of 2 GiB")
    parser.add_argument("--size-mib", type=int, help="object size in MiB (default 2048)")
    parser.add_argument("--chunk-kib", type=int, default=64, help="stream piece size (64 KiB)")
    parser.add_argument("--dir", type=Path, help="scratch parent folder (default: system temp)")
    parser.add_argument(
        "--checksums",
        default=",".join(S3_CHECKSUMS),
        help="S3 checksums computed besides MD5, comma-separated (default: all, as DataPath)",
    )
    parser.add_argument("--no-full-read", action="store_true", help="check a few ranges only")
    parser.add_argument("--dsn", help="superuser DSN of an existing PostgreSQL (default: embedded)")
    args = parser.parse_args()
    args.size_mib = args.size_mib or (256 if args.quick else 2048)
    args.checksums = [c for c in args.checksums.split(",") if c]
    return args


def main() -> None:
    args = parse_args()
    install_sigterm_handler()
    with (
        scratch_dir(args.dir, "shoal-write-rss-bench-") as root,
        postgres_server(args.dsn) as admin,
        scratch_shard(admin) as shard,
        node_cluster(shard, root, ["n0", "n1"]) as cluster,
    ):
        summary = machine_summary(shard.dsn)
        print("\n".join(summary))
        print(f"scratch: {filesystem_line(root)}")
        if not any("load average" in line for line in summary):
            print(f"load average before: {load_line()}")
        print(
            f"object: {args.size_mib:,} MiB in pieces of {args.chunk_kib} KiB, "
            f"checksums md5 + {'+'.join(args.checksums) or 'none'}",
            flush=True,
        )
        report = asyncio.run(run_with_store(cluster, shard, args))
        print(f"load average after: {load_line()}")
    print_report(report)
    if not report.md5_ok:
        raise SystemExit("the object read back is not the one written")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        raise SystemExit("interrupted; storage nodes stopped and scratch files removed") from None
