"""`shoal db check`: the catalog's bucket names against the vnodes' bucket rows, as shards
restored from backups taken at different points leave them. A restore is played here by
removing or adding the rows that the later backup would have held and the earlier did not."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from shoal.config import MetadataConfig
from shoal.metadata import MetadataStore, ObjectWrite
from shoal.metadata.claims import (
    HELD_BY_ANOTHER,
    KINDS,
    LOST_BUCKET,
    STALE_CLAIM,
    TWO_BUCKETS,
    UNCLAIMED_BUCKET,
    Check,
)
from shoal.metadata.errors import BucketAlreadyExists, MetadataUnavailable
from shoal.metadata.migrate import migrate
from shoal.metadata.ring import vnode_schema
from tests.fixtures.postgres import MakeStore, create_databases, unique

SHOAL = str(Path(sys.executable).parent / "shoal")
CLAIM = "INSERT INTO shoal.bucket_name (name, owner, bucket_id) VALUES (%s, %s, %s)"
DROP_CLAIM = "DELETE FROM shoal.bucket_name WHERE name = %s"
DROP_BUCKET_ROW = "DELETE FROM {schema}.manta_bucket WHERE id = %s"
ADD_BUCKET_ROW = "INSERT INTO {schema}.manta_bucket (id, owner, name) VALUES (%s, %s, %s)"


def test_claims_and_rows_restored_apart_are_found_and_repaired(
    make_store: MakeStore, run: Any
) -> None:
    store = make_store(shards=2, vnodes=8)
    owner = run(store.accounts.create(unique("owner"))).id
    other = run(store.accounts.create(unique("other"))).id
    names = {
        LOST_BUCKET: unique("lost"),
        STALE_CLAIM: unique("stale"),
        UNCLAIMED_BUCKET: unique("unclaimed"),
        HELD_BY_ANOTHER: unique("held"),
    }
    in_step = unique("in-step")
    for name in [*names.values(), in_step]:
        run(store.buckets.create(owner, name))
    lost = run(store.buckets.get(owner, names[LOST_BUCKET]))
    for key in ("a", "b/c", "d"):
        run(store.objects.put(owner, lost.name, key, _inline(key.encode())))
    # A name the other account held and deleted, and the owner took since.
    taken_since = unique("taken-since")
    before = run(store.buckets.create(other, taken_since))
    run(store.buckets.delete(other, taken_since))
    run(store.buckets.create(owner, taken_since))
    # The lost bucket's vnode is from before it was made; the stale claim's catalog from
    # before its DeleteBucket, and taken_since's from before the other account's; the
    # unclaimed bucket's catalog from before its create; and the held name's catalog from
    # when another account held it.
    run(_on_vnode_of(store, owner, lost.name, DROP_BUCKET_ROW, lost.id))
    stale = run(store.buckets.delete(owner, names[STALE_CLAIM]))
    run(_on_catalog(store, CLAIM, stale.name, owner, stale.id))
    run(_on_catalog(store, DROP_CLAIM, names[UNCLAIMED_BUCKET]))
    run(_on_catalog(store, DROP_CLAIM, taken_since))
    run(_on_catalog(store, CLAIM, taken_since, other, before.id))
    # Two owners' buckets of one name, neither claimed.
    twice = unique("twice")
    run(store.buckets.create(owner, twice))
    run(_on_catalog(store, DROP_CLAIM, twice))
    run(_on_vnode_of(store, other, twice, ADD_BUCKET_ROW, uuid.uuid4(), other, twice))
    holder = (other, uuid.uuid4())
    run(_on_catalog(store, DROP_CLAIM, names[HELD_BY_ANOTHER]))
    run(_on_catalog(store, CLAIM, names[HELD_BY_ANOTHER], *holder))
    for name in names.values():
        store.buckets.forget_bucket(owner, name)

    check = run(store.claims.check(settle=0.1))
    mine = [*names.values(), taken_since, in_step, twice]
    found = [d for d in check.differences if d.name in mine]  # other tests' buckets aside
    assert sorted((d.kind, d.name) for d in found) == sorted(
        [
            (STALE_CLAIM, names[STALE_CLAIM]),
            (STALE_CLAIM, taken_since),
            (LOST_BUCKET, names[LOST_BUCKET]),
            (UNCLAIMED_BUCKET, taken_since),
            (UNCLAIMED_BUCKET, names[UNCLAIMED_BUCKET]),
            (HELD_BY_ANOTHER, names[HELD_BY_ANOTHER]),
            (TWO_BUCKETS, twice),
            (TWO_BUCKETS, twice),
        ]
    )
    assert [d.kind for d in found] == sorted((d.kind for d in found), key=KINDS.index)
    by_kind = {(d.kind, d.name): d for d in found}
    assert by_kind[LOST_BUCKET, lost.name].bucket_id == lost.id
    assert by_kind[HELD_BY_ANOTHER, names[HELD_BY_ANOTHER]].holder == holder
    assert by_kind[STALE_CLAIM, taken_since].owner == other
    assert by_kind[UNCLAIMED_BUCKET, taken_since].owner == owner

    repaired = [run(store.claims.repair(d)) for d in found]
    assert repaired == [d.kind not in (HELD_BY_ANOTHER, TWO_BUCKETS) for d in found]
    again = run(store.claims.check(settle=0.1))
    assert [(d.kind, d.name) for d in again.differences if d.name in mine] == [
        (HELD_BY_ANOTHER, names[HELD_BY_ANOTHER]),
        (TWO_BUCKETS, twice),
        (TWO_BUCKETS, twice),
    ]
    # The lost bucket is back under its id, with its objects.
    assert run(store.buckets.get(owner, lost.name)).id == lost.id
    listed = run(store.objects.list(owner, lost.name))
    assert [entry.name for entry in listed.entries] == ["a", "b/c", "d"]
    # The stale name is free again; the unclaimed ones are their owner's alone.
    run(store.buckets.create(other, names[STALE_CLAIM]))
    for name in (names[UNCLAIMED_BUCKET], taken_since):
        with pytest.raises(BucketAlreadyExists):
            run(store.buckets.create(other, name))


def test_a_create_under_way_is_not_a_difference(make_store: MakeStore, run: Any) -> None:
    """A create claims the name, then writes the row: a check whose first reading comes
    between the two, and its second after, reports nothing; a claim whose row never comes is
    a lost bucket."""
    store = make_store(shards=2, vnodes=8)
    owner = run(store.accounts.create(unique("owner"))).id
    creating, never = unique("creating"), unique("never")
    bucket_id = uuid.uuid4()
    readings: list[Check] = []
    first_read = asyncio.Event()
    read_once = store.claims.read_once

    async def reading() -> Check:
        readings.append(await read_once())
        first_read.set()
        return readings[-1]

    async def create_in_two_steps() -> Check:
        await _on_catalog(store, CLAIM, creating, owner, bucket_id)
        await _on_catalog(store, CLAIM, never, owner, uuid.uuid4())
        check = asyncio.ensure_future(store.claims.check(settle=0.5))
        await first_read.wait()
        await _on_vnode_of(store, owner, creating, ADD_BUCKET_ROW, bucket_id, owner, creating)
        return await check

    store.claims.read_once = reading  # type: ignore[method-assign]
    check = run(create_in_two_steps())
    first, second = ({(d.kind, d.name) for d in r.differences} for r in readings)
    assert {(LOST_BUCKET, creating), (LOST_BUCKET, never)} <= first
    assert (LOST_BUCKET, creating) not in second
    found = {(d.kind, d.name) for d in check.differences}
    assert (LOST_BUCKET, never) in found and (LOST_BUCKET, creating) not in found


def test_a_create_refused_for_its_vnodes_shard_leaves_no_claim(
    make_store: MakeStore, run: Any
) -> None:
    """A CreateBucket whose row cannot be written (its vnode's shard down, or its commits
    hung) is refused before it claims the name: no lost bucket for `db check` to make."""
    store = make_store(shards=2, vnodes=8)
    owner = run(store.accounts.create(unique("owner"))).id
    for state in ("down", "hung"):
        name, pool = unique(state), store.shards.catalog.pool
        while pool is store.shards.catalog.pool:  # a name whose row is on the other shard
            name = unique(state)
            pool = store.shards.of_vnode(store.shards.ring.vnode_for_bucket(owner, name)).pool
        if state == "down":
            pool.down_since = time.monotonic()  # as ShardPool.lost marks it
        else:
            pool.commits_hang_since = time.monotonic()  # as the commit probe marks it
        try:
            with pytest.raises(MetadataUnavailable):
                run(store.buckets.create(owner, name))
        finally:
            pool.down_since = pool.commits_hang_since = None
        assert name not in {d.name for d in run(store.claims.read_once()).differences}
        run(store.buckets.create(owner, name))  # and the name is free for it afterwards


def test_a_delete_refused_while_the_catalog_does_not_commit_keeps_the_bucket(
    make_store: MakeStore, run: Any
) -> None:
    """A DeleteBucket's last step releases the name on the catalog: while the catalog's
    commits hang it is refused before its first, not done half (the row gone, the name
    still claimed)."""
    store = make_store(shards=2, vnodes=8)
    owner = run(store.accounts.create(unique("owner"))).id
    catalog = store.shards.catalog.pool
    name = unique("kept")
    while store.shards.of_vnode(store.shards.ring.vnode_for_bucket(owner, name)).pool is catalog:
        name = unique("kept")  # a bucket whose row is on the shard that commits
    bucket = run(store.buckets.create(owner, name))
    catalog.commits_hang_since = time.monotonic()  # as the commit probe marks it
    try:
        with pytest.raises(MetadataUnavailable):
            run(store.buckets.delete(owner, name))
    finally:
        catalog.commits_hang_since = None
    store.buckets.forget_bucket(owner, name)
    assert run(store.buckets.get(owner, name)).id == bucket.id
    assert name not in {d.name for d in run(store.claims.read_once()).differences}
    run(store.buckets.delete(owner, name))


def test_the_command_reports_repairs_and_exits_by_what_remains(
    admin_dsn: str, run: Any, tmp_path: Path
) -> None:
    shards = create_databases(admin_dsn, 2)
    config = tmp_path / "shoal.toml"
    config.write_text(
        "[metadata]\nvnodes = 4\n"
        + "".join(f'[[metadata.shards]]\nname = "{s.name}"\ndsn = "{s.dsn}"\n' for s in shards)
    )
    run(migrate(shards, MetadataConfig(vnodes=4, partitions_ahead=1)))

    async def one_unclaimed_bucket() -> str:
        async with await MetadataStore.open(shards, 2, poll_ring=False) as store:
            owner = (await store.accounts.create(unique("owner"))).id
            name = unique("unclaimed")
            await store.buckets.create(owner, name)
            await store.buckets.create(owner, unique("fine"))
            await _on_catalog(store, DROP_CLAIM, name)
            return name

    clean = _shoal("db", "check", "--config", str(config))
    assert clean.returncode == 0 and "0 difference(s)" in clean.stdout, clean
    name = run(one_unclaimed_bucket())
    found = _shoal("db", "check", "--config", str(config))
    assert found.returncode == 1, found
    assert f"unclaimed bucket: {name} of owner" in found.stdout
    assert "`shoal db check --repair`" in found.stdout
    report = json.loads(_shoal("db", "check", "--json", "--config", str(config)).stdout)
    assert [(d["kind"], d["name"], d["repair"]) for d in report["differences"]] == [
        (UNCLAIMED_BUCKET, name, None)
    ]
    repaired = _shoal("db", "check", "--repair", "--config", str(config))
    assert repaired.returncode == 0 and f"{name} of owner" in repaired.stdout, repaired
    assert "[repaired]" in repaired.stdout
    after = _shoal("db", "check", "--config", str(config))
    assert after.returncode == 0 and "0 difference(s)" in after.stdout, after
    # What --repair leaves alone keeps the exit at 1.
    with psycopg.connect(shards[0].dsn, autocommit=True) as catalog:
        catalog.execute("UPDATE shoal.bucket_name SET owner = %s", (uuid.uuid4(),))
    left = _shoal("db", "check", "--repair", "--config", str(config))
    assert left.returncode == 1 and "name held by another" in left.stdout, left
    assert "[not repaired]" in left.stdout


def _inline(data: bytes) -> ObjectWrite:
    return ObjectWrite(content_length=len(data), content_md5=hashlib.md5(data).digest(), data=data)


async def _on_catalog(store: MetadataStore, statement: str, *values: Any) -> None:
    async with store.shards.catalog.pool.connection() as conn:
        await conn.execute(statement, values)  # type: ignore[arg-type]


async def _on_vnode_of(
    store: MetadataStore, owner: uuid.UUID, name: str, statement: str, *values: Any
) -> None:
    vnode = store.shards.ring.vnode_for_bucket(owner, name)
    async with store.shards.of_vnode(vnode).pool.connection() as conn:
        await conn.execute(statement.format(schema=vnode_schema(vnode)), values)  # type: ignore[arg-type]


def _shoal(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SHOAL, *args], capture_output=True, text=True, timeout=120)
