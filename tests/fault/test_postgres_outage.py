"""PostgreSQL goes away under a bounded mixed load, and comes back.

What a client may see meanwhile: 503 ServiceUnavailable, answered fast, and nothing else (no
500, no hang). What it may not see: an acknowledged write lost or changed. Afterwards every
block on the nodes that no row names belongs to a write that was answered 503 (those are
what `shoal pipeline orphans` reclaims); none belongs to an acknowledged one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import botocore.exceptions
import psutil
import psycopg
import pytest

from shoal.metadata.batched import COMMIT_WAIT_SECONDS
from shoal.metadata.embedded import EmbeddedPostgres
from shoal.readiness import READY_CHECK_SECONDS
from tests.e2e.test_metrics import settled, value
from tests.fault.load import MixedLoad, Outcome, iter_failures, statuses, wait_until
from tests.fault.proxy import CuttingProxy, cutting_proxy
from tests.fault.serving import block_versions, named_versions, own_serve
from tests.fixtures.admin import admin_get, bearer
from tests.fixtures.postgres import create_databases
from tests.fixtures.processes import stop
from tests.fixtures.serve import SHOAL, Served

pytestmark = pytest.mark.slow

# A request that meets an outage is answered 503 within this (the gateway's own bound is a
# second: shards.CONNECTION_WAIT_SECONDS; the rest is the machine's load). A hang would run
# into the load's client timeout.
FAST_503_SECONDS = 3.0
# From kill -9 of the postmaster to a request that succeeds: `serve` notices within a second,
# PostgreSQL recovers from its crash and starts, the pools find it within PROBE_SECONDS.
RESTART_SECONDS = 20.0
# From PostgreSQL accepting connections again to a request that succeeds: the pools' probes
# find it within PROBE_SECONDS, the rest is the machine's load. A pool left to psycopg_pool's
# own reconnect, which backs off to seconds apart, would be later than this after OUTAGE.
RECOVERY_SECONDS = 3.0
OUTAGE_SECONDS = 8.0
# From a shard that stops answering to the gateway refusing its calls at once: the readiness
# check runs every second and gives a shard a second to answer (readiness.py); the rest is
# the machine's load.
HANG_FOUND_SECONDS = 10.0


def test_kill_9_of_the_embedded_postgres_costs_fast_503s_and_loses_nothing(
    tmp_path: Path,
) -> None:
    with own_serve(tmp_path, "[s3]\nworkers = 2\n") as served:
        client = served.raw_client(served.root)
        client.create_bucket(Bucket="killed")
        _checkpoint(_embedded_dsn(served.data_dir))
        load = _load(served, "killed")
        with load:
            load.wait_for_requests(30)
            killed_at = time.monotonic()
            os.kill(_postmaster_pid(served.data_dir), signal.SIGKILL)
            wait_until(lambda: _first_503_after(load, killed_at) is not None, 10)
            first_503 = _first_503_after(load, killed_at)
            assert first_503 is not None
            wait_until(lambda: _first_success_after(load, first_503) is not None, RESTART_SECONDS)
            load.wait_for_requests(30)
        back = _first_success_after(load, first_503)
        assert back is not None
        print(
            f"kill -9: first 503 after {first_503 - killed_at:.2f} s, success again after "
            f"{back - killed_at:.2f} s; {statuses(load.outcomes)}"
        )
        _check_outcomes(load)
        load.verify(client)
        # Writes cut by the crash took their '/' directory rows with them, and no more.
        load.verify_listings(client)
        _check_unnamed_blocks(served, load, _embedded_dsn(served.data_dir))
        assert "embedded PostgreSQL started again" in served.log.read_text()


def test_postgres_stopped_for_seconds_costs_fast_503s_and_recovers_at_once(
    tmp_path: Path,
) -> None:
    server = EmbeddedPostgres(tmp_path / "postgres")
    server.start()
    try:
        shard = f'[[metadata.shards]]\nname = "pg"\ndsn = "{server.dsn("postgres")}"\n'
        with own_serve(tmp_path / "serve", "[s3]\nworkers = 2\n\n" + shard) as served:
            client = served.raw_client(served.root)
            client.create_bucket(Bucket="stopped")
            load = _load(served, "stopped")
            with load:
                load.wait_for_requests(30)
                server.stop()
                stopped_at = time.monotonic()
                time.sleep(OUTAGE_SECONDS)
                during = [o for o in load.outcomes if o.started > stopped_at + 0.5]
                server.start()
                accepting_at = time.monotonic()
                wait_until(
                    lambda: _first_success_after(load, accepting_at) is not None,
                    RECOVERY_SECONDS + 5,
                )
                load.wait_for_requests(30)
            back = _first_success_after(load, accepting_at)
            assert back is not None
            print(
                f"stopped: {statuses(during)} while down; success again "
                f"{back - accepting_at:.2f} s after PostgreSQL accepted connections"
            )
            assert during and all(o.status == 503 for o in during), statuses(during)
            assert back - accepting_at < RECOVERY_SECONDS
            _check_outcomes(load)
            load.verify(client)
            _check_unnamed_blocks(served, load, server.dsn("postgres"))
            # serve's daemons meet the outage too: a warning line each, not a trace.
            log = served.log.read_text()
            assert "Traceback" not in log, log[log.index("Traceback") - 300 :][:3000]
    finally:
        server.stop()


def _load(served: Served, bucket: str) -> MixedLoad:
    return MixedLoad(
        lambda **config: served.raw_client(served.root, **config),
        bucket,
        threads=4,
        max_requests=400,
        max_seconds=45,
    )


def _check_outcomes(load: MixedLoad) -> None:
    failures = load.failures()
    wrong = [o for o in failures if o.status != 503]
    assert not wrong, "\n".join(iter_failures(load))
    slow = [o for o in failures if o.seconds > FAST_503_SECONDS]
    assert not slow, [f"{o.op} {o.key} {o.seconds:.2f} s" for o in slow]


def _check_unnamed_blocks(served: Served, load: MixedLoad, dsn: str) -> None:
    """Blocks no row names (what `shoal pipeline orphans` would reclaim, checked here on the
    nodes' folders and the shard's tables directly) are at most one version per failed PUT."""
    unnamed = block_versions(served.data_dir) - named_versions(dsn)
    failed_puts = [o for o in load.failures() if o.op == "PUT"]
    assert len(unnamed) <= len(failed_puts), (len(unnamed), len(failed_puts))


def _first_503_after(load: MixedLoad, moment: float) -> float | None:
    """When the first 503 to a request sent after `moment` was answered."""
    found = [o for o in _outcomes(load) if o.started >= moment and o.status == 503]
    return min((o.started + o.seconds for o in found), default=None)


def _first_success_after(load: MixedLoad, moment: float) -> float | None:
    """When the first request sent after `moment` that succeeded was answered."""
    done = [o for o in _outcomes(load) if o.started >= moment and not o.failed]
    return min((o.started + o.seconds for o in done), default=None)


def _outcomes(load: MixedLoad) -> list[Outcome]:
    return list(load.outcomes)


def _checkpoint(dsn: str) -> None:
    """A checkpoint before the crash, as a server that has been up a while has had: crash
    recovery then replays the load only, not the thousands of files `serve` just migrated."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def test_a_serve_that_adopts_its_postgres_left_by_a_crash_stops_it_when_it_stops(
    tmp_path: Path,
) -> None:
    with own_serve(tmp_path) as crashed:
        postmaster = _postmaster_pid(crashed.data_dir)
        os.kill(crashed.pid, signal.SIGKILL)  # serve's PostgreSQL outlives it
    assert psutil.pid_exists(postmaster)
    with own_serve(tmp_path) as adopting:
        assert _postmaster_pid(adopting.data_dir) == postmaster  # found running, used
    # And stopped with the serve that used it.
    wait_until(lambda: not psutil.pid_exists(postmaster), 30)


