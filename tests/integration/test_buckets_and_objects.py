"""Buckets and objects through the metadata API: the S3 behaviours and their errors."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from shoal.metadata import (
    AccountNotFound,
    BucketAlreadyExists,
    BucketAlreadyOwnedByYou,
    BucketNotEmpty,
    BucketNotFound,
    CommitUnknown,
    InvalidName,
    MetadataStore,
    ObjectNotFound,
    ObjectWrite,
    PartWrite,
    PreconditionFailed,
    UploadNotFound,
)
from shoal.metadata.objects import ANY_VERSION
from shoal.metadata.ring import vnode_schema
from shoal.storage import block_runs
from tests.fixtures.postgres import MakeStore, unique

INVALID_UTF8 = b"caf\xe9".decode("utf-8", "surrogateescape")


@pytest.fixture(scope="module")
def store(make_store: MakeStore) -> MetadataStore:
    return make_store(shards=3, vnodes=6)


@pytest.fixture
def owner(store: MetadataStore, run: Any) -> uuid.UUID:
    return run(store.accounts.create(unique("acct"))).id


@pytest.fixture
def bucket(store: MetadataStore, run: Any, owner: uuid.UUID) -> str:
    name = unique("bkt")
    run(store.buckets.create(owner, name))
    return name


def blob(content: bytes, **kwargs: Any) -> ObjectWrite:
    import hashlib

    md5 = hashlib.md5(content).digest()
    return ObjectWrite(content_length=len(content), content_md5=md5, **kwargs)


def test_bucket_lifecycle(store: MetadataStore, run: Any, owner: uuid.UUID) -> None:
    names = sorted(unique(p) for p in ("alpha", "beta", "gamma"))
    created = [run(store.buckets.create(owner, n)) for n in names]
    assert run(store.buckets.get(owner, names[0])) == created[0]
    assert [b.name for b in run(store.buckets.list(owner))] == names
    assert [b.name for b in run(store.buckets.list(owner, prefix="beta"))] == [names[1]]
    assert [b.name for b in run(store.buckets.list(owner, after=names[0], limit=1))] == [names[1]]
    run(store.buckets.delete(owner, names[1]))
    assert [b.name for b in run(store.buckets.list(owner))] == [names[0], names[2]]
    with pytest.raises(BucketNotFound):
        run(store.buckets.get(owner, names[1]))


def test_bucket_cors_rules_belong_to_one_incarnation(
    store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str
) -> None:
    assert run(store.buckets.get_cors(owner, bucket)) is None
    rules = [{"id": "", "origins": ["*"], "methods": ["GET"], "headers": [], "expose": []}]
    run(store.buckets.put_cors(owner, bucket, rules))
    assert run(store.buckets.get_cors(owner, bucket)) == rules
    old = run(store.buckets.get(owner, bucket))
    run(store.buckets.delete(owner, bucket))
    assert run(store.buckets.cors_of(old)) is None  # deleted with the bucket, not left behind
    run(store.buckets.create(owner, bucket))
    assert run(store.buckets.get_cors(owner, bucket)) is None
    run(store.buckets.put_cors(owner, bucket, rules))
    run(store.buckets.delete_cors(owner, bucket))
    assert run(store.buckets.get_cors(owner, bucket)) is None


def test_bucket_names_are_global(
    store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str
) -> None:
    with pytest.raises(BucketAlreadyOwnedByYou):
        run(store.buckets.create(owner, bucket))
    other = run(store.accounts.create(unique("other"))).id
    with pytest.raises(BucketAlreadyExists):
        run(store.buckets.create(other, bucket))
    with pytest.raises(BucketNotFound):
        run(store.buckets.get(other, bucket))


def test_recreated_bucket_is_a_new_incarnation_without_old_objects(
    store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str
) -> None:
    first = run(store.buckets.get(owner, bucket))
    run(store.objects.put(owner, bucket, "old", blob(b"old")))
    run(store.buckets.delete(owner, bucket, force=True))
    second = run(store.buckets.create(owner, bucket))
    assert second.id != first.id
    assert run(store.objects.list(owner, bucket)).entries == []
    with pytest.raises(ObjectNotFound):
        run(store.objects.get(owner, bucket, "old"))
    # The old incarnation's object waits for GC.
    left = run(store.garbage.bucket_contents(owner, first.id))
    assert [r.name for r in left] == ["old"]


def test_a_delete_whose_bucket_was_deleted_and_made_again_meanwhile_is_no_such_bucket(
    store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two deletes and a create of one name at once: the delete whose incarnation another
    delete took answers NoSuchBucket, and leaves the bucket made since (it was not asked to
    delete that one, and a retry would)."""
    first = run(store.buckets.get(owner, bucket))
    vnode = store.shards.ring.vnode_for_bucket(owner, bucket)
    schema = vnode_schema(vnode)
    made_again = uuid.uuid4()

    async def deleted_and_made_again(*_: Any) -> bool:
        async with store.shards.of_vnode(vnode).pool.connection() as conn:
            await conn.execute(f"DELETE FROM {schema}.manta_bucket WHERE id = %s", (first.id,))
            await conn.execute(
                f"INSERT INTO {schema}.manta_bucket (id, owner, name) VALUES (%s, %s, %s)",
                (made_again, owner, bucket),
            )
        return False

    monkeypatch.setattr(store.buckets, "has_objects", deleted_and_made_again)
    with pytest.raises(BucketNotFound):
        run(store.buckets.delete(owner, bucket))
    store.buckets.forget_bucket(owner, bucket)
    assert run(store.buckets.get(owner, bucket)).id == made_again


