"""`[s3] workers`: several gateway processes serve one port (the session's serve runs 2)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.fixtures.postgres import unique
from tests.fixtures.serve import Served, raw_request


def gateway_workers(serve_pid: int) -> list[int]:
    """The worker processes of `shoal serve` (not its storage nodes or multiprocessing's
    resource tracker)."""
    children = Path(f"/proc/{serve_pid}/task/{serve_pid}/children").read_text().split()
    workers = []
    for pid in children:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # exited (a killed worker reaped) since the list was read
        if b"multiprocessing.spawn" in command:
            workers.append(int(pid))
    return workers


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def test_the_worker_serves_requests_too(served: Served) -> None:
    (worker,) = gateway_workers(served.pid)
    bucket = unique("workers")
    assert raw_request(served, "PUT", f"/{bucket}").status == 200
    before = cpu_ticks(worker)
    # Each request on a new connection: the kernel hands connections to either process.
    for n in range(300):
        assert raw_request(served, "PUT", f"/{bucket}/k{n}", b"x").status == 200
    assert cpu_ticks(worker) > before


def test_a_killed_worker_is_replaced(served: Served) -> None:
    (worker,) = gateway_workers(served.pid)
    os.kill(worker, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        replacement = gateway_workers(served.pid)
        if replacement and replacement != [worker]:
            break
        time.sleep(0.2)
    assert replacement and replacement != [worker]
    bucket = unique("after-kill")
    for _ in range(20):  # whichever process takes them, requests are served
        assert raw_request(served, "PUT", f"/{bucket}").status in (200, 409)
    assert raw_request(served, "GET", f"/{bucket}").status == 200