def test_a_command_against_a_hung_postgres_says_so_within_seconds(tmp_path: Path) -> None:
    """A PostgreSQL that takes connections into its backlog and never answers (a stopped
    postmaster, a hung host): a CLI command is one line and exit 1 within seconds, never a
    wait without end."""
    with own_serve(tmp_path) as served:
        postmaster = _postmaster_pid(served.data_dir)
        command = [SHOAL, "node", "list", "--config", str(tmp_path / "shoal.toml")]
        try:
            stop(postmaster)
            started = time.monotonic()
            done = subprocess.run(command, capture_output=True, text=True, timeout=40)
            took = time.monotonic() - started
        finally:
            os.kill(postmaster, signal.SIGCONT)
        assert done.returncode == 1, done.stdout
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert "cannot connect" in done.stderr and took < 20
        again = subprocess.run(command, capture_output=True, text=True, timeout=40)
        assert again.returncode == 0, again.stderr  # and once it answers, it works


def test_a_command_run_while_serves_postgres_is_down_waits_for_serve_to_start_it(
    tmp_path: Path,
) -> None:
    """PostgreSQL dies under a running `serve`, and a command runs before `serve` has started
    it again. The command must not start a server of its own: it would stop it when it ends,
    under `serve`'s clients. It waits for `serve`'s, and uses it."""
    with own_serve(tmp_path) as served:
        server = EmbeddedPostgres(served.data_dir / "postgres")
        command = [SHOAL, "node", "list", "--config", str(tmp_path / "shoal.toml")]
        stop(served.pid)  # its supervisor starts nothing until SIGCONT
        try:
            postmaster = _postmaster_pid(served.data_dir)
            os.kill(postmaster, signal.SIGKILL)
            # Gone, not a zombie: `pg_ctl status` counts a zombie as running.
            wait_until(lambda: not psutil.pid_exists(postmaster), 20)
            waiting = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            time.sleep(3)
            assert waiting.poll() is None, waiting.communicate()
            assert not server.is_running(), "the command started PostgreSQL itself"
        finally:
            os.kill(served.pid, signal.SIGCONT)
        _, err = waiting.communicate(timeout=60)
        assert waiting.returncode == 0, err
        assert b"waiting for `shoal serve` to start it" in err
        # `serve`'s server, still up once the command has ended, and serving.
        assert psutil.pid_exists(_postmaster_pid(served.data_dir))
        served.raw_client(served.root).list_buckets()


