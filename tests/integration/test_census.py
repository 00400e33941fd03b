"""The census (shoal/admin/census.py), its metrics collector, the admin API's routes, the
pipeline run history and `shoal status`, against real PostgreSQL (three shards) and Spark."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from psycopg.conninfo import conninfo_to_dict

from shoal.admin.api import api_routes
from shoal.admin.census import ANSWER_SECONDS, Census
from shoal.admin.collector import CensusCollector
from shoal.config import Config, ShardConfig
from shoal.credentials import load_encryption_key
from shoal.metadata import MetadataStore, ObjectWrite
from shoal.metadata.moves import add_shard
from shoal.metadata.ring import vnode_schema
from shoal.pipeline import run_job
from tests.fixtures.postgres import MakeStore, create_databases, unique

SHOAL = str(Path(sys.executable).parent / "shoal")


@dataclass
class World:
    store: MetadataStore
    shards: list[ShardConfig]
    config: Config
    config_file: Path
    alice: str
    bob: str
    buckets: dict[str, list[str]]  # account name -> its live buckets
    live: dict[tuple[str, str], tuple[int, int]]  # (account, bucket) -> objects, bytes


@pytest.fixture(scope="module")
def world(make_store: MakeStore, run: Any, tmp_path_factory: pytest.TempPathFactory) -> World:
    """Two accounts with buckets over three shards, objects overwritten and deleted (deletion
    records) and a deleted bucket."""
    store = make_store(shards=3, vnodes=8)
    shards = [ShardConfig(name, s.pool.conninfo) for name, s in store.shards.shards.items()]
    root = tmp_path_factory.mktemp("census")
    config_file = root / "shoal.toml"
    config_file.write_text(
        f'data_dir = "{root}"\n[metadata]\nvnodes = 8\n'
        + "".join(f'[[metadata.shards]]\nname = "{s.name}"\ndsn = "{s.dsn}"\n' for s in shards)
    )
    alice, bob = unique("alice"), unique("bob")
    buckets = {alice: [unique("photos"), unique("logs")], bob: [unique("bob")]}
    live: dict[tuple[str, str], tuple[int, int]] = {}
    for account, names in buckets.items():
        owner = run(store.accounts.create(account)).id
        for bucket in names:
            run(store.buckets.create(owner, bucket))
            live[(account, bucket)] = (0, 0)
        gone = unique("gone")
        run(store.buckets.create(owner, gone))
        run(store.buckets.delete(owner, gone))  # a deleted-bucket record
    owner = run(store.accounts.get_by_name(alice)).id
    photos, logs = buckets[alice]
    for index in range(12):
        put(run, store, owner, photos, f"p{index}", 100 + index)
    for index in range(4):
        run(store.objects.delete(owner, photos, f"p{index}"))  # 4 records
    for index in range(6):
        put(run, store, owner, logs, f"l{index}", 1000)
        put(run, store, owner, logs, f"l{index}", 2000)  # 6 records of 1000 bytes
    live[(alice, photos)] = (8, sum(100 + i for i in range(4, 12)))
    live[(alice, logs)] = (6, 6 * 2000)
    config = Config(data_dir=root)
    return World(store, shards, config, config_file, alice, bob, buckets, live)


def put(run: Any, store: MetadataStore, owner: uuid.UUID, bucket: str, key: str, size: int) -> None:
    write = ObjectWrite(content_length=size, content_md5=bytes(16), sharks=["dc0:n0", "dc0:n1"])
    run(store.objects.put(owner, bucket, key, write))


def truth(world: World, shard: str) -> dict[str, Any]:
    """A shard's backlog by plain SQL: count, sum and min over every deleted table."""
    dsn = next(s.dsn for s in world.shards if s.name == shard)
    records = size = windows = 0
    oldest = []
    with psycopg.connect(dsn) as conn:
        for vnode in world.store.ring.vnodes_of(shard):
            schema = vnode_schema(vnode)
            count, total, first = conn.execute(
                f"SELECT count(*), coalesce(sum(content_length), 0), min(deleted_at) "
                f"FROM {schema}.manta_bucket_deleted_object"
            ).fetchone()  # type: ignore[misc]
            buckets, first_bucket = conn.execute(
                f"SELECT count(*), min(deleted_at) FROM {schema}.manta_bucket_deleted_bucket"
            ).fetchone()  # type: ignore[misc]
            records += count + buckets
            size += total
            oldest += [t for t in (first, first_bucket) if t is not None]
            windows += conn.execute(
                "SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind = 'r'",
                [schema],
            ).fetchone()[0]  # type: ignore[index]
    return {
        "records": records,
        "bytes": size,
        "oldest": min(oldest, default=None),
        "windows": windows,
    }


