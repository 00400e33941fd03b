"""The fault tier's load and ledger, checked against a healthy `shoal serve`: with no fault,
every request succeeds and every key reads back as acknowledged."""

from __future__ import annotations

from tests.fault.load import MixedLoad, iter_failures
from tests.fixtures.serve import Served


def test_a_healthy_store_fails_nothing_and_loses_nothing(served: Served) -> None:
    client = served.client()
    client.create_bucket(Bucket="fault-harness")
    load = MixedLoad(
        lambda **config: served.raw_client(served.root, **config),
        "fault-harness",
        threads=3,
        max_requests=40,
        max_seconds=30,
    )
    with load:
        load.wait_for_requests(60)
    assert load.acknowledged_writes() > 10
    assert not list(iter_failures(load))
    load.verify(client)