def test_a_job_that_lost_postgresql_notes_its_failure_once_it_is_back(
    tmp_path: Path, run: Any
) -> None:
    """A pipeline job whose PostgreSQL was killed under it fails; `serve` starts the server
    again within seconds, and the job's failure must be in the history then, not lost."""
    from shoal import pipeline
    from shoal.config import MetadataConfig, ShardConfig
    from shoal.metadata.migrate import migrate
    from shoal.metadata.pipeline_runs import PipelineRun, read_runs

    server = EmbeddedPostgres(tmp_path / "postgres")
    server.start()
    try:
        shards = [ShardConfig(name="pg", dsn=server.dsn("postgres"))]
        run(migrate(shards, MetadataConfig(vnodes=8, partitions_ahead=1)))
        server.stop()
        failed = PipelineRun("gc", datetime.now(UTC), "failed", error="lost the shard")
        threading.Timer(2.0, server.start).start()
        started = time.monotonic()
        pipeline._record(shards, failed, job_failed=True, wait=pipeline.RECORD_WAIT_SECONDS)
        assert 1.5 < time.monotonic() - started < pipeline.RECORD_WAIT_SECONDS

        async def runs() -> list[PipelineRun]:
            async with await psycopg.AsyncConnection.connect(shards[0].dsn) as conn:
                return await read_runs(conn, "gc")

        [noted] = run(runs())
        assert (noted.outcome, noted.error) == ("failed", "lost the shard")
        # A job that never reached PostgreSQL waits for nothing: its error says it all.
        server.stop()
        started = time.monotonic()
        pipeline._record(shards, failed, job_failed=True)
        assert time.monotonic() - started < 1.5
    finally:
        server.stop()


