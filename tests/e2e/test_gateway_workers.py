"""`[s3] workers`: several gateway processes serve one port (the session's serve runs 2)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.fault.serving import own_serve
from tests.fixtures.admin import admin_get
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


def test_a_fresh_serve_answers_every_request_once_it_says_ready(tmp_path: Path) -> None:
    """From the banner on, /ready says 200 and no process of the serve answers 503: not the
    serve itself, whose last check in the background may predate its nodes, nor a worker
    still starting (each request on a new connection, so that any process may take it)."""
    with own_serve(tmp_path, "[s3]\nworkers = 3\n") as served:
        status, _, body = admin_get(served.admin_port, "/ready")
        assert status == 200, body
        bucket = unique("first")
        statuses = [raw_request(served, "PUT", f"/{bucket}").status]
        statuses += [raw_request(served, "PUT", f"/{bucket}/k{n}", b"x").status for n in range(40)]
        assert statuses == [200] * 41
        assert len(gateway_workers(served.pid)) == 2
