"""What the gateway's Prometheus metrics cost a request, in the mode `shoal serve` runs them.

    .venv/bin/python bench/metrics_bench.py            # a few seconds
    .venv/bin/python bench/metrics_bench.py --quick    # a smoke run

Why: every S3 request passes through s3/metrics.py (in flight up and down, its count,
latency and bytes where its access line is written) and, for most operations, through a
metadata statement's latency (metadata/metrics.py). In `shoal serve` those metrics live in
prometheus_client's multiprocess mode (telemetry.py): each increment takes a lock and writes
a memory-mapped file. Compare the figures with what a request costs the gateway's CPU
(bench/s3_bench.py: a GET of 4 KiB is over a millisecond of gateway CPU).

What is measured, in this process, on one core, after telemetry.share_between_processes
(a temporary folder), as each call's best of three runs:

  request          started() + answered(GetObject, 200, ...) + finished(): one S3 request
  statement        statement_took(SELECT_OBJECT_WITH_DATA, ...): one metadata statement
  auth failure     refused(SignatureDoesNotMatch): a refused signature (not the common case)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def per_call(action: Callable[[], object], count: int) -> float:
    """Seconds per call, the best of three runs of `count` calls."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(count):
            action()
        best = min(best, (time.perf_counter() - started) / count)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls: a smoke run")
    count = 2_000 if parser.parse_args().quick else 200_000
    with tempfile.TemporaryDirectory() as folder:
        # Before anything makes a metric, as `shoal serve` does.
        from shoal import telemetry

        telemetry.share_between_processes(Path(folder) / "metrics")
        from shoal.metadata import metrics as metadata_metrics
        from shoal.metadata.queries import SELECT_OBJECT_WITH_DATA
        from shoal.s3 import metrics as s3_metrics
        from shoal.s3.sigv4 import SigV4Error

        gateway = s3_metrics.gateway()
        metadata = metadata_metrics.metadata()
        mismatch = SigV4Error("SignatureDoesNotMatch", "does not match")

        def request() -> None:
            gateway.started()
            gateway.answered("GetObject", 200, 0, 4096, 0.0012)
            gateway.finished()

        def statement() -> None:
            metadata.statement_took(SELECT_OBJECT_WITH_DATA, 0.0004)

        figures = {
            "request": per_call(request, count),
            "statement": per_call(statement, count),
            "auth failure": per_call(lambda: gateway.refused(mismatch), count),
        }
        for name, seconds in figures.items():
            print(f"{name:<14} {seconds * 1e6:6.2f} us")
        total = figures["request"] + figures["statement"]
        print(f"{'a GET in all':<14} {total * 1e6:6.2f} us (request + one statement)")


if __name__ == "__main__":
    main()
