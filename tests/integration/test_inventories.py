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

    async def put(config_id: str) -> bool:
        try:
            await store.inventories.put(owner, bucket, _configuration(config_id, bucket))
        except TooManyConfigurations:
            return False
        return True

    async def put_at_once(config_ids: list[str]) -> list[bool]:
        return await asyncio.gather(*(put(config_id) for config_id in config_ids))

    # Never more puts at once than the catalog's pool has connections (they take turns).
    at_once = store.shards.catalog.pool.max_size

    async def fill(count: int) -> None:
        for start in range(0, count, at_once):
            ids = [f"c{n:04d}" for n in range(start, min(start + at_once, count))]
            assert all(await put_at_once(ids))

    run(fill(MAX_CONFIGURATIONS - 5))
    # Ten new ones at once for the last five places: five are stored, never more.
    racing = [f"c{n:04d}" for n in range(MAX_CONFIGURATIONS - 5, MAX_CONFIGURATIONS + 5)]
    assert sorted(run(put_at_once(racing))) == [False] * 5 + [True] * 5
    stored = [c["id"] for c in run(store.inventories.list(owner, bucket, limit=2000))]
    assert len(stored) == MAX_CONFIGURATIONS
    with pytest.raises(TooManyConfigurations):
        run(store.inventories.put(owner, bucket, _configuration("one-more", bucket)))
    replaced = _configuration("c0000", bucket) | {"enabled": False}
    run(store.inventories.put(owner, bucket, replaced))  # replacing one is no new one
    assert run(store.inventories.get(owner, bucket, "c0000")) == replaced
    page = run(store.inventories.list(owner, bucket, after="c0997", limit=100))
    assert [c["id"] for c in page] == [i for i in stored if i > "c0997"]


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
