"""One storage node's block write and read throughput, beside the raw disk ceiling.

    .venv/bin/python bench/storage_bench.py            # 2-4 minutes on 2 cores
    .venv/bin/python bench/storage_bench.py --quick    # a smoke run, well under a minute
    options: --dir DIR (scratch folder, default a new one under /tmp), --no-drop-caches,
             --dsn DSN (an existing PostgreSQL for the node registry instead of the embedded),
             --block-kib 1024 (only that block size; repeatable), --rounds N,
             --direct-writes (the node writes by O_DIRECT: [storage] direct_writes)

Why: a storage node is an HTTP service in Python between the network and the disk. Its cost is
worth knowing against the best the same disk allows; the target is node >= 70% of the raw
ceiling for 1 MiB blocks (the default block size), judged as the data path uses the node, with
its window of blocks in flight per replica (datapath.BLOCKS_IN_FLIGHT, 4); 1 in flight is
printed beside it, not judged (there one block's HTTP exchange is serial with the disk work:
docs/storage.md, "How fast").

What is measured, for blocks of 64 KiB, 1 MiB and 4 MiB, at 1 and 4 requests in flight:

  node write   BlockClient.put_block to one real `shoal storage-node` process on 127.0.0.1
               (HTTP, token check, XXH3-128 verified by the node, write, fsync, link, fsync of
               the directory). The client's XXH3 of each payload is computed before timing,
               as the data path computes it once per block for all its replicas.
  raw write    the same number of files of the same size, from Python threads in this process
               on the same file system: write to tmp/ (in 256 KiB pieces, as the node writes),
               fsync, rename into a fan-out folder, fsync that folder. No hashing, no HTTP:
               the disk's ceiling for this pattern.
  node read    BlockClient.get_block (whole block, XXH3-128 verified by the client).
  raw read     open, read, close of the raw files.

Reads run twice: "cold" right after `sync; echo 3 > /proc/sys/vm/drop_caches` (when permitted;
otherwise the table says so), then "cached" from the page cache. Each case writes a fixed amount
(64 MiB of 64 KiB blocks, 512 MiB of 1 and 4 MiB blocks; an eighth with --quick) and deletes it
afterwards. Blocks of one case share one version id, so they land in one fan-out folder as the
blocks of one object do; the raw files mirror that layout.

Node and raw take turns, 16 MiB each, within every phase: an fsync's cost depends on whatever
else on the machine has dirty data on the same file system (ext4 commits its journal for all),
so alternating lets both sides see the same conditions. Each case runs --rounds times (3; 1 with
--quick), rounds interleaved, and the tables show each phase's median round; "node/raw per
round" shows the spread. The load averages before and after are printed: on a shared machine,
compare ratios rather than absolute MiB/s.

CPU columns: CPU time (user + system, all threads) of the node process and of this process
during the node's turns, in milliseconds per MiB moved (the cost, which other work on the
machine hardly changes), and in brackets per wall second (1.00 = one core busy). They include
the kernel's share (TCP copies, page cache, fsync). "raw CPU" is this process during the raw
turns: what the same disk work costs without HTTP, hashing and the event loop.

The node needs a metadata shard to heartbeat into (it runs exactly as in production): a scratch
database on the embedded PostgreSQL (bench/benchlib.py), dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from benchlib import machine_summary, markdown_table, postgres_server, scratch_shard

import shoal.loop
from shoal.cluster import node_sockets
from shoal.config import MetadataConfig, ShardConfig
from shoal.ids import uuid7
from shoal.keyfiles import load_or_create_secret
from shoal.metadata import migrate
from shoal.storage import BlockClient, NodeError, block_name
from shoal.storage.blockfile import checksum_of
from shoal.storage.datapath import BLOCKS_IN_FLIGHT

KiB = 1024
MiB = 1024 * KiB
BLOCK_SIZES = (64 * KiB, MiB, 4 * MiB)
CONCURRENCY = (1, BLOCKS_IN_FLIGHT)
BYTES_PER_CASE = {64 * KiB: 64 * MiB, MiB: 512 * MiB, 4 * MiB: 512 * MiB}
QUICK_DIVISOR = 8
DISTINCT_PAYLOADS = 16  # payloads cycle through this many random buffers
SLICE_BYTES = 16 * MiB  # node and raw take turns, a slice each
# Raw files are written in pieces of this size, as the node does (blockfile.WRITE_PIECE_BYTES):
# here one 4 MiB write() before the fsync ran at half the speed of 256 KiB pieces.
RAW_WRITE_BYTES = 256 * KiB
TARGET_RATIO = 0.70
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
DELETE_BATCH = 10_000
START_TIMEOUT_SECONDS = 60


# -- storage-node processes (also used by write_rss_bench.py) ------------------------------


@dataclass
class NodeProcess:
    name: str
    datacenter: str
    root: Path
    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        """CPU time of the node, its worker processes included."""
        return sum(process_cpu_seconds(pid) for pid in process_tree(self.process.pid))

    def peak_rss_mib(self) -> float:
        return status_field_kib(self.process.pid, "VmHWM") / 1024


@dataclass
class NodeCluster:
    config_file: Path
    secret: bytes
    nodes: list[NodeProcess] = field(default_factory=list)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (from /proc/<pid>/stat)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def process_tree(pid: int) -> list[int]:
    """A process and its live descendants (a node may run worker processes)."""
    found = [pid]
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            for child in (task / "children").read_text().split():
                found += process_tree(int(child))
    return found


def status_field_kib(pid: int | str, key: str) -> int:
    """A `kB` line of /proc/<pid>/status (VmRSS, VmHWM), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def self_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def write_node_config(
    root: Path, shard: ShardConfig, node_workers: int = 1, direct_writes: bool = False
) -> Path:
    """A TOML configuration naming the one metadata shard, as tests/fixtures/storage.py does."""
    config_file = root / "shoal.toml"
    config_file.write_text(
        f"data_dir = {json.dumps(str(root))}\n"
        "[metadata]\n[[metadata.shards]]\n"
        f"name = {json.dumps(shard.name)}\ndsn = {json.dumps(shard.dsn)}\n"
        "[storage]\nheartbeat_interval_seconds = 1\n"
        + (f"node_workers = {node_workers}\n" if node_workers != 1 else "")
        + ("direct_writes = true\n" if direct_writes else "")
    )
    return config_file


