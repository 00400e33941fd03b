"""`shoal gc run` against `shoal pipeline gc`, on local[2] and on a Spark standalone cluster of
1, 2 and 4 executors, on the same backlog of deletion records, run as an operator runs them.

    .venv/bin/python bench/pipeline_gc_bench.py                      # 100,000 and 1,000,000
    .venv/bin/python bench/pipeline_gc_bench.py --records 100000 --executors 1 2

Set-up: the embedded PostgreSQL 18 (127.0.0.1, a scratch database, 64 vnodes as the default
configuration has, one day windows), two `shoal storage-node` processes registering in it.
For each record count and each runner, the backlog is made afresh: N deletion records spread
over the vnodes, each naming one 100-byte block on both nodes; for a tenth of them the block
files exist (made on the nodes' disks in their layout), the others are already missing (the
node answers "missing", which counts as gone). Then the runner is started as a command:

- `shoal gc run --leeway 0s` (the one-process collector, its default workers);
- `shoal pipeline gc --leeway 0s --master local[2]`;
- `shoal pipeline gc --leeway 0s --master spark://127.0.0.1:PORT` with `spark.cores.max` E and
  one core per executor, so E executors (a master and a worker with 4 cores started here).

Each run is checked: exit 0, no record left, no block file left. Printed per run: the wall
time of the command (Spark's start included) and records per second over it, the job's own
seconds when it prints them, records per second per executor, and the peak resident memory
(psutil, sampled every 0.2 s) of the driver (the command's process and its JVM; in local
mode the executors run inside that JVM) and of the executors' processes (the Python workers
and, on the cluster, each executor's JVM with its Python workers).

Everything binds 127.0.0.1; nodes, Spark, PostgreSQL and the scratch folder are cleaned up on
exit, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from benchlib import exit_on_sigterm, load_average, postgres_server
from gc_bench import (
    PAYLOAD,
    PAYLOAD_CHECKSUM,
    Bench,
    bench_world,
    clear_records,
    count_records,
    files_on_nodes,
    insert_records,
    sample_ids,
    write_block_files,
)

from shoal.config import DEFAULT_VNODES
from shoal.storage.blockfile import HEADER, MAGIC

SHOAL = str(Path(sys.executable).parent / "shoal")
# This checkout, for the commands the bench runs (the venv's editable install may point at
# another checkout) and for the test suite's standalone cluster (tests/fixtures/cluster.py).
REPO = Path(__file__).resolve().parents[1]
REAL_BLOCKS = 0.1  # the share of records whose block files exist
WORKER_CORES = 4
SAMPLE_SECONDS = 0.2
RUN_TIMEOUT = 3600


@dataclass
class Peaks:
    """Peak resident memory, in bytes, of the parts of a run's process trees."""

    driver: int = 0  # the command's process and its JVM (with local mode's executors)
    python_workers: int = 0  # every executor-side Python process at once
    executor: int = 0  # the largest one executor (its JVM and its Python workers)
    total: int = 0  # everything at once
    samples: int = 0
    # CPU seconds (user + system) of each process of the run's trees, as last sampled, and
    # what each process is: "Python workers", "JVMs" (the driver's, executors'), "driver".
    cpu: dict[int, float] = field(default_factory=dict)
    kinds: dict[int, str] = field(default_factory=dict)

    def cpu_of(self, kind: str) -> float:
        return sum(seconds for pid, seconds in self.cpu.items() if self.kinds[pid] == kind)


@dataclass
class Outcome:
    runner: str
    records: int
    seconds: float
    job_seconds: float | None
    executors: int
    peaks: Peaks
    left: tuple[int, int]  # records, block files
    figures: dict[str, Any] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds: command, nodes, postgres

    @property
    def rate(self) -> float:
        return self.records / self.seconds


# -- memory ------------------------------------------------------------------------------------


