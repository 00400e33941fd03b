"""Multipart uploads: parts, complete with a subset, abort, and the records they leave."""

from __future__ import annotations

import asyncio
import hashlib
import random
import uuid
from datetime import timedelta
from typing import Any

import pytest

from shoal.metadata import (
    BucketNotEmpty,
    CommitUnknown,
    CommonPrefix,
    EntityTooSmall,
    InvalidPart,
    InvalidPartOrder,
    MetadataStore,
    ObjectNotFound,
    PartWrite,
    PreconditionFailed,
    Upload,
    UploadNotFound,
)
from shoal.metadata.objects import ANY_VERSION
from tests.fixtures.postgres import MakeStore, unique

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def store(make_store: MakeStore) -> MetadataStore:
    return make_store(shards=2, vnodes=4, pool_max_size=20)


@pytest.fixture
def where(store: MetadataStore, run: Any) -> tuple[uuid.UUID, str]:
    owner = run(store.accounts.create(unique("mpu"))).id
    bucket = unique("mpu")
    run(store.buckets.create(owner, bucket))
    return owner, bucket


def part(number: int, size: int = 5 * MiB, tag: bytes = b"") -> PartWrite:
    md5 = hashlib.md5(f"{number}{tag!r}".encode()).digest()
    return PartWrite(
        part_number=number,
        content_length=size,
        content_md5=md5,
        sharks=[f"dc1:n{number % 3}"],
        properties={"block_size": MiB},
    )


def records_of(
    store: MetadataStore, run: Any, owner: uuid.UUID, bucket: str, key: str
) -> list[Any]:
    """Every deletion record of `key` (any age), found by claiming with a zero leeway."""
    found = run(store.buckets.get(owner, bucket))
    vnode = store.ring.vnode_for_object(owner, found.id, key)

    async def claim() -> list[Any]:
        async with store.garbage.claim_deleted_objects(vnode, timedelta(0), limit=1000) as c:
            return [r for r in c.records if r.name == key and r.bucket_id == found.id]

    return run(claim())


def test_complete_with_a_subset_retires_unused_and_replaced_parts(
    store: MetadataStore, run: Any, where: tuple[uuid.UUID, str]
) -> None:
    owner, bucket = where
    upload = run(
        store.uploads.create(
            owner, bucket, "big", content_type="video/mp4", headers={"x-amz-meta-k": "v"}
        )
    )
    parts = {n: part(n) for n in (1, 2, 3, 4)}
    for p in parts.values():
        run(store.uploads.put_part(owner, bucket, "big", upload.id, p))
    replaced = parts[2]
    parts[2] = part(2, tag=b"again")
    run(store.uploads.put_part(owner, bucket, "big", upload.id, parts[2]))
    listed = run(store.uploads.list_parts(owner, bucket, "big", upload.id))
    assert [(p.part_number, p.id) for p in listed] == [(n, parts[n].id) for n in (1, 2, 3, 4)]

    chosen = [(n, parts[n].content_md5) for n in (1, 2, 4)]
    result = run(store.uploads.complete(owner, bucket, "big", upload.id, chosen))
    obj = run(store.objects.get(owner, bucket, "big"))
    assert obj.id == result.id and obj.content_length == 15 * MiB
    expected_md5 = hashlib.md5(b"".join(parts[n].content_md5 for n in (1, 2, 4))).hexdigest()
    assert obj.etag == f"{expected_md5}-3"
    [listed_object] = run(store.objects.list(owner, bucket, prefix="big")).objects
    assert listed_object.etag == obj.etag  # "-N" from the part count
    assert (obj.content_type, obj.headers) == ("video/mp4", {"x-amz-meta-k": "v"})
    assert [p["id"] for p in obj.properties["parts"]] == [str(parts[n].id) for n in (1, 2, 4)]
    assert obj.properties["parts"][0]["block_size"] == MiB

    retired = {
        (r.properties["part_number"], r.id) for r in records_of(store, run, owner, bucket, "big")
    }
    assert retired == {(2, replaced.id), (3, parts[3].id)}
    assert run(store.uploads.list(owner, bucket)) == []
    with pytest.raises(UploadNotFound):
        run(store.uploads.list_parts(owner, bucket, "big", upload.id))


def test_invalid_completions_change_nothing(
    store: MetadataStore, run: Any, where: tuple[uuid.UUID, str]
) -> None:
    owner, bucket = where
    upload = run(store.uploads.create(owner, bucket, "k"))
    small, last = part(1, size=MiB), part(2, size=MiB)
    for p in (small, last):
        run(store.uploads.put_part(owner, bucket, "k", upload.id, p))
    with pytest.raises(InvalidPartOrder):
        run(
            store.uploads.complete(
                owner, bucket, "k", upload.id, [(2, last.content_md5), (1, small.content_md5)]
            )
        )
    with pytest.raises(InvalidPart):
        run(store.uploads.complete(owner, bucket, "k", upload.id, [(1, b"\0" * 16)]))
    with pytest.raises(InvalidPart):
        run(store.uploads.complete(owner, bucket, "k", upload.id, [(7, small.content_md5)]))
    with pytest.raises(EntityTooSmall):
        run(
            store.uploads.complete(
                owner, bucket, "k", upload.id, [(1, small.content_md5), (2, last.content_md5)]
            )
        )
    assert len(run(store.uploads.list_parts(owner, bucket, "k", upload.id))) == 2
    # The last part may be small: completing with part 2 alone works.
    run(store.uploads.complete(owner, bucket, "k", upload.id, [(2, last.content_md5)]))
    assert run(store.objects.get(owner, bucket, "k")).content_length == MiB


