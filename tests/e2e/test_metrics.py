"""The gateway's Prometheus metrics, scraped from `shoal serve`'s admin listener around a
known workload (summed over the gateway's two processes), and the request rates of the
admin API."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from shoal.metadata.metrics import statement_name
from shoal.metadata.queries import SELECT_OBJECT_WITH_DATA
from shoal.telemetry import FLUSH_SECONDS
from tests.fixtures.admin import admin_get, bearer
from tests.fixtures.serve import Keys, Served, raw_request

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(served: Served) -> Series:
    status, _, body = admin_get(served.admin_port, "/metrics")
    assert status == 200, body
    series: Series = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            series[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return series


def value(series: Series, name: str, **labels: str) -> float:
    return series.get((name, frozenset(labels.items())), 0.0)


def settled(served: Served, done: Callable[[Series], bool], seconds: float = 10) -> Series:
    """A scrape once `done` holds (or the last one after `seconds`): each gateway process
    writes what it counted once a second."""
    deadline = time.monotonic() + seconds
    while True:
        series = scrape(served)
        if done(series) or time.monotonic() > deadline:
            return series
        time.sleep(0.05)


def quiet(served: Served, seconds: float = 10) -> Series:
    """A scrape that no request counted before it can still change: the same as one taken
    more than a flush interval earlier (each process writes its counts once a second, so a
    request just answered may not be in the files yet)."""
    deadline = time.monotonic() + seconds
    earlier = scrape(served)
    while True:
        time.sleep(FLUSH_SECONDS + 0.1)
        now = scrape(served)
        if _requests(now) == _requests(earlier) or time.monotonic() > deadline:
            return now
        earlier = now


def _requests(series: Series) -> Series:
    return {k: v for k, v in series.items() if k[0].startswith("shoal_s3_")}


def test_a_known_workload_moves_each_counter_by_exactly_its_share(
    served: Served, bucket: str
) -> None:
    # Plain bodies (no aws-chunked checksum trailer): the bytes counted are the bodies.
    s3 = served.client(request_checksum_calculation="when_required")
    sizes = [1000 * n + 7 for n in range(1, 6)]
    wrong_secret = Keys(served.root.access_key_id, "not-the-secret")
    unknown_key = Keys("SHNOSUCHKEY000000000", "whatever")
    before = quiet(served)  # the tests before this one counted in full

    for n, size in enumerate(sizes):
        s3.put_object(Bucket=bucket, Key=f"k{n}", Body=b"x" * size)
    got = [len(s3.get_object(Bucket=bucket, Key=f"k{n}")["Body"].read()) for n in range(3)]
    missing = [raw_request(served, "GET", f"/{bucket}/missing-{n}") for n in range(4)]
    refused = [
        raw_request(served, "GET", f"/{bucket}/k0", keys=wrong_secret),
        raw_request(served, "GET", f"/{bucket}/k0", keys=unknown_key),
    ]
    assert [r.status for r in missing] == [404] * 4
    assert [r.status for r in refused] == [403, 403]
    error_bytes = sum(len(r.body) for r in missing + refused)

    requests, duration = "shoal_s3_requests_total", "shoal_s3_request_duration_seconds_count"
    expected = {
        (requests, (("operation", "PutObject"), ("status_class", "2xx"))): len(sizes),
        (requests, (("operation", "GetObject"), ("status_class", "2xx"))): 3,
        (requests, (("operation", "GetObject"), ("status_class", "4xx"))): 4 + 2,
        (requests, (("operation", "GetObject"), ("status_class", "5xx"))): 0,
        (duration, (("operation", "PutObject"),)): len(sizes),
        (duration, (("operation", "GetObject"),)): 3 + 4 + 2,
        ("shoal_s3_received_bytes_total", (("operation", "PutObject"),)): sum(sizes),
        ("shoal_s3_sent_bytes_total", (("operation", "GetObject"),)): sum(got) + error_bytes,
        ("shoal_s3_auth_failures_total", (("reason", "signature_mismatch"),)): 1,
        ("shoal_s3_auth_failures_total", (("reason", "unknown_key"),)): 1,
    }

    def moved(series: Series, name: str, **labels: str) -> float:
        return value(series, name, **labels) - value(before, name, **labels)

    def movements(series: Series) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {key: moved(series, key[0], **dict(key[1])) for key in expected}

    # Each gateway process writes its counts every second: wait until both have.
    after = settled(
        served,
        lambda s: movements(s) == expected and value(s, "shoal_s3_requests_in_flight") == 0,
    )
    assert movements(after) == expected
    assert sum(got) == sum(sizes[:3])
    assert value(after, "shoal_s3_requests_in_flight") == 0
    # Every GET read its object's row, alone or in a batch.
    statement = statement_name(SELECT_OBJECT_WITH_DATA)
    statements = "shoal_metadata_statement_duration_seconds_count"
    assert moved(after, statements, statement=statement) >= 3 + 4
    assert moved(after, "shoal_metadata_batch_size_count", kind="read") >= 1
    assert moved(after, "shoal_metadata_batch_size_count", kind="write") >= 1
    assert value(after, "shoal_ready") == 1


def test_the_pool_of_every_shard_is_sampled(served: Served) -> None:
    series = settled(served, lambda s: any(name == "shoal_metadata_pool_waiting" for name, _ in s))
    shards = {
        dict(labels)["shard"]
        for name, labels in series
        if name == "shoal_metadata_pool_connections"
    }
    assert shards
    for shard in shards:
        size = value(series, "shoal_metadata_pool_connections", shard=shard, state="size")
        idle = value(series, "shoal_metadata_pool_connections", shard=shard, state="idle")
        busy = value(series, "shoal_metadata_pool_connections", shard=shard, state="busy")
        assert size >= 2  # at least one connection in each of the two gateway processes
        assert busy + idle == size
        assert ("shoal_metadata_pool_waiting", frozenset({("shard", shard)})) in series


def test_the_request_rates_need_the_token_and_show_the_traffic(served: Served, bucket: str) -> None:
    path = "/admin/v1/requests"
    assert admin_get(served.admin_port, path)[0] == 401
    s3 = served.client()
    counter = ("shoal_s3_requests_total", {"operation": "PutObject", "status_class": "2xx"})
    before = value(quiet(served), counter[0], **counter[1])
    for n in range(5):
        s3.put_object(Bucket=bucket, Key=f"r{n}", Body=b"r")
    # These PUTs counted (earlier tests' PUTs may be older than the rates' window).
    settled(served, lambda s: value(s, counter[0], **counter[1]) >= before + 5)
    status, headers, body = admin_get(served.admin_port, path, bearer(served))
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    rates: dict[str, Any] = json.loads(body)
    assert set(rates) == {
        "window_seconds",
        "requests_per_second",
        "errors_per_second",
        "by_operation",
    }
    assert rates["window_seconds"] > 0 and rates["requests_per_second"] > 0
    by_operation = {
        entry["operation"]: entry["requests_per_second"] for entry in rates["by_operation"]
    }
    assert by_operation["PutObject"] > 0
