"""S3 gateway benchmark: what one `shoal serve` gives S3 clients over HTTP on 127.0.0.1.

    .venv/bin/python bench/s3_bench.py --quick     # 1.5-2.5 min
    .venv/bin/python bench/s3_bench.py             # 4.5-6 min (filling 100,000 keys: 1.5-3)
    .venv/bin/python bench/s3_bench.py --endpoint http://127.0.0.1:9000 \\
        --access-key AK --secret-key SK [--gateway-pid PID]      # an existing server

Server: unless --endpoint is given, `shoal serve` (embedded PostgreSQL, 2 storage nodes, the
gateway) is started in a new session on a free loopback port in a temp dir, its banner read for
the root keys; it is stopped with one SIGINT and the temp dir removed at the end, also on an
error, Ctrl-C or SIGTERM. The gateway is the `shoal serve` process itself; the storage nodes
are its children and PostgreSQL is found through <data-dir>/postgres/data/postmaster.pid.
Before measuring, a PUT is retried until it succeeds (the banner comes before the storage nodes
have registered; the wait and the refusals are printed).

Load generator: this one process, one asyncio loop, aiohttp with a pool of `concurrency`
keep-alive connections; every request is signed by botocore's S3SigV4Auth with
UNSIGNED-PAYLOAD. Its own CPU (getrusage, self + children), signing included, is reported per
phase as cores busy, beside the CPU of the gateway, of the nodes and of PostgreSQL (from
/proc/<pid>/stat) and of everything else on the machine ("others": /proc/stat busy time minus
ours), so the reader can see which side was busy and whether other tenants took the CPU.

Workloads, each phase bounded by a count and a time (whichever comes first):
  small  PUT, GET, HEAD, DELETE of 4 KiB objects at concurrency 1, 16, 64: ops/s, p50/p99
         latency (ms, successful requests), errors (non-2xx or exceptions).
  list   ListObjectsV2 pages of 1000 keys from a bucket filled through the S3 API with 0-byte
         PUTs at concurrency 64 (N keys, or what the fill time bound allows): pages/s, p50/p99;
         one walker following continuation tokens, then 4 walkers starting at N/4 apart.
  big    64 MiB objects by multipart (8 MiB parts; one part at a time per object, `conc`
         objects at once), then GET of each, its bytes compared with what was sent: MiB/s.
  rss    one object of 2 GiB (--quick: 512 MiB) by multipart with 64 MiB parts, 4 parts in
         flight, each part streamed from a generator in 1 MiB pieces (the client holds no
         part); its part ETags checked against MD5s computed while sending. The gateway's
         VmHWM (peak RSS) is reset through /proc/<pid>/clear_refs before and read after (VmRSS
         also sampled every 20 ms); the same for reading the object back. Target < 200 MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import platform
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import yarl
from benchlib import cpu_model, exit_on_sigterm, load_average, markdown_table, memory_gib
from benchlib import percentile as nearest_rank
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from multidict import CIMultiDict

KiB = 1024
MiB = 1024 * KiB
SHOAL = str(Path(sys.executable).parent / "shoal")
REGION = "us-east-1"
TARGET_RSS_MIB = 200
START_TIMEOUT_SECONDS = 120
STOP_TIMEOUT_SECONDS = 60
RSS_SAMPLE_SECONDS = 0.02
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
UNRESERVED = "-_.~"
CORES = "cores busy: client / gateway / nodes / postgres / others"


# -- settings -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    quick: bool
    phase_seconds: float  # small-object phases
    phase_ops: int
    list_keys: int
    fill_seconds: float
    list_seconds: float
    list_pages: int
    big_objects: dict[int, int]  # concurrency -> objects
    big_seconds: float
    rss_object_mib: int
    rss_seconds: float
    small_concurrency: tuple[int, ...] = (1, 16, 64)
    small_size: int = 4 * KiB
    fill_concurrency: int = 64
    big_object_mib: int = 64
    big_part_mib: int = 8
    rss_part_mib: int = 64
    rss_parts_in_flight: int = 4

    @classmethod
    def of(cls, args: argparse.Namespace) -> Settings:
        if args.quick:
            return cls(
                quick=True,
                phase_seconds=3,
                phase_ops=1000,
                list_keys=10_000,
                fill_seconds=60,
                list_seconds=4,
                list_pages=200,
                big_objects={1: 2, 4: 4},
                big_seconds=30,
                rss_object_mib=512,
                rss_seconds=120,
            )
        return cls(
            quick=False,
            phase_seconds=10,
            phase_ops=5000,
            list_keys=100_000,
            fill_seconds=180,
            list_seconds=10,
            list_pages=1000,
            big_objects={1: 4, 4: 8},
            big_seconds=60,
            rss_object_mib=2048,
            rss_seconds=300,
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller and shorter phases")
    parser.add_argument("--endpoint", help="an existing server, e.g. http://127.0.0.1:9000")
    parser.add_argument("--access-key", help="with --endpoint")
    parser.add_argument("--secret-key", help="with --endpoint")
    parser.add_argument(
        "--gateway-pid",
        type=int,
        help='with --endpoint: the gateway process, for CPU and RSS (else all is "others")',
    )
    parser.add_argument(
        "--only",
        default="small,list,big,rss",
        help="comma-separated workloads to run (small, list, big, rss)",
    )
    args = parser.parse_args(argv)
    if args.endpoint and not (args.access_key and args.secret_key):
        parser.error("--endpoint needs --access-key and --secret-key")
    return args


# -- the server -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Server:
    endpoint: str
    access_key: str
    secret_key: str
    gateway_pid: int | None
    data_dir: Path | None = None  # of a `shoal serve` started here


@contextlib.contextmanager
def shoal_server(args: argparse.Namespace) -> Iterator[Server]:
    """The server to measure: the given one, or a `shoal serve` started (and stopped) here."""
    if args.endpoint:
        yield Server(args.endpoint, args.access_key, args.secret_key, args.gateway_pid)
        return
    with started_shoal() as server:
        yield server


@contextlib.contextmanager
def started_shoal(
    temp_prefix: str = "shoal-s3-bench-",
    gateway_workers: int | None = None,
    replicas: int | None = None,
    wrapper: Sequence[str] = (),
    start_timeout: float = START_TIMEOUT_SECONDS,
    shards: int | None = None,
    settings: str = "",
    block_size: int | None = None,
    direct_writes: bool | None = None,
) -> Iterator[Server]:
    """A `shoal serve` in a new temp dir on ports the kernel picks (read back from its
    banner); stopped and the dir removed after.

    gateway_workers: `[s3] workers`; replicas, block_size, direct_writes: `[storage]`'s;
    shards: `[metadata] embedded_shards`, in a configuration file (else Shoal's defaults),
    with `settings` (more TOML tables) after them; wrapper: a command that runs it
    (valgrind, say)."""
    scratch = Path(tempfile.mkdtemp(prefix=temp_prefix))
    storage = {"replicas": replicas, "block_size": block_size, "direct_writes": direct_writes}
    storage_lines = "".join(
        f"{key} = {str(value).lower()}\n" for key, value in storage.items() if value is not None
    )
    try:
        where = ["--data-dir", str(scratch / "data")]
        if gateway_workers is not None or storage_lines or shards is not None or settings:
            config = scratch / "shoal.toml"
            text = 'data_dir = "data"\n'
            if gateway_workers is not None:
                text += f"\n[s3]\nworkers = {gateway_workers}\n"
            if storage_lines:
                text += f"\n[storage]\n{storage_lines}"
            if shards is not None:
                text += f"\n[metadata]\nembedded_shards = {shards}\n"
            config.write_text(text + settings)
            where = ["--config", str(config)]
        with open(scratch / "serve.log", "w") as log:
            # A new session: a Ctrl-C in the terminal reaches only us, and we send one SIGINT.
            process = subprocess.Popen(
                [
                    *wrapper,
                    SHOAL,
                    "serve",
                    *where,
                    *("--port", "0", "--admin-port", "0"),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
            )
            try:
                banner = read_banner(process, start_timeout)
                yield Server(
                    banner_value(banner, "S3 endpoint"),
                    banner_value(banner, "access key id"),
                    banner_value(banner, "secret access key"),
                    process.pid,
                    scratch / "data",
                )
            finally:
                stop_server(process, scratch / "data")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def read_banner(process: subprocess.Popen[str], timeout: float = START_TIMEOUT_SECONDS) -> str:
    """The banner up to "Press Ctrl-C"; stdout is then drained by a thread until exit."""
    lines: list[str] = []
    ready = threading.Event()

    def drain() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "Press Ctrl-C" in line:
                ready.set()

    threading.Thread(target=drain, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not ready.wait(0.2):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"shoal serve did not start: {''.join(lines)[-2000:]}")
    return "".join(lines)


def banner_value(banner: str, label: str) -> str:
    found = re.search(rf"{label}\s+(\S+)", banner)
    if found is None:
        raise RuntimeError(f"no {label!r} in the banner: {banner}")
    return found[1]


def stop_server(process: subprocess.Popen[str], data_dir: Path) -> None:
    """One SIGINT (a clean stop of gateway, nodes and PostgreSQL), then force if it hangs."""
    postmaster = postmaster_pid(data_dir)
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the session we started for it
            process.wait()
    if postmaster is not None and pid_alive(postmaster):
        os.kill(postmaster, signal.SIGINT)  # PostgreSQL's "fast" shutdown
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        while pid_alive(postmaster) and time.monotonic() < deadline:
            time.sleep(0.2)


def postmaster_pid(data_dir: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int((data_dir / "postgres" / "data" / "postmaster.pid").read_text().split()[0])
    return None


def pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


# -- the server's processes: CPU and memory -------------------------------------------------


def proc_stat(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat after the command name (field 3 is index 0)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def children_of(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return [int(p) for p in found]
    return []


def cpu_seconds(pid: int, reaped_children: bool = False) -> float:
    """User + system CPU of a process (and of its children it has waited for)."""
    try:
        fields = proc_stat(pid)
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / CLOCK_TICKS


def status_kib(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return 0


def command_line(pid: int) -> list[str]:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return []


def data_dir_of(pid: int) -> Path | None:
    """The data directory of a `shoal serve` process, from its --data-dir or --config."""
    argv = command_line(pid)
    with contextlib.suppress(OSError, ValueError, KeyError, tomllib.TOMLDecodeError):
        if "--config" in argv:
            config = Path(argv[argv.index("--config") + 1])
            return config.parent / tomllib.loads(config.read_text())["data_dir"]
        return Path(argv[argv.index("--data-dir") + 1])
    return None


def tree_cpu_seconds(pid: int) -> float:
    """CPU of a process and of its live descendants."""
    return cpu_seconds(pid) + sum(tree_cpu_seconds(child) for child in children_of(pid))


def machine_busy_seconds() -> float:
    """CPU time the whole machine spent busy (user, nice, system, irq, softirq; all cores)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields)
    return (user + nice + system + irq + softirq) / CLOCK_TICKS