def start_node(config_file: Path, root: Path, name: str, datacenter: str) -> NodeProcess:
    """`shoal storage-node` on sockets bound here (ports the kernel picks), as `shoal serve`
    starts its nodes."""
    node_root = root / name
    with node_sockets("127.0.0.1", 0, 0) as sockets:
        command = sockets.command(node_root, name, datacenter, ["--config", str(config_file)])
        log = open(root / f"{name}.log", "wb")  # noqa: SIM115 - the child keeps it open
        # A session of its own: Ctrl-C reaches this process only, which stops the node in
        # order.
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            pass_fds=sockets.fds,
        )
        log.close()
        port = sockets.ports[0]
    return NodeProcess(name, datacenter, node_root, port, process)


def stop_nodes(nodes: Sequence[NodeProcess]) -> None:
    for node in nodes:
        if node.process.poll() is None:
            node.process.terminate()
    for node in nodes:
        try:
            node.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            node.process.kill()
            node.process.wait()


@contextlib.contextmanager
def node_cluster(
    shard: ShardConfig,
    root: Path,
    names: Sequence[str],
    datacenter: str = "dc0",
    node_workers: int = 1,
    direct_writes: bool = False,
) -> Iterator[NodeCluster]:
    """`shoal storage-node` processes on 127.0.0.1 registering in `shard`; stopped at exit."""
    asyncio.run(migrate([shard], MetadataConfig(vnodes=2, partitions_ahead=1)))
    config_file = write_node_config(root, shard, node_workers, direct_writes)
    cluster = NodeCluster(config_file, load_or_create_secret(root / "cluster.secret"))
    try:
        for name in names:
            cluster.nodes.append(start_node(config_file, root, name, datacenter))
        yield cluster
    finally:
        stop_nodes(cluster.nodes)


async def wait_until_serving(client: BlockClient, nodes: Sequence[NodeProcess]) -> None:
    """Until every node answers /status (it serves before its first heartbeat)."""
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    for node in nodes:
        while True:
            if node.process.poll() is not None:
                log = (node.root.parent / f"{node.name}.log").read_text()[-2000:]
                raise RuntimeError(f"storage node {node.name} exited: {log}")
            try:
                await client.status(node.url)
                break
            except NodeError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"storage node {node.name} did not start") from None
                await asyncio.sleep(0.1)


