"""The GC daemon inside a real `shoal serve`: killed midway by the fault-injection setting and
started again, it converges with nothing lost and nothing leaked; and serve's storage nodes
never outlive it, however it dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from shoal.cluster import RegistryDirectory
from shoal.config import MetadataConfig, ShardConfig
from shoal.keyfiles import load_or_create_secret
from shoal.metadata import MetadataStore, migrate
from shoal.storage import BlockClient, DataPath
from tests.fixtures.garbage import build_garbage, check_live
from tests.fixtures.postgres import create_databases
from tests.fixtures.serve import read_banner

SHOAL = str(Path(sys.executable).parent / "shoal")
KiB = 1024


@pytest.fixture
def shard(admin_dsn: str, run: Any) -> ShardConfig:
    [config] = create_databases(admin_dsn, 1)
    run(migrate([config], MetadataConfig(vnodes=2, partitions_ahead=1)))
    return config


@pytest.fixture
def store(shard: ShardConfig, run: Any) -> Iterator[MetadataStore]:
    opened = run(MetadataStore.open([shard], 4, poll_ring=False))  # see postgres.py
    yield opened
    run(opened.close())


class Serve:
    """`shoal serve` on an existing shard, with three local storage nodes; the daemon takes
    batches of two records so that a pass makes many delete batches."""

    def __init__(self, root: Path, shard: ShardConfig) -> None:
        self.data = root / "data"
        self.config_file = root / "shoal.toml"
        self.config_file.write_text(
            f'data_dir = "{self.data}"\n'
            f'[metadata]\n[[metadata.shards]]\nname = "{shard.name}"\ndsn = "{shard.dsn}"\n'
            "[storage]\nlocal_nodes = 3\nheartbeat_interval_seconds = 1\n"
            "[gc]\nleeway_hours = 0\nbatch_size = 2\nworkers = 1\ninterval_minutes = 60\n"
            # No Spark job starts at its hour meanwhile: the gc job's run would be the last.
            "[pipeline]\nscheduled = false\n"
        )
        self.processes: list[subprocess.Popen[str]] = []
        self.seen_nodes: set[int] = set()

    def start(self, **env: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [
                SHOAL,
                "serve",
                "--config",
                str(self.config_file),
                *("--port", "0", "--admin-port", "0"),  # ports the kernel picks
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, **env},
        )
        self.processes.append(process)
        read_banner(process)  # printed once the nodes answer, before the daemon's first pass
        self.seen_nodes |= self.node_pids()
        return process

    def wait(self, process: subprocess.Popen[str], timeout: float = 60) -> int:
        """Its exit code once it has exited (its banner pipe closed)."""
        code = process.wait(timeout=timeout)
        assert process.stdout is not None
        process.stdout.close()
        return code

    def node_pids(self) -> set[int]:
        """The storage-node processes serving this data directory's node folders."""
        marker = str(self.data / "nodes").encode()
        pids = set()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue  # exited meanwhile
            if b"storage-node" in command and marker in command:
                pids.add(int(entry.name))
        return pids

    def wait_nodes_gone(self, seconds: float = 20) -> set[int]:
        deadline = time.monotonic() + seconds
        while (left := self.node_pids()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    def block_ids(self) -> set[uuid.UUID]:
        return {uuid.UUID(f.name.split(".")[0]) for f in self.block_files()}

    def block_files(self) -> list[Path]:
        return list((self.data / "nodes").glob("*/blocks/*/*"))

    def garbage_files(self, garbage: set[uuid.UUID]) -> int:
        return sum(uuid.UUID(f.name.split(".")[0]) in garbage for f in self.block_files())

    def cleanup(self) -> None:
        """Whatever a failed test left running: serve, then any node it started."""
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            self.wait(process)
        for pid in self.seen_nodes & self.node_pids():
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def serve(tmp_path: Path, shard: ShardConfig) -> Iterator[Serve]:
    served = Serve(tmp_path, shard)
    yield served
    served.cleanup()


def data_path(serve: Serve, store: MetadataStore) -> DataPath:
    client = BlockClient(load_or_create_secret(serve.data / "cluster.secret"))
    directory = RegistryDirectory(store, timedelta(seconds=30), client)
    return DataPath(client, directory, block_size=16 * KiB, replicas=2)


def test_daemon_killed_midway_converges_after_restart(
    serve: Serve, store: MetadataStore, run: Any
) -> None:
    # Garbage written while the daemon is paused, through serve's own storage nodes.
    run(store.gc_book.set_paused(True))
    first = serve.start()
    path = data_path(serve, store)
    try:
        world = run(build_garbage(store, path))
        first.send_signal(signal.SIGINT)
        assert serve.wait(first) == 0
        assert not serve.wait_nodes_gone()
        assert world.garbage <= serve.block_ids()
        garbage_files = serve.garbage_files(world.garbage)

        # The daemon's first pass dies by the fault after three node delete batches.
        run(store.gc_book.set_paused(False))
        crashed = serve.start(SHOAL_GC_FAULT_AFTER="3")
        assert serve.wait(crashed, 120) == 3
        # Its storage nodes do not outlive it (they would hold the folders and heartbeat).
        assert not serve.wait_nodes_gone()
        assert 0 < serve.garbage_files(world.garbage) < garbage_files  # it stopped midway
        assert sum(b.records for b in run(store.gc_book.backlog())) > 0

        # Started again, the daemon's first pass finishes the work.
        serve.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            runs = run(store.gc_book.last_runs(1))
            if runs and runs[0].kind == "daemon":
                break
            time.sleep(0.5)
        [done] = run(store.gc_book.last_runs(1))
        assert done.kind == "daemon" and done.records_failed == 0
        assert sum(b.records for b in run(store.gc_book.backlog())) == 0
        assert not world.garbage & serve.block_ids()  # nothing leaked
        check_live(store, path, world, run)  # nothing lost
    finally:
        run(path.client.close())


def test_storage_nodes_die_with_a_killed_serve(serve: Serve, run: Any) -> None:
    process = serve.start()
    nodes = serve.node_pids()
    assert len(nodes) == 3
    process.send_signal(signal.SIGKILL)
    serve.wait(process)
    assert not serve.wait_nodes_gone()
    # A new serve starts on the same folders and its nodes come up (the lock and ports free).
    again = serve.start()
    assert len(serve.node_pids()) == 3 and not nodes & serve.node_pids()
    again.send_signal(signal.SIGINT)
    assert serve.wait(again) == 0
