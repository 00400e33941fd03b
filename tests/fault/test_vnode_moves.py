"""Vnodes move between shards under a real `shoal serve` and a bounded S3 load: to a new
shard and back, and with the mover killed (SIGKILL) at each of its steps and run again.

Garbage collection runs all along (`shoal gc run` with a short leeway, one run after
another), so GC passes meet every step of the moves.

What must hold afterwards: every acknowledged write reads back with its bytes, no deleted
object comes back, each replaced version has exactly one deletion record (reclaimed or
not), listings during the moves neither skip nor repeat a key, and the clients saw no error
but 503s."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import botocore.exceptions
import psycopg
import pytest

from shoal.metadata.embedded import EmbeddedPostgres
from shoal.metadata.moves import FAULT_ENV, FAULT_STEPS, MIN_GRACE
from tests.fault.load import MixedLoad, iter_failures, statuses
from tests.fault.serving import block_versions, named_versions, own_serve
from tests.fixtures.serve import SHOAL, Served

pytestmark = pytest.mark.slow

VNODES = 12
# GC runs as `shoal gc run` passes one after another (the daemon's interval counts in
# minutes); records older than GC_LEEWAY are reclaimed while the vnodes move.
CONFIG = f"[s3]\nworkers = 2\n\n[gc]\nenabled = false\n\n[metadata]\nvnodes = {VNODES}\n"
GC_LEEWAY = "3s"
STATIC_KEYS = [f"static/{n:03d}" for n in range(40)]


def test_vnodes_move_to_a_new_shard_and_back_under_load(tmp_path: Path) -> None:
    """Five of twelve vnodes go to a new shard, the mover killed after a different step of
    each move and run again; then all five come back in one run."""
    with own_serve(tmp_path, CONFIG) as served:
        client = served.raw_client(served.root)
        client.create_bucket(Bucket="moving")
        for key in STATIC_KEYS:
            client.put_object(Bucket="moving", Key=key, Body=key.encode())
        _shoal(served, "shard", "add", "extra")
        load = _load(served)
        began = time.monotonic()
        said = []
        with load, _Lister(served) as lister, _Collecting(served) as collecting:
            for vnode, step in enumerate(FAULT_STEPS):
                load.wait_for_requests(10)
                _shoal(served, "ring", "move", str(vnode), "--to", "extra", fault=step, rc=-9)
                _check_one_owner(served, vnode)
                if step == "fenced":  # as a restart of `serve` would: no second, empty copy
                    _shoal(served, "db", "migrate")
                    _check_one_owner(served, vnode)
                again = _shoal(served, "ring", "move", str(vnode), "--to", "extra")
                said.append(f"killed after {step}, then: {again.strip()!r}")
                print(f"{time.monotonic() - began:.1f} s: {said[-1]}", flush=True)
                assert vnode in _placed(served, "extra")
                _check_one_owner(served, vnode)
            moved = _placed(served, "extra")
            assert moved == list(range(len(FAULT_STEPS)))
            load.wait_for_requests(10)
            time.sleep(MIN_GRACE.total_seconds())  # until their old copies may be dropped
            said.append(
                _shoal(served, "ring", "move", *map(str, moved), "--to", "shard0", "--grace", "0")
            )
            assert _placed(served, "extra") == []
            load.wait_for_requests(10)
        print(
            *said,
            f"{lister.listings} complete listings; {statuses(load.outcomes)}",
            f"{collecting.runs} gc runs, {collecting.reclaimed} records reclaimed, "
            f"{collecting.skipped} runs left a moving vnode alone",
            sep="\n",
        )
        assert not collecting.failures, collecting.failures
        assert collecting.runs > 0 and collecting.reclaimed > 0
        _check(served, load, lister, client)


class _Lister:
    """A thread listing the static keys page by page (7 keys a page) until stopped; each
    complete listing must be exactly those keys, in order. A 503 starts the listing over."""

    def __init__(self, served: Served) -> None:
        self.client = served.raw_client(served.root, retries={"total_max_attempts": 1})
        self.listings = 0
        self.wrong: list[str] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Lister:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self.client.close()

    def _run(self) -> None:
        deadline = time.monotonic() + 90
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                keys = self._list_all()
            except botocore.exceptions.ClientError as exc:
                status = exc.response["ResponseMetadata"]["HTTPStatusCode"]
                if status != 503:
                    self.failures.append(repr(exc))
                time.sleep(0.05)
                continue
            self.listings += 1
            if keys != STATIC_KEYS:
                self.wrong.append(f"listed {len(keys)} keys: {keys[:5]}...")

    def _list_all(self) -> list[str]:
        keys: list[str] = []
        token: dict[str, Any] = {}
        while True:
            page = self.client.list_objects_v2(
                Bucket="moving", Prefix="static/", MaxKeys=7, **token
            )
            keys += [o["Key"] for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return keys
            token = {"ContinuationToken": page["NextContinuationToken"]}


class _Collecting:
    """A thread running `shoal gc run --leeway GC_LEEWAY` one after another until stopped
    (the run in progress is waited for). A run exits 0, or 1 when a record had to be kept;
    anything else, or a trace, is a failure."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.runs = 0
        self.reclaimed = 0
        self.skipped = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Collecting:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(120)

    def _run(self) -> None:
        while not self._stop.is_set():
            done = subprocess.run(
                [
                    SHOAL,
                    "gc",
                    "run",
                    "--leeway",
                    GC_LEEWAY,
                    "--data-dir",
                    str(self.served.data_dir),
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
            self.runs += 1
            if done.returncode not in (0, 1) or "Traceback" in done.stderr:
                self.failures.append(f"rc {done.returncode}: {done.stdout}{done.stderr}")
            if done.stdout.startswith("reclaimed "):
                self.reclaimed += int(done.stdout.split()[1])
            self.skipped += "being moved" in done.stdout


def _load(served: Served) -> MixedLoad:
    return MixedLoad(
        lambda **config: served.raw_client(served.root, **config),
        "moving",
        threads=3,
        max_requests=3000,
        max_seconds=110,
        keys_per_thread=10,
    )


def _shoal(served: Served, *args: str, fault: str | None = None, rc: int = 0) -> str:
    env = {**os.environ}
    env.pop(FAULT_ENV, None)
    if fault:
        env[FAULT_ENV] = fault
    done = subprocess.run(
        [SHOAL, *args, "--data-dir", str(served.data_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == rc, (args, done.returncode, done.stdout, done.stderr)
    return done.stdout


def _check(served: Served, load: MixedLoad, lister: _Lister, client: Any) -> None:
    wrong = [o for o in load.failures() if o.status != 503]
    assert not wrong, "\n".join(iter_failures(load))
    assert not lister.wrong and not lister.failures, (lister.wrong, lister.failures)
    assert lister.listings > 0
    load.verify(client)
    for key in STATIC_KEYS:
        assert client.get_object(Bucket="moving", Key=key)["Body"].read() == key.encode()
    twice = _deletion_records_twice(served)
    assert not twice, twice
    # Exactly one record for each replaced version with blocks: none missing (a version
    # with blocks that no row names would be a replaced version without its record: GC
    # deletes only blocks a record names), and no second one of a record GC reclaimed
    # already (a record whose blocks are all gone: the first one's reclaim deleted them).
    on_nodes = block_versions(served.data_dir)
    named: set[Any] = set()
    for database in _databases(served):
        named |= named_versions(_dsn(served, database))
    assert not on_nodes - named, f"versions with blocks and no row: {on_nodes - named}"
    recorded = _recorded_with_blocks(served)
    assert not recorded - on_nodes, f"records reclaimed already: {recorded - on_nodes}"


def _dsn(served: Served, database: str) -> str:
    return EmbeddedPostgres(served.data_dir / "postgres").dsn(database)


def _databases(served: Served) -> list[str]:
    return ["shard0", "extra"]


def _placed(served: Served, shard: str) -> list[int]:
    with psycopg.connect(_dsn(served, "shard0"), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT vnode FROM shoal.ring_vnode WHERE shard = %s"
            " AND version = (SELECT max(version) FROM shoal.ring) ORDER BY vnode",
            (shard,),
        ).fetchall()
    return [row[0] for row in rows]


def _check_one_owner(served: Served, vnode: int) -> None:
    """The shard the ring names holds the vnode's schema, or holds it renamed by the write
    fence (a move between its fence and its switch: nobody writes it then). Any other shard
    that holds the schema is a copy being filled by a subscription: never in the ring, so
    never written by a gateway."""
    owner = "extra" if vnode in _placed(served, "extra") else "shard0"
    schema = f"manta_bucket_{vnode}"
    for database in _databases(served):
        with psycopg.connect(_dsn(served, database), autocommit=True) as conn:
            held = _one(conn, "SELECT count(*) FROM pg_namespace WHERE nspname = %s", schema)
            fenced = _one(
                conn,
                "SELECT count(*) FROM pg_namespace WHERE nspname LIKE %s",
                f"moved\\_manta\\_bucket\\_{vnode}\\_m%",
            )
            subscribed = _one(conn, "SELECT count(*) FROM pg_subscription")
        if database == owner:
            assert held != fenced, (vnode, database, held, fenced)
        elif held:
            assert subscribed, f"{database} holds {schema} unsubscribed, not the owner"


def _one(conn: psycopg.Connection[Any], statement: str, *params: Any) -> Any:
    row = conn.execute(statement, params).fetchone()
    assert row is not None
    return row[0]


def _recorded_with_blocks(served: Served) -> set[Any]:
    """The versions of the deletion records that name blocks (inline objects' versions
    leave no record; a multipart part record names its own blocks)."""
    recorded: set[Any] = set()
    for database in _databases(served):
        with psycopg.connect(_dsn(served, database), autocommit=True) as conn:
            for schema in _vnode_schemas(conn):
                recorded.update(
                    row[0]
                    for row in conn.execute(
                        f"SELECT id FROM {schema}.manta_bucket_deleted_object"
                        " WHERE cardinality(sharks) > 0 AND content_length > 0"
                    )
                )
    return recorded


def _vnode_schemas(conn: psycopg.Connection[Any]) -> list[str]:
    return [
        row[0]
        for row in conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'manta\\_bucket\\_%'"
        )
    ]


def _deletion_records_twice(served: Served) -> list[str]:
    """Versions with more than one deletion record, across every vnode of every shard."""
    twice = []
    for database in _databases(served):
        with psycopg.connect(_dsn(served, database), autocommit=True) as conn:
            for schema in _vnode_schemas(conn):
                rows = conn.execute(
                    f"SELECT id FROM {schema}.manta_bucket_deleted_object"
                    " GROUP BY id HAVING count(*) > 1"
                ).fetchall()
                twice += [f"{database}.{schema}: {row[0]}" for row in rows]
    return twice
