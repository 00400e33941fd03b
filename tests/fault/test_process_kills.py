"""kill -9 of Shoal's own processes under a bounded mixed load: a gateway worker, a storage
node, the whole serve tree. No acknowledged write is lost or changed; what clients see is
stated per test (docs/durability.md, "Storage nodes and Shoal's own processes")."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.fault.load import MixedLoad, iter_failures, statuses, wait_until
from tests.fault.serve_tree import ServeTree, wait_for_new_process
from tests.fault.serving import block_versions
from tests.fixtures.admin import wait_until_ready
from tests.fixtures.postgres import create_databases, unique
from tests.fixtures.processes import stop
from tests.fixtures.serve import SHOAL, RawResponse, raw_request

pytestmark = pytest.mark.slow

THREADS = 4
# A killed node is reaped and started again by the serve loop (every second), and a node
# takes a second or two to start: it must be back well within this.
RESTART_SECONDS = 15
# After a kill, writes go to the nodes left at once (the dead node is marked unreachable on
# its first refused connection): any 503 is in this window after the kill.
NODE_KILL_ERROR_SECONDS = 5
# How long a node is stopped for: past a node request's token lifetime (auth.py), after
# which a hung node that wakes up refuses what waited for it.
HUNG_NODE_SECONDS = 20
# The longest a request may take while one node hangs: the gateway's readiness check finds
# the node silent twice in about two seconds and gives up what waits on it (DataPath.
# node_silent); the rest is the machine's load.
HUNG_NODE_WAIT_SECONDS = 8
# The longest `shoal gc run` may take with one node stopped: its start, and a few seconds of
# checks before the node's deletes are given up (not the node client's 60 s time-out).
GC_HUNG_NODE_SECONDS = 30


@pytest.fixture(scope="module")
def tree(admin_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeTree]:
    (shard,) = create_databases(admin_dsn, 1)
    tree = ServeTree(tmp_path_factory.mktemp("kills"), shard)
    try:
        tree.start()
        tree.client().create_bucket(Bucket="kills")
        yield tree
    finally:
        tree.stop()


def mixed_load(tree: ServeTree, max_seconds: float = 40, threads: int = THREADS) -> MixedLoad:
    """A load on a bucket of its own (the ledger knows only what this load wrote), once the
    serve is ready again after what the test before did to it."""
    assert tree.served is not None
    wait_until_ready(tree.served)
    bucket = unique("kills")
    tree.client().create_bucket(Bucket=bucket)
    return MixedLoad(
        tree.client, bucket, threads=threads, max_requests=2000, max_seconds=max_seconds
    )


def listen_backlog(port: int) -> int:
    """The accept backlog of the socket listening on 127.0.0.1:port (ss's Send-Q)."""
    out = subprocess.run(
        ["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout
    return int(out.split()[2])


def test_every_listening_socket_keeps_its_backlog(tree: ServeTree) -> None:
    # asyncio's create_server(sock=...) listens again with 100 unless told otherwise.
    assert listen_backlog(tree.port) == 1024
    for name in ("node0", "node1"):
        command = tree.storage_node(name).cmdline()
        port = int(command[command.index("--port") + 1])  # not its admin port
        assert listen_backlog(port) == 1024


def test_a_killed_gateway_worker_costs_only_its_requests_in_flight(tree: ServeTree) -> None:
    (worker,) = tree.gateway_workers()
    assert tree.process is not None
    serve = psutil.Process(tree.process.pid)
    load = mixed_load(tree, threads=2 * THREADS)
    # Each client keeps one connection, taken by whichever gateway process accepts it first,
    # and a busy machine may give the worker none: while the clients connect, the serve
    # process is stopped, so the worker takes them.
    serve.suspend()
    try:
        load.start()
        wait_until(lambda: bool(_clients_of(worker, tree.port)), 30, interval=0.05)
    finally:
        serve.resume()
    try:
        load.wait_for_requests(100)
        # Stopped, it accepts no connection more: what it holds is counted exactly.
        stop(worker.pid)
        held = _clients_of(worker, tree.port)
        os.kill(worker.pid, signal.SIGKILL)
        assert held, "the worker held none of the clients' connections"
        wait_until(lambda: gone(worker), 5, interval=0.01)
        dead_at = time.monotonic()  # its sockets are closed: a client sees it from now on
        _, seconds = wait_for_new_process(lambda: tree.gateway_workers()[0], worker.pid)
        assert seconds < RESTART_SECONDS
        load.wait_for_requests(200)
    finally:
        load.stop()
    after = [o for o in load.outcomes if o.started > dead_at]
    # The requests that fail are the ones sent on the connections the killed process held,
    # before its sockets were closed: a connection carries one request at a time, and after
    # the close a client finds the connection closed and opens another before it sends. So:
    # at most one per connection it held, each a connection error (no status). Nothing else
    # fails: new connections wait in the listening socket's queue for the parent process.
    failures = load.failures()
    assert len(failures) <= len(held), list(iter_failures(load))
    assert all(f.status is None and f.started <= dead_at for f in failures), list(
        iter_failures(load)
    )
    slowest = max(o.seconds for o in after)
    assert slowest < 5, f"a request after the kill took {slowest:.1f} s"
    load.verify(tree.client())


def test_a_killed_storage_node_is_restarted_and_costs_at_most_brief_503s(
    tree: ServeTree,
) -> None:
    node = tree.storage_node("node1")
    blocks = tree.folder / "data" / "nodes" / "node1" / "blocks"
    load = mixed_load(tree)
    with load:
        load.wait_for_requests(100)
        killed_at = time.monotonic()
        node.send_signal(signal.SIGKILL)
        _, seconds = wait_for_new_process(lambda: tree.storage_node("node1"), node.pid)
        assert seconds < RESTART_SECONDS
        restarted = time.time()
        # Writes go to it again once it answers: new block files appear in its folder.
        wait_until(lambda: newest_block_mtime(blocks) > restarted, RESTART_SECONDS)
        load.wait_for_requests(100)
    failures = load.failures()
    assert all(f.status == 503 for f in failures), list(iter_failures(load))
    late = [f for f in failures if f.started > killed_at + NODE_KILL_ERROR_SECONDS]
    assert not late, statuses(late)
    written_while_down = [
        o
        for o in load.outcomes
        if o.op == "PUT" and not o.failed and killed_at < o.started < killed_at + seconds
    ]
    assert written_while_down or seconds < 1, "no write succeeded while the node was down"
    load.verify(tree.client())


def test_a_hung_storage_node_costs_seconds_and_no_errors(tree: ServeTree) -> None:
    """One node of two stops (SIGSTOP: a hung host or disk) for longer than a node request's
    token lives: writes go on with the other node and reads take its copy, each within
    seconds; none waits for the hung node, none is a 500."""
    node = tree.storage_node("node1")
    load = mixed_load(tree)
    with load:
        load.wait_for_requests(100)
        stopped_at = time.monotonic()
        try:
            stop(node.pid)
            time.sleep(HUNG_NODE_SECONDS)
        finally:
            node.send_signal(signal.SIGCONT)
        load.wait_for_requests(100)
    during = [o for o in load.outcomes if o.started + o.seconds > stopped_at]
    assert not load.failures(), list(iter_failures(load))
    slowest = max(during, key=lambda o: o.seconds)
    assert slowest.seconds < HUNG_NODE_WAIT_SECONDS, slowest
    assert any(o.op == "PUT" and o.started > stopped_at + 5 for o in during)
    load.verify(tree.client())


def test_gc_run_gives_up_a_hung_node_in_seconds_and_reclaims_its_blocks_once_it_answers(
    tree: ServeTree,
) -> None:
    """`shoal gc run` has no readiness check watching the nodes: with one node stopped, the
    run asks it its /status while its deletes wait, fails that node's records within
    seconds (exit 1), and keeps them; once the node answers, the next run reclaims them."""
    assert tree.served is not None
    wait_until_ready(tree.served)
    client, bucket = tree.client(), unique("gc-hung")
    client.create_bucket(Bucket=bucket)
    body = os.urandom(256 * 1024)  # stored in blocks on both nodes, not in its row
    keys = [f"k{n}" for n in range(4)]
    data = tree.folder / "data"

    def written_to_both_nodes() -> bool:
        """Write the keys (again): true once every version has a copy on each node (a
        gateway may still be giving node1 no blocks after the test before stopped it)."""
        nonlocal versions
        before = block_versions(data)  # the module's other tests' blocks, and earlier tries
        for key in keys:
            client.put_object(Bucket=bucket, Key=key, Body=body)
        versions = block_versions(data) - before
        return all(versions <= versions_on(data / "nodes" / n) for n in ("node0", "node1"))

    versions: set[uuid.UUID] = set()
    wait_until(written_to_both_nodes, 30)
    assert len(versions) == len(keys)
    for key in keys:
        client.delete_object(Bucket=bucket, Key=key)
    node = tree.storage_node("node1")

    def gc_run() -> tuple[subprocess.CompletedProcess[str], float]:
        started = time.monotonic()
        done = subprocess.run(
            [SHOAL, "gc", "run", "--leeway", "0s", "--config", str(tree.config)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        return done, time.monotonic() - started

    try:
        stop(node.pid)
        hung, seconds = gc_run()
        # Read before it wakes up: the deletes it was sent may still reach it, and a block
        # of a record kept for the next run may go now (that run counts it as gone).
        kept = versions & block_versions(tree.folder / "data")
    finally:
        node.send_signal(signal.SIGCONT)
    assert hung.returncode == 1, hung.stderr
    assert "failed" in hung.stdout and "Traceback" not in hung.stderr
    assert seconds < GC_HUNG_NODE_SECONDS, f"gc run took {seconds:.1f} s"
    assert kept == versions  # the hung node's copies, which only it had to delete
    answered, _ = gc_run()
    assert answered.returncode == 0, answered.stdout + answered.stderr
    assert not versions & block_versions(tree.folder / "data")


def versions_on(node_root: Path) -> set[uuid.UUID]:
    """The versions with a block file on one node."""
    return {uuid.UUID(f.name.split(".")[0]) for f in (node_root / "blocks").glob("*/*")}


def test_a_gateway_whose_nodes_stop_answering_says_503_fast(tree: ServeTree) -> None:
    nodes = [tree.storage_node("node0"), tree.storage_node("node1")]
    client = tree.client(connect_timeout=5, read_timeout=10)
    served = tree.served
    assert served is not None
    answers: list[RawResponse] = []

    def refused() -> bool:
        # New connections, which either gateway process may take: each notices at its own
        # next check (a node is given a second to answer).
        answers[:] = [raw_request(served, "GET", "/") for _ in range(6)]
        return all(a.status == 503 for a in answers) and head_status(client) == 503

    try:
        for node in nodes:
            stop(node.pid)
        wait_until(refused, 10)
        for answer in answers:
            assert answer.headers["Retry-After"] == "1"
            assert b"<Code>ServiceUnavailable</Code>" in answer.body
        started = time.monotonic()
        assert head_status(client) == 503
        took = time.monotonic() - started
        assert took < 1, f"a 503 took {took:.2f} s"  # not a wait for the nodes
    finally:
        for node in nodes:
            node.send_signal(signal.SIGCONT)
    wait_until(lambda: head_status(client) == 200, 10)


def test_a_killed_serve_tree_restarts_with_503s_until_ready_and_loses_nothing(
    tree: ServeTree,
) -> None:
    load = mixed_load(tree, max_seconds=60)
    with load:
        load.wait_for_requests(100)
        killed_at = time.monotonic()
        tree.kill_tree()
        restarting = time.monotonic()
        tree.start()
        back_at = time.monotonic()
        load.wait_for_requests(100)
    assert back_at - restarting < 60
    seen = statuses(load.failures())
    # While serve is down connections are refused (None); once it listens and until it is
    # ready, 503; never a 500 or anything else.
    assert set(seen) <= {None, 503}, list(iter_failures(load))
    late = [f for f in load.failures() if f.started > back_at + 1]
    assert not late, statuses(late)
    assert any(o.started > killed_at and not o.failed for o in load.outcomes)
    load.verify(tree.client())


def gone(process: psutil.Process) -> bool:
    """Exited (a zombie until its parent reaps it)."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def head_status(client: object) -> int | None:
    import botocore.exceptions

    try:
        client.head_bucket(Bucket="kills")  # type: ignore[attr-defined]
        return 200
    except botocore.exceptions.ClientError as exc:
        return int(exc.response["ResponseMetadata"]["HTTPStatusCode"])
    except botocore.exceptions.BotoCoreError:
        return None


def newest_block_mtime(blocks: Path) -> float:
    """When the newest block file was written; a file removed since it was listed (the block
    of a failed write, deleted) counts for nothing."""
    newest = 0.0
    for file in blocks.glob("*/*"):
        with contextlib.suppress(FileNotFoundError):
            newest = max(newest, file.stat().st_mtime)
    return newest


def _clients_of(process: psutil.Process, port: int) -> list[Any]:
    """The client connections to `port` that `process` holds."""
    return [
        c
        for c in process.net_connections("tcp")
        if c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED
    ]
