"""The S3 gateway's Prometheus metrics: requests, their latency and bytes, requests in
flight, and refused signatures (docs/operations.md, "Metrics").

Counted where the access line is written (app.py `_log_access`), once a request's answer is
out, so that the access log and the metrics count the same requests and the same bytes. A
request the gateway never answered (its client left before its turn) is in neither the
request counts nor the latencies.

The metric objects are made at first use, by `gateway()` (telemetry.py says why never at
import), and the labelled children of each operation are kept in a dict: a request then
costs a dict lookup and a few increments of memory-mapped values (bench/metrics_bench.py).
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
AUTH_FAILURE_REASONS = (
    UNKNOWN_KEY,
    SIGNATURE_MISMATCH,
    EXPIRED,
    CLOCK_SKEW,
    MALFORMED,
    UNSUPPORTED,
)

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
    """One operation's labelled children, made once."""

    statuses: dict[int, Counter]  # by status // 100
    duration: Histogram
    received: Counter
    sent: Counter


@dataclass
class GatewayMetrics:
    requests: Counter
    duration: Histogram
    received: Counter
    sent: Counter
    in_flight: Gauge
    auth_failures: Counter
    restarts: Counter
    _operations: dict[str, _Operation] = field(default_factory=dict)

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
            restarts=Counter(
                "shoal_gateway_worker_restarts",
                "Gateway worker processes that died and were started again.",
            ),
        )

    def started(self) -> None:
        self.in_flight.inc()

    def finished(self) -> None:
        self.in_flight.dec()

    def answered(
        self, operation: str, status: int, received: int, sent: int, seconds: float
    ) -> None:
        """Count one answered request."""
        children = self._operations.get(operation)
        if children is None:
            children = self._operation(operation)
        counter = children.statuses.get(status // 100)
        if counter is None:
            counter = self.requests.labels(operation, f"{status // 100}xx")
            children.statuses[status // 100] = counter
        counter.inc()
        children.duration.observe(seconds)
        if received:
            children.received.inc(received)
        if sent:
            children.sent.inc(sent)

    def refused(self, error: Exception) -> None:
        """Count `error` if it refused a request's signature."""
        reason = auth_failure_reason(error)
        if reason is not None:
            self.auth_failures.labels(reason).inc()

    def _operation(self, operation: str) -> _Operation:
        children = _Operation(
            statuses={},
            duration=self.duration.labels(operation),
            received=self.received.labels(operation),
            sent=self.sent.labels(operation),
        )
        self._operations[operation] = children
        return children


_metrics: GatewayMetrics | None = None


def gateway() -> GatewayMetrics:
    """This process's gateway metrics, made on first use."""
    global _metrics
    if _metrics is None:
        _metrics = GatewayMetrics.make()
    return _metrics