def _postmaster_pid(data_dir: Path) -> int:
    return int((data_dir / "postgres" / "data" / "postmaster.pid").read_text().split()[0])


def _embedded_dsn(data_dir: Path) -> str:
    return EmbeddedPostgres(data_dir / "postgres").dsn("shard0")


def test_a_shard_that_hangs_costs_only_the_buckets_it_holds(admin_dsn: str, tmp_path: Path) -> None:
    """Of two shards, the second stops answering (connections accepted, nothing answered):
    within a few seconds the gateway refuses its buckets' requests at once with 503, serves
    the first shard's buckets as before, and serves both again once it answers."""
    with _second_shard_behind_a_proxy(admin_dsn, tmp_path) as (served, proxy, other):
        client = served.raw_client(served.root, retries={"total_max_attempts": 1}, read_timeout=10)
        body = os.urandom(1024)
        buckets = _buckets_of_one_object(client, "spread", body)
        proxy.freeze()
        wait_until(lambda: _shards_not_answering(served) == [other], HANG_FOUND_SECONDS)
        answers = {bucket: _timed_get(client, bucket, body) for bucket in buckets}
        proxy.thaw()
        served_buckets = [b for b, (status, _) in answers.items() if status == 200]
        refused = [b for b, (status, _) in answers.items() if status == 503]
        assert sorted(served_buckets + refused) == buckets, answers
        assert served_buckets and refused, answers  # 48 buckets over 2 shards: both
        assert max(seconds for _, seconds in answers.values()) < FAST_503_SECONDS, answers
        wait_until(
            lambda: all(_timed_get(client, b, body)[0] == 200 for b in refused),
            RECOVERY_SECONDS + 2,
        )


def test_a_shard_that_hangs_under_load_refuses_new_requests_at_once(
    admin_dsn: str, tmp_path: Path
) -> None:
    """Writers keep both of a shard's write batches busy when it hangs, so its writes stay
    stuck until it answers again. The requests that come after the gateway found it silent
    must not queue behind them: each is 503 at once (or served, on the other shard)."""
    with _second_shard_behind_a_proxy(admin_dsn, tmp_path) as (served, proxy, other):
        client = served.raw_client(served.root, retries={"total_max_attempts": 1}, read_timeout=10)
        body = os.urandom(1024)
        buckets = _buckets_of_one_object(client, "busy", body)
        stop = threading.Event()

        def write() -> None:  # until stopped; stuck while the shard hangs
            writer = served.raw_client(
                served.root, retries={"total_max_attempts": 1}, read_timeout=120
            )
            while not stop.is_set():
                for bucket in buckets:
                    with contextlib.suppress(botocore.exceptions.ClientError):
                        writer.put_object(Bucket=bucket, Key="load", Body=body)

        writers = [threading.Thread(target=write) for _ in range(6)]
        for thread in writers:
            thread.start()
        try:
            time.sleep(1)
            proxy.freeze()
            wait_until(lambda: _shards_not_answering(served) == [other], HANG_FOUND_SECONDS)
            time.sleep(1)  # the writers are stuck on the hung shard by now
            answers = {bucket: _timed_get(client, bucket, body) for bucket in buckets}
            puts = {bucket: _timed_put(client, bucket, body) for bucket in buckets}
        finally:
            proxy.thaw()
            stop.set()
            for thread in writers:
                thread.join(timeout=150)
        refused = [b for b, (status, _) in answers.items() if status == 503]
        assert refused and len(refused) < len(buckets), answers
        assert all(status in (200, 503) for status, _ in answers.values()), answers
        assert [b for b, (status, _) in puts.items() if status == 503] == refused, puts
        slowest = max(seconds for _, seconds in [*answers.values(), *puts.values()])
        assert slowest < FAST_503_SECONDS, (answers, puts)


