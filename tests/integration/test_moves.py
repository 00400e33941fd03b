"""A shard joins and a vnode moves to it and back, while stores that knew the old ring follow."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from shoal.config import MetadataConfig, ShardConfig
from shoal.metadata import (
    MetadataStore,
    ObjectNotFound,
    ObjectWrite,
    Ring,
    SchemaError,
    migrate,
    moves,
    shards,
)
from shoal.metadata.moves import MoveError, Mover, add_shard, plan_rebalance
from tests.fixtures.postgres import close_later, create_databases, unique

Run = Callable[[Awaitable[Any]], Any]
SHOAL = str(Path(sys.executable).parent / "shoal")
VNODES = 4


@pytest.fixture(scope="module")
def cluster(admin_dsn: str, run: Run) -> tuple[list[ShardConfig], bytes]:
    """Shards s0 and s1 in the ring, s2 added by `add_shard` (no vnodes yet)."""
    configs = create_databases(admin_dsn, 3)
    config = MetadataConfig(vnodes=VNODES, partitions_ahead=1)
    run(migrate(configs[:2], config))
    key = secrets.token_bytes(32)
    run(add_shard(configs[0], configs[2], key, config))
    return configs, key


def _open(configs: list[ShardConfig], key: bytes, run: Run) -> MetadataStore:
    store = run(MetadataStore.open(configs[:2], 4, shard_key=key))
    close_later(lambda: run(store.close()))
    return store


def _mover(configs: list[ShardConfig]) -> Mover:
    return Mover(configs, MetadataConfig(vnodes=VNODES, partitions_ahead=1), grace=timedelta(0))


async def _ring_note(catalog: str, reader: str, wait: float = 10.0) -> list[tuple[int]]:
    """The ring version `reader` noted in the catalog, waiting up to `wait` seconds for a
    note: a store's ring poller writes its first one in a task of its own as it opens."""
    deadline = time.monotonic() + wait
    while True:
        with psycopg.connect(catalog, autocommit=True) as conn:
            sql = "SELECT ring_version FROM shoal.ring_reader WHERE process = %s"
            noted: list[tuple[int]] = conn.execute(sql, (reader,)).fetchall()
        if noted or time.monotonic() >= deadline:
            return noted
        await asyncio.sleep(0.1)


