"""What a storage node's metrics cost a block request.

    .venv/bin/python bench/node_metrics_bench.py            # a few seconds
    .venv/bin/python bench/node_metrics_bench.py --quick    # a smoke run

Why: every block request a node serves updates its Prometheus metrics (shoal/storage/
metrics.py), a few thousand times a second on a busy node. In the node's multiprocess mode
(telemetry.py) each update writes a value into a memory-mapped file under a lock, so the
cost per request is worth knowing beside the request's own (a 4 KiB block write is ~0.3 ms of
node CPU, bench/storage_bench.py).

What is measured, in this process, on one core, with the metrics in multiprocess mode in a
scratch folder as in a node:

  counter child inc         one increment of a labelled child looked up once (what the node
                            does)
  counter .labels().inc     the same through .labels() on every call (what caching avoids)
  histogram observe         one fsync duration observed
  block write's metrics     what one block PUT adds: operation and bytes counters, and two
                            fsync observations (the file's and its folder's), each timed with
                            time.perf_counter
  block read's metrics      what one block GET adds: operation and bytes counters
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchlib import per_call
from prometheus_client import Counter

from shoal import telemetry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls: a smoke run")
    args = parser.parse_args()
    count = 20_000 if args.quick else 200_000
    with tempfile.TemporaryDirectory(prefix="node-metrics-bench-") as scratch:
        telemetry.share_between_processes(Path(scratch) / "metrics")
        from shoal.storage.metrics import metrics  # made after the mode is chosen

        node = metrics()
        # A labelled counter of its own, to compare a child looked up on every call.
        looked_up = Counter("bench_operations_total", "a labelled counter", ["operation"])

        def write_metrics() -> None:
            node.writes.inc()
            node.bytes_written.inc(4096)
            for _ in range(2):
                started = time.perf_counter()
                node.fsync_seconds.observe(time.perf_counter() - started)

        def read_metrics() -> None:
            node.reads.inc()
            node.bytes_read.inc(4096)

        cases: list[tuple[str, Callable[[], object]]] = [
            ("counter child inc", node.writes.inc),
            ("counter .labels().inc", lambda: looked_up.labels(operation="write").inc()),
            ("histogram observe", lambda: node.fsync_seconds.observe(0.001)),
            ("block write's metrics", write_metrics),
            ("block read's metrics", read_metrics),
        ]
        print(f"{'case':<24} {'us per call':>12}   ({count:,} calls, best of 3)")
        for name, action in cases:
            print(f"{name:<24} {per_call(action, count) * 1e6:>12.2f}")


if __name__ == "__main__":
    main()