@contextlib.contextmanager
def _second_shard_behind_a_proxy(
    admin_dsn: str, folder: Path
) -> Iterator[tuple[Served, CuttingProxy, str]]:
    """A serve (one gateway process, no GC) of two shards, the second reached through a
    proxy that can stop answering; and that shard's name."""
    catalog, other = create_databases(admin_dsn, 2)
    with cutting_proxy(other.dsn) as proxy:
        config = (
            "[s3]\nworkers = 1\n\n[gc]\nenabled = false\n\n"
            f'[[metadata.shards]]\nname = "{catalog.name}"\ndsn = "{catalog.dsn}"\n\n'
            f'[[metadata.shards]]\nname = "{other.name}"\ndsn = "{proxy.dsn}"\n'
        )
        with own_serve(folder, config) as served:
            yield served, proxy, other.name


def _buckets_of_one_object(client: Any, prefix: str, body: bytes) -> list[str]:
    """Buckets spread over the shards, each holding `k` = `body`. A GET of one is served
    while the second shard hangs only if its bucket's row and its object's row are both on
    the first (one in four, with the owner's ids drawn at random): with 48 of them, none
    being served is a chance in a million, where with 16 it was one in a hundred."""
    buckets = [f"{prefix}-{n:02d}" for n in range(48)]
    for bucket in buckets:
        client.create_bucket(Bucket=bucket)
        client.put_object(Bucket=bucket, Key="k", Body=body)
    return buckets


def _timed_put(client: Any, bucket: str, body: bytes) -> tuple[int, float]:
    started = time.monotonic()
    try:
        client.put_object(Bucket=bucket, Key="k", Body=body)
        status = 200
    except botocore.exceptions.ClientError as exc:
        status = int(exc.response["ResponseMetadata"]["HTTPStatusCode"])
    return status, time.monotonic() - started


def _shards_not_answering(served: Served) -> list[str]:
    """What the gateway's readiness check found (the gateway is serve's one process)."""
    _, _, body = admin_get(served.admin_port, "/ready")
    return list(json.loads(body)["shards_not_answering"])


def _timed_get(client: Any, bucket: str, body: bytes) -> tuple[int, float]:
    """A GET's status and how long it took; a 200 must bring back `body`."""
    started = time.monotonic()
    try:
        found = client.get_object(Bucket=bucket, Key="k")["Body"].read()
        assert found == body
        status = 200
    except botocore.exceptions.ClientError as exc:
        status = int(exc.response["ResponseMetadata"]["HTTPStatusCode"])
    return status, time.monotonic() - started