def drop_caches() -> bool:
    """Empty the page cache (root only); False when not permitted."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def install_sigterm_handler() -> None:
    """SIGTERM cleans up as Ctrl-C does (finally blocks stop nodes, remove the scratch dir)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


@contextlib.contextmanager
def scratch_dir(parent: Path | None, prefix: str) -> Iterator[Path]:
    """A new folder under `parent` (default: the system temp dir), removed at exit."""
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=prefix, dir=parent) as path:
        yield Path(path)


def load_line() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1, 5, 15 min)"


def filesystem_line(path: Path) -> str:
    result = subprocess.run(["df", "-hT", str(path)], capture_output=True, text=True)
    return result.stdout.strip().splitlines()[-1] if result.returncode == 0 else "?"


# -- the measurements --------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    """Bytes moved in some wall seconds, and the CPU seconds the node and this process used."""

    nbytes: int = 0
    seconds: float = 0.0
    node_cpu_seconds: float = 0.0
    client_cpu_seconds: float = 0.0

    @property
    def mib_s(self) -> float:
        return self.nbytes / MiB / self.seconds

    def cpu_cell(self, cpu_seconds: float) -> str:
        """CPU milliseconds per MiB moved, and (in brackets) cores busy."""
        return f"{cpu_seconds * 1000 / (self.nbytes / MiB):.1f} ({cpu_seconds / self.seconds:.2f})"

    def __add__(self, other: Phase) -> Phase:
        return Phase(
            self.nbytes + other.nbytes,
            self.seconds + other.seconds,
            self.node_cpu_seconds + other.node_cpu_seconds,
            self.client_cpu_seconds + other.client_cpu_seconds,
        )


@dataclass(frozen=True)
class Case:
    block_size: int
    concurrency: int
    blocks: int

    @property
    def label(self) -> str:
        size = self.block_size
        return f"{size // MiB} MiB" if size >= MiB else f"{size // KiB} KiB"


@dataclass
class CaseResult:
    case: Case
    node_write: Phase
    raw_write: Phase
    node_cold: Phase | None
    raw_cold: Phase | None
    node_cached: Phase
    raw_cached: Phase
    write_ratios: list[float] = field(default_factory=list)  # node/raw of each round


PHASE_NAMES = ("node_write", "raw_write", "node_cold", "raw_cold", "node_cached", "raw_cached")


