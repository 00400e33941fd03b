"""Every replaced version is recorded exactly once, under any interleaving of writers."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import pytest

from shoal.metadata import MetadataStore, ObjectWrite, PreconditionFailed
from shoal.metadata.ring import vnode_schema
from tests.fixtures.postgres import MakeStore, unique

WRITERS = 40


@pytest.fixture(scope="module")
def store(make_store: MakeStore) -> MetadataStore:
    # One connection per writer, so the writes really run at the same time in PostgreSQL.
    return make_store(shards=2, vnodes=4, pool_max_size=WRITERS, full_pools=True)


@pytest.fixture
def bucket(store: MetadataStore, run: Any) -> tuple[uuid.UUID, str]:
    owner = run(store.accounts.create(unique("racer"))).id
    name = unique("race")
    run(store.buckets.create(owner, name))
    return owner, name


def write(n: int) -> ObjectWrite:
    return ObjectWrite(content_length=n, content_md5=n.to_bytes(16, "big"), sharks=[f"dc:node{n}"])


async def versions_named(store: MetadataStore, owner: uuid.UUID, bucket: str, key: str) -> Counter:
    """How often each version id appears: live row plus deletion records."""
    found = await store.buckets.get(owner, bucket)
    vnode = store.ring.vnode_for_object(owner, found.id, key)
    schema = vnode_schema(vnode)
    async with store.shards.of_vnode(vnode).pool.connection() as conn:
        cur = await conn.execute(
            f"SELECT id FROM {schema}.manta_bucket_object WHERE owner = %(o)s AND bucket_id = %(b)s"
            f" AND name = %(n)s UNION ALL SELECT id FROM {schema}.manta_bucket_deleted_object"
            " WHERE owner = %(o)s AND bucket_id = %(b)s AND name = %(n)s",
            {"o": owner, "b": found.id, "n": key},
        )
        return Counter(row[0] for row in await cur.fetchall())


async def start_together(coroutines: list[Any]) -> list[Any]:
    return await asyncio.gather(*coroutines, return_exceptions=True)


def test_concurrent_overwrites_record_every_version_once(
    store: MetadataStore, run: Any, bucket: tuple[uuid.UUID, str]
) -> None:
    owner, name = bucket
    writes = [write(n) for n in range(WRITERS)]
    results = run(start_together([store.objects.put(owner, name, "hot", w) for w in writes]))
    assert not [r for r in results if isinstance(r, BaseException)]
    seen = run(versions_named(store, owner, name, "hot"))
    assert seen == Counter({w.id: 1 for w in writes})
    live = run(store.objects.get(owner, name, "hot"))
    assert live.id in {w.id for w in writes}
    # Each put reports the version it replaced; together they chain every version once.
    replaced = [r.replaced for r in results if r.replaced is not None]
    assert len(replaced) == WRITERS - 1 and len(set(replaced)) == WRITERS - 1


def test_concurrent_deletes_record_the_version_once(
    store: MetadataStore, run: Any, bucket: tuple[uuid.UUID, str]
) -> None:
    owner, name = bucket
    only = write(1)
    run(store.objects.put(owner, name, "doomed", only))
    results = run(
        start_together([store.objects.delete(owner, name, "doomed") for _ in range(WRITERS)])
    )
    assert [r.id for r in results if r is not None] == [only.id]
    assert run(versions_named(store, owner, name, "doomed")) == Counter({only.id: 1})


def test_interleaved_puts_and_deletes_lose_no_version(
    store: MetadataStore, run: Any, bucket: tuple[uuid.UUID, str]
) -> None:
    owner, name = bucket
    writes = [write(n) for n in range(WRITERS)]
    operations = []
    for w in writes:
        operations.append(store.objects.put(owner, name, "churn", w))
        operations.append(store.objects.delete(owner, name, "churn"))
    results = run(start_together(operations))
    assert not [r for r in results if isinstance(r, BaseException)]
    assert run(versions_named(store, owner, name, "churn")) == Counter({w.id: 1 for w in writes})


def test_if_none_match_lets_exactly_one_creator_win(
    store: MetadataStore, run: Any, bucket: tuple[uuid.UUID, str]
) -> None:
    owner, name = bucket
    writes = [write(n) for n in range(WRITERS)]
    results = run(
        start_together(
            [store.objects.put(owner, name, "once", w, if_none_match=True) for w in writes]
        )
    )
    winners = [r for r in results if not isinstance(r, BaseException)]
    losers = [r for r in results if isinstance(r, BaseException)]
    assert len(winners) == 1
    assert all(isinstance(e, PreconditionFailed) for e in losers)
    assert run(store.objects.get(owner, name, "once")).id == winners[0].id
    assert run(versions_named(store, owner, name, "once")) == Counter({winners[0].id: 1})


def test_if_match_lets_exactly_one_of_racing_replacers_win(
    store: MetadataStore, run: Any, bucket: tuple[uuid.UUID, str]
) -> None:
    owner, name = bucket
    first = write(1000)
    run(store.objects.put(owner, name, "cas", first))
    writes = [write(n) for n in range(WRITERS)]
    results = run(
        start_together(
            [store.objects.put(owner, name, "cas", w, if_match=first.content_md5) for w in writes]
        )
    )
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1
    assert all(isinstance(r, PreconditionFailed) for r in results if r not in winners)
    expected = Counter({first.id: 1, winners[0].id: 1})
    assert run(versions_named(store, owner, name, "cas")) == expected


def test_if_none_match_an_etag_lets_exactly_one_of_racing_writers_win(
    store: MetadataStore, run: Any, bucket: tuple[uuid.UUID, str]
) -> None:
    owner, name = bucket
    first = write(2000)
    run(store.objects.put(owner, name, "unless", first))
    # Every writer writes the same ETag, unless it is already there: only the first may.
    same = [
        ObjectWrite(content_length=1, content_md5=b"\7" * 16, sharks=["dc:n"])
        for _ in range(WRITERS)
    ]
    results = run(
        start_together(
            [store.objects.put(owner, name, "unless", w, if_none_match=w.content_md5) for w in same]
        )
    )
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1 and winners[0].replaced == first.id
    assert all(isinstance(r, PreconditionFailed) for r in results if r not in winners)
    expected = Counter({first.id: 1, winners[0].id: 1})
    assert run(versions_named(store, owner, name, "unless")) == expected


def test_delete_many_racing_writers_records_every_version_once(
    store: MetadataStore, run: Any, bucket: tuple[uuid.UUID, str]
) -> None:
    owner, name = bucket
    keys = [f"many{i:02d}" for i in range(10)]
    writes = {key: [write(n) for n in range(4)] for key in keys}
    operations = [store.objects.put(owner, name, key, w) for key in keys for w in writes[key]]
    operations += [store.objects.delete_many(owner, name, keys) for _ in range(WRITERS // 2)]
    results = run(start_together(operations))
    assert not [r for r in results if isinstance(r, BaseException)]
    assert all(not any(r.values()) for r in results if isinstance(r, dict))
    for key in keys:
        expected = Counter({w.id: 1 for w in writes[key]})
        assert run(versions_named(store, owner, name, key)) == expected
