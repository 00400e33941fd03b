"""DeleteObjects of 1000 keys through a `shoal serve`: seconds per request.

    .venv/bin/python bench/delete_objects_bench.py              # ~1 min
    .venv/bin/python bench/delete_objects_bench.py --rounds 5 --size 0   # small objects

A `shoal serve` (embedded PostgreSQL, storage nodes, the gateway) is started in a temp dir on a
free port, as bench/s3_bench.py does, with the `shoal` package found first on PYTHONPATH: to
compare two versions, run this once per version, each on PYTHONPATH (for instance a
`git archive` of the other commit unpacked in a temp dir). Each round fills a bucket with
`--keys` objects of `--size` bytes (PUTs from 16 threads, not timed), then times one
DeleteObjects of all of them (boto3, its default checksum) and checks the listing is empty.
Prints each round, the median and the fastest (the machine's other load only ever adds
time), of the call in the client and of the exchange alone (from the request's sending to
its answer, without botocore's own work on 1000 keys, the same for any server).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import boto3
from benchlib import exit_on_sigterm
from botocore.config import Config
from s3_bench import Server, code_version, started_shoal

FILL_THREADS = 16


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keys", type=int, default=1000, help="keys per request (at most 1000)")
    parser.add_argument(
        "--size", type=int, default=8192, help="bytes per object (default: in blocks)"
    )
    return parser.parse_args()


def client(server: Server) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=server.endpoint,
        aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key,
        region_name="us-east-1",
        config=Config(max_pool_connections=FILL_THREADS, retries={"max_attempts": 10}),
    )


def fill(s3: Any, bucket: str, keys: list[str], size: int) -> None:
    body = b"x" * size
    with ThreadPoolExecutor(FILL_THREADS) as pool:
        list(pool.map(lambda key: s3.put_object(Bucket=bucket, Key=key, Body=body), keys))


@dataclass
class Timing:
    total: float  # the call in the client: botocore building the request (its XML and
    # checksum of 1000 keys), the exchange, parsing the answer
    exchange: float  # from the request's sending to its answer: the server's part


def timed_delete(s3: Any, bucket: str, keys: list[str]) -> Timing:
    marks: dict[str, float] = {}
    events = s3.meta.events
    sent = events.register("before-send.s3.DeleteObjects", lambda **_: mark(marks, "sent"))
    answered = events.register("needs-retry.s3.DeleteObjects", lambda **_: mark(marks, "back"))
    started = time.perf_counter()
    answer = s3.delete_objects(
        Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True}
    )
    total = time.perf_counter() - started
    events.unregister("before-send.s3.DeleteObjects", sent)
    events.unregister("needs-retry.s3.DeleteObjects", answered)
    if answer.get("Errors"):
        raise RuntimeError(f"DeleteObjects refused keys: {answer['Errors'][:3]}")
    if s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0):
        raise RuntimeError("keys are left after DeleteObjects")
    return Timing(total, marks["back"] - marks["sent"])


def mark(marks: dict[str, float], name: str) -> None:
    marks[name] = time.perf_counter()


def main() -> int:
    args = parse_args()
    print(f"# DeleteObjects of {args.keys} keys of {args.size} B, {code_version()}")
    spec = importlib.util.find_spec("shoal")
    print(f"# shoal from {spec.origin if spec else '?'}")
    with exit_on_sigterm(), started_shoal(temp_prefix="shoal-delete-bench-") as server:
        s3 = client(server)
        bucket = "delete-bench"
        s3.create_bucket(Bucket=bucket)
        fill(s3, bucket, ["warm-up"], args.size)  # waits out the storage nodes' registration
        s3.delete_object(Bucket=bucket, Key="warm-up")
        timings = []
        for round_number in range(1, args.rounds + 1):
            keys = [f"r{round_number}/key-{i:05d}" for i in range(args.keys)]
            fill(s3, bucket, keys, args.size)
            timings.append(timed_delete(s3, bucket, keys))
            print(
                f"round {round_number}: {timings[-1].total:.3f} s in the client, "
                f"{timings[-1].exchange:.3f} s from sending to the answer"
            )
        for what in ("total", "exchange"):
            seconds = [getattr(t, what) for t in timings]
            print(
                f"{what}: median {statistics.median(seconds):.3f} s, "
                f"fastest {min(seconds):.3f} s per DeleteObjects of {args.keys} keys"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