def test_delete_refuses_a_bucket_with_objects_not_one_with_only_uploads(
    store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str
) -> None:
    found = run(store.buckets.get(owner, bucket))
    run(store.objects.put(owner, bucket, "k", blob(b"x")))
    upload = run(store.uploads.create(owner, bucket, "big"))
    part = PartWrite(part_number=1, content_length=3, content_md5=b"\1" * 16, sharks=["dc:n1"])
    run(store.uploads.put_part(owner, bucket, "big", upload.id, part))
    run(store.uploads.create(owner, bucket, "empty"))  # an upload with no part
    with pytest.raises(BucketNotEmpty):
        run(store.buckets.delete(owner, bucket))
    run(store.objects.delete(owner, bucket, "k"))
    run(store.buckets.delete(owner, bucket))
    # The uploads went with the incarnation: a new bucket of the name never sees them ...
    run(store.buckets.create(owner, bucket))
    assert run(store.uploads.list(owner, bucket)) == []
    with pytest.raises(UploadNotFound):
        run(store.uploads.get(owner, bucket, "big", upload.id))
    # ... and their parts are garbage of the dead incarnation, with its record.
    vnode = store.ring.vnode_for_bucket(owner, bucket)

    async def claimed() -> list[Any]:
        async with store.garbage.claim_deleted_buckets(vnode, timedelta(0)) as claim:
            return claim.buckets

    assert found.id in [b.id for b in run(claimed())]
    left = run(store.garbage.bucket_contents(owner, found.id))
    assert [(r.id, r.properties["part_number"]) for r in left] == [(part.id, 1)]
    run(store.garbage.remove_bucket_contents(owner, found.id, left))
    run(store.garbage.remove_bucket_uploads(owner, found.id))
    assert not run(store.buckets.has_content(owner, found.id))


def test_a_delete_racing_writes_never_loses_one_it_acknowledged(
    store: MetadataStore, run: Any, owner: uuid.UUID
) -> None:
    """Writes into a bucket while it is deleted: each round, either the delete is refused
    and every acknowledged write reads back, or the delete succeeds and no write was
    acknowledged (it would be lost with the bucket)."""

    async def put(bucket: str, name: str) -> bool:
        try:
            await store.objects.put(owner, bucket, name, blob(name.encode()))
        except (BucketNotFound, CommitUnknown):
            return False
        return True

    async def delete(bucket: str) -> bool:
        try:
            await store.buckets.delete(owner, bucket)
        except (BucketNotEmpty, BucketNotFound):  # not empty, or deleted by the other
            return False
        return True

    async def round_(bucket: str) -> tuple[bool, list[str]]:
        # Two deletes at once (a client retrying one), each with its own mark.
        names = [f"k{n}" for n in range(8)]
        answers = await asyncio.gather(
            delete(bucket), delete(bucket), *(put(bucket, n) for n in names)
        )
        deleted = answers[0] or answers[1]
        return deleted, [n for n, ok in zip(names, answers[2:], strict=True) if ok]

    deleted_rounds = 0
    for _ in range(30):
        bucket = unique("race")
        run(store.buckets.create(owner, bucket))
        deleted, acknowledged = run(round_(bucket))
        if deleted:
            deleted_rounds += 1
            assert acknowledged == [], acknowledged  # acknowledged, then lost with the bucket
        for name in acknowledged:
            found = run(store.objects.get(owner, bucket, name))
            assert found.content_md5 == blob(name.encode()).content_md5
    assert deleted_rounds  # the race ran both ways