@dataclass(frozen=True)
class Blocks:
    """The blocks of one case: names, and payloads cycling through a few random buffers."""

    case: Case
    names: list[str]
    data: list[bytes]
    checksums: list[str]

    @classmethod
    def make(cls, case: Case) -> Blocks:
        version = uuid7()  # one version: one fan-out folder, as the blocks of one object
        data = [os.urandom(case.block_size) for _ in range(DISTINCT_PAYLOADS)]
        return cls(
            case,
            [block_name(version, i) for i in range(case.blocks)],
            data,
            [checksum_of(d) for d in data],
        )

    def payload(self, index: int) -> tuple[bytes, str]:
        return self.data[index % DISTINCT_PAYLOADS], self.checksums[index % DISTINCT_PAYLOADS]

    def slices(self) -> list[range]:
        """The indexes in slices of about SLICE_BYTES (at least one block)."""
        step = max(1, SLICE_BYTES // self.case.block_size)
        return [range(i, min(i + step, self.case.blocks)) for i in range(0, self.case.blocks, step)]


async def run_tasks(
    concurrency: int, indexes: range, work: Callable[[int], Awaitable[None]]
) -> None:
    """`work(i)` for each index with `concurrency` calls in flight."""
    pending = iter(indexes)

    async def worker() -> None:
        for index in pending:
            await work(index)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def timed_node_part(node: NodeProcess, nbytes: int, run: Awaitable[None]) -> Phase:
    node_cpu, client_cpu = node.cpu_seconds(), self_cpu_seconds()
    started = time.perf_counter()
    await run
    seconds = time.perf_counter() - started
    return Phase(nbytes, seconds, node.cpu_seconds() - node_cpu, self_cpu_seconds() - client_cpu)


async def node_write(
    client: BlockClient, node: NodeProcess, blocks: Blocks, indexes: range
) -> Phase:
    async def put(index: int) -> None:
        data, checksum = blocks.payload(index)
        await client.put_block(node.url, blocks.names[index], data, checksum)

    work = run_tasks(blocks.case.concurrency, indexes, put)
    return await timed_node_part(node, len(indexes) * blocks.case.block_size, work)


async def node_read(
    client: BlockClient, node: NodeProcess, blocks: Blocks, indexes: range
) -> Phase:
    async def get(index: int) -> None:
        data = await client.get_block(node.url, blocks.names[index])
        if len(data) != blocks.case.block_size:
            raise RuntimeError(f"block {blocks.names[index]}: {len(data)} bytes")

    work = run_tasks(blocks.case.concurrency, indexes, get)
    return await timed_node_part(node, len(indexes) * blocks.case.block_size, work)


def fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_write_one(root: Path, name: str, data: bytes) -> None:
    """What the node does for a block, minus HTTP and hashing: write, fsync, rename, fsync dir."""
    final_dir = root / "blocks" / name[34:36]  # the node's fan-out folder
    tmp = root / "tmp" / f"{name}.{uuid.uuid4().hex}"
    with open(tmp, "xb") as handle:
        view = memoryview(data)
        for offset in range(0, len(data), RAW_WRITE_BYTES):
            handle.write(view[offset : offset + RAW_WRITE_BYTES])
        handle.flush()
        os.fsync(handle.fileno())
    final_dir.mkdir(exist_ok=True)
    os.rename(tmp, final_dir / name)
    fsync_directory(final_dir)


def raw_read_one(root: Path, name: str, size: int) -> None:
    with open(root / "blocks" / name[34:36] / name, "rb") as handle:
        if len(handle.read()) != size:
            raise RuntimeError(f"raw file {name} is short")


def threaded_part(
    pool: ThreadPoolExecutor, indexes: range, nbytes: int, one: Callable[[int], None]
) -> Phase:
    """`one(i)` for every index over the pool's threads, timed (CPU: this whole process)."""
    cpu = self_cpu_seconds()
    started = time.perf_counter()
    list(pool.map(one, indexes))
    return Phase(nbytes, time.perf_counter() - started, 0.0, self_cpu_seconds() - cpu)


def raw_write(pool: ThreadPoolExecutor, root: Path, blocks: Blocks, indexes: range) -> Phase:
    def one(index: int) -> None:
        raw_write_one(root, blocks.names[index], blocks.payload(index)[0])

    return threaded_part(pool, indexes, len(indexes) * blocks.case.block_size, one)


def raw_read(pool: ThreadPoolExecutor, root: Path, blocks: Blocks, indexes: range) -> Phase:
    def one(index: int) -> None:
        raw_read_one(root, blocks.names[index], blocks.case.block_size)

    return threaded_part(pool, indexes, len(indexes) * blocks.case.block_size, one)


@dataclass(frozen=True)
class Bench:
    """What every case runs against: the node and its client, and the raw files' folder."""

    client: BlockClient
    node: NodeProcess
    raw_root: Path

    async def writes(self, blocks: Blocks, pool: ThreadPoolExecutor) -> tuple[Phase, Phase]:
        """Node and raw writes, a slice of each in turn, so both see the same disk weather."""
        node = raw = Phase()
        for indexes in blocks.slices():
            node += await node_write(self.client, self.node, blocks, indexes)
            raw += await asyncio.to_thread(raw_write, pool, self.raw_root, blocks, indexes)
        return node, raw

    async def reads(self, blocks: Blocks, pool: ThreadPoolExecutor) -> tuple[Phase, Phase]:
        node = raw = Phase()
        for indexes in blocks.slices():
            node += await node_read(self.client, self.node, blocks, indexes)
            raw += await asyncio.to_thread(raw_read, pool, self.raw_root, blocks, indexes)
        return node, raw

    async def run_case(self, case: Case, cold: bool) -> CaseResult:
        blocks = Blocks.make(case)
        (self.raw_root / "tmp").mkdir(parents=True, exist_ok=True)
        (self.raw_root / "blocks").mkdir(exist_ok=True)
        fsync_directory(self.raw_root)
        with ThreadPoolExecutor(max_workers=case.concurrency) as pool:
            written = await self.writes(blocks, pool)
            node_cold = raw_cold = None
            if cold:
                drop_caches()
                node_cold, raw_cold = await self.reads(blocks, pool)
            node_cached, raw_cached = await self.reads(blocks, pool)
        for first in range(0, case.blocks, DELETE_BATCH):
            await self.client.delete_blocks(
                self.node.url, blocks.names[first : first + DELETE_BATCH]
            )
        shutil.rmtree(self.raw_root)
        return CaseResult(
            case,
            *written,
            node_cold,
            raw_cold,
            node_cached,
            raw_cached,
            [written[0].mib_s / written[1].mib_s],
        )


async def benchmark(
    cluster: NodeCluster, raw_root: Path, cases: list[Case], rounds: int, cold: bool
) -> list[list[CaseResult]]:
    """Every case once per round (rounds interleave, so a slow spell of the disk is shared)."""
    client = BlockClient(cluster.secret)
    try:
        bench = Bench(client, cluster.nodes[0], raw_root)
        await wait_until_serving(client, cluster.nodes)
        await bench.run_case(Case(MiB, 1, 16), cold=False)  # warm-up: connections, code, disk
        results: list[list[CaseResult]] = [[] for _ in cases]
        for round_number in range(1, rounds + 1):
            for case, runs in zip(cases, results, strict=True):
                runs.append(await bench.run_case(case, cold))
                print(f"round {round_number}: {case_line(runs[-1])}", flush=True)
        return results
    finally:
        await client.close()


def median_phase(phases: Sequence[Phase | None]) -> Phase | None:
    """The run with the median throughput (its CPU figures come with it)."""
    present = sorted((p for p in phases if p is not None), key=lambda p: p.mib_s)
    return present[(len(present) - 1) // 2] if present else None


def combine(runs: list[CaseResult]) -> CaseResult:
    """One result per case: each phase's median run over the rounds."""

    def pick(name: str) -> Phase | None:
        return median_phase([getattr(r, name) for r in runs])

    return CaseResult(
        runs[0].case,
        **{name: pick(name) for name in PHASE_NAMES},
        write_ratios=[r.node_write.mib_s / r.raw_write.mib_s for r in runs],
    )


# -- the report --------------------------------------------------------------------------


def ratio(node: Phase | None, raw: Phase | None) -> str:
    if node is None or raw is None:
        return "-"
    return f"{node.mib_s / raw.mib_s:.0%}"


def mib_s(phase: Phase | None) -> str:
    return "-" if phase is None else f"{phase.mib_s:,.0f}"


def case_line(r: CaseResult) -> str:
    return (
        f"{r.case.label:>7} x{r.case.concurrency}: write node {mib_s(r.node_write)} "
        f"raw {mib_s(r.raw_write)} MiB/s ({ratio(r.node_write, r.raw_write)}); "
        f"cold read node {mib_s(r.node_cold)} raw {mib_s(r.raw_cold)}; "
        f"cached read node {mib_s(r.node_cached)} raw {mib_s(r.raw_cached)}"
    )


def write_table(results: list[CaseResult]) -> str:
    headers = [
        "block",
        "conc",
        "MiB",
        "node MiB/s",
        "raw MiB/s",
        "node/raw",
        "node/raw per round",
        "node CPU ms/MiB (cores)",
        "client CPU ms/MiB (cores)",
        "raw CPU ms/MiB (cores)",
    ]
    rows = [
        [
            r.case.label,
            r.case.concurrency,
            r.case.blocks * r.case.block_size // MiB,
            mib_s(r.node_write),
            mib_s(r.raw_write),
            ratio(r.node_write, r.raw_write),
            " ".join(f"{x:.0%}" for x in r.write_ratios),
            r.node_write.cpu_cell(r.node_write.node_cpu_seconds),
            r.node_write.cpu_cell(r.node_write.client_cpu_seconds),
            r.raw_write.cpu_cell(r.raw_write.client_cpu_seconds),
        ]
        for r in results
    ]
    return markdown_table(headers, rows)


def read_table(results: list[CaseResult]) -> str:
    headers = [
        "block",
        "conc",
        "cold node",
        "cold raw",
        "node/raw",
        "cached node",
        "cached raw",
        "node/raw",
        "cached: node CPU ms/MiB (cores)",
        "client CPU ms/MiB (cores)",
    ]
    rows = [
        [
            r.case.label,
            r.case.concurrency,
            mib_s(r.node_cold),
            mib_s(r.raw_cold),
            ratio(r.node_cold, r.raw_cold),
            mib_s(r.node_cached),
            mib_s(r.raw_cached),
            ratio(r.node_cached, r.raw_cached),
            r.node_cached.cpu_cell(r.node_cached.node_cpu_seconds),
            r.node_cached.cpu_cell(r.node_cached.client_cpu_seconds),
        ]
        for r in results
    ]
    return markdown_table(headers, rows)


def verdict(results: list[CaseResult]) -> str:
    ratios = {
        r.case.concurrency: r.node_write.mib_s / r.raw_write.mib_s
        for r in results
        if r.case.block_size == MiB
    }
    if BLOCKS_IN_FLIGHT not in ratios:
        return "target: not measured (no 1 MiB case)"
    judged = ratios[BLOCKS_IN_FLIGHT]  # of the medians: how the data path writes to a node
    met = "met" if judged >= TARGET_RATIO else "NOT met"
    target = (
        f"node >= {TARGET_RATIO:.0%} of raw for 1 MiB block writes "
        f"at the data path's {BLOCKS_IN_FLIGHT} in flight"
    )
    others = ", ".join(
        f"{ratio:.0%} at {n} in flight"
        for n, ratio in sorted(ratios.items())
        if n != BLOCKS_IN_FLIGHT
    )
    return f"target {target}: {met} ({judged:.0%}; not judged: {others})"


def cases_for(quick: bool, sizes_kib: Sequence[int] | None = None) -> list[Case]:
    sizes = [s for s in BLOCK_SIZES if sizes_kib is None or s // KiB in sizes_kib]
    return [
        Case(size, concurrency, BYTES_PER_CASE[size] // (QUICK_DIVISOR if quick else 1) // size)
        for size in sizes
        for concurrency in CONCURRENCY
    ]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="an eighth of the data per case")
    parser.add_argument("--rounds", type=int, help="runs of each case, median kept (3; 1 quick)")
    parser.add_argument("--dir", type=Path, help="scratch parent folder (default: system temp)")
    parser.add_argument(
        "--no-drop-caches", action="store_true", help="skip the cold reads (page cache kept)"
    )
    parser.add_argument(
        "--block-kib",
        type=int,
        action="append",
        choices=[s // KiB for s in BLOCK_SIZES],
        help="only this block size (repeatable; default all)",
    )
    parser.add_argument(
        "--node-workers", type=int, default=1, help="[storage] node_workers of the node (1)"
    )
    parser.add_argument(
        "--direct-writes",
        action="store_true",
        help="[storage] direct_writes = true: the node writes blocks by O_DIRECT",
    )
    parser.add_argument("--dsn", help="superuser DSN of an existing PostgreSQL (default: embedded)")
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 3)
    return args


def main() -> None:
    args = parse_args()
    install_sigterm_handler()
    cold = not args.no_drop_caches and drop_caches()
    cases = cases_for(args.quick, args.block_kib)
    with (
        scratch_dir(args.dir, "shoal-storage-bench-") as root,
        postgres_server(args.dsn) as admin,
        scratch_shard(admin) as shard,
        node_cluster(
            shard,
            root,
            ["n0"],
            node_workers=args.node_workers,
            direct_writes=args.direct_writes,
        ) as cluster,
    ):
        summary = machine_summary(shard.dsn)
        print("\n".join(summary))
        print(f"scratch: {filesystem_line(root)}", flush=True)
        if not any("load average" in line for line in summary):
            print(f"load average before: {load_line()}")
        # The client runs on the loop Shoal's own clients (the gateway, the pipeline) run on.
        runs = shoal.loop.run(benchmark(cluster, root / "raw", cases, args.rounds, cold))
        print(f"load average after: {load_line()}")
    results = [combine(r) for r in runs]
    print(f"\nmedian of {args.rounds} round(s) per case")
    print()
    print("writes (MiB/s; CPU: user + system milliseconds per MiB, and cores busy)")
    print(write_table(results))
    print()
    reads = "cold = after drop_caches" if cold else "cold reads skipped (page cache not dropped)"
    print(f"reads (MiB/s; {reads}; cached = from the page cache)")
    print(read_table(results))
    print()
    print(verdict(results))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        raise SystemExit("interrupted; storage nodes stopped and scratch files removed") from None
