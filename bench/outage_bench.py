"""What S3 clients see while PostgreSQL is away: time to the first 503, how fast 503s are
answered during the outage, and how soon requests succeed once PostgreSQL accepts
connections again.

    .venv/bin/python bench/outage_bench.py                 # a stop, then a kill -9
    .venv/bin/python bench/outage_bench.py --fault kill --clients 8

A fresh `shoal serve` (embedded PostgreSQL, which `serve` restarts when its postmaster dies)
takes a light load of 4 KiB PUTs and GETs from client threads that never retry. Each fault:
`stop` is `pg_ctl stop -m fast` (PostgreSQL says goodbye to its connections), `kill` is
SIGKILL of the postmaster (crash recovery at restart). In both, `serve` starts PostgreSQL
again; this script watches for it to accept connections with a connect every 20 ms.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

import boto3
import botocore.exceptions
import psycopg
from botocore.config import Config as BotoConfig
from s3_bench import started_shoal

from shoal.metadata.embedded import EmbeddedPostgres

BUCKET = "outage-bench"
BODY = os.urandom(4096)
SETTLE_SECONDS = 3.0  # healthy load before and after each fault


@dataclass
class Request:
    started: float
    ended: float
    status: int | None  # None: no HTTP answer (connection error, time-out)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fault", choices=["stop", "kill", "both"], default="both")
    parser.add_argument("--clients", type=int, default=4, help="client threads")
    parser.add_argument("--gateway-workers", type=int, default=2, help="Shoal's [s3] workers")
    return parser.parse_args()


class Load:
    """Client threads doing PUT then GET of their own key until stopped; every request kept."""

    def __init__(self, endpoint: str, keys: tuple[str, str], clients: int) -> None:
        self.requests: list[Request] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(endpoint, keys, n), daemon=True)
            for n in range(clients)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _run(self, endpoint: str, keys: tuple[str, str], n: int) -> None:
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id=keys[0],
            aws_secret_access_key=keys[1],
            config=BotoConfig(
                s3={"addressing_style": "path"},
                retries={"total_max_attempts": 1},
                connect_timeout=5,
                read_timeout=30,
            ),
        )
        key = f"client-{n}"
        while not self._stop.is_set():
            for call in (
                lambda: client.put_object(Bucket=BUCKET, Key=key, Body=BODY),
                lambda: client.get_object(Bucket=BUCKET, Key=key)["Body"].read(),
            ):
                started = time.monotonic()
                status = _status(call)
                self.requests.append(Request(started, time.monotonic(), status))
                if status != 200:
                    time.sleep(0.05)  # a refused client waits a little, as SDKs do
        client.close()


def _status(call: Any) -> int | None:
    try:
        call()
    except botocore.exceptions.ClientError as exc:
        return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])
    except (botocore.exceptions.BotoCoreError, OSError):
        return None
    return 200


def wait_accepting(dsn: str, since: float, timeout: float = 120.0) -> float:
    """When PostgreSQL first accepted a connection after `since` (a connect every 20 ms)."""
    while time.monotonic() - since < timeout:
        try:
            with psycopg.connect(dsn, connect_timeout=2):
                return time.monotonic()
        except psycopg.OperationalError:
            time.sleep(0.02)
    raise TimeoutError("PostgreSQL did not come back")


def measure(load: Load, postgres: EmbeddedPostgres, fault: str) -> None:
    time.sleep(SETTLE_SECONDS)
    pid = int((postgres.pgdata / "postmaster.pid").read_text().split()[0])
    faulted = time.monotonic()
    if fault == "kill":
        os.kill(pid, signal.SIGKILL)
    else:
        postgres.stop()
    # Wait for it to be gone (a stop returns once it is), then for serve to bring it back.
    while _alive(pid):
        time.sleep(0.01)
    accepting = wait_accepting(postgres.dsn("shard0"), faulted)
    time.sleep(SETTLE_SECONDS)
    after = [r for r in load.requests if r.started >= faulted]
    refused = [r for r in after if r.status != 200]
    first_refusal = min((r.ended for r in refused), default=None)
    back = min((r.ended for r in after if r.started >= accepting and r.status == 200), default=None)
    latencies = sorted((r.ended - r.started) * 1000 for r in refused if r.status == 503)
    others = sorted({r.status for r in refused if r.status != 503}, key=str)
    print(f"fault: {fault} (PostgreSQL accepting again {accepting - faulted:.2f} s after it)")
    if first_refusal is not None:
        print(f"  time to first 503            {first_refusal - faulted:.3f} s")
    if latencies:
        print(
            f"  503s answered                {len(latencies)}: p50 {_pct(latencies, 50):.1f} ms, "
            f"p90 {_pct(latencies, 90):.1f} ms, p99 {_pct(latencies, 99):.1f} ms, "
            f"max {latencies[-1]:.1f} ms"
        )
    print(f"  failures other than 503      {others or 'none'}")
    if back is not None:
        print(f"  accepting -> first success   {back - accepting:.3f} s")
    else:
        print("  no success after PostgreSQL came back")


def _pct(values: list[float], percent: int) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main() -> None:
    args = parse_args()
    with started_shoal("shoal-outage-bench-", gateway_workers=args.gateway_workers) as server:
        assert server.data_dir is not None
        keys = (server.access_key, server.secret_key)
        boto3.client(
            "s3",
            endpoint_url=server.endpoint,
            region_name="us-east-1",
            aws_access_key_id=keys[0],
            aws_secret_access_key=keys[1],
        ).create_bucket(Bucket=BUCKET)
        postgres = EmbeddedPostgres(server.data_dir / "postgres")
        with psycopg.connect(postgres.dsn("shard0"), autocommit=True) as conn:
            conn.execute("CHECKPOINT")  # as on a server up for a while: no migration to replay
        load = Load(server.endpoint, keys, args.clients)
        load.start()
        try:
            for fault in ("stop", "kill") if args.fault == "both" else (args.fault,):
                measure(load, postgres, fault)
        finally:
            load.stop()


if __name__ == "__main__":
    main()