def test_backlog_is_exact_on_every_shard(world: World, run: Any) -> None:
    snapshot = run(Census(world.config, world.shards).refresh())
    assert [entry.shard for entry in snapshot.backlog] == ["s0", "s1", "s2"]
    for entry in snapshot.backlog:
        expected = truth(world, entry.shard)
        assert entry.backlog is not None and not entry.backlog.estimated
        assert entry.backlog.records == expected["records"]
        assert entry.backlog.bytes == expected["bytes"]
        assert entry.backlog.oldest == expected["oldest"]
        assert entry.backlog.windows == expected["windows"] > 0
    assert sum(e.backlog.records for e in snapshot.backlog) == 4 + 6 + 2  # type: ignore[union-attr]
    assert sum(e.backlog.bytes for e in snapshot.backlog) == 100 + 101 + 102 + 103 + 6 * 1000  # type: ignore[union-attr]


def test_large_backlog_is_estimated_from_statistics_and_a_sample(world: World, run: Any) -> None:
    for shard in world.shards:
        with psycopg.connect(shard.dsn, autocommit=True) as conn:
            for vnode in world.store.ring.vnodes_of(shard.name):
                for table in ("manta_bucket_deleted_object", "manta_bucket_deleted_bucket"):
                    conn.execute(f"ANALYZE {vnode_schema(vnode)}.{table}")
    snapshot = run(Census(world.config, world.shards, exact_backlog_limit=0).refresh())
    estimated = [e for e in snapshot.backlog if e.backlog is not None and e.backlog.records]
    assert estimated
    for entry in estimated:
        expected = truth(world, entry.shard)
        assert entry.backlog is not None and entry.backlog.estimated
        # Small tables: ANALYZE counted every row, and the sample reads every page.
        assert entry.backlog.records == expected["records"]
        assert entry.backlog.bytes == expected["bytes"]
        assert entry.backlog.oldest == expected["oldest"]


def silent(world: World, name: str) -> list[ShardConfig]:
    """The shards with `name` at an address where nothing listens."""
    dead = "host=127.0.0.1 port=1 dbname=nothing user=nobody connect_timeout=2"
    return [replace(s, dsn=dead) if s.name == name else s for s in world.shards]


def test_a_shard_that_does_not_answer_is_shown_not_fatal(world: World, run: Any) -> None:
    census = Census(world.config, silent(world, "s2"))
    cluster = run(census.cluster())
    by_name = {s["name"]: s for s in cluster["shards"]}
    assert by_name["s2"]["reachable"] is False and by_name["s0"]["reachable"] is True
    assert by_name["s2"]["vnode_count"] == len(world.store.ring.vnodes_of("s2"))
    assert by_name["s0"]["schema_versions"]["catalog"] >= 7
    assert cluster["ready"] is False and "s2" in cluster["reason"]
    gc = run(census.gc())
    backlog = {b["shard"]: b for b in gc["backlog"]}
    assert backlog["s2"]["reachable"] is False and backlog["s2"]["records"] is None
    assert backlog["s0"]["records"] == truth(world, "s0")["records"]
    accounts = run(census.accounts())
    assert accounts["unreachable_shards"] == ["s2"]
    # The collector shows no backlog for it (not a zero that would read as "no garbage").
    text = exposition(census)
    assert 'shoal_gc_backlog_records{shard="s0"}' in text
    assert 'shard="s2"' not in text


def test_a_shards_dsn_is_shown_without_its_passwords(world: World, run: Any) -> None:
    """The API shows each shard's DSN with every secret libpq takes hidden: the password,
    and the passphrase of its client key (`sslpassword`)."""
    secrets = "password=hunter2-db sslpassword=hunter2-key connect_timeout=2"
    dead = f"host=127.0.0.1 port=1 dbname=nothing user=nobody {secrets}"
    shards = [replace(s, dsn=dead) if s.name == "s2" else s for s in world.shards]
    cluster = run(Census(world.config, shards).cluster())
    shown = {s["name"]: s["dsn"] for s in cluster["shards"]}
    assert "hunter2" not in json.dumps(cluster)
    assert shown["s2"] == (
        "host=127.0.0.1 port=1 dbname=nothing user=nobody password=*** sslpassword=*** "
        "connect_timeout=2"
    )