def test_abort_retires_every_part(
    store: MetadataStore, run: Any, where: tuple[uuid.UUID, str]
) -> None:
    owner, bucket = where
    upload = run(store.uploads.create(owner, bucket, "gone"))
    parts = [part(n) for n in (1, 2, 3)]
    for p in parts:
        run(store.uploads.put_part(owner, bucket, "gone", upload.id, p))
    assert run(store.uploads.abort(owner, bucket, "gone", upload.id)) == 3
    assert {r.id for r in records_of(store, run, owner, bucket, "gone")} == {p.id for p in parts}
    with pytest.raises(UploadNotFound):
        run(store.uploads.abort(owner, bucket, "gone", upload.id))
    with pytest.raises(UploadNotFound):
        run(store.uploads.put_part(owner, bucket, "gone", upload.id, part(4)))


def test_racing_complete_and_abort_have_one_winner(
    store: MetadataStore, run: Any, where: tuple[uuid.UUID, str]
) -> None:
    owner, bucket = where
    upload = run(store.uploads.create(owner, bucket, "race"))
    only = part(1)
    run(store.uploads.put_part(owner, bucket, "race", upload.id, only))

    async def race() -> list[Any]:
        return await asyncio.gather(
            store.uploads.complete(owner, bucket, "race", upload.id, [(1, only.content_md5)]),
            store.uploads.abort(owner, bucket, "race", upload.id),
            store.uploads.complete(owner, bucket, "race", upload.id, [(1, only.content_md5)]),
            return_exceptions=True,
        )

    results = run(race())
    failures = [r for r in results if isinstance(r, BaseException)]
    assert len(failures) == 2 and all(isinstance(f, UploadNotFound) for f in failures)
    completed = not isinstance(results[0], BaseException) or not isinstance(
        results[2], BaseException
    )
    records = records_of(store, run, owner, bucket, "race")
    if completed:
        assert run(store.objects.get(owner, bucket, "race")).properties["parts"][0]["id"] == str(
            only.id
        )
        assert records == []
    else:
        assert [r.id for r in records] == [only.id]


def test_uploads_list_by_key_then_upload_id(
    store: MetadataStore, run: Any, where: tuple[uuid.UUID, str]
) -> None:
    owner, bucket = where
    made = [run(store.uploads.create(owner, bucket, key)) for key in ("b", "a", "b", "c/d")]
    listed = run(store.uploads.list(owner, bucket))
    assert [(u.name, u.id) for u in listed] == sorted((u.name, u.id) for u in made)
    assert [u.name for u in run(store.uploads.list(owner, bucket, prefix="c/"))] == ["c/d"]
    after_a = run(store.uploads.list(owner, bucket, key_marker="a"))
    assert [u.name for u in after_a] == ["b", "b", "c/d"]
    first_b = min(u.id for u in made if u.name == "b")
    after_first_b = run(store.uploads.list(owner, bucket, key_marker="b", upload_id_marker=first_b))
    assert [u.name for u in after_first_b] == ["b", "c/d"]


def model_page(uploads: list[Upload], prefix: str, delimiter: str) -> list[Upload | CommonPrefix]:
    """Every entry ListMultipartUploads pages through, from all the uploads: each one under
    `prefix` in (key, id) order, keys with `delimiter` after the prefix as their common
    prefix, once."""
    entries: list[Upload | CommonPrefix] = []
    for upload in sorted(uploads, key=lambda u: (u.name, u.id)):
        if not upload.name.startswith(prefix):
            continue
        found = upload.name.find(delimiter, len(prefix))
        entry: Upload | CommonPrefix = (
            upload if found < 0 else CommonPrefix(upload.name[: found + len(delimiter)])
        )
        if entry not in entries:
            entries.append(entry)
    return entries


