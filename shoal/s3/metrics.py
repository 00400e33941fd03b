"""The S3 gateway's Prometheus metrics: requests, their latency and bytes, requests in
flight, and refused signatures (docs/operations.md, "Metrics").

Counted where the access line is written (app.py `_log_access`), once a request's answer is
out, so that the access log and the metrics count the same requests and the same bytes. A
request the gateway never answered (its client left before its turn) is in neither the
request counts nor the latencies.

The metric objects are made at first use, by `gateway()` (telemetry.py says why never at
import). A request adds to plain numbers, each operation's in a dict (telemetry.Tallies),
which a task of each gateway process writes to the shared metrics every second: an
increment of a shared value costs about a microsecond, and a request made several
(bench/metrics_bench.py). So a scrape sees a request up to a second after its answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge, Histogram

from shoal import telemetry
from shoal.metadata import AccessKeyNotFound
from shoal.s3.errors import S3Error
from shoal.s3.sigv4 import SigV4Error

# What `operation` is when a request named none (it was refused before or at routing).
UNKNOWN_OPERATION = "Unknown"

# Why a signature was refused: a small fixed set, from the error the request got.
UNKNOWN_KEY = "unknown_key"  # no such access key, or a revoked one
SIGNATURE_MISMATCH = "signature_mismatch"  # the wrong secret, or a request changed on its way
EXPIRED = "expired"  # a presigned URL out of its validity window
CLOCK_SKEW = "clock_skew"  # the client's clock is more than 15 minutes off
MALFORMED = "malformed"  # an Authorization header or presigned query that cannot be read
UNSUPPORTED = "unsupported"  # another algorithm, or temporary credentials

# SigV4/SigV2 error codes (sigv4.py, sigv2.py) that say what was wrong with the signature.
# InvalidArgument and AccessDenied say more than that, and are told apart by their text.
_REASON_OF_CODE = {
    "InvalidAccessKeyId": UNKNOWN_KEY,
    "SignatureDoesNotMatch": SIGNATURE_MISMATCH,
    "RequestTimeTooSkewed": CLOCK_SKEW,
    "AuthorizationHeaderMalformed": MALFORMED,
    "AuthorizationQueryParametersError": MALFORMED,
    "MissingSecurityHeader": MALFORMED,
}


def auth_failure_reason(error: Exception) -> str | None:
    """Why `error` refused a request's signature, or None if it is no signature's failure."""
    if isinstance(error, AccessKeyNotFound):
        return UNKNOWN_KEY
    if isinstance(error, SigV4Error):
        reason = _REASON_OF_CODE.get(error.code)
        if reason is not None:
            return reason
        if "not supported" in error.message:
            return UNSUPPORTED
        if error.code == "AccessDenied":
            # A presigned URL out of its window, else a date that cannot be read.
            expired = "expired" in error.message or "not valid yet" in error.message
            return EXPIRED if expired else MALFORMED
        if error.code == "InvalidArgument":
            return MALFORMED
        return None  # a body cut short (IncompleteBody) is no signature's failure
    if isinstance(error, S3Error) and error.code in _REASON_OF_CODE:
        return _REASON_OF_CODE[error.code]  # a POST form's policy signature (post.py)
    return None


@dataclass
class _Operation:
    """One operation's tallies, made at its first request."""

    statuses: dict[int, telemetry.CounterTally]  # by status // 100
    duration: telemetry.HistogramTally
    received: telemetry.CounterTally
    sent: telemetry.CounterTally


@dataclass
class GatewayMetrics:
    requests: Counter
    duration: Histogram
    received: Counter
    sent: Counter
    in_flight: Gauge
    auth_failures: Counter
    _operations: dict[str, _Operation] = field(default_factory=dict)
    _in_flight: int = 0  # set on the gauge when the tallies are written

    @classmethod
    def make(cls) -> GatewayMetrics:
        return cls(
            requests=Counter(
                "shoal_s3_requests",
                "S3 requests answered, by operation and status class.",
                ["operation", "status_class"],
            ),
            duration=Histogram(
                "shoal_s3_request_duration_seconds",
                "Time from a request's head to the end of its answer, by operation.",
                ["operation"],
                buckets=telemetry.LATENCY_BUCKETS,
            ),
            received=Counter(
                "shoal_s3_received_bytes",
                "Request body bytes received, by operation.",
                ["operation"],
            ),
            sent=Counter(
                "shoal_s3_sent_bytes",
                "Response body bytes sent, by operation.",
                ["operation"],
            ),
            in_flight=Gauge(
                "shoal_s3_requests_in_flight",
                "S3 requests being handled or answered now.",
                multiprocess_mode="livesum",
            ),
            auth_failures=Counter(
                "shoal_s3_auth_failures",
                "Requests refused for their signature, by reason.",
                ["reason"],
            ),
        )

    def started(self) -> None:
        self._in_flight += 1

    def finished(self) -> None:
        self._in_flight -= 1

    def answered(
        self, operation: str, status: int, received: int, sent: int, seconds: float
    ) -> None:
        """Count one answered request."""
        tallies = self._operations.get(operation)
        if tallies is None:
            tallies = self._operation(operation)
        requests = tallies.statuses.get(status // 100)
        if requests is None:
            requests = telemetry.tallies().counter(
                self.requests.labels(operation, f"{status // 100}xx")
            )
            tallies.statuses[status // 100] = requests
        requests.inc()
        tallies.duration.observe(seconds)
        tallies.received.inc(received)
        tallies.sent.inc(sent)

    def refused(self, error: Exception) -> None:
        """Count `error` if it refused a request's signature (rare: counted at once)."""
        reason = auth_failure_reason(error)
        if reason is not None:
            self.auth_failures.labels(reason).inc()

    def _operation(self, operation: str) -> _Operation:
        tallies = telemetry.tallies()
        made = _Operation(
            statuses={},
            duration=tallies.histogram(self.duration.labels(operation)),
            received=tallies.counter(self.received.labels(operation)),
            sent=tallies.counter(self.sent.labels(operation)),
        )
        self._operations[operation] = made
        return made

    def _set_in_flight(self) -> None:
        self.in_flight.set(self._in_flight)


_metrics: GatewayMetrics | None = None


def gateway() -> GatewayMetrics:
    """This process's gateway metrics, made on first use."""
    global _metrics
    if _metrics is None:
        _metrics = GatewayMetrics.make()
        telemetry.tallies().before_flush.append(_metrics._set_in_flight)
    return _metrics