def test_a_shard_that_hangs_is_not_waited_for(world: World, run: Any) -> None:
    """A host that accepts connections and never answers (the kernel completes the
    handshake of a socket that listens but never accepts)."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(8)
        port = hung.getsockname()[1]
        shards = [
            replace(s, dsn=f"host=127.0.0.1 port={port} dbname=x user=x") if s.name == "s1" else s
            for s in world.shards
        ]
        started = time.monotonic()
        cluster = run(Census(world.config, shards).cluster())
        assert time.monotonic() - started < ANSWER_SECONDS
    assert [s["reachable"] for s in cluster["shards"]] == [True, False, True]
    assert "s1" in cluster["shards"][1]["error"]


def test_the_census_refreshes_in_the_background_until_stopped(world: World, run: Any) -> None:
    census = Census(world.config, world.shards, refresh_seconds=0.05)

    async def refresh_a_few_times() -> list[datetime]:
        stop = asyncio.Event()
        task = asyncio.create_task(census.keep_refreshing(stop))
        seen: list[datetime] = []
        while len(seen) < 3:
            await asyncio.sleep(0.01)
            if census.last is not None and census.last.computed_at not in seen:
                seen.append(census.last.computed_at)
        stop.set()
        await asyncio.wait_for(task, 5)
        return seen

    seen = run(refresh_a_few_times())
    assert seen == sorted(seen)


def exposition(census: Census) -> str:
    registry = CollectorRegistry()
    registry.register(CensusCollector(census))
    return generate_latest(registry).decode()


def test_collector_exposes_the_catalogue_names_from_the_last_values(world: World, run: Any) -> None:
    census = Census(world.config, world.shards)
    assert "shoal_gc_backlog_records{" not in exposition(census)  # nothing read yet
    run(census.refresh())
    text = exposition(census)
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    for shard in world.shards:
        expected = truth(world, shard.name)
        assert samples[f'shoal_gc_backlog_records{{shard="{shard.name}"}}'] == expected["records"]
        assert samples[f'shoal_gc_backlog_bytes{{shard="{shard.name}"}}'] == expected["bytes"]
        assert samples[f'shoal_gc_deleted_windows{{shard="{shard.name}"}}'] == expected["windows"]
        oldest = f'shoal_gc_backlog_oldest_timestamp_seconds{{shard="{shard.name}"}}'
        if expected["oldest"] is None:
            assert oldest not in samples
        else:
            assert samples[oldest] == pytest.approx(expected["oldest"].timestamp())
    assert samples["shoal_census_timestamp_seconds"] == pytest.approx(
        census.last.computed_at.timestamp()  # type: ignore[union-attr]
    )
    for name in (
        "shoal_gc_last_run_records",
        "shoal_gc_last_run_duration_seconds",
        "shoal_gc_last_run_timestamp_seconds",
        "shoal_pipeline_last_run_timestamp_seconds",
        "shoal_pipeline_last_run_duration_seconds",
        "shoal_pipeline_last_run_success",
    ):
        assert f"# TYPE {name} gauge" in text


@pytest.fixture
def api(world: World, run: Any) -> Iterator[str]:
    """The API's routes on a plain aiohttp application on a loopback port (no auth)."""
    runner, base = served_api(Census(world.config, world.shards), run)
    yield f"{base}/admin/v1"
    run(runner.cleanup())


def served_api(census: Census, run: Any) -> tuple[web.AppRunner, str]:
    """The API's routes on a plain aiohttp application on a loopback port the kernel picks,
    and its base URL."""
    app = web.Application()
    app.router.add_routes(api_routes(census))
    runner = web.AppRunner(app, access_log=None)
    run(runner.setup())
    run(web.TCPSite(runner, "127.0.0.1", 0).start())
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


def get(run: Any, url: str) -> tuple[int, Any]:
    async def fetch() -> tuple[int, Any]:
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            assert response.content_type == "application/json"
            return response.status, await response.json()

    return run(fetch())  # type: ignore[no-any-return]


