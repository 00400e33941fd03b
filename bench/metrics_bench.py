"""What the gateway's Prometheus metrics cost a request, in the mode `shoal serve` runs them.

    .venv/bin/python bench/metrics_bench.py            # a few seconds
    .venv/bin/python bench/metrics_bench.py --quick    # a smoke run

Why: every S3 request passes through s3/metrics.py (in flight up and down, its count,
latency and bytes where its access line is written) and, for most operations, through a
metadata statement's latency and a batch's size (metadata/metrics.py). In `shoal serve`
those metrics live in prometheus_client's multiprocess mode (telemetry.py), where each
increment takes a lock and writes a memory-mapped file; so the request path adds to plain
numbers (telemetry.Tallies), written to the shared files once a second. Compare the figures
with what a request costs the gateway's CPU (bench/s3_bench.py's "CPU ms/op: gateway").

What is measured, in this process, on one core, after telemetry.share_between_processes
(a temporary folder), as each call's best of three runs:

  request          started() + answered(GetObject, 200, ...) + finished(): one S3 request
  statement        statement_took(SELECT_OBJECT_WITH_DATA) + batch_sent(read, 1)
  auth failure     refused(SignatureDoesNotMatch): a refused signature (not the common case)
  flush            Tallies.flush() after one request of each of 20 operations: once a second
  unbatched        what `request` + `statement` cost as direct increments of the shared
                   values (Counter.inc, Histogram.observe, Gauge.inc/dec), for comparison
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from benchlib import per_call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls: a smoke run")
    count = 2_000 if parser.parse_args().quick else 200_000
    with tempfile.TemporaryDirectory() as folder:
        # Before anything makes a metric, as `shoal serve` does.
        from shoal import telemetry

        telemetry.share_between_processes(Path(folder) / "metrics")
        from prometheus_client import Counter, Gauge, Histogram

        from shoal.metadata import metrics as metadata_metrics
        from shoal.metadata.queries import SELECT_OBJECT_WITH_DATA
        from shoal.s3 import metrics as s3_metrics
        from shoal.s3.sigv4 import SigV4Error

        gateway = s3_metrics.gateway()
        metadata = metadata_metrics.metadata()
        mismatch = SigV4Error("SignatureDoesNotMatch", "does not match")
        operations = [f"Operation{n}" for n in range(20)]

        def request() -> None:
            gateway.started()
            gateway.answered("GetObject", 200, 0, 4096, 0.0012)
            gateway.finished()

        def statement() -> None:
            metadata.statement_took(SELECT_OBJECT_WITH_DATA, 0.0004)
            metadata.batch_sent(metadata_metrics.READ, 1)

        def flush() -> None:
            for operation in operations:
                gateway.answered(operation, 200, 10, 10, 0.001)
            telemetry.tallies().flush()

        requests = Counter("bench_requests", "", ["operation", "status_class"])
        direct_count = requests.labels("GetObject", "2xx")
        direct_sent = Counter("bench_sent", "", ["operation"]).labels("GetObject")
        direct_latency = Histogram("bench_seconds", "", ["operation"]).labels("GetObject")
        direct_statement = Histogram("bench_statement", "", ["statement"]).labels("s")
        direct_batch = Histogram("bench_batch", "", ["kind"]).labels("read")
        direct_in_flight = Gauge("bench_in_flight", "", multiprocess_mode="livesum")

        def unbatched() -> None:
            direct_in_flight.inc()
            direct_count.inc()
            direct_latency.observe(0.0012)
            direct_sent.inc(4096)
            direct_in_flight.dec()
            direct_statement.observe(0.0004)
            direct_batch.observe(1)

        figures = {
            "request": per_call(request, count),
            "statement": per_call(statement, count),
            "auth failure": per_call(lambda: gateway.refused(mismatch), count),
            "flush": per_call(flush, max(count // 100, 10)),
            "unbatched": per_call(unbatched, count),
        }
        for name, seconds in figures.items():
            print(f"{name:<14} {seconds * 1e6:6.2f} us")
        total = figures["request"] + figures["statement"]
        print(f"{'a GET in all':<14} {total * 1e6:6.2f} us (request + statement)")


if __name__ == "__main__":
    main()