def own_cpu_seconds() -> float:
    """CPU of this process (the load generator) and of the children it has waited for."""
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds: this process, the gateway, the storage nodes, PostgreSQL, the machine."""

    client: float
    gateway: float
    nodes: float
    postgres: float
    machine: float

    @property
    def server(self) -> float:
        return self.gateway + self.nodes + self.postgres

    @property
    def others(self) -> float:
        """Other work on the machine (other tenants, the kernel's threads)."""
        return max(0.0, self.machine - self.client - self.server)

    def since(self, earlier: CpuSample) -> CpuSample:
        return CpuSample(
            self.client - earlier.client,
            self.gateway - earlier.gateway,
            self.nodes - earlier.nodes,
            self.postgres - earlier.postgres,
            self.machine - earlier.machine,
        )

    def cores(self, seconds: float) -> str:
        """Cores busy over `seconds`: client / gateway / nodes / postgres / others."""
        parts = (self.client, self.gateway, self.nodes, self.postgres, self.others)
        return " / ".join(f"{p / seconds:.2f}" if seconds else "-" for p in parts)


@dataclass(frozen=True)
class ServerProcesses:
    """The gateway and, when known, its storage nodes and the PostgreSQL server."""

    gateway: int | None
    postmaster: int | None

    @classmethod
    def find(cls, gateway: int | None) -> ServerProcesses:
        data_dir = data_dir_of(gateway) if gateway else None
        return cls(gateway, postmaster_pid(data_dir) if data_dir else None)

    def cpu(self) -> CpuSample:
        client = own_cpu_seconds()
        machine = machine_busy_seconds()
        if self.gateway is None:
            return CpuSample(client, 0.0, 0.0, 0.0, machine)
        # The gateway's children: its storage nodes, and its worker processes ([s3] workers).
        gateway, nodes = cpu_seconds(self.gateway), 0.0
        for child in children_of(self.gateway):
            if "storage-node" in command_line(child):
                nodes += tree_cpu_seconds(child)
            else:
                gateway += tree_cpu_seconds(child)
        postgres = 0.0
        if self.postmaster is not None:
            # Backends that exited are in the postmaster's reaped-children time.
            postgres = cpu_seconds(self.postmaster, reaped_children=True)
            postgres += sum(cpu_seconds(p) for p in children_of(self.postmaster))
        return CpuSample(client, gateway, nodes, postgres, machine)

    def observe(self, name: str, concurrency: int) -> contextlib.AbstractContextManager[None]:
        """What to do around each measured phase (nothing here; a profiler in peer_bench)."""
        return contextlib.nullcontext()

    def reset_peak_rss(self) -> bool:
        """Reset the gateway's VmHWM (Linux >= 4.0; needs to own the process or be root)."""
        if self.gateway is None:
            return False
        try:
            Path(f"/proc/{self.gateway}/clear_refs").write_text("5")
        except OSError:
            return False
        return True

    def peak_rss_mib(self) -> float:
        return status_kib(self.gateway, "VmHWM") / KiB if self.gateway else 0.0

    def rss_mib(self) -> float:
        return status_kib(self.gateway, "VmRSS") / KiB if self.gateway else 0.0


class RssSampler:
    """The gateway's VmRSS, sampled by a thread: the peak seen and the value at the start."""

    def __init__(self, processes: ServerProcesses) -> None:
        self.processes = processes
        self.start = processes.rss_mib()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(RSS_SAMPLE_SECONDS):
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, self.processes.rss_mib())