def test_api_answers_the_contract(world: World, run: Any, api: str) -> None:
    status, cluster = get(run, f"{api}/cluster")
    assert status == 200 and cluster["ring"] == {"version": 1, "vnodes": 8}
    assert [s["name"] for s in cluster["shards"]] == ["s0", "s1", "s2"]
    assert all(s["reachable"] and s["vnode_count"] == len(s["vnodes"]) for s in cluster["shards"])
    password = conninfo_to_dict(world.shards[0].dsn)["password"]
    assert password and password not in json.dumps(cluster)
    status, nodes = get(run, f"{api}/nodes")
    assert status == 200 and nodes == {"nodes": []}
    status, accounts = get(run, f"{api}/accounts")
    assert status == 200 and accounts["metered_at"] is None
    mine = {a["name"]: a for a in accounts["accounts"]}
    assert [b["name"] for b in mine[world.alice]["buckets"]] == sorted(world.buckets[world.alice])
    assert mine[world.alice]["buckets"][0]["objects"] is None  # not metered yet
    status, gc = get(run, f"{api}/gc")
    assert status == 200 and gc["paused"] is False and gc["runs"] == []
    assert [b["records"] for b in gc["backlog"]] == [
        truth(world, s.name)["records"] for s in world.shards
    ]
    assert gc["computed_at"].endswith("Z")
    status, usage = get(run, f"{api}/usage")
    assert status == 200 and usage == {"days": []}
    status, pipeline = get(run, f"{api}/pipeline?limit=5")
    assert status == 200 and isinstance(pipeline["runs"], list)
    assert get(run, f"{api}/pipeline?limit=lots")[0] == 400


def test_api_without_the_catalog_is_503_with_a_reason(world: World, run: Any) -> None:
    runner, base = served_api(Census(world.config, silent(world, "s0")), run)
    try:
        status, body = get(run, f"{base}/admin/v1/nodes")
        assert status == 503 and "s0" in body["error"]
        status, cluster = get(run, f"{base}/admin/v1/cluster")
        assert status == 200 and cluster["ring"] is None and cluster["ready"] is False
        assert not cluster["shards"][0]["reachable"] and cluster["shards"][1]["reachable"]
    finally:
        run(runner.cleanup())


@pytest.mark.slow
def test_every_pipeline_run_is_recorded_and_the_census_reads_the_meter(
    world: World, spark: Any, run: Any
) -> None:
    store, config = world.store, world.config
    output = config.data_dir / "pipeline"
    metered = run_job("meter", config, world.shards, spark=spark, output=output)
    assert not metered.problems

    owner = run(store.accounts.get_by_name(world.bob)).id
    rule = {
        "id": "r",
        "enabled": True,
        "prefix": "",
        "expiration_days": 3_000_000,  # refused by the gateway, stored here: a problem
        "expiration_date": None,
        "abort_days": None,
    }
    run(store.buckets.put_lifecycle(owner, world.buckets[world.bob][0], [rule]))
    lifecycle = run_job("lifecycle", config, world.shards, spark=spark, output=output)
    assert lifecycle.problems
    with pytest.raises(AttributeError):
        run_job("gc", config, world.shards, spark=spark, options={"leeway": "soon"})

    runs = run(store.pipeline_runs.runs())
    assert [(r.job, r.outcome) for r in runs[:3]] == [
        ("gc", "failed"),
        ("lifecycle", "problems"),
        ("meter", "ok"),
    ]
    failed, problems, ok = runs[:3]
    assert "total_seconds" in (failed.error or "") and "\n" not in (failed.error or "")
    assert problems.problems == lifecycle.problems
    assert ok.figures["buckets"] == metered.figures["buckets"]
    assert ok.output == str(metered.output)
    assert all(r.finished and r.finished >= r.started for r in runs[:3])
    assert [r.id for r in run(store.pipeline_runs.runs("meter", 5))] == [ok.id]

    census = Census(config, world.shards)
    run(census.refresh())
    success = {r.job: r.outcome for r in census.last.last_pipeline_runs}  # type: ignore[union-attr]
    assert success == {"gc": "failed", "lifecycle": "problems", "meter": "ok"}
    text = exposition(census)
    assert 'shoal_pipeline_last_run_success{pipeline_job="meter"} 1.0' in text
    assert 'shoal_pipeline_last_run_success{pipeline_job="gc"} 0.0' in text

    accounts = run(census.accounts())
    assert accounts["metered_at"] is not None
    mine = {a["name"]: a for a in accounts["accounts"]}
    for bucket in mine[world.alice]["buckets"]:
        assert (bucket["objects"], bucket["bytes"]) == world.live[(world.alice, bucket["name"])]
    assert mine[world.alice]["objects"] == 14
    assert mine[world.alice]["bytes"] == sum(
        v[1] for k, v in world.live.items() if k[0] == world.alice
    )
    days = run(census.usage())["days"]
    assert {
        "date": metered.figures["date"],
        "account": world.alice,
        "objects": 14,
        "bytes": mine[world.alice]["bytes"],
    } in days

    history = shoal("pipeline", "history", "--config", str(world.config_file))
    assert history.splitlines()[1].split()[:2] == ["id", "job"]
    assert "meter" in history and "problems" in history and "failed" in history
    one = json.loads(
        shoal("pipeline", "history", "--job", "meter", "--json", "--config", str(world.config_file))
    )
    assert [r["outcome"] for r in one] == ["ok"] and one[0]["duration_seconds"] > 0