def _is_python_worker(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return any(
            "pyspark.daemon" in part or "pyspark.worker" in part for part in process.cmdline()
        )
    return False


def _is_executor_jvm(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return any("CoarseGrainedExecutorBackend" in part for part in process.cmdline())
    return False


def _kind(process: psutil.Process) -> str:
    if _is_python_worker(process):
        return "Python workers"
    with contextlib.suppress(psutil.Error):
        if process.name() == "java":
            return "JVMs"
    return "driver"


def _rss(process: psutil.Process) -> int:
    with contextlib.suppress(psutil.Error):
        return int(process.memory_info().rss)
    return 0


def _tree(root: psutil.Process) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return [root, *root.children(recursive=True)]
    return []


class MemoryWatch:
    """Samples the process trees of the command and of the Spark worker (whose children are
    the cluster's executors) until stopped."""

    def __init__(self, command: psutil.Process, worker: psutil.Process | None) -> None:
        self.command = command
        self.worker = worker
        self.peaks = Peaks()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(SAMPLE_SECONDS)

    def _sample(self) -> None:
        peaks = self.peaks
        driver = python = total = 0
        for process in _tree(self.command):
            self._cpu(process)
            rss = _rss(process)
            total += rss
            if _is_python_worker(process):
                python += rss
            else:
                driver += rss
        biggest = 0
        if self.worker is not None:
            for executor in [p for p in _tree(self.worker) if _is_executor_jvm(p)]:
                own = 0
                for process in _tree(executor):
                    self._cpu(process)
                    rss = _rss(process)
                    own += rss
                    total += rss
                    if _is_python_worker(process):
                        python += rss
                biggest = max(biggest, own)
        if python and self.worker is None:
            biggest = python  # local mode: the one executor's Python workers
        peaks.driver = max(peaks.driver, driver)
        peaks.python_workers = max(peaks.python_workers, python)
        peaks.executor = max(peaks.executor, biggest)
        peaks.total = max(peaks.total, total)
        peaks.samples += 1

    def _cpu(self, process: psutil.Process) -> None:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            self.peaks.cpu[process.pid] = times.user + times.system
            # As last seen: the JVM starts as a shell script that execs it.
            self.peaks.kinds[process.pid] = _kind(process)


# -- a standalone cluster ---------------------------------------------------------------------


@contextlib.contextmanager
def standalone_cluster(root: Path, cores: int) -> Iterator[Any]:
    """A master and one worker offering `cores` cores on 127.0.0.1, stopped on exit."""
    sys.path.insert(0, str(REPO))
    from tests.fixtures.cluster import start_spark_standalone

    cluster = start_spark_standalone(root, cores=cores, memory=f"{cores}g")
    try:
        cluster.wait_for_worker()
        yield cluster
    finally:
        cluster.stop()


# -- runs --------------------------------------------------------------------------------------


def make_backlog(bench: Bench, records: int) -> list[str]:
    """Fresh deletion records; the block names whose files exist on both nodes."""
    clear_records(bench.shard.dsn, bench.ring.vnodes)
    real = sample_ids(int(records * REAL_BLOCKS))
    content = HEADER.pack(MAGIC, len(PAYLOAD), bytes.fromhex(PAYLOAD_CHECKSUM)) + PAYLOAD
    for node in bench.nodes:
        write_block_files(node.root / "blocks", real, content)
    insert_records(bench, records, real)
    with contextlib.closing(_connect(bench)) as conn:
        conn.execute("VACUUM ANALYZE")
    return [f"{version}.0" for version in real]


def _connect(bench: Bench) -> Any:
    import psycopg

    return psycopg.connect(bench.shard.dsn, autocommit=True)


def config_for(bench: Bench, executors: int) -> Path:
    """The bench's configuration, with one core per executor and at most `executors` cores
    for the job (standalone); the local master ignores both."""
    base = (bench.scratch / "shoal.toml").read_text()
    path = bench.scratch / f"shoal-{executors}.toml"
    path.write_text(
        base
        + '[pipeline]\nexecutor_cores = 1\nexecutor_memory = "1g"\n'
        + f'[pipeline.spark]\n"spark.cores.max" = "{executors}"\n'
    )
    return path


def run_command(
    bench: Bench,
    runner: str,
    command: list[str],
    records: int,
    executors: int,
    worker: psutil.Process | None,
    profile: Path | None = None,
) -> Outcome:
    names = make_backlog(bench, records)
    assert count_records(bench.shard.dsn, bench.ring.vnodes) == records
    print(f"  {runner}: {' '.join(command[1:])}", flush=True)
    cpu_before = {"nodes": _nodes_cpu(bench), "postgres": _postgres_cpu(bench)}
    if profile is not None:
        command = profiled(command, profile / f"{runner.replace(' ', '-')}-{records}.txt")
    started = time.monotonic()
    with open(bench.scratch / "run.out", "w+") as out, open(bench.scratch / "run.err", "w+") as err:
        environment = {**os.environ, "PYTHONPATH": str(REPO)}
        process = subprocess.Popen(command, stdout=out, stderr=err, text=True, env=environment)
        with MemoryWatch(psutil.Process(process.pid), worker) as watch:
            returncode = process.wait(timeout=RUN_TIMEOUT)
        seconds = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if returncode != 0:
        raise RuntimeError(f"{runner} exited {returncode}: {stderr[-2000:]}")
    figures: dict[str, Any] = {}
    job_seconds = None
    if stdout.lstrip().startswith("{"):
        figures = json.loads(stdout)
        job_seconds = figures.get("seconds: total")
    cpu = {
        "command": sum(watch.peaks.cpu.values()),
        **{kind: watch.peaks.cpu_of(kind) for kind in ("driver", "JVMs", "Python workers")},
        "nodes": _nodes_cpu(bench) - cpu_before["nodes"],
        "postgres": _postgres_cpu(bench) - cpu_before["postgres"],
    }
    left = (count_records(bench.shard.dsn, bench.ring.vnodes), files_on_nodes(bench, names))
    outcome = Outcome(
        runner, records, seconds, job_seconds, executors, watch.peaks, left, figures, cpu
    )
    print(report(outcome), flush=True)
    if left != (0, 0):
        raise RuntimeError(f"{runner} left {left[0]} records and {left[1]} block files")
    return outcome


def _nodes_cpu(bench: Bench) -> float:
    return sum(node.cpu_seconds() for node in bench.nodes)


def _postgres_cpu(bench: Bench) -> float:
    """CPU seconds of the PostgreSQL server: the postmaster, its processes, and its
    connections that have ended (reaped, so counted in the postmaster's children)."""
    with contextlib.closing(_connect(bench)) as conn:
        backend = psutil.Process(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        postmaster = backend.parent()
    assert postmaster is not None
    seconds = 0.0
    for process in _tree(postmaster):
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            seconds += times.user + times.system + times.children_user + times.children_system
    return seconds


def profiled(command: list[str], output: Path) -> list[str]:
    """The command under py-spy, sampling it and every process it starts (the JVM's Python
    workers included), written as collapsed stacks (one line per stack and its count)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    spy = str(Path(sys.executable).parent / "py-spy")
    return [spy, "record", "--subprocesses", "--format", "raw", "-o", str(output), "--", *command]


def mib(value: int) -> str:
    return f"{value / (1 << 20):,.0f} MiB"


def report(o: Outcome) -> str:
    job = f", job {o.job_seconds:.1f} s" if o.job_seconds is not None else ""
    per_executor = f", {o.rate / o.executors:,.0f}/s per executor" if o.executors else ""
    memory = f"peak RSS: driver {mib(o.peaks.driver)}"
    if o.executors:
        memory += (
            f", executor {mib(o.peaks.executor)}, Python workers {mib(o.peaks.python_workers)}"
        )
    memory += f", all {mib(o.peaks.total)}"
    phases = {k: v for k, v in o.figures.items() if k.startswith("seconds: ")}
    line = (
        f"  {o.runner}: {o.records:,} records in {o.seconds:.1f} s{job}: {o.rate:,.0f} records/s"
        f"{per_executor}; {memory}; left {o.left[0]} records, {o.left[1]} block files"
    )
    if o.cpu:
        per = 100_000 / o.records
        line += "\n    CPU s per 100,000 records: " + ", ".join(
            f"{name} {seconds * per:.1f}" for name, seconds in o.cpu.items()
        )
    if phases:
        line += "\n    " + ", ".join(f"{k[9:]} {v}" for k, v in phases.items())
    return line


def measure(args: argparse.Namespace, bench: Bench, config: Path) -> list[Outcome]:
    outcomes: list[Outcome] = []
    where = ["--config", str(config), "--leeway", "0s"]
    with contextlib.ExitStack() as stack:
        cluster = None
        if args.executors:
            cluster = stack.enter_context(
                standalone_cluster(bench.scratch / "spark", max(args.executors))
            )
        for records in args.records:
            print(f"{records:,} records ({load_average('now')})", flush=True)
            outcomes.append(
                run_command(
                    bench, "gc run", [SHOAL, "gc", "run", *where], records, 0, None, args.profile
                )
            )
            local = [SHOAL, "pipeline", "gc", *where, "--master", "local[2]", "--json"]
            outcomes.append(
                run_command(bench, "pipeline gc local[2]", local, records, 2, None, args.profile)
            )
            for executors in args.executors:
                assert cluster is not None
                on_cluster = [
                    SHOAL,
                    "pipeline",
                    "gc",
                    "--config",
                    str(config_for(bench, executors)),
                    "--leeway",
                    "0s",
                    "--master",
                    cluster.master_url,
                    "--json",
                ]
                outcomes.append(
                    run_command(
                        bench,
                        f"pipeline gc standalone, {executors} executor(s)",
                        on_cluster,
                        records,
                        executors,
                        psutil.Process(cluster.processes[1].pid),  # the worker
                        args.profile,
                    )
                )
    return outcomes


def run(args: argparse.Namespace, admin_dsn: str, scratch: Path) -> None:
    with bench_world(admin_dsn, scratch, args.vnodes) as (bench, config_file):
        outcomes = measure(args, bench, config_file)
    print("\nsummary (records/s over each command's wall time):", flush=True)
    for outcome in outcomes:
        print(report(outcome), flush=True)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--records", type=int, nargs="+", default=[100_000, 1_000_000], help="backlog sizes"
    )
    parser.add_argument(
        "--executors",
        type=int,
        nargs="*",
        default=[1, 2, 4],
        help="executor counts on the standalone cluster (none: local[2] only)",
    )
    parser.add_argument("--vnodes", type=int, default=DEFAULT_VNODES)
    parser.add_argument(
        "--profile",
        type=Path,
        help="run each command under py-spy (its Python workers too), stacks written here",
    )
    parser.add_argument("--dsn", help="an existing PostgreSQL superuser DSN (default: embedded)")
    parser.add_argument("--scratch", type=Path, help="parent folder of the scratch folder")
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> None:
    import tempfile

    args = parse_args(argv)
    started = time.monotonic()
    print(load_average("before"), flush=True)
    with (
        exit_on_sigterm(),
        tempfile.TemporaryDirectory(prefix="shoal-pipeline-gc-bench-", dir=args.scratch) as root,
        postgres_server(args.dsn) as admin_dsn,
    ):
        run(args, admin_dsn, Path(root))
    print(f"{load_average('after')}; total {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
