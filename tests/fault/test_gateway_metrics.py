"""What the gateway's health and metrics say when something breaks: PostgreSQL stopped
(/ready 503 naming the shard, S3 answering 503 fast, `shoal_ready` 0, all back once it
returns), and a gateway worker killed with requests in flight (the gauge forgets them)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Iterator

import psutil
import pytest

from shoal.metadata.embedded import EmbeddedPostgres
from tests.e2e.test_metrics import settled, value
from tests.fault.load import wait_until
from tests.fault.serve_tree import wait_for_new_process
from tests.fault.serving import own_serve
from tests.fixtures.admin import admin_get
from tests.fixtures.serve import Served, raw_request, signed_headers

pytestmark = pytest.mark.slow

SHARD = "pg"
BUCKET = "metrics"
# The readiness check runs every second and gives a shard a second to answer.
NOTICED_SECONDS = 5.0
# A request that meets the outage is answered 503 within this (the pool's own bound is a
# second; the rest is the machine's load).
FAST_503_SECONDS = 3.0
# From PostgreSQL accepting connections again to /ready saying 200.
RECOVERY_SECONDS = 10.0
IN_FLIGHT = "shoal_s3_requests_in_flight"
# Stalled requests a test opens at most while waiting for both gateway processes to hold some.
MAX_STALLED = 40


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    server = EmbeddedPostgres(tmp_path_factory.mktemp("metrics-pg") / "postgres")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def served(
    postgres: EmbeddedPostgres, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    shard = f'[[metadata.shards]]\nname = "{SHARD}"\ndsn = "{postgres.dsn("postgres")}"\n'
    config = "[s3]\nworkers = 2\n\n[gc]\nenabled = false\n\n" + shard
    with own_serve(tmp_path_factory.mktemp("metrics-serve"), config) as served:
        served.raw_client(served.root).create_bucket(Bucket=BUCKET)
        yield served


def test_a_killed_workers_requests_in_flight_stop_counting(served: Served) -> None:
    before = settled(served, lambda s: value(s, IN_FLIGHT) == 0)  # written every second
    assert value(before, IN_FLIGHT) == 0
    (worker,) = _gateway_workers(served)
    with _stalled_puts(served) as stall:
        # Each connection is taken by whichever gateway process accepts it first (a worker
        # that has just started may not listen yet): stall requests until both hold some.
        stalled = held = 0
        while not 0 < held < stalled:
            assert stalled < MAX_STALLED, "one process took every connection"
            stall.add()
            stalled = len(stall.clients)
            settled(served, lambda s, n=stalled: value(s, IN_FLIGHT) == n)  # each accepted
            held = len(stall.held_by(worker))
        os.kill(worker.pid, signal.SIGKILL)
        wait_for_new_process(lambda: _gateway_workers(served)[0], worker.pid)
        series = settled(served, lambda s: value(s, IN_FLIGHT) == stalled - held)
        assert value(series, IN_FLIGHT) == stalled - held
        restarts = "shoal_gateway_worker_restarts_total"
        assert value(series, restarts) - value(before, restarts) == 1
    # The clients left: the requests the parent still had end, and stop counting too.
    series = settled(served, lambda s: value(s, IN_FLIGHT) == 0)
    assert value(series, IN_FLIGHT) == 0


def test_ready_and_the_s3_port_say_503_while_postgres_is_stopped(
    served: Served, postgres: EmbeddedPostgres
) -> None:
    served.raw_client(served.root).put_object(Bucket=BUCKET, Key="k", Body=b"kept")
    assert admin_get(served.admin_port, "/ready")[0] == 200
    postgres.stop()
    try:
        # Until a check finds the shard silent (one that ran as PostgreSQL stopped may fail
        # on the registry's read instead: 503 too, for another reason).
        wait_until(lambda: _silent_shards(served) == [SHARD], NOTICED_SECONDS)
        status, _, body = admin_get(served.admin_port, "/ready")
        report = json.loads(body)
        assert status == 503 and report["ready"] is False
        assert report["shards_not_answering"] == [SHARD] and SHARD in report["reason"]
        started = time.monotonic()
        answer = raw_request(served, "GET", f"/{BUCKET}/k")
        assert answer.status == 503 and b"ServiceUnavailable" in answer.body
        assert answer.headers["Retry-After"]
        assert time.monotonic() - started < FAST_503_SECONDS
        series = settled(served, lambda s: value(s, "shoal_ready") == 0)
        assert value(series, "shoal_ready") == 0
    finally:
        postgres.start()
    wait_until(lambda: admin_get(served.admin_port, "/ready")[0] == 200, RECOVERY_SECONDS)
    assert raw_request(served, "GET", f"/{BUCKET}/k").body == b"kept"
    series = settled(served, lambda s: value(s, "shoal_ready") == 1)
    assert value(series, "shoal_ready") == 1


class _StalledPuts:
    """Connections, each with a PUT whose head was sent and whose body stops after its first
    bytes."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.clients: list[socket.socket] = []

    def add(self) -> None:
        path = f"/{BUCKET}/stalled-{len(self.clients)}"
        headers = signed_headers(self.served, "PUT", path, {"Content-Length": "1000"})
        head = f"PUT {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        client = socket.create_connection(("127.0.0.1", self.served.port), timeout=10)
        self.clients.append(client)
        client.sendall(head.encode() + b"\r\n" + b"x" * 10)

    def held_by(self, process: psutil.Process) -> list[int]:
        """The client ports whose connections `process` accepted."""
        ports = {client.getsockname()[1] for client in self.clients}
        return [
            c.raddr.port
            for c in process.net_connections("tcp")
            if c.raddr and c.raddr.port in ports and c.status == psutil.CONN_ESTABLISHED
        ]


@contextlib.contextmanager
def _stalled_puts(served: Served) -> Iterator[_StalledPuts]:
    """Stalled PUTs (none at first: `add` them), their connections closed at the end."""
    stall = _StalledPuts(served)
    try:
        yield stall
    finally:
        for client in stall.clients:
            client.close()


def _gateway_workers(served: Served) -> list[psutil.Process]:
    children = psutil.Process(served.pid).children()
    return [p for p in children if _command_has(p, "multiprocessing.spawn")]


def _command_has(process: psutil.Process, text: str) -> bool:
    with contextlib.suppress(psutil.Error):
        return text in " ".join(process.cmdline())
    return False


def _silent_shards(served: Served) -> list[str]:
    return list(json.loads(admin_get(served.admin_port, "/ready")[2])["shards_not_answering"])
