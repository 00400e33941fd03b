"""A `shoal serve` of a fault test's own, whose processes the test may kill.

The session's `served` (tests/fixtures/serve.py) is shared by every test and must stay whole;
a fault test starts this one in its own folder, on a database of the session's PostgreSQL
server, and finds the processes of its tree (gateway workers, storage nodes) to kill them.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from shoal.config import ShardConfig
from tests.fault.serving import FEW_VNODES, NO_SCHEDULE
from tests.fixtures.serve import Served, start_serve, stop_serve


@dataclass
class ServeTree:
    """`shoal serve` with two gateway processes and two storage nodes, restartable."""

    folder: Path
    shard: ShardConfig
    port: int = 0
    process: subprocess.Popen[str] | None = None
    served: Served | None = None
    more_config: str = ""  # TOML tables added to the configuration ([log], say)

    def __post_init__(self) -> None:
        self.config = self.folder / "shoal.toml"
        self.config.write_text(
            'data_dir = "data"\n\n'
            # Room for the batchers' connections beside re-replication's and the registry's,
            # which a killed worker's or node's load puts on the survivors at once.
            f"{FEW_VNODES}pool_max_size = 12\n"
            f'[[metadata.shards]]\nname = "{self.shard.name}"\ndsn = "{self.shard.dsn}"\n\n'
            f"[s3]\nworkers = 2\n\n{self.more_config}"
            + (NO_SCHEDULE if "[pipeline]" not in self.more_config else "")
        )
        self.log = self.folder / "serve.log"

    def start(self) -> Served:
        """Start serve (again, on the same data and port: the first start's, which the
        kernel picked, unless `port` was given) and wait for its banner."""
        self.process, self.served = start_serve(self.config, self.log, port=self.port)
        self.port = self.served.port
        return self.served

    def client(self, **config: Any) -> Any:
        assert self.served is not None
        return self.served.raw_client(self.served.root, **config)

    def children(self) -> list[psutil.Process]:
        assert self.process is not None
        return psutil.Process(self.process.pid).children()

    def tree(self) -> list[psutil.Process]:
        """serve and every process under it (workers of workers included)."""
        assert self.process is not None
        serve = psutil.Process(self.process.pid)
        return [serve, *serve.children(recursive=True)]

    def gateway_workers(self) -> list[psutil.Process]:
        return [p for p in self.children() if _command_has(p, "multiprocessing.spawn")]

    def storage_node(self, name: str) -> psutil.Process:
        (node,) = [
            p
            for p in self.children()
            if _command_has(p, "storage-node") and _command_has(p, f"{name}\0")
        ]
        return node

    def kill_tree(self) -> None:
        """kill -9 of the serve process; its children die with it (PR_SET_PDEATHSIG)."""
        assert self.process is not None
        children = self.children()
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        psutil.wait_procs(children, timeout=30)
        assert not [c for c in children if c.is_running()], "a child outlived serve"

    def stop(self) -> None:
        if self.process is not None:
            stop_serve(self.process)


def _command_has(process: psutil.Process, text: str) -> bool:
    with contextlib.suppress(psutil.Error):
        return text in "\0".join(process.cmdline()) + "\0"
    return False


@contextlib.contextmanager
def serve_tree(folder: Path, shard: ShardConfig) -> Iterator[ServeTree]:
    tree = ServeTree(folder, shard)
    try:
        tree.start()
        yield tree
    finally:
        tree.stop()


def wait_for_new_process(find: Any, old_pid: int, timeout: float = 30) -> tuple[int, float]:
    """(pid, seconds) of the process `find()` returns once it is not `old_pid`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        with contextlib.suppress(LookupError, ValueError, psutil.Error):  # none yet
            found = find()
            if found.pid != old_pid and found.is_running():
                return found.pid, time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"no new process replaced {old_pid} within {timeout} s")