def _leftovers(dsn: str) -> list[str]:
    """Replication objects a move may have left on a shard's server or database."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT 'slot ' || slot_name FROM pg_replication_slots WHERE slot_name LIKE 'shoal%%'"
            " OR slot_name LIKE 'pg\\_%%\\_sync\\_%%'"
            " UNION ALL SELECT 'publication ' || pubname FROM pg_publication"
            " UNION ALL SELECT 'subscription ' || subname FROM pg_subscription"
        ).fetchall()
    return [row[0] for row in rows]


def test_a_vnode_moves_to_an_added_shard_and_back(
    cluster: tuple[list[ShardConfig], bytes], run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    configs, key = cluster
    monkeypatch.setattr(shards, "RING_POLL_SECONDS", 3600.0)  # only refusals make it follow
    fresh = _open(configs, key, run)
    stale = _open(configs, key, run)
    stale_lister = _open(configs, key, run)  # its first read after the move is a '/' listing

    async def scenario() -> None:
        account = await fresh.accounts.create(unique("mover"))
        owner = account.id
        bucket = unique("moving")
        found = await fresh.buckets.create(owner, bucket)
        names = [f"key-{i:03d}" for i in range(120)]
        for i, name in enumerate(names):
            await fresh.objects.put(owner, bucket, name, ObjectWrite(i, b"m" * 16))
        for name in names[:10]:
            await fresh.objects.delete(owner, bucket, name)
        for name in names[10:20]:
            await fresh.objects.put(owner, bucket, name, ObjectWrite(1000, b"o" * 16))
        ring = fresh.ring
        moved = ring.vnode_for_object(owner, found.id, names[50])
        in_moved = [n for n in names if ring.vnode_for_object(owner, found.id, n) == moved]
        # The stale store prepares its statements on the vnode's first shard.
        for name in names[10:]:
            await stale.objects.get(owner, bucket, name)
        source = ring.shard_of(moved)
        # '/' directories, some on the moved vnode: their directory rows move with it.
        in_dirs = [f"tree/d{i}/k" for i in range(400)]
        in_dirs = [n for n in in_dirs if ring.vnode_for_object(owner, found.id, n) == moved][:3]
        in_dirs += ["tree/other/k", "tree/other2/k"]
        for name in in_dirs:
            await fresh.objects.put(owner, bucket, name, ObjectWrite(1, b"t" * 16))

        async with _mover(configs) as mover:
            assert await mover.recover() == []
            result = await mover.move(moved, "s2")
        assert result is not None and result.source == source and result.target == "s2"
        assert result.ring_version == ring.version + 1
        assert result.write_pause_seconds < 5.0
        for config in configs:
            assert _leftovers(config.dsn) == []

        # Written through the new ring; the stale store must see it, not its old copy.
        await fresh.objects.put(owner, bucket, in_moved[-1], ObjectWrite(7777, b"n" * 16))
        got = await stale.objects.get(owner, bucket, in_moved[-1])
        assert got.content_length == 7777
        assert stale.ring.version == result.ring_version
        assert stale.shards.of_vnode(moved).name == "s2"
        for i, name in enumerate(names):
            if i < 10:
                with pytest.raises(ObjectNotFound):
                    await stale.objects.get(owner, bucket, name)
                continue
            want = 1000 if i < 20 else (7777 if name == in_moved[-1] else i)
            assert (await stale.objects.get(owner, bucket, name)).content_length == want
        page = await stale.objects.list(owner, bucket, prefix="key-", limit=1000)
        assert [o.name for o in page.objects] == names[10:]
        page = await stale.objects.list(owner, bucket, prefix="tree/", delimiter="/")
        assert page.common_prefixes == sorted(name[: -len("k")] for name in in_dirs)
        # The directory rows of the moved vnode came with it, and follow its writes there: a
        # process whose ring is older than the move follows it when it lists.
        gone, *kept = in_dirs
        await fresh.objects.delete(owner, bucket, gone)
        added = next(
            n
            for n in (f"tree/new{i}/k" for i in range(400))
            if fresh.ring.vnode_for_object(owner, found.id, n) == moved
        )
        await fresh.objects.put(owner, bucket, added, ObjectWrite(1, b"t" * 16))
        assert stale_lister.ring.version == ring.version
        page = await stale_lister.objects.list(owner, bucket, prefix="tree/", delimiter="/")
        assert page.common_prefixes == sorted(n[: -len("k")] for n in [*kept, added])
        assert stale_lister.ring.version == result.ring_version
        in_dirs = [*kept, added]

        # Back again: refused while s(source) holds the old copy, then after `finish`.
        async with _mover(configs) as mover:
            with pytest.raises(MoveError, match="grace period"):
                await mover.move(moved, source)
            assert len(await mover.finish(now=True)) == 1
            back = await mover.move(moved, source)
            assert back is not None and back.target == source
            # These poll no more: they note a ring version only when they follow one.
            for store in (fresh, stale, stale_lister):
                await store.shards.follow_ring()
            said = await mover.finish(now=True)
            assert len(said) == 1 and "dropped" in said[0], said
        # Each copy dropped took its directory rows with it: only the source's are left.
        for config in configs:
            with psycopg.connect(config.dsn) as conn:
                held = conn.execute(
                    "SELECT count(*) FROM shoal.bucket_directory WHERE vnode = %s", [moved]
                ).fetchone()
            assert (held is not None and held[0] > 0) == (config.name == source), config.name
        page = await fresh.objects.list(owner, bucket, prefix="key-", limit=1000)
        assert [o.name for o in page.objects] == names[10:]
        assert (await fresh.objects.get(owner, bucket, in_moved[-1])).content_length == 7777
        page = await fresh.objects.list(owner, bucket, prefix="tree/", delimiter="/")
        assert page.common_prefixes == sorted(name[: -len("k")] for name in in_dirs)

    run(scenario())


def test_only_one_mover_at_a_time(cluster: tuple[list[ShardConfig], bytes], run: Run) -> None:
    configs, _ = cluster

    async def twice() -> None:
        async with _mover(configs):
            with pytest.raises(MoveError, match="another"):
                async with _mover(configs):
                    pass

    run(twice())


def test_a_move_names_a_known_shard_and_vnode(
    cluster: tuple[list[ShardConfig], bytes], run: Run
) -> None:
    configs, _ = cluster

    async def wrong() -> None:
        async with _mover(configs) as mover:
            with pytest.raises(MoveError, match="unknown shard"):
                await mover.move(0, "nowhere")
            with pytest.raises(MoveError, match="vnodes 0 to"):
                await mover.move(VNODES, "s2")

    run(wrong())


@pytest.mark.parametrize(
    ("assignment", "shard_names", "counts"),
    [
        (("a",) * 8, ["a", "b"], {"a": 4, "b": 4}),
        (("a", "b") * 6, ["a", "b", "c"], {"a": 4, "b": 4, "c": 4}),
        (("a", "b", "c") * 3 + ("a",), ["a", "b", "c"], {"a": 4, "b": 3, "c": 3}),
        (("a", "b") * 4, ["a"], {"a": 8}),
    ],
)
def test_rebalance_evens_out_vnodes(
    assignment: tuple[str, ...], shard_names: list[str], counts: dict[str, int]
) -> None:
    ring = Ring(version=1, assignment=assignment)
    placed = list(assignment)
    plan = plan_rebalance(ring, shard_names)
    for vnode, target in plan:
        assert placed[vnode] != target
        placed[vnode] = target
    assert {name: placed.count(name) for name in set(placed)} == counts
    moved = {vnode for vnode, _ in plan}
    assert len(moved) == len(plan)  # each vnode moves at most once


def test_a_stale_owner_refuses_prepared_statements(admin_dsn: str) -> None:
    """What the move relies on: after its schema is renamed, a statement prepared before on
    the same connection (a point read, a UNION ALL over vnodes) fails; it is never run
    against the renamed copy."""
    (config,) = create_databases(admin_dsn, 1)
    schema = f"manta_bucket_{uuid.uuid4().hex[:6]}"
    with (
        psycopg.connect(config.dsn, autocommit=True) as conn,
        psycopg.connect(config.dsn, autocommit=True) as other,
    ):
        conn.execute(f"CREATE SCHEMA {schema}; CREATE TABLE {schema}.t (k int PRIMARY KEY)")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE one(int) AS SELECT k FROM {schema}.t WHERE k = $1")
        conn.execute(f"PREPARE arms AS SELECT k FROM {schema}.t UNION ALL SELECT 1")
        conn.execute("EXECUTE one(1)")
        conn.execute("EXECUTE arms")
        with other.transaction():
            other.execute(f"LOCK TABLE {schema}.t IN ACCESS EXCLUSIVE MODE")
            other.execute(f"ALTER SCHEMA {schema} RENAME TO moved_{schema}")
        for statement in ("EXECUTE one(1)", "EXECUTE arms"):
            with pytest.raises(psycopg.errors.UndefinedTable):
                conn.execute(statement)


def test_the_ring_commands(admin_dsn: str, tmp_path: Path) -> None:
    """`shoal shard add`, `ring rebalance`, `ring status`, and a wrong move as one line."""
    first, second, third = create_databases(admin_dsn, 3)
    config = tmp_path / "shoal.toml"
    config.write_text(
        f'data_dir = "{tmp_path / "data"}"\n\n[metadata]\nvnodes = {VNODES}\n\n'
        f'[[metadata.shards]]\nname = "s0"\ndsn = "{first.dsn}"\n\n'
        f'[[metadata.shards]]\nname = "s1"\ndsn = "{second.dsn}"\n'
    )
    where = ("--config", str(config))
    _shoal("db", "migrate", *where)
    unreadable = _shoal("shard", "add", "s2", "host=db password=top secret", *where, check=False)
    assert unreadable.returncode == 1 and "secret" not in unreadable.stderr
    assert unreadable.stderr == (
        "shoal: error: shard s2: the dsn is not a connection string libpq reads\n"
    )
    _shoal("shard", "add", "s2", third.dsn, *where)
    rebalanced = _shoal("ring", "rebalance", "--grace", "0", *where).stdout
    assert rebalanced.count(" -> s2, ring version") == 1, rebalanced
    # The old copy stays for its grace period, and the command says so.
    assert "old copies kept for the grace period" in rebalanced, rebalanced
    status = json.loads(_shoal("ring", "status", "--json", *where).stdout)
    counts = sorted(len(shard["vnodes"]) for shard in status["shards"])
    assert counts == [1, 1, 2] and status["ring"]["version"] == 2, status
    assert status["moves"][0]["step"] == "switched"
    wrong = _shoal("ring", "move", "0", "--to", "nowhere", *where, check=False)
    assert wrong.returncode == 1
    assert wrong.stderr == "shoal: error: unknown shard 'nowhere': add it with `shoal shard add`\n"

    # Taking s2 out again: drain it, wait out the old copies' grace, forget it.
    held = _shoal("shard", "remove", "s2", *where, check=False)
    assert held.returncode == 1 and held.stderr.count("\n") == 1, held.stderr
    assert "holds 1 vnode(s)" in held.stderr and "shoal shard drain s2" in held.stderr
    _finish_moves(where)  # a vnode cannot go back where its old copy still is
    drained = _shoal("shard", "drain", "s2", "--grace", "0", *where).stdout
    assert drained.count("s2 -> ") == 1, drained
    status = json.loads(_shoal("ring", "status", "--json", *where).stdout)
    assert sorted(len(shard["vnodes"]) for shard in status["shards"]) == [0, 2, 2], status
    catalog = _shoal("shard", "remove", "s0", *where, check=False)
    assert catalog.returncode == 1 and "holds the catalog" in catalog.stderr
    configured = _shoal("shard", "remove", "s1", *where, check=False)
    assert configured.returncode == 1 and "holds 2 vnode(s)" in configured.stderr
    refused = _shoal("shard", "remove", "s2", *where, check=False)
    assert refused.returncode == 1 and "is not over (switched)" in refused.stderr, refused.stderr
    _finish_moves(where)
    removed = _shoal("shard", "remove", "s2", *where)
    assert removed.stdout.endswith("removed shard s2; its database is yours to drop\n")
    status = json.loads(_shoal("ring", "status", "--json", *where).stdout)
    assert sorted(shard["name"] for shard in status["shards"]) == ["s0", "s1"], status
    assert _shoal("db", "status", *where).returncode == 0


def _finish_moves(where: tuple[str, ...]) -> None:
    """Until every moved vnode's old copy is dropped: each goes once its grace period (at
    least moves.MIN_GRACE) is over (deadline 60 s)."""
    deadline = time.monotonic() + 60
    while True:
        _shoal("ring", "move", "--finish", "--grace", "0", *where)
        moves = json.loads(_shoal("ring", "status", "--json", *where).stdout)["moves"]
        if all(move["step"] != "switched" for move in moves):
            return
        assert time.monotonic() < deadline, moves
        time.sleep(0.5)


def _shoal(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([SHOAL, *args], capture_output=True, text=True, timeout=120)
    assert not check or done.returncode == 0, (args, done.stdout, done.stderr)
    return done


def test_an_added_shard_needs_the_key_that_sealed_its_dsn(
    cluster: tuple[list[ShardConfig], bytes], run: Run
) -> None:
    configs, key = cluster

    async def with_other_key() -> None:
        async with await MetadataStore.open(configs[:2], 2, shard_key=secrets.token_bytes(32)):
            pass

    # The ring names s2 only once a vnode moved there: force a read of the added shards.
    async def unsealed(with_key: bytes) -> list[ShardConfig]:
        async with await psycopg.AsyncConnection.connect(configs[0].dsn) as conn:
            return await shards.added_shards(conn, with_key)

    assert [s.name for s in run(unsealed(key))] == ["s2"]
    with pytest.raises(SchemaError, match="credentials key"):
        run(unsealed(secrets.token_bytes(32)))
    run(with_other_key())  # s2 holds no vnode now: nothing to open


def test_a_pipeline_read_follows_a_vnode_that_moved_after_its_snapshot(
    cluster: tuple[list[ShardConfig], bytes], run: Run
) -> None:
    from shoal.pipeline import io

    configs, key = cluster
    store = _open(configs, key, run)

    async def objects() -> tuple[uuid.UUID, uuid.UUID, list[str]]:
        account = await store.accounts.create(unique("reader"))
        found = await store.buckets.create(account.id, unique("read"))
        names = [f"r-{i:02d}" for i in range(24)]
        for name in names:
            await store.objects.put(account.id, found.name, name, ObjectWrite(5, b"r" * 16))
        return account.id, found.id, names

    owner, bucket_id, names = run(objects())
    ring = store.ring
    moved = ring.vnode_for_object(owner, bucket_id, names[0])
    query = io.LIVE_OBJECTS.replace("{columns}", io.OBJECT_COLUMNS)
    every = tuple((c.name, c.dsn) for c in configs)
    dsns = dict(every)
    with io.exported_snapshots(configs[:2]) as snapshots:
        tasks = [
            io.ReadTask(
                ring.shard_of(v),
                dsns[ring.shard_of(v)],
                snapshots[ring.shard_of(v)],
                v,
                query,
                every,
            )
            for v in range(ring.vnodes)
        ]

        async def move() -> None:
            async with _mover(configs) as mover:
                assert await mover.move(moved, "s2") is not None

        run(move())
        rows = [row for batch in io.read_batches(tasks) for row in batch.to_pylist()]
    mine = [row for row in rows if row["bucket_id"] == str(bucket_id)]
    assert sorted(row["name"] for row in mine) == names
    assert {row["shard"] for row in mine if row["vnode"] == moved} == {"s2"}


def test_a_move_waits_for_the_gc_batch_in_flight_on_its_vnode(admin_dsn: str, run: Run) -> None:
    """A GC worker holds a claimed batch of the vnode's deletion records (its blocks being
    deleted): the mover waits for it before copying, and the records the worker removed are
    gone on the new shard too, the others there exactly once. On shards of its own: what
    earlier moves left (an old copy in its grace) would refuse the move."""
    home, spare, key = _home_and_spare(admin_dsn, run)
    store = run(MetadataStore.open([home], 4, shard_key=key))
    close_later(lambda: run(store.close()))

    async def scenario() -> None:
        owner = (await store.accounts.create(unique("gcmove"))).id
        found = await store.buckets.create(owner, unique("gcmove"))
        ring = store.ring
        vnode = ring.vnode_for_object(owner, found.id, "k-0")
        names = [f"k-{i}" for i in range(200)]
        names = [n for n in names if ring.vnode_for_object(owner, found.id, n) == vnode][:6]
        for name in names:
            for size in (1, 2):  # the second replaces the first: one deletion record each
                write = ObjectWrite(size, b"g" * 16, sharks=["dc0:n1"])
                await store.objects.put(owner, found.name, name, write)
        claim = store.garbage.claim_deleted_objects(vnode, timedelta(0))
        batch = await claim.__aenter__()
        released = False
        try:
            mine = [r for r in batch.records if r.bucket_id == found.id]
            assert len(mine) == len(names)
            async with _mover([home, spare]) as mover:
                moving = asyncio.create_task(mover.move(vnode, spare.name))
                try:
                    await _until_the_mover_waits(home.dsn, moving)
                    await batch.remove(mine[:2])
                    await claim.__aexit__(None, None, None)
                    released = True
                    result = await moving
                finally:
                    if not moving.done():
                        moving.cancel()
                        await asyncio.gather(moving, return_exceptions=True)
                assert result is not None and result.target == spare.name
                await mover.finish(now=True)
        finally:
            if not released:  # its transaction would hold up every later move of the server
                await claim.__aexit__(None, None, None)
        with psycopg.connect(spare.dsn, autocommit=True) as conn:
            rows = conn.execute(
                f"SELECT id FROM manta_bucket_{vnode}.manta_bucket_deleted_object"
                " WHERE bucket_id = %s",
                (found.id,),
            ).fetchall()
        assert sorted(r[0] for r in rows) == sorted(r.id for r in mine[2:])

    run(scenario())


def test_directory_rows_follow_writes_streamed_to_the_new_shard(
    admin_dsn: str, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Names written and deleted on the source after the vnode's copy synced reach the new
    shard by replication's stream, whose apply runs the vnode's directory triggers: after the
    switch its rows there are exactly those of the vnode's names."""
    home, spare, key = _home_and_spare(admin_dsn, run)
    store = run(MetadataStore.open([home], 4, shard_key=key))
    close_later(lambda: run(store.close()))

    async def scenario() -> None:
        owner = (await store.accounts.create(unique("dirmove"))).id
        found = await store.buckets.create(owner, unique("dirmove"))
        vnode = store.ring.vnode_for_object(owner, found.id, "a/k0")

        def on_vnode(pattern: str, count: int) -> list[str]:
            names = (pattern.format(i) for i in range(1000))
            return [n for n in names if store.ring.vnode_for_object(owner, found.id, n) == vnode][
                :count
            ]

        emptied, kept = on_vnode("gone/{}/k", 1), on_vnode("kept/k{}", 2)
        added = on_vnode("new/{}/k", 1)
        for name in emptied + kept:
            await store.objects.put(owner, found.name, name, ObjectWrite(1, b"d" * 16))
        synced = Mover._wait_synced

        async def then_write(mover: Mover, move: Any, timeout: float = 3600.0) -> None:
            await synced(mover, move, timeout)
            await store.objects.delete(owner, found.name, emptied[0])
            await store.objects.delete(owner, found.name, kept[0])
            await store.objects.put(owner, found.name, added[0], ObjectWrite(1, b"d" * 16))

        monkeypatch.setattr(Mover, "_wait_synced", then_write)
        async with _mover([home, spare]) as mover:
            result = await mover.move(vnode, spare.name)
            assert result is not None and result.target == spare.name
            await mover.finish(now=True)
        page = await store.objects.list(owner, found.name, delimiter="/")
        assert page.common_prefixes == ["kept/", "new/"]
        with psycopg.connect(spare.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT parent, segment FROM shoal.bucket_directory"
                " WHERE bucket_id = %s AND vnode = %s",
                (found.id, vnode),
            ).fetchall()
        added_dir = added[0][: -len("k")]
        assert sorted(rows) == sorted(
            [("", "kept/"), ("kept/", ""), ("", "new/"), ("new/", added_dir[4:]), (added_dir, "")]
        )

    run(scenario())