def test_a_shard_whose_commits_hang_refuses_writes_at_once_and_goes_on_reading(
    tmp_path: Path,
) -> None:
    """A synchronous standby that does not answer holds every commit of its primary: here
    PostgreSQL waits for a standby that does not exist. The gateway's commit probe finds it
    within seconds: the writes waiting on the shard (a batched PUT, a CompleteMultipartUpload's
    transaction) are given up with a 503, later writes are refused at once, and reads go on,
    past the storage nodes' heartbeat deadline (their heartbeats cannot land either). Once
    commits come back so do writes, with blocks on the nodes at once; each write given up
    either happened or did not, never half."""
    server = EmbeddedPostgres(tmp_path / "postgres")
    server.start()
    try:
        config = (
            f'[[metadata.shards]]\nname = "pg"\ndsn = "{server.dsn("postgres")}"\n'
            f"[storage]\nheartbeat_interval_seconds = 1\n"
            f"heartbeat_deadline_seconds = {HEARTBEAT_DEADLINE_SECONDS}\n"
        )
        with own_serve(tmp_path / "serve", config) as served:
            client = served.raw_client(served.root, retries={"total_max_attempts": 1})
            client.create_bucket(Bucket="held")
            client.put_object(Bucket="held", Key="before", Body=BIG)
            upload = client.create_multipart_upload(Bucket="held", Key="parts")["UploadId"]
            etag = client.upload_part(
                Bucket="held", Key="parts", UploadId=upload, PartNumber=1, Body=b"p" * 1000
            )["ETag"]
            parts = {"Parts": [{"PartNumber": 1, "ETag": etag}]}
            still_open = client.create_multipart_upload(Bucket="held", Key="open")["UploadId"]
            client.upload_part(
                Bucket="held", Key="open", UploadId=still_open, PartNumber=1, Body=b"o"
            )
            _synchronous_standby(server, "ghost")
            try:
                held = {
                    "CompleteMultipartUpload": lambda: client.complete_multipart_upload(
                        Bucket="held", Key="parts", UploadId=upload, MultipartUpload=parts
                    ),
                    "PutObject": lambda: client.put_object(Bucket="held", Key="held", Body=BIG),
                }
                with ThreadPoolExecutor(len(held)) as pool:
                    waits = dict(zip(held, pool.map(_refused_after, held.values()), strict=True))
                # Given up when the probe found the commits hung: not at once, and before a
                # write's own time limit.
                assert all(1.0 < w < COMMIT_WAIT_SECONDS - 1 for w in waits.values()), waits
                refused = {
                    "PutObject": lambda: client.put_object(Bucket="held", Key="k", Body=b"k"),
                    "CreateBucket": lambda: client.create_bucket(Bucket="other"),
                    "DeleteObject": lambda: client.delete_object(Bucket="held", Key="before"),
                }
                for name, write in refused.items():
                    assert _refused_after(write) < FAST_503_SECONDS, name
                status, _, body = admin_get(served.admin_port, "/ready")
                assert status == 200 and json.loads(body)["shards_not_committing"] == ["pg"]
                hung = settled(served, lambda s: value(s, COMMITS_HUNG, shard="pg") == 1)
                assert value(hung, COMMITS_HUNG, shard="pg") == 1
                # An operator cancels the waiting sessions: the probes come back committed on
                # the primary alone, which says nothing of the standby.
                assert _cancel_probes(server) >= 1
                time.sleep(2 * READY_CHECK_SECONDS)
                status, _, body = admin_get(served.admin_port, "/ready")
                assert json.loads(body)["shards_not_committing"] == ["pg"], body
                assert _refused_after(refused["PutObject"]) < FAST_503_SECONDS
                # A command that writes as it opens and closes the store (its ring note)
                # ends, and answers.
                checked = subprocess.run(
                    [SHOAL, "db", "check", "--config", str(tmp_path / "serve" / "shoal.toml")],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                assert checked.returncode == 0, checked
                assert "0 difference(s)" in checked.stdout
                time.sleep(HEARTBEAT_DEADLINE_SECONDS + 1)  # no heartbeat lands meanwhile
                assert client.get_object(Bucket="held", Key="before")["Body"].read() == BIG
                status, _, body = admin_get(served.admin_port, "/admin/v1/nodes", bearer(served))
                assert status == 200, body
                assert {n["state"] for n in json.loads(body)["nodes"]} == {"alive"}, body
                _, _, body = admin_get(served.admin_port, "/admin/v1/cluster", bearer(served))
                cluster = json.loads(body)
                assert cluster["ready"] and cluster["shards_not_committing"] == ["pg"], body
                assert [s["commits"] for s in cluster["shards"]] == ["hung"], body
                # `shoal status` probes for itself: it cannot tell since when the heartbeats
                # could not land, so a late one is unknown, not silent, and the cluster is
                # ready (reads go on) with its writes refused.
                report = _status(tmp_path / "serve" / "shoal.toml", "--json")
                assert report.returncode == 3, report
                cluster = json.loads(report.stdout)["cluster"]
                assert cluster["ready"] and cluster["shards_not_committing"] == ["pg"], cluster
                assert [s["commits"] for s in cluster["shards"]] == ["hung"]
                nodes = json.loads(report.stdout)["nodes"]["nodes"]
                assert {n["state"] for n in nodes} == {"unknown"}, nodes
                shown = _status(tmp_path / "serve" / "shoal.toml").stdout
                assert "WRITES REFUSED: the commits of shard(s) pg do not come back" in shown
                assert "heartbeats cannot land" in shown, shown
                listed = client.list_objects_v2(Bucket="held")["Contents"]
                assert "before" in [entry["Key"] for entry in listed]
                open_parts = client.list_parts(Bucket="held", Key="open", UploadId=still_open)
                assert [part["Size"] for part in open_parts["Parts"]] == [1]
                with pytest.raises(botocore.exceptions.ClientError) as no_rules:
                    client.get_bucket_lifecycle_configuration(Bucket="held")
                assert no_rules.value.response["Error"]["Code"] == "NoSuchLifecycleConfiguration"
            finally:
                _synchronous_standby(server, "")
            wait_until(lambda: _puts(client, "after"), COMMITS_BACK_SECONDS)
            # Blocks go to the nodes at once: their heartbeats, late by the hang, still count.
            client.put_object(Bucket="held", Key="big-after", Body=BIG)
            assert _whole_or_missing(client, "held") in (BIG, None)  # never a 500
            try:
                client.complete_multipart_upload(
                    Bucket="held", Key="parts", UploadId=upload, MultipartUpload=parts
                )
            except botocore.exceptions.ClientError as exc:  # it had committed
                assert exc.response["Error"]["Code"] == "NoSuchUpload"
            assert _whole_or_missing(client, "parts") == b"p" * 1000
            log = served.log.read_text()
            assert "Traceback" not in log, log[log.index("Traceback") - 300 :][:3000]
            assert "shard pg does not commit" in log and "shard pg commits again" in log
            assert "not ready" not in log, log
            back = settled(served, lambda s: value(s, COMMITS_HUNG, shard="pg") == 0)
            assert value(back, COMMITS_HUNG, shard="pg") == 0
    finally:
        server.stop()


HEARTBEAT_DEADLINE_SECONDS = 3
COMMITS_HUNG = "shoal_metadata_commits_hung"
COMMITS_BACK_SECONDS = 10.0  # the probe left waiting commits as the standby setting goes
BIG = os.urandom(5_000_000)  # stored in blocks on the nodes, not in its row


def _status(config: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """`shoal status`, which must answer within a few seconds whatever the shards do."""
    return subprocess.run(
        [SHOAL, "status", *options, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
    )


def _cancel_probes(server: EmbeddedPostgres) -> int:
    """pg_cancel_backend on every commit probe waiting; how many there were."""
    with psycopg.connect(server.dsn("postgres"), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE pg_cancel_backend(pid)) FROM pg_stat_activity "
            "WHERE query LIKE %s AND pid <> pg_backend_pid()",
            ("%shoal-commit-probe%",),
        ).fetchone()
    return row[0] if row else 0


def _refused_after(write: Callable[[], object]) -> float:
    """How long `write` took to be answered 503."""
    started = time.monotonic()
    with pytest.raises(botocore.exceptions.ClientError) as refused:
        write()
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503
    return time.monotonic() - started


def _whole_or_missing(client: Any, key: str) -> bytes | None:
    try:
        return client.get_object(Bucket="held", Key=key)["Body"].read()  # type: ignore[no-any-return]
    except botocore.exceptions.ClientError as exc:
        assert exc.response["Error"]["Code"] == "NoSuchKey"
        return None


def _synchronous_standby(server: EmbeddedPostgres, names: str) -> None:
    with psycopg.connect(server.dsn("postgres"), autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
        conn.execute("SELECT pg_reload_conf()")
    time.sleep(0.2)  # the backends take the setting at their next command


def _puts(client: Any, key: str) -> bool:
    try:
        client.put_object(Bucket="held", Key=key, Body=b"after")
    except botocore.exceptions.ClientError:
        return False
    return True
