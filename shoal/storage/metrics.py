"""A storage node's Prometheus metrics (the "Storage node" names of Shoal's metric catalogue).

Every process of a node counts its own requests; the node's admin listener sums the processes
(telemetry.py). The metrics are made at first use, by `metrics()`, never at import: a node's
first process must choose multiprocess mode before any metric exists.

A block request touches a handful of these, so the labelled children are looked up once, when
the metrics are made, and a request only increments them (about a microsecond each:
bench/node_metrics_bench.py).
"""

from __future__ import annotations

import threading

from prometheus_client import Counter, Gauge, Histogram

# From a tenth of a millisecond (a battery-backed cache, tmpfs) to seconds (a disk that
# struggles, or a journal commit behind a large write-back).
FSYNC_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class NodeMetrics:
    """The metrics one node process updates, with their labelled children at hand."""

    def __init__(self) -> None:
        operations = Counter(
            "shoal_node_block_operations_total",
            "Block reads (GET), writes (PUT) and deletes this node did",
            ["operation"],
        )
        self.reads = operations.labels(operation="read")
        self.writes = operations.labels(operation="write")
        self.deletes = operations.labels(operation="delete")
        moved = Counter(
            "shoal_node_block_bytes_total",
            "Block data bytes sent to readers and received and stored from writers",
            ["direction"],
        )
        self.bytes_read = moved.labels(direction="read")
        self.bytes_written = moved.labels(direction="written")
        self.fsync_seconds = Histogram(
            "shoal_node_fsync_duration_seconds",
            "Time of each fsync of a block file or of the folder it was linked into",
            buckets=FSYNC_BUCKETS,
        )
        self.checksum_failures = Counter(
            "shoal_node_checksum_failures_total",
            "Blocks whose data did not match their checksum or header (written or read)",
        )
        # Set by the node's first process on each heartbeat; "mostrecent" keeps its value
        # whatever the workers do.
        disk = Gauge(
            "shoal_node_disk_bytes",
            "Bytes of the block file system used and free for the node",
            ["state"],
            multiprocess_mode="mostrecent",
        )
        self.disk_used = disk.labels(state="used")
        self.disk_free = disk.labels(state="free")
        self.blocks = Gauge(
            "shoal_node_blocks", "Blocks this node holds", multiprocess_mode="mostrecent"
        )


_made: NodeMetrics | None = None
_making = threading.Lock()  # a node's request threads may all reach the first use at once


def metrics() -> NodeMetrics:
    """This process's node metrics, made at the first call."""
    global _made
    if _made is None:
        with _making:
            if _made is None:
                _made = NodeMetrics()
    return _made