@pytest.mark.parametrize("delimiter", ["/", "-", "ab"])
def test_upload_pages_roll_keys_up_into_common_prefixes_as_a_model_does(
    store: MetadataStore, run: Any, where: tuple[uuid.UUID, str], delimiter: str
) -> None:
    owner, bucket = where
    rng = random.Random(delimiter)
    parts = ["a", "b", "/", "-", "ab", "z"]
    names = ["".join(rng.choice(parts) for _ in range(rng.randint(1, 5))) for _ in range(40)]
    made = [run(store.uploads.create(owner, bucket, name)) for name in [*names, *names[:5]]]
    for prefix in ("", "a", "b/", "ab"):
        for limit in (1, 3, 1000):
            pages: list[Upload | CommonPrefix] = []
            key_marker, id_marker = "", None
            for _ in range(len(made) + 1):  # as a client pages, from the last entry's markers
                page = run(
                    store.uploads.page(
                        owner,
                        bucket,
                        prefix=prefix,
                        delimiter=delimiter,
                        key_marker=key_marker,
                        upload_id_marker=id_marker,
                        limit=limit + 1,
                    )
                )
                pages.extend(page[:limit])
                if len(page) <= limit:
                    break
                last = page[limit - 1]
                key_marker = last.name if isinstance(last, Upload) else last.prefix
                id_marker = last.id if isinstance(last, Upload) else None
            else:
                pytest.fail(f"the pages of {prefix!r} by {limit} never end")
            assert pages == model_page(made, prefix, delimiter), (prefix, limit)


def test_a_page_of_many_common_prefixes_is_read_in_few_statements(
    store: MetadataStore, run: Any, where: tuple[uuid.UUID, str], monkeypatch: Any
) -> None:
    owner, bucket = where
    names = [f"p{i:03}/{leaf}" for i in range(60) for leaf in ("a", "b", "c")]
    for name in names:
        run(store.uploads.create(owner, bucket, name))
    reads = 0
    read = store.uploads._read

    async def counted(*args: Any) -> list[Upload]:
        nonlocal reads
        reads += 1
        return await read(*args)

    monkeypatch.setattr(store.uploads, "_read", counted)
    page = run(store.uploads.page(owner, bucket, delimiter="/", limit=1000))
    assert page == [CommonPrefix(f"p{i:03}/") for i in range(60)]
    assert reads == 1  # not one for each common prefix
    page = run(store.uploads.page(owner, bucket, delimiter="/", limit=50))
    assert page == [CommonPrefix(f"p{i:03}/") for i in range(50)]
    # A read of 50 uploads makes 17 entries: three reads fill the page.
    assert reads == 1 + 3


def test_complete_checks_if_match_any_and_if_none_match_an_etag(
    store: MetadataStore, run: Any, where: tuple[uuid.UUID, str]
) -> None:
    owner, bucket = where
    upload = run(store.uploads.create(owner, bucket, "cond"))
    only = part(1, size=10)
    run(store.uploads.put_part(owner, bucket, "cond", upload.id, only))
    chosen = [(1, only.content_md5)]
    complete = store.uploads.complete
    with pytest.raises(ObjectNotFound):  # If-Match: * and no object: the upload stays open
        run(complete(owner, bucket, "cond", upload.id, chosen, if_match=ANY_VERSION))
    first = run(complete(owner, bucket, "cond", upload.id, chosen, if_none_match=b"\0" * 16))
    again = run(store.uploads.create(owner, bucket, "cond"))
    run(store.uploads.put_part(owner, bucket, "cond", again.id, only))
    etag = run(store.objects.get(owner, bucket, "cond")).content_md5
    with pytest.raises(PreconditionFailed):
        run(complete(owner, bucket, "cond", again.id, chosen, if_none_match=etag))
    done = run(complete(owner, bucket, "cond", again.id, chosen, if_match=ANY_VERSION))
    assert done.replaced == first.id


def test_a_complete_sent_again_is_answered_only_while_its_bucket_takes_writes(
    store: MetadataStore,
    run: Any,
    where: tuple[uuid.UUID, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """made_by: a Complete sent again after its answer was lost gets the version the first
    made, unless other parts are named; and not while a DeleteBucket is under way, which the
    version may go with (the first Complete was answered 503 for that very reason)."""
    owner, bucket = where
    upload = run(store.uploads.create(owner, bucket, "again"))
    parts = [part(1), part(2, size=MiB)]
    for p in parts:
        run(store.uploads.put_part(owner, bucket, "again", upload.id, p))
    chosen = [(p.part_number, p.content_md5) for p in parts]
    completed = run(store.uploads.complete(owner, bucket, "again", upload.id, chosen))

    made = run(store.uploads.made_by(owner, bucket, "again", upload.id, chosen))
    assert made is not None and made.id == completed.id
    assert run(store.uploads.made_by(owner, bucket, "again", upload.id, chosen[:1])) is None
    assert run(store.uploads.made_by(owner, bucket, "again", uuid.uuid4(), chosen)) is None

    checking, go_on = asyncio.Event(), asyncio.Event()
    has_objects = store.buckets.has_objects

    async def slow_check(owner_: uuid.UUID, bucket_id: uuid.UUID) -> bool:
        checking.set()
        await go_on.wait()
        return await has_objects(owner_, bucket_id)

    monkeypatch.setattr(store.buckets, "has_objects", slow_check)

    async def sent_again_during_a_delete() -> None:
        deleting = asyncio.create_task(store.buckets.delete(owner, bucket))
        await checking.wait()  # the bucket is marked
        try:
            with pytest.raises(CommitUnknown):
                await store.uploads.made_by(owner, bucket, "again", upload.id, chosen)
        finally:
            go_on.set()
            with pytest.raises(BucketNotEmpty):
                await deleting

    run(sent_again_during_a_delete())