def shoal(*args: str, exit_code: int = 0) -> str:
    result = subprocess.run([SHOAL, *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == exit_code, result.stderr
    return result.stdout


def test_shoal_status_prints_the_census_and_exits_3_while_the_cluster_is_not_ready(
    world: World, run: Any
) -> None:
    not_ready = shoal("status", "--config", str(world.config_file), exit_code=3)
    assert "NOT READY: 0 storage node(s) alive" in not_ready
    for name in ("ready1", "ready2"):
        url = "http://127.0.0.1:1"
        run(world.store.nodes.heartbeat(name, "dc1", url, 1000, 400, blocks=0, admin_url=None))
    text = shoal("status", "--config", str(world.config_file))
    assert "cluster: ring version 1, 8 vnodes" in text and "NOT READY" not in text
    for shard in ("s0", "s1", "s2"):
        assert f"\n  {shard} " in text
    assert world.alice in text and world.buckets[world.alice][0] in text
    assert "gc daemon: running" in text
    report = json.loads(shoal("status", "--json", "--config", str(world.config_file)))
    assert set(report) == {"cluster", "nodes", "accounts", "gc", "pipeline"}
    # Its own commit probe found every shard committing (a hang: tests/fault).
    assert report["cluster"]["shards_not_committing"] == []
    assert [s["commits"] for s in report["cluster"]["shards"]] == ["ok"] * 3
    assert sum(b["records"] for b in report["gc"]["backlog"]) == 12


def test_nodes_show_the_registry_and_a_block_count_where_it_has_one(world: World, run: Any) -> None:
    census = Census(world.config, world.shards)
    run(
        world.store.nodes.heartbeat(
            "n9", "dc1", "http://127.0.0.1:1", 1000, 400, blocks=12, admin_url="http://n9:9"
        )
    )
    (node,) = [n for n in run(census.nodes())["nodes"] if n["name"] == "n9"]
    assert node["shark"] == "dc1:n9" and node["state"] == "alive"
    assert node["url"] == "http://127.0.0.1:1" and node["admin_url"] == "http://n9:9"
    assert (node["capacity_bytes"], node["free_bytes"], node["used_bytes"]) == (1000, 400, 600)
    assert 0 <= node["heartbeat_age_seconds"] < 30 and node["heartbeat"].endswith("Z")
    assert node["blocks"] == 12


def test_a_shard_added_while_the_census_runs_is_listed(
    make_store: MakeStore, admin_dsn: str, run: Any, tmp_path: Path
) -> None:
    """A gateway's census lists the shards `shoal shard add` added after it started, as it
    reads the ring, not only those of its configuration."""
    store = make_store(shards=1, vnodes=4)
    (catalog,) = [ShardConfig(n, s.pool.conninfo) for n, s in store.shards.shards.items()]
    config = Config(data_dir=tmp_path)
    census = Census(config, [catalog])
    assert [s["name"] for s in run(census.cluster())["shards"]] == [catalog.name]
    (database,) = create_databases(admin_dsn, 1)
    key = load_encryption_key(config.credentials_key_file)
    run(add_shard(catalog, ShardConfig("added", database.dsn), key, config.metadata))
    shards = run(census.cluster())["shards"]
    assert [s["name"] for s in shards] == [catalog.name, "added"]
    assert shards[1]["reachable"] and shards[1]["vnode_count"] == 0
    backlog = run(census.refresh()).backlog
    assert [b.shard for b in backlog] == [catalog.name, "added"]
