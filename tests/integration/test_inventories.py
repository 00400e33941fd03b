"""Bucket inventory configurations through the metadata API: S3's limit of 1,000 per
bucket, one incarnation's configurations only, and the record of each delivery."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from shoal.metadata import MetadataStore, TooManyConfigurations
from shoal.metadata.inventories import MAX_CONFIGURATIONS
from tests.fixtures.postgres import MakeStore, unique


@pytest.fixture(scope="module")
def store(make_store: MakeStore) -> MetadataStore:
    return make_store(shards=1, vnodes=4)


@pytest.fixture
def owner(store: MetadataStore, run: Any) -> uuid.UUID:
    return run(store.accounts.create(unique("acct"))).id


def _configuration(config_id: str, destination: str) -> dict[str, Any]:
    return {
        "id": config_id,
        "enabled": True,
        "prefix": None,
        "versions": "Current",
        "fields": [],
        "frequency": "Daily",
        "destination": {"bucket": destination, "prefix": None, "format": "CSV"},
    }


def test_at_most_1000_configurations_per_bucket(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    bucket = unique("inv")
    run(store.buckets.create(owner, bucket))

    async def fill() -> None:
        for start in range(0, MAX_CONFIGURATIONS, 100):
            await asyncio.gather(
                *(
                    store.inventories.put(owner, bucket, _configuration(f"c{n:04d}", bucket))
                    for n in range(start, start + 100)
                )
            )

    run(fill())
    with pytest.raises(TooManyConfigurations):
        run(store.inventories.put(owner, bucket, _configuration("one-more", bucket)))
    replaced = _configuration("c0000", bucket) | {"enabled": False}
    run(store.inventories.put(owner, bucket, replaced))  # replacing one is no new one
    assert run(store.inventories.get(owner, bucket, "c0000")) == replaced
    page = run(store.inventories.list(owner, bucket, after="c0997", limit=100))
    assert [c["id"] for c in page] == ["c0998", "c0999"]


def test_configurations_belong_to_one_incarnation_and_record_deliveries(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    bucket = unique("inv")
    run(store.buckets.create(owner, bucket))
    run(store.inventories.put(owner, bucket, _configuration("daily", bucket)))
    (setting,) = [s for s in run(store.inventories.all()) if s.bucket == bucket]
    assert setting.owner == owner and setting.delivered is None
    delivered = datetime(2024, 5, 1, 3, 0, tzinfo=UTC)
    run(store.inventories.mark_delivered(setting.bucket_id, "daily", delivered))
    (setting,) = [s for s in run(store.inventories.all()) if s.bucket == bucket]
    assert setting.delivered == delivered
    assert run(store.inventories.delete(owner, bucket, "daily")) is True
    assert run(store.inventories.delete(owner, bucket, "daily")) is False
    run(store.inventories.put(owner, bucket, _configuration("daily", bucket)))
    run(store.buckets.delete(owner, bucket))
    run(store.buckets.create(owner, bucket))
    assert run(store.inventories.list(owner, bucket)) == []
    assert [s for s in run(store.inventories.all()) if s.bucket == bucket] == []