def test_a_refused_delete_leaves_the_mark_of_another_delete_under_way(
    store: MetadataStore, run: Any, owner: uuid.UUID, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two deletes of one bucket (a client retrying one): the first has checked that the
    bucket is empty and is slow to go on; a write comes, the retry is refused as not empty.
    The first delete's mark must still hold back the writes that follow, or one of them is
    acknowledged and then deleted with the bucket."""
    bucket = unique("twice")
    run(store.buckets.create(owner, bucket))
    checked, go_on = asyncio.Event(), asyncio.Event()
    has_objects = store.buckets.has_objects
    first = True

    async def slow_first_check(owner_: uuid.UUID, bucket_id: uuid.UUID) -> bool:
        nonlocal first
        found = await has_objects(owner_, bucket_id)
        if first:
            first = False
            checked.set()
            await go_on.wait()
        return found

    monkeypatch.setattr(store.buckets, "has_objects", slow_first_check)

    async def scenario() -> list[str]:
        acknowledged = []
        slow = asyncio.create_task(store.buckets.delete(owner, bucket))
        await checked.wait()
        for name in ("before the retry", "after the retry"):
            try:
                await store.objects.put(owner, bucket, name, blob(name.encode()))
                acknowledged.append(name)
            except CommitUnknown:
                pass
            if name == "before the retry":
                with pytest.raises(BucketNotEmpty):  # the retry sees the first write
                    await store.buckets.delete(owner, bucket)
        go_on.set()
        await slow
        return acknowledged

    assert run(scenario()) == []  # every write into the bucket being deleted was a 503
    with pytest.raises(BucketNotFound):
        run(store.buckets.get(owner, bucket))


def test_a_write_whose_bucket_cannot_be_read_after_its_commit_is_commit_unknown(
    store: MetadataStore, run: Any, owner: uuid.UUID, admin_dsn: str
) -> None:
    """The read of the bucket after a write's commit fails (its shard went down): the write
    committed, so the caller is told CommitUnknown (it keeps the blocks the row names), never
    an error that says nothing was written."""

    def bucket_shard_of(name: str) -> Any:
        return store.shards.of_vnode(store.ring.vnode_for_bucket(owner, name))

    # Not on the catalog shard, whose connections carry the bucket cache's notices.
    bucket = next(
        name
        for name in (unique("down") for _ in range(100))
        if bucket_shard_of(name) is not store.shards.catalog
    )
    found = run(store.buckets.create(owner, bucket))
    bucket_shard = bucket_shard_of(bucket)
    name = next(
        f"k{n}"
        for n in range(1000)
        if store.shards.of_vnode(store.ring.vnode_for_object(owner, found.id, f"k{n}"))
        is not bucket_shard
    )
    database = psycopg.conninfo.conninfo_to_dict(bucket_shard.pool.conninfo)["dbname"]
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        run(store.objects.put(owner, bucket, "warm", blob(b"x")))  # its id, cached for 1 s
        # Then at once the bucket's shard goes away: its connections cut, new ones refused.
        admin.execute(f'ALTER DATABASE "{database}" WITH ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            [database],
        )
        try:
            with pytest.raises(CommitUnknown):
                run(store.objects.put(owner, bucket, name, blob(b"committed")))
        finally:
            admin.execute(f'ALTER DATABASE "{database}" WITH ALLOW_CONNECTIONS true')
    deadline = time.monotonic() + 30
    while bucket_shard.pool.down_since is not None:  # until its pool finds it back
        assert time.monotonic() < deadline, "the shard was not found back"
        run(asyncio.sleep(0.1))
    committed = blob(b"committed").content_md5
    assert run(store.objects.get(owner, bucket, name)).content_md5 == committed


def test_forced_delete_records_the_incarnation_and_leaves_objects_to_gc(
    store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str
) -> None:
    found = run(store.buckets.get(owner, bucket))
    for i in range(20):
        run(store.objects.put(owner, bucket, f"k{i}", blob(b"x")))
    run(store.buckets.delete(owner, bucket, force=True))
    vnode = store.ring.vnode_for_bucket(owner, bucket)

    async def claimed() -> list[Any]:
        async with store.garbage.claim_deleted_buckets(vnode, timedelta(0)) as claim:
            return claim.buckets

    assert found.id in [b.id for b in run(claimed())]
    assert len(run(store.garbage.bucket_contents(owner, found.id))) == 20


def test_put_get_update_delete(
    store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str
) -> None:
    first = blob(
        b"hello",
        content_type="text/plain",
        headers={"x-amz-meta-a": "1"},
        sharks=["dc1:n1", "dc2:n2"],
        properties={"block_size": 1048576},
    )
    put = run(store.objects.put(owner, bucket, "greeting", first))
    assert put.replaced is None
    got = run(store.objects.get(owner, bucket, "greeting"))
    assert (got.id, got.content_type, got.headers, got.sharks) == (
        first.id,
        "text/plain",
        {"x-amz-meta-a": "1"},
        ["dc1:n1", "dc2:n2"],
    )
    assert got.properties == {"block_size": 1048576}
    assert got.etag == "5d41402abc4b2a76b9719d911017c592"

    second = blob(b"world")
    assert run(store.objects.put(owner, bucket, "greeting", second)).replaced == first.id
    deleted = run(store.objects.delete(owner, bucket, "greeting"))
    assert deleted is not None and deleted.id == second.id
    assert run(store.objects.delete(owner, bucket, "greeting")) is None
    with pytest.raises(ObjectNotFound):
        run(store.objects.get(owner, bucket, "greeting"))


def test_a_small_object_keeps_its_bytes_in_its_row(
    store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str
) -> None:
    small = blob(b"tiny", data=b"tiny", properties={"inline": True})
    run(store.objects.put(owner, bucket, "k", small))
    got = run(store.objects.get(owner, bucket, "k"))
    assert (got.data, got.sharks, block_runs(got.id, 4, got.sharks, got.properties)) == (
        b"tiny",
        [],
        [],
    )
    assert run(store.objects.get(owner, bucket, "k", with_data=False)).data is None  # HEAD
    # Replaced by a version in blocks, and back: each row holds only its own version's data.
    large = blob(b"x" * 10, sharks=["dc1:n1"], properties={"block_size": 1048576})
    assert run(store.objects.put(owner, bucket, "k", large)).replaced == small.id
    assert run(store.objects.get(owner, bucket, "k")).data is None
    again = blob(b"again", data=b"again", properties={"inline": True})
    params = {"if_match": large.content_md5}
    assert run(store.objects.put(owner, bucket, "k", again, **params)).replaced == large.id
    assert run(store.objects.get(owner, bucket, "k")).data == b"again"
    created = blob(b"new", data=b"new", properties={"inline": True})
    run(store.objects.put(owner, bucket, "fresh", created, if_none_match=True))
    assert run(store.objects.get(owner, bucket, "fresh")).data == b"new"
    deleted = run(store.objects.delete(owner, bucket, "k"))
    assert deleted is not None and deleted.id == again.id
    assert block_runs(deleted.id, 5, deleted.sharks, deleted.properties) == []
    # Only the version in blocks waits for GC: a small one leaves nothing on a node.
    recorded = run(deletion_records(store, owner, bucket, "k"))
    assert large.id in recorded
    assert small.id not in recorded and again.id not in recorded


def test_properties_read_back_exactly_as_written(
    store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str
) -> None:
    # Integers beyond 64 bits too: a faster JSON reader tried for jsonb (orjson) made them
    # floats without a word (docs/decisions.md, "Tried and not kept").
    properties = {"n": 2**70 + 1, "m": -(2**64) - 3, "list": [1, 2.5, None, "é✓"]}
    run(store.objects.put(owner, bucket, "props", blob(b"", properties=properties)))
    assert run(store.objects.get(owner, bucket, "props")).properties == properties


def test_remove_deletes_as_delete_does_and_answers_the_id(
    store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str
) -> None:
    """`remove` (S3's DeleteObject) leaves what `delete` leaves: no live version, and a
    deletion record for a version in blocks only."""
    large = blob(b"x" * 10, sharks=["dc1:n1"], properties={"block_size": 1048576})
    small = blob(b"tiny", data=b"tiny", properties={"inline": True})
    run(store.objects.put(owner, bucket, "large", large))
    run(store.objects.put(owner, bucket, "small", small))
    assert run(store.objects.remove(owner, bucket, "large")) == large.id
    assert run(store.objects.remove(owner, bucket, "small")) == small.id
    assert run(store.objects.remove(owner, bucket, "small")) is None
    for name in ("large", "small"):
        with pytest.raises(ObjectNotFound):
            run(store.objects.get(owner, bucket, name))
    assert large.id in run(deletion_records(store, owner, bucket, "large"))
    assert small.id not in run(deletion_records(store, owner, bucket, "small"))


async def deletion_records(
    store: MetadataStore, owner: uuid.UUID, bucket: str, name: str
) -> set[uuid.UUID]:
    """Ids of the deletion records on the vnode of `name` (claimed, then let go)."""
    found = await store.objects.bucket(owner, bucket)
    vnode = store.ring.vnode_for_object(owner, found.id, name)
    async with store.garbage.claim_deleted_objects(vnode, timedelta(0), limit=1000) as claim:
        return {record.id for record in claim.records}


def test_conditional_writes(store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str) -> None:
    v1 = blob(b"one")
    run(store.objects.put(owner, bucket, "c", v1, if_none_match=True))
    with pytest.raises(PreconditionFailed):
        run(store.objects.put(owner, bucket, "c", blob(b"two"), if_none_match=True))
    with pytest.raises(PreconditionFailed):
        run(store.objects.put(owner, bucket, "c", blob(b"two"), if_match=b"\0" * 16))
    v2 = blob(b"two")
    run(store.objects.put(owner, bucket, "c", v2, if_match=v1.content_md5))
    with pytest.raises(ObjectNotFound):
        run(store.objects.put(owner, bucket, "missing", blob(b"x"), if_match=v1.content_md5))
    with pytest.raises(PreconditionFailed):
        run(store.objects.delete(owner, bucket, "c", if_match=v1.content_md5))
    assert run(store.objects.delete(owner, bucket, "c", if_match=v2.content_md5)).id == v2.id


def test_if_match_any_and_if_none_match_an_etag(
    store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str
) -> None:
    with pytest.raises(ObjectNotFound):
        run(store.objects.put(owner, bucket, "c", blob(b"one"), if_match=ANY_VERSION))
    v1 = blob(b"one")
    run(store.objects.put(owner, bucket, "c", v1, if_none_match=blob(b"other").content_md5))
    v2 = blob(b"two")
    replaced = run(store.objects.put(owner, bucket, "c", v2, if_match=ANY_VERSION))
    assert replaced.replaced == v1.id
    with pytest.raises(PreconditionFailed):
        run(store.objects.put(owner, bucket, "c", blob(b"x"), if_none_match=v2.content_md5))
    v3 = blob(b"three")
    replaced = run(store.objects.put(owner, bucket, "c", v3, if_none_match=v1.content_md5))
    assert replaced.replaced == v2.id
    assert run(store.objects.get(owner, bucket, "c")).id == v3.id
    assert {v1.id, v2.id} <= run(deletion_records(store, owner, bucket, "c"))


def test_delete_many_deletes_per_vnode_and_records_each_version_once(
    store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str
) -> None:
    writes = {f"k{i:03d}": blob(b"x", sharks=["dc:n1"]) for i in range(60)}
    for name, write in writes.items():
        run(store.objects.put(owner, bucket, name, write))
    small = blob(b"small", properties={"inline": True}, data=b"small")
    run(store.objects.put(owner, bucket, "small", small))
    names = [*writes, "small", "absent", "k000", ""]
    outcome = run(store.objects.delete_many(owner, bucket, names))
    assert set(outcome) == set(names)
    assert isinstance(outcome[""], InvalidName)
    assert all(outcome[name] is None for name in names if name)
    assert run(store.objects.list(owner, bucket)).entries == []
    recorded = Counter()
    for vnode in range(store.ring.vnodes):
        recorded.update(run(records_of_bucket(store, vnode, owner, bucket)))
    assert recorded == Counter({write.id: 1 for write in writes.values()})  # none for "small"


async def records_of_bucket(
    store: MetadataStore, vnode: int, owner: uuid.UUID, bucket: str
) -> list[uuid.UUID]:
    """Ids of a vnode's deletion records of the bucket, as often as each is recorded."""
    found = await store.objects.bucket(owner, bucket)
    async with store.garbage.claim_deleted_objects(vnode, timedelta(0), limit=10_000) as claim:
        return [r.id for r in claim.records if r.bucket_id == found.id]


@pytest.mark.parametrize(
    "name",
    ["", "x" * 1025, "é" * 513, "nul\x00byte", INVALID_UTF8],
    ids=["empty", "1025-bytes", "513-two-byte-chars", "nul", "invalid-utf8"],
)
def test_bad_object_names_are_refused_clearly(
    store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str, name: str
) -> None:
    with pytest.raises(InvalidName) as refused:
        run(store.objects.put(owner, bucket, name, blob(b"x")))
    assert str(refused.value)
    with pytest.raises(InvalidName):
        run(store.objects.get(owner, bucket, name))


def test_longest_name_is_accepted(
    store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str
) -> None:
    name = "é" * 511 + "xy"  # 1024 bytes
    run(store.objects.put(owner, bucket, name, blob(b"x")))
    assert run(store.objects.get(owner, bucket, name)).name == name


@pytest.mark.parametrize("name", ["ab", "UPPER", "has_underscore", "192.168.0.1", "a" * 64])
def test_bad_bucket_names_are_refused(
    store: MetadataStore, run: Any, owner: uuid.UUID, name: str
) -> None:
    with pytest.raises(InvalidName):
        run(store.buckets.create(owner, name))


def test_unknown_owner_and_bucket(store: MetadataStore, run: Any, owner: uuid.UUID) -> None:
    with pytest.raises(AccountNotFound):
        run(store.buckets.create(uuid.uuid4(), unique("orphan")))
    with pytest.raises(BucketNotFound):
        run(store.objects.put(owner, unique("nothere"), "k", blob(b"x")))
    with pytest.raises(BucketNotFound):
        run(store.objects.list(uuid.uuid4(), unique("nothere")))


def test_version_ids_must_be_uuid7(
    store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str
) -> None:
    with pytest.raises(InvalidName, match="UUIDv7"):
        run(store.objects.put(owner, bucket, "k", blob(b"x", id=uuid.uuid4())))
    put = run(store.objects.put(owner, bucket, "k", blob(b"x")))
    assert put.id.version == 7


def test_tags_are_set_on_the_version_read_and_nothing_else(
    store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str
) -> None:
    first = blob(b"one", sharks=["dc:n1"], properties={"block_size": 1048576})
    run(store.objects.put(owner, bucket, "k", first))
    before = run(store.objects.get(owner, bucket, "k"))
    assert run(store.objects.set_tags(owner, bucket, "k", first.id, {"a": "1", "b": ""}))
    tagged = run(store.objects.get(owner, bucket, "k"))
    assert tagged.properties == {"block_size": 1048576, "tags": {"a": "1", "b": ""}}
    # The data, ETag and Last-Modified stay, and no deletion record is made.
    assert (tagged.modified, tagged.etag, tagged.sharks) == (
        before.modified,
        before.etag,
        before.sharks,
    )
    recorded = Counter()
    for vnode in range(store.ring.vnodes):
        recorded.update(run(records_of_bucket(store, vnode, owner, bucket)))
    assert recorded == Counter()
    assert run(store.objects.set_tags(owner, bucket, "k", first.id, {}))
    assert run(store.objects.get(owner, bucket, "k")).properties == {"block_size": 1048576}

    # A tagging request that read the first version, then lost the race to an overwrite,
    # changes nothing: the new version keeps its own tags (none).
    second = blob(b"two", sharks=["dc:n1"])
    run(store.objects.put(owner, bucket, "k", second))
    assert not run(store.objects.set_tags(owner, bucket, "k", first.id, {"late": "1"}))
    assert run(store.objects.get(owner, bucket, "k")).properties == {}
    run(store.objects.delete(owner, bucket, "k"))
    assert not run(store.objects.set_tags(owner, bucket, "k", second.id, {"late": "1"}))


def test_bucket_tags(store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str) -> None:
    assert run(store.buckets.get_tags(owner, bucket)) == {}
    run(store.buckets.put_tags(owner, bucket, {"team": "storage"}))
    run(store.buckets.put_tags(owner, bucket, {"team": "data", "cost": "1"}))
    assert run(store.buckets.get_tags(owner, bucket)) == {"team": "data", "cost": "1"}
    run(store.buckets.delete_tags(owner, bucket))
    assert run(store.buckets.get_tags(owner, bucket)) == {}
    with pytest.raises(BucketNotFound):
        run(store.buckets.put_tags(owner, unique("none"), {"a": "1"}))