def test_a_move_gives_up_on_a_transaction_left_open_on_its_server(
    cluster: tuple[list[ShardConfig], bytes], run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy's replication slot waits for every writing transaction of the source's server:
    one left open costs the move SLOT_WAIT and a roll-back, never a hang."""
    monkeypatch.setattr(moves, "SLOT_WAIT", "1s")
    configs, key = cluster
    ring = _open(configs, key, run).ring
    source = ring.shard_of(0)
    target = next(c.name for c in configs if c.name != source)

    async def attempt() -> None:
        async with _mover(configs) as mover:
            await mover.finish(now=True)
            with pytest.raises(MoveError, match="stayed open for 1s"):
                await mover.move(0, target)

    with psycopg.connect(configs[0].dsn) as open_transaction:
        open_transaction.execute("SELECT txid_current()")  # it writes: it has an id
        run(attempt())
        open_transaction.rollback()
    assert _open(configs, key, run).ring.shard_of(0) == source
    for config in configs:
        assert _leftovers(config.dsn) == []


def test_readiness_asks_only_the_shards_that_hold_vnodes(admin_dsn: str, run: Run) -> None:
    """A shard that holds no vnode (added and unused, or drained for removal) may be stopped:
    the store's readiness ping leaves it out, and counts it again once a vnode is on it."""
    home, spare, key = _home_and_spare(admin_dsn, run)
    config = MetadataConfig(vnodes=VNODES, partitions_ahead=1)
    store = run(MetadataStore.open([home], 4, shard_key=key))
    close_later(lambda: run(store.close()))

    async def move(vnode: int, target: str) -> None:
        # The old copy of the move before is dropped here, after the store below loaded the
        # ring that moved it; dropped right after its move, it would wait for the store
        # first (moves.READERS_WAIT_SECONDS).
        async with Mover([home, spare], config, grace=timedelta(0)) as mover:
            await mover.finish(now=True)
            assert await mover.move(vnode, target) is not None
        await store.shards.follow_ring(5.0)

    run(move(0, spare.name))  # the store opens the spare's pool when the ring names it
    assert store.shards.of_vnode(0).name == spare.name
    run(move(0, home.name))
    with _refusing_connections(admin_dsn, spare):
        assert run(store.silent_shards(2.0)) == []
    run(move(1, spare.name))
    with _refusing_connections(admin_dsn, spare):
        assert run(store.silent_shards(2.0)) == [spare.name]
    run(move(1, home.name))


@contextlib.contextmanager
def _refusing_connections(admin_dsn: str, shard: ShardConfig) -> Iterator[None]:
    """The shard's database refuses new connections and has none open: as if stopped."""
    database = psycopg.conninfo.conninfo_to_dict(shard.dsn)["dbname"]
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(sql.Identifier(database))
        )
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            (database,),
        )
        try:
            yield
        finally:
            admin.execute(
                sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(sql.Identifier(database))
            )


