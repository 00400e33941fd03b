"""A `shoal serve` logging JSON whose gateway worker is killed with SIGKILL three times in a
row: it is restarted at once, then after 1 s, then after 2 s (shoal/restarts.py), each
restart logged; and every line serve's processes wrote on stderr is one JSON object, the
access lines with their fields (docs/operations.md, "Logs")."""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.fault.serve_tree import ServeTree, wait_for_new_process
from tests.fixtures.admin import admin_get
from tests.fixtures.postgres import create_databases
from tests.fixtures.serve import raw_request

pytestmark = pytest.mark.slow

ACCESS_FIELDS = {"request_id", "account", "operation", "status", "bytes_in", "bytes_out"}


@pytest.fixture(scope="module")
def tree(admin_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeTree]:
    (shard,) = create_databases(admin_dsn, 1)
    tree = ServeTree(
        tmp_path_factory.mktemp("json-logs"), shard, more_config='[log]\nformat = "json"\n'
    )
    try:
        tree.start()
        yield tree
    finally:
        tree.stop()


def the_gateway_worker(tree: ServeTree) -> psutil.Process:
    (worker,) = [p for p in tree.gateway_workers() if p.status() != psutil.STATUS_ZOMBIE]
    return worker


def log_entries(log: Path) -> list[dict[str, Any]]:
    """Every line of the log as JSON (a line that is not fails the test)."""
    entries = []
    for number, line in enumerate(log.read_text().splitlines(), 1):
        try:
            entries.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"line {number} of serve's stderr is not JSON: {line!r}") from None
    return entries


def test_a_gateway_worker_that_keeps_dying_is_restarted_after_a_growing_pause(
    tree: ServeTree,
) -> None:
    waits = []
    pid = the_gateway_worker(tree).pid
    for _ in range(3):  # each kill soon after the previous start: a quick exit in a row
        os.kill(pid, signal.SIGKILL)
        pid, seconds = wait_for_new_process(lambda: the_gateway_worker(tree), pid)
        waits.append(seconds)
    # The serve loop notices an exit within a second (WORKER_CHECK_SECONDS), then pauses.
    assert waits[1] >= 1.0 and waits[2] >= 2.0, waits
    assert waits[2] > waits[0], waits
    restarts = [
        e["message"] for e in log_entries(tree.log) if "gateway worker 1 exited" in e["message"]
    ]
    assert [line.rsplit(" in ", 1)[1] for line in restarts] == ["0 s", "1 s", "2 s"], restarts
    # The restarted worker serves: every request of a few is answered by one process or
    # the other (no connection refused or reset).
    served = tree.served
    assert served is not None
    for _ in range(10):
        assert raw_request(served, "GET", "/").status == 200
    # Counted where Prometheus sees it.
    status, _, metrics = admin_get(served.admin_port, "/metrics")
    assert status == 200
    assert "shoal_gateway_worker_restarts_total 3.0" in metrics.decode()


def test_every_stderr_line_of_serve_is_json_and_access_lines_carry_their_fields(
    tree: ServeTree,
) -> None:
    served = tree.served
    assert served is not None
    client = tree.client()
    client.create_bucket(Bucket="json-logs")
    client.put_object(Bucket="json-logs", Key="k", Body=b"0123456789")
    missing = raw_request(served, "GET", "/json-logs/missing")
    assert missing.status == 404
    tree.stop()  # stop-time lines included; held access lines are written out at exit

    entries = log_entries(tree.log)
    for entry in entries:
        assert {"time", "level", "logger", "message"} <= entry.keys(), entry
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["time"]), entry
    access = [e for e in entries if e["logger"] == "shoal.access"]
    assert all(e.keys() >= ACCESS_FIELDS for e in access), access
    (miss,) = [e for e in access if e["request_id"] == missing.headers["x-amz-request-id"]]
    assert miss["operation"] == "GetObject" and miss["status"] == 404
    assert miss["account"] != "-" and isinstance(miss["duration_ms"], float)
    (put,) = [e for e in access if e["operation"] == "PutObject"]
    assert put["bytes_in"] == 10 and put["status"] == 200