# -- the S3 client --------------------------------------------------------------------------


class S3Failure(Exception):
    """A request answered with an error status (or a wrong body)."""


class UnsignedPayloadAuth(S3SigV4Auth):
    """SigV4 over headers only (x-amz-content-sha256: UNSIGNED-PAYLOAD), as SDKs do on TLS."""

    def _should_sha256_sign_payload(self, request: AWSRequest) -> bool:
        return False


class S3:
    """Signed S3 requests over one aiohttp session (path-style addressing)."""

    def __init__(self, server: Server, connections: int) -> None:
        self.endpoint = server.endpoint.rstrip("/")
        self.signer = UnsignedPayloadAuth(
            Credentials(server.access_key, server.secret_key), "s3", REGION
        )
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=120),
            auto_decompress=False,
        )

    async def __aenter__(self) -> S3:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()

    def url(self, bucket: str, key: str = "", query: dict[str, str] | None = None) -> str:
        path = f"/{quote(bucket, safe='')}" + (
            f"/{quote(key, safe='/' + UNRESERVED)}" if key else ""
        )
        if query:
            path += "?" + "&".join(
                f"{quote(k, safe=UNRESERVED)}={quote(v, safe=UNRESERVED)}"
                for k, v in sorted(query.items())
            )
        return self.endpoint + path

    def open(
        self,
        method: str,
        bucket: str,
        key: str = "",
        query: dict[str, str] | None = None,
        data: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """A signed request, to use as `async with`: the response, not yet read."""
        url = self.url(bucket, key, query)
        signed = AWSRequest(method=method, url=url, headers=dict(headers or {}))
        self.signer.add_auth(signed)
        return self.session.request(
            method, yarl.URL(url, encoded=True), data=data, headers=dict(signed.headers.items())
        )

    async def call(
        self,
        method: str,
        bucket: str,
        key: str = "",
        query: dict[str, str] | None = None,
        data: Any = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[bytes, CIMultiDict[str]]:
        """The body and headers of a successful response; S3Failure otherwise."""
        async with self.open(method, bucket, key, query, data, headers) as response:
            body = await response.read()
            if response.status >= 300:
                raise S3Failure(f"{method} {response.status} {error_code(body)}")
            return body, CIMultiDict(response.headers)


def error_code(body: bytes) -> str:
    found = re.search(rb"<Code>([^<]*)</Code>", body)
    return found[1].decode() if found else ""


def xml_value(body: bytes, element: str) -> str:
    found = re.search(rf"<{element}>([^<]*)</{element}>".encode(), body)
    if found is None:
        raise S3Failure(f"no <{element}> in {body[:200]!r}")
    return found[1].decode()


# -- phases: bounded runs of one operation --------------------------------------------------


@dataclass
class Phase:
    """What a phase did: per-operation latencies, errors, wall time and CPU."""

    name: str
    concurrency: int
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    units: float = 0.0  # bytes, keys or pages moved, as the workload counts them
    cpu: CpuSample = CpuSample(0, 0, 0, 0, 0)

    @property
    def ops(self) -> int:
        return len(self.latencies)

    def rate(self, amount: float) -> float:
        return amount / self.seconds if self.seconds else 0.0

    def ms(self, fraction: float) -> float:
        return nearest_rank(self.latencies, fraction) * 1000

    def cores(self) -> str:
        return self.cpu.cores(self.seconds)


Operation = Callable[[int], Awaitable[float]]  # op number -> units moved


async def run_phase(
    name: str,
    concurrency: int,
    operation: Operation,
    max_ops: int,
    max_seconds: float,
    processes: ServerProcesses,
) -> Phase:
    """`concurrency` workers take op numbers 0, 1, ... until max_ops or max_seconds."""
    phase = Phase(name, concurrency)
    counter = iter(range(max_ops))

    async def worker() -> None:
        for number in counter:
            if time.perf_counter() > deadline:
                return
            t0 = time.perf_counter()
            try:
                moved = await operation(number)
            except (S3Failure, aiohttp.ClientError, TimeoutError) as exc:
                phase.errors.append(f"{name}: {exc!r}"[:300])
                continue
            phase.latencies.append(time.perf_counter() - t0)
            phase.units += moved

    with processes.observe(name, concurrency):
        started = time.perf_counter()
        deadline = started + max_seconds
        before = processes.cpu()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        phase.seconds = time.perf_counter() - started
        phase.cpu = processes.cpu().since(before)
    progress(
        f"{name} c={concurrency}: {phase.ops} ok, {len(phase.errors)} errors, "
        f"{phase.seconds:.1f} s, cores {phase.cores()}"
    )
    return phase


def progress(line: str) -> None:
    print(f"  [{datetime.now():%H:%M:%S}] {line}", file=sys.stderr, flush=True)


# -- workload: small objects ----------------------------------------------------------------


async def small_objects(
    server: Server, settings: Settings, processes: ServerProcesses, bucket: str
) -> list[Phase]:
    body = os.urandom(settings.small_size)
    phases = []
    for concurrency in settings.small_concurrency:
        async with S3(server, concurrency) as s3:
            phases += await small_round(s3, settings, processes, bucket, concurrency, body)
    return phases


async def small_round(
    s3: S3,
    settings: Settings,
    processes: ServerProcesses,
    bucket: str,
    concurrency: int,
    body: bytes,
) -> list[Phase]:
    """PUT new keys, GET and HEAD random ones of them, DELETE them, at one concurrency."""
    stored: list[str] = []
    rng = random.Random(concurrency)

    async def put(n: int) -> float:
        key = f"small/c{concurrency}/{n:08d}"
        await s3.call("PUT", bucket, key, data=body)
        stored.append(key)
        return len(body)

    async def get(n: int) -> float:
        got, _ = await s3.call("GET", bucket, rng.choice(stored))
        if got != body:
            raise S3Failure(f"GET returned {len(got)} bytes that differ from the PUT")
        return len(got)

    async def head(n: int) -> float:
        _, headers = await s3.call("HEAD", bucket, rng.choice(stored))
        if int(headers.get("Content-Length", -1)) != len(body):
            raise S3Failure(f"HEAD Content-Length {headers.get('Content-Length')}")
        return 0

    async def delete(n: int) -> float:
        await s3.call("DELETE", bucket, stored[n])
        return 0

    bound = (settings.phase_ops, settings.phase_seconds, processes)
    phases = [await run_phase("PUT", concurrency, put, *bound)]
    if stored:
        phases.append(await run_phase("GET", concurrency, get, *bound))
        phases.append(await run_phase("HEAD", concurrency, head, *bound))
        bound = (len(stored), settings.phase_seconds, processes)
        phases.append(await run_phase("DELETE", concurrency, delete, *bound))
    return phases


def phase_row(p: Phase, rate: str, latencies: list[str], units: float, digits: int) -> list[object]:
    """A phase's row in a table: what it did, its rate and latencies, then the CPU
    milliseconds per unit (of `units` moved) of the gateway and of the whole server."""
    per_unit = [
        f"{cpu / units * 1000:.{digits}f}" if units else "-"
        for cpu in (p.cpu.gateway, p.cpu.server)
    ]
    return [
        p.name,
        p.concurrency,
        p.ops,
        len(p.errors),
        f"{p.seconds:.1f}",
        rate,
        *latencies,
        *per_unit,
        p.cores(),
    ]


def small_table(phases: Sequence[Phase]) -> str:
    rows = [
        phase_row(p, f"{p.rate(p.ops):,.0f}", [f"{p.ms(0.5):.1f}", f"{p.ms(0.99):.1f}"], p.ops, 2)
        for p in phases
    ]
    headers = ["op", "conc", "ops", "errors", "s", "ops/s", "p50 ms", "p99 ms"]
    headers += ["CPU ms/op: gateway", "all server", CORES]
    return markdown_table(headers, rows)


# -- workload: listing ----------------------------------------------------------------------


@dataclass
class Listing:
    fill: Phase
    keys: int  # keys in the bucket
    walked: int  # keys seen by the first complete walk
    pages: list[Phase]


async def listing(
    server: Server, settings: Settings, processes: ServerProcesses, bucket: str
) -> Listing:
    async with S3(server, settings.fill_concurrency) as s3:

        async def fill(n: int) -> float:
            await s3.call("PUT", bucket, list_key(n), data=b"")
            return 1

        bound = (settings.list_keys, settings.fill_seconds, processes)
        filled = await run_phase("PUT 0 B (fill)", settings.fill_concurrency, fill, *bound)
    keys = filled.ops + len(filled.errors)  # attempted keys; failures are counted apart
    walked = await walk_all(server, bucket)
    pages = [
        await list_pages(server, settings, processes, bucket, walkers, keys) for walkers in (1, 4)
    ]
    return Listing(filled, keys, walked, pages)


def list_key(n: int) -> str:
    return f"k/{n:08d}"


async def walk_all(server: Server, bucket: str) -> int:
    """Keys in the bucket, counted by following continuation tokens to the end."""
    seen, token = 0, None
    async with S3(server, 1) as s3:
        while True:
            body, _ = await s3.call("GET", bucket, query=list_query(token, None))
            seen += int(xml_value(body, "KeyCount"))
            if b"<IsTruncated>true</IsTruncated>" not in body:
                return seen
            token = xml_value(body, "NextContinuationToken")


def list_query(
    token: str | None, start_after: str | None, prefix: str = "", delimiter: str = ""
) -> dict[str, str]:
    query = {"list-type": "2", "max-keys": "1000"}
    if prefix:
        query["prefix"] = prefix
    if delimiter:
        query["delimiter"] = delimiter
    if token is not None:
        query["continuation-token"] = token
    elif start_after:
        query["start-after"] = start_after
    return query


async def list_pages(
    server: Server,
    settings: Settings,
    processes: ServerProcesses,
    bucket: str,
    walkers: int,
    keys: int,
) -> Phase:
    """`walkers` clients each walk the bucket page by page from their own start, wrapping."""
    async with S3(server, walkers) as s3:
        tokens: list[str | None] = [None] * walkers
        starts = [list_key(keys * w // walkers - 1) if w else "" for w in range(walkers)]
        idle = list(range(walkers))  # one request per walker at a time

        async def page(n: int) -> float:
            walker = idle.pop()
            try:
                query = list_query(tokens[walker], starts[walker])
                body, _ = await s3.call("GET", bucket, query=query)
            finally:
                idle.append(walker)
            truncated = b"<IsTruncated>true</IsTruncated>" in body
            tokens[walker] = xml_value(body, "NextContinuationToken") if truncated else None
            starts[walker] = ""  # after the first page, wrap to the bucket's start
            return int(xml_value(body, "KeyCount"))

        bound = (settings.list_pages, settings.list_seconds, processes)
        return await run_phase("LIST 1000", walkers, page, *bound)


def listing_table(result: Listing) -> str:
    f = result.fill
    rows = [
        [
            f"fill: PUT 0 B x {result.keys:,}",
            f.concurrency,
            f"{f.ops:,} puts",
            len(f.errors),
            f"{f.seconds:.1f}",
            f"{f.rate(f.ops):,.0f} puts/s",
            f"{f.ms(0.5):.1f}",
            f"{f.ms(0.99):.1f}",
            f.cores(),
        ]
    ]
    for p in result.pages:
        rows.append(
            [
                "ListObjectsV2 max-keys=1000",
                p.concurrency,
                f"{p.ops:,} pages",
                len(p.errors),
                f"{p.seconds:.1f}",
                f"{p.rate(p.ops):,.1f} pages/s ({p.rate(p.units):,.0f} keys/s)",
                f"{p.ms(0.5):.1f}",
                f"{p.ms(0.99):.1f}",
                p.cores(),
            ]
        )
    headers = ["workload", "conc", "done", "errors", "s", "rate", "p50 ms", "p99 ms"]
    headers.append(CORES)
    return markdown_table(headers, rows)


# -- the content of big objects -------------------------------------------------------------


HEADER_BYTES = 16


class Pattern:
    """Object content made on the fly: MiB n of object `tag` is a random MiB whose first 16
    bytes are (tag, n), so that misplaced parts or blocks show on reading back."""

    def __init__(self) -> None:
        self.seed = os.urandom(MiB)

    def mib(self, tag: int, n: int) -> bytes:
        return tag.to_bytes(8, "big") + n.to_bytes(8, "big") + self.seed[HEADER_BYTES:]

    def part(self, tag: int, first_mib: int, mibs: int) -> bytes:
        return b"".join(self.mib(tag, n) for n in range(first_mib, first_mib + mibs))

    async def stream(self, tag: int, first_mib: int, mibs: int, md5: Any) -> AsyncIterator[bytes]:
        """The same bytes as part(), one MiB at a time, fed to `md5` on the way."""
        for n in range(first_mib, first_mib + mibs):
            piece = self.mib(tag, n)
            md5.update(piece)
            yield piece

    def matches(self, tag: int, offset: int, chunk: bytes) -> bool:
        """Whether `chunk`, read at `offset` of object `tag`, is what was written there.

        Compared in place (bytes.startswith at an offset, against memoryview slices of the
        seed: memcmp, no copies): building each expected MiB and slicing both sides cost the
        load generator as much CPU per MiB as a 64 MiB GET costs the server, and capped the
        GETs it measured."""
        seed = memoryview(self.seed)
        position = 0
        while position < len(chunk):
            n, within = divmod(offset + position, MiB)
            take = min(MiB - within, len(chunk) - position)
            header = tag.to_bytes(8, "big") + n.to_bytes(8, "big")
            if within < HEADER_BYTES:  # the (tag, n) header of MiB n, then the seed
                head = header[within : min(HEADER_BYTES, within + take)]
                if not chunk.startswith(head, position):
                    return False
                position, within, take = (
                    position + len(head),
                    within + len(head),
                    take - len(head),
                )
            if take and not chunk.startswith(seed[within : within + take], position):
                return False
            position += take
        return True


async def multipart_upload(
    s3: S3, bucket: str, key: str, parts: Sequence[Callable[[], Any]], in_flight: int
) -> list[str]:
    """Create, upload `parts` (callables giving each part's body and length), `in_flight` at
    a time, complete; the part ETags in order. Aborts the upload on failure."""
    body, _ = await s3.call("POST", bucket, key, query={"uploads": ""})
    upload_id = xml_value(body, "UploadId")
    etags: dict[int, str] = {}
    numbers = iter(range(1, len(parts) + 1))

    async def send() -> None:
        for number in numbers:
            data, length = parts[number - 1]()
            _, headers = await s3.call(
                "PUT",
                bucket,
                key,
                query={"partNumber": str(number), "uploadId": upload_id},
                data=data,
                headers={"Content-Length": str(length)},
            )
            etags[number] = headers["ETag"]

    try:
        await asyncio.gather(*(send() for _ in range(in_flight)))
        listed = "".join(
            f"<Part><PartNumber>{n}</PartNumber><ETag>{etags[n]}</ETag></Part>"
            for n in sorted(etags)
        )
        await s3.call(
            "POST",
            bucket,
            key,
            query={"uploadId": upload_id},
            data=f"<CompleteMultipartUpload>{listed}</CompleteMultipartUpload>".encode(),
        )
    except BaseException:
        with contextlib.suppress(Exception):
            await asyncio.shield(s3.call("DELETE", bucket, key, query={"uploadId": upload_id}))
        raise
    return [etags[n] for n in sorted(etags)]


async def read_back(s3: S3, bucket: str, key: str, pattern: Pattern, tag: int) -> int:
    """GET an object, compare every byte with the pattern; the byte count."""
    offset = 0
    async with s3.open("GET", bucket, key) as response:
        if response.status != 200:
            raise S3Failure(f"GET {response.status} {error_code(await response.read())}")
        async for chunk in response.content.iter_any():  # as received: no joining copies
            if not pattern.matches(tag, offset, chunk):
                raise S3Failure(f"GET {key}: bytes at {offset} differ from what was written")
            offset += len(chunk)
    return offset


async def upload_pattern(
    s3: S3, bucket: str, key: str, pattern: Pattern, tag: int, mib: int, part_mib: int
) -> None:
    """Object `tag` of the pattern, `mib` MiB, uploaded by multipart in parts of `part_mib`."""

    def part(first: int) -> Callable[[], tuple[bytes, int]]:
        return lambda: (pattern.part(tag, first, part_mib), part_mib * MiB)

    parts = [part(first) for first in range(0, mib, part_mib)]
    await multipart_upload(s3, bucket, key, parts, in_flight=1)


async def read_back_whole(
    s3: S3, bucket: str, key: str, pattern: Pattern, tag: int, size: int
) -> int:
    """read_back, and the object must be all of its `size` bytes."""
    got = await read_back(s3, bucket, key, pattern, tag)
    if got != size:
        raise S3Failure(f"GET returned {got} bytes, expected {size}")
    return got


# -- workload: big objects ------------------------------------------------------------------


async def big_objects(
    server: Server, settings: Settings, processes: ServerProcesses, bucket: str
) -> list[Phase]:
    pattern = Pattern()
    phases = []
    for concurrency, objects in settings.big_objects.items():
        async with S3(server, concurrency) as s3:
            phases += await big_round(
                s3, settings, processes, bucket, concurrency, objects, pattern
            )
    return phases


async def big_round(
    s3: S3,
    settings: Settings,
    processes: ServerProcesses,
    bucket: str,
    concurrency: int,
    objects: int,
    pattern: Pattern,
) -> list[Phase]:
    """Upload `objects` objects by multipart, `concurrency` at a time, then read them back."""
    mib, part_mib = settings.big_object_mib, settings.big_part_mib
    uploaded: list[int] = []

    async def put(n: int) -> float:
        tag = concurrency * 1000 + n
        await upload_pattern(s3, bucket, f"big/{tag}", pattern, tag, mib, part_mib)
        uploaded.append(tag)
        return mib * MiB

    async def get(n: int) -> float:
        tag = uploaded[n]
        return await read_back_whole(s3, bucket, f"big/{tag}", pattern, tag, mib * MiB)

    bound = (objects, settings.big_seconds, processes)
    phases = [await run_phase(f"PUT {mib} MiB (multipart)", concurrency, put, *bound)]
    bound = (len(uploaded), settings.big_seconds, processes)
    phases.append(await run_phase(f"GET {mib} MiB", concurrency, get, *bound))
    return phases


def big_table(phases: Sequence[Phase]) -> str:
    rows = [
        phase_row(p, f"{p.rate(p.units) / MiB:,.0f}", [f"{p.ms(0.5) / 1000:.2f}"], p.units / MiB, 1)
        for p in phases
    ]
    headers = ["op", "conc", "objects", "errors", "s", "MiB/s", "p50 s/object"]
    headers += ["CPU ms/MiB: gateway", "all server", CORES]
    return markdown_table(headers, rows)


# -- workload: peak RSS of the gateway during a large upload --------------------------------


@dataclass
class RssRun:
    name: str
    mib: int
    seconds: float
    rss_before: float
    peak_sampled: float
    peak_hwm: float | None  # None when VmHWM could not be reset first
    cpu: CpuSample
    error: str | None


async def rss_upload(
    server: Server, settings: Settings, processes: ServerProcesses, bucket: str
) -> list[RssRun]:
    pattern = Pattern()
    tag = 7
    key = "rss/object"
    part_mib, total_mib = settings.rss_part_mib, settings.rss_object_mib
    md5s: list[Any] = []

    def part(first: int) -> Callable[[], tuple[AsyncIterator[bytes], int]]:
        def body() -> tuple[AsyncIterator[bytes], int]:
            md5 = hashlib.md5(usedforsecurity=False)
            md5s.append((first, md5))
            return pattern.stream(tag, first, part_mib, md5), part_mib * MiB

        return body

    async with S3(server, settings.rss_parts_in_flight) as s3:

        async def upload() -> None:
            parts = [part(m) for m in range(0, total_mib, part_mib)]
            etags = await multipart_upload(s3, bucket, key, parts, settings.rss_parts_in_flight)
            sent = [f'"{md5.hexdigest()}"' for _, md5 in sorted(md5s, key=lambda p: p[0])]
            if etags != sent:
                raise S3Failure("part ETags differ from the MD5s of the parts sent")

        async def download() -> None:
            got = await read_back(s3, bucket, key, pattern, tag)
            if got != total_mib * MiB:
                raise S3Failure(f"GET returned {got} bytes, expected {total_mib} MiB")

        name = (
            f"PUT {total_mib} MiB multipart, {total_mib // part_mib} x {part_mib} MiB parts, "
            f"{settings.rss_parts_in_flight} in flight"
        )
        runs = [await measured_rss(name, total_mib, upload(), settings, processes)]
        if runs[0].error is None:
            name = f"GET {total_mib} MiB"
            runs.append(await measured_rss(name, total_mib, download(), settings, processes))
    return runs


async def measured_rss(
    name: str,
    mib: int,
    work: Awaitable[None],
    settings: Settings,
    processes: ServerProcesses,
) -> RssRun:
    reset = processes.reset_peak_rss()
    before_cpu = processes.cpu()
    started = time.perf_counter()
    error = None
    with RssSampler(processes) as sampler:
        try:
            await asyncio.wait_for(work, settings.rss_seconds)
        except (S3Failure, aiohttp.ClientError, TimeoutError) as exc:
            error = repr(exc)[:300]
    seconds = time.perf_counter() - started
    cpu = processes.cpu().since(before_cpu)
    run = RssRun(
        name,
        mib,
        seconds,
        sampler.start,
        sampler.peak,
        processes.peak_rss_mib() if reset else None,
        cpu,
        error,
    )
    progress(f"{name}: {seconds:.1f} s, peak RSS {run.peak_hwm or sampler.peak:.0f} MiB, {error}")
    return run


def rss_table(runs: Sequence[RssRun]) -> str:
    rows = []
    for r in runs:
        rows.append(
            [
                r.name,
                "yes" if r.error is None else f"no: {r.error}",
                f"{r.seconds:.1f}",
                f"{r.mib / r.seconds:,.0f}",
                f"{r.rss_before:.0f}",
                f"{r.peak_sampled:.0f}",
                "-" if r.peak_hwm is None else f"{r.peak_hwm:.0f}",
                r.cpu.cores(r.seconds),
            ]
        )
    headers = ["gateway process during", "ok", "s", "MiB/s", "RSS before MiB"]
    headers += ["peak VmRSS sampled MiB", "VmHWM MiB", CORES]
    return markdown_table(headers, rows)


# -- the run --------------------------------------------------------------------------------


def machine_lines(server: Server, processes: ServerProcesses) -> list[str]:
    return [
        f"date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; code: {code_version()}",
        f"machine: {os.cpu_count()} cores ({cpu_model()}), {memory_gib():.1f} GiB RAM, "
        f"Linux {platform.release()}, Python {platform.python_version()}, "
        f"aiohttp {aiohttp.__version__}",
        f"server: {server.endpoint}, gateway pid {processes.gateway}, "
        f"postmaster pid {processes.postmaster}",
    ]


def code_version() -> str:
    """The commit, and how many files under shoal/ differ from it (others may be editing)."""

    def git(*args: str) -> str:
        where = str(Path(__file__).resolve().parent.parent)
        done = subprocess.run(["git", "-C", where, *args], capture_output=True, text=True)
        return done.stdout.strip()

    changed = [line for line in git("status", "--porcelain", "--", "shoal").splitlines() if line]
    commit = git("rev-parse", "--short", "HEAD") or "?"
    return f"commit {commit}, {len(changed)} files changed in shoal/"


async def run_workloads(
    server: Server, settings: Settings, processes: ServerProcesses, only: set[str]
) -> list[str]:
    """Run the chosen workloads; the report's sections (printed as each is done)."""
    suffix = f"{int(time.time())}-{os.getpid()}"
    buckets = {"main": f"bench-{suffix}", "list": f"bench-list-{suffix}"}
    async with S3(server, 1) as s3:
        for bucket in buckets.values():
            await s3.call("PUT", bucket)
        waited, refused = await wait_until_writable(s3, buckets["main"])
    print(f"first PUT accepted after {waited:.1f} s ({refused} refused before)\n", flush=True)
    sections: list[str] = []

    def section(title: str, table: str) -> None:
        sections.append(f"{title}\n\n{table}\n")
        print(sections[-1], flush=True)

    if "small" in only:
        phases = await small_objects(server, settings, processes, buckets["main"])
        section(f"Small objects ({settings.small_size // KiB} KiB)", small_table(phases))
        report_errors(phases)
    if "list" in only:
        result = await listing(server, settings, processes, buckets["list"])
        title = f"Listing (bucket of {result.keys:,} keys; a full walk saw {result.walked:,})"
        section(title, listing_table(result))
        report_errors([result.fill, *result.pages])
    if "big" in only:
        phases = await big_objects(server, settings, processes, buckets["main"])
        title = f"Big objects ({settings.big_object_mib} MiB, {settings.big_part_mib} MiB parts)"
        section(title, big_table(phases))
        report_errors(phases)
    if "rss" in only:
        hwm_so_far = processes.peak_rss_mib()
        runs = await rss_upload(server, settings, processes, buckets["main"])
        title = (
            f"Gateway memory (target peak RSS < {TARGET_RSS_MIB} MiB; "
            f"VmHWM over all earlier workloads: {hwm_so_far:.0f} MiB)"
        )
        section(title, rss_table(runs))
    return sections


async def wait_until_writable(s3: S3, bucket: str) -> tuple[float, int]:
    """Seconds until a PUT succeeds and how many were refused: `shoal serve` prints its
    banner before the storage nodes have registered, and answers 503 until they have."""
    started, refused = time.perf_counter(), 0
    while True:
        try:
            await s3.call("PUT", bucket, "probe", data=b"probe")
            return time.perf_counter() - started, refused
        except (S3Failure, aiohttp.ClientError):
            refused += 1
            if time.perf_counter() - started > START_TIMEOUT_SECONDS:
                raise
            await asyncio.sleep(0.1)


def report_errors(phases: Sequence[Phase]) -> None:
    errors = [e for p in phases for e in p.errors]
    if errors:
        distinct = sorted(set(errors))
        print(f"{len(errors)} errors; first kinds: {distinct[:5]}\n", flush=True)


def load_generator_usage() -> str:
    own = resource.getrusage(resource.RUSAGE_SELF)
    cpu = own.ru_utime + own.ru_stime
    return f"load generator: {cpu:.0f} s CPU in all, peak RSS {own.ru_maxrss / KiB:.0f} MiB"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = Settings.of(args)
    only = {w.strip() for w in args.only.split(",") if w.strip()}
    print(load_average("at start"), flush=True)
    with exit_on_sigterm(), shoal_server(args) as server:
        processes = ServerProcesses.find(server.gateway_pid)
        print("\n".join(machine_lines(server, processes)), flush=True)
        mode = "quick" if settings.quick else "full"
        print(f"mode: {mode}; {settings}\n", flush=True)
        started = time.perf_counter()
        asyncio.run(run_workloads(server, settings, processes, only))
        print(f"gateway VmHWM at the end: {processes.peak_rss_mib():.0f} MiB (since last reset)")
        print(f"workloads took {time.perf_counter() - started:.0f} s; {load_generator_usage()}")
    print(load_average("at end"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