def _home_and_spare(admin_dsn: str, run: Run) -> tuple[ShardConfig, ShardConfig, bytes]:
    """Two new shards: `home` with every vnode, `spare` added by `add_shard` (no vnode)."""
    home, spare = create_databases(admin_dsn, 2)
    config = MetadataConfig(vnodes=VNODES, partitions_ahead=1)
    run(migrate([home], config))
    key = secrets.token_bytes(32)
    run(add_shard(home, spare, key, config))
    return home, spare, key


async def _until_the_mover_waits(dsn: str, moving: asyncio.Task[Any]) -> None:
    """Until a session waits for a vnode's move lock on this shard (deadline 20 s)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if moving.done():
            raise AssertionError(f"the move ended before it waited: {moving.exception()}")
        with psycopg.connect(dsn, autocommit=True) as conn:
            waiting = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                " AND classid = 5456035 AND database = (SELECT oid FROM pg_database"
                " WHERE datname = current_database())"
            ).fetchone()
        if waiting and waiting[0]:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the mover never waited for the vnode's move lock")


def test_a_pipeline_read_holds_no_lock_on_the_vnodes_it_has_read(
    cluster: tuple[list[ShardConfig], bytes], run: Run
) -> None:
    """A Spark task reading several vnodes of a shard: once it reads the next vnode, a move
    of the one it read fences at once (its read's locks went with its transaction)."""
    from shoal.pipeline import io

    configs, key = cluster
    store = _open(configs, key, run)

    async def objects() -> tuple[uuid.UUID, uuid.UUID, list[str]]:
        account = await store.accounts.create(unique("locks"))
        found = await store.buckets.create(account.id, unique("locks"))
        names = [f"l-{i:02d}" for i in range(40)]
        for name in names:
            await store.objects.put(account.id, found.name, name, ObjectWrite(5, b"l" * 16))
        return account.id, found.id, names

    owner, bucket_id, names = run(objects())
    ring = store.ring
    by_shard: dict[str, list[int]] = {}
    for vnode in sorted({ring.vnode_for_object(owner, bucket_id, n) for n in names}):
        by_shard.setdefault(ring.shard_of(vnode), []).append(vnode)
    source, (first, second, *_) = next((s, v) for s, v in by_shard.items() if len(v) > 1)
    target = next(c.name for c in configs if c.name != source)
    query = io.LIVE_OBJECTS.replace("{columns}", io.OBJECT_COLUMNS)
    every = tuple((c.name, c.dsn) for c in configs)
    with io.exported_snapshots(configs) as snapshots:
        tasks = [
            io.ReadTask(source, dict(every)[source], snapshots[source], v, query, every)
            for v in (first, second)
        ]
        batches = io.read_batches(tasks)
        read: list[dict[str, Any]] = []
        for batch in batches:  # until the read is on the second vnode
            read += batch.to_pylist()
            if read and read[-1]["vnode"] == second:
                break

        async def move() -> None:
            async with _mover(configs) as mover:
                await mover.finish(now=True)
                assert await mover.move(first, target) is not None

        run(move())
        read += [row for batch in batches for row in batch.to_pylist()]
    mine = sorted(row["name"] for row in read if row["bucket_id"] == str(bucket_id))
    assert mine == sorted(
        n for n in names if ring.vnode_for_object(owner, bucket_id, n) in (first, second)
    )


def test_an_old_copy_stays_while_a_live_process_uses_an_older_ring(
    cluster: tuple[list[ShardConfig], bytes], run: Run
) -> None:
    """Every process that follows the ring notes the version it loaded; a moved vnode's old
    copy is dropped only once every process noted lately has the move's version (and the
    vnode cannot move back before). A process not noted lately counts as gone."""
    configs, key = cluster
    store = _open(configs, key, run)
    catalog = configs[0].dsn

    def note_behind(seen: str, version: int = 0) -> None:
        """A process that still uses ring `version`, last heard of at `seen`."""
        with psycopg.connect(catalog, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO shoal.ring_reader (process, ring_version, seen)"
                " VALUES ('behind', %s, " + seen + ") ON CONFLICT (process) DO UPDATE"
                " SET seen = excluded.seen, ring_version = excluded.ring_version",
                (version,),
            )

    async def scenario() -> None:
        await store.shards.follow_ring()
        assert await _ring_note(catalog, store.shards.reader) == [(store.ring.version,)]
        vnode = 1
        source = store.ring.shard_of(vnode)
        target = next(c.name for c in configs if c.name != source)
        async with _mover(configs) as mover:
            await mover.finish(now=True)  # earlier tests' old copies
            result = await mover.move(vnode, target)
            assert result is not None
            note_behind("current_timestamp", result.ring_version - 1)
            said = [line for line in await mover.finish(now=True) if f"vnode {vnode}:" in line]
            assert len(said) == 1 and "stays" in said[0] and "(behind" in said[0], said
            with pytest.raises(MoveError, match="grace period"):
                await mover.move(vnode, source)
            note_behind("current_timestamp - interval '1 minute'")  # gone since
            said = [line for line in await mover.finish(now=True) if f"vnode {vnode}:" in line]
            assert len(said) == 1 and "dropped" in said[0], said
            assert await mover.move(vnode, source) is not None
            await mover.finish(now=True)

    run(scenario())


def test_a_store_closed_cleanly_holds_up_no_move(
    cluster: tuple[list[ShardConfig], bytes], run: Run
) -> None:
    """A store that closes removes its ring note: a stopped gateway is not a process behind,
    and `ring move --finish` drops the old copies of moves made after it stopped."""
    configs, key = cluster
    catalog = configs[0].dsn

    async def scenario() -> None:
        closed = await MetadataStore.open(configs[:2], 4, shard_key=key)
        reader, version = closed.shards.reader, closed.ring.version
        assert await _ring_note(catalog, reader) == [(version,)]
        await closed.close()
        assert await _ring_note(catalog, reader, wait=0) == []
        vnode = 2
        source = closed.ring.shard_of(vnode)
        target = next(c.name for c in configs if c.name != source)
        async with _mover(configs) as mover:
            await mover.finish(now=True)  # earlier tests' old copies
            assert await mover.move(vnode, target) is not None
            said = [line for line in await mover.finish(now=True) if f"vnode {vnode}:" in line]
            assert len(said) == 1 and "dropped" in said[0], said
            assert await mover.move(vnode, source) is not None
            await mover.finish(now=True)

    run(scenario())


def test_gc_removals_follow_a_vnode_that_moved_after_they_were_read(
    cluster: tuple[list[ShardConfig], bytes], run: Run
) -> None:
    """The Spark gc's executors stage the records they reclaimed on the shard they read them
    from; if the vnode moved meanwhile, its records are removed on the shard holding it now,
    never left for a rerun."""
    from shoal.pipeline import io

    configs, key = cluster
    store = _open(configs, key, run)
    dsns = {c.name: c.dsn for c in configs}

    async def replaced() -> tuple[uuid.UUID, int]:
        owner = (await store.accounts.create(unique("gcfollow"))).id
        found = await store.buckets.create(owner, unique("gcfollow"))
        vnode = store.ring.vnode_for_object(owner, found.id, "k-0")
        names = [f"k-{i}" for i in range(200)]
        names = [n for n in names if store.ring.vnode_for_object(owner, found.id, n) == vnode]
        for name in names[:5]:
            for size in (1, 2):  # the second replaces the first: one deletion record each
                write = ObjectWrite(size, b"f" * 16, sharks=["dc0:n1"])
                await store.objects.put(owner, found.name, name, write)
        return found.id, vnode

    def records(shard: str, vnode: int, bucket_id: uuid.UUID) -> list[tuple[int, str, str]]:
        with psycopg.connect(dsns[shard], autocommit=True) as conn:
            rows = conn.execute(
                "SELECT c.relname, d.id::text"
                f" FROM manta_bucket_{vnode}.manta_bucket_deleted_object d"
                " JOIN pg_class c ON c.oid = d.tableoid WHERE d.bucket_id = %s",
                (bucket_id,),
            ).fetchall()
        return [(vnode, window, id_) for window, id_ in rows]

    bucket_id, vnode = run(replaced())
    source = store.ring.shard_of(vnode)
    target = next(c.name for c in configs if c.name != source)
    staged = records(source, vnode, bucket_id)
    assert len(staged) == 5
    remover = io.Remover(dsns)
    try:
        remover.records(source, staged)

        async def move() -> None:
            async with _mover(configs) as mover:
                await mover.finish(now=True)  # earlier tests' old copies
                assert await mover.move(vnode, target) is not None

        run(move())
        _, to_vacuum = remover.finish()
    finally:
        remover.close()
    assert remover.removed == 5
    assert records(target, vnode, bucket_id) == []
    assert {shard for shard, _, _ in to_vacuum} <= {target}
