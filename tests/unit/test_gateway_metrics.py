"""The pieces of the gateway's metrics that need no server: why a signature was refused,
and request rates from samples of the request counter."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shoal.admin.rates import Counted, RequestRates
from shoal.metadata import AccessKeyNotFound
from shoal.s3 import sigv4
from shoal.s3.errors import NoSuchKey, SignatureDoesNotMatch
from shoal.s3.metrics import auth_failure_reason
from shoal.s3.sigv4 import SignedRequest, SigV4Error

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def presigned(signed_at: datetime, expires: int = 60) -> SignedRequest:
    stamp = signed_at.strftime("%Y%m%dT%H%M%SZ")
    query = [
        ("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),
        ("X-Amz-Credential", f"AKID/{stamp[:8]}/us-east-1/s3/aws4_request"),
        ("X-Amz-Date", stamp),
        ("X-Amz-Expires", str(expires)),
        ("X-Amz-SignedHeaders", "host"),
        ("X-Amz-Signature", "0" * 64),
    ]
    return SignedRequest(method="GET", raw_path="/b/k", query=query, headers={"host": "h"})


def refusal(request: SignedRequest) -> Exception:
    with pytest.raises(SigV4Error) as raised:
        sigv4.parse(request, NOW)
    return raised.value


def test_each_refused_signature_has_its_reason() -> None:
    assert auth_failure_reason(refusal(presigned(NOW - timedelta(hours=1)))) == "expired"
    assert auth_failure_reason(refusal(presigned(NOW + timedelta(hours=1)))) == "expired"
    header = {"host": "h", "authorization": "AWS4-HMAC-SHA256 nonsense"}
    malformed = SignedRequest(method="GET", raw_path="/", query=[], headers=header)
    assert auth_failure_reason(refusal(malformed)) == "malformed"
    other = {"host": "h", "authorization": "AWS4-HMAC-SHA512 Credential=x"}
    unsupported = SignedRequest(method="GET", raw_path="/", query=[], headers=other)
    assert auth_failure_reason(refusal(unsupported)) == "unsupported"
    skewed = SigV4Error("RequestTimeTooSkewed", "too large")
    assert auth_failure_reason(skewed) == "clock_skew"
    assert auth_failure_reason(SigV4Error("SignatureDoesNotMatch", "no")) == "signature_mismatch"
    assert auth_failure_reason(AccessKeyNotFound("no such key")) == "unknown_key"
    assert auth_failure_reason(SignatureDoesNotMatch()) == "signature_mismatch"  # a POST form


def test_what_is_no_signatures_fault_has_no_reason() -> None:
    assert auth_failure_reason(NoSuchKey()) is None
    assert auth_failure_reason(SigV4Error("IncompleteBody", "cut short")) is None
    assert auth_failure_reason(ValueError("anything")) is None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rates_are_what_the_counter_grew_over_the_window() -> None:
    clock = Clock()
    counter = Counted({"GetObject": 0.0}, errors=0.0)
    rates = RequestRates(window=60, read=lambda: counter, clock=clock)
    assert rates.rates()["requests_per_second"] == 0.0  # one sample: no rate yet
    for _ in range(20):  # 100 s: GETs at 10/s, PUTs at 2/s, one 5xx every 5 s
        clock.now += 5
        counter = Counted(
            {
                "GetObject": counter.by_operation["GetObject"] + 50,
                "PutObject": counter.by_operation.get("PutObject", 0.0) + 10,
            },
            errors=counter.errors + 1,
        )
        rates.sample()
    answer = rates.rates()
    assert answer["window_seconds"] == 60.0
    assert answer["requests_per_second"] == 12.0
    assert answer["errors_per_second"] == 0.2
    assert answer["by_operation"] == [
        {"operation": "GetObject", "requests_per_second": 10.0},
        {"operation": "PutObject", "requests_per_second": 2.0},
    ]


def test_a_quiet_operation_is_not_listed() -> None:
    clock = Clock()
    counter = Counted({"GetObject": 7.0}, errors=0.0)
    rates = RequestRates(window=60, read=lambda: counter, clock=clock)
    rates.sample()
    clock.now += 10
    answer = rates.rates()  # sampled again when asked: the last sample is not fresh
    assert answer["window_seconds"] == 10.0
    assert answer["requests_per_second"] == 0.0 and answer["by_operation"] == []
