"""A storage node that stops answering, seen from the data path and from readiness: it is
marked unreachable at its first refused connection (not after the heartbeat deadline), writes
go on without it, reads that reach no replica are retryable, and it is chosen again once it
answers."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from datetime import timedelta
from typing import Any

import pytest

from shoal.cluster import RegistryDirectory
from shoal.ids import uuid7
from shoal.pipeline import io
from shoal.readiness import Readiness
from shoal.storage import (
    BlockRun,
    ClientSettings,
    DataPath,
    DataUnavailable,
    NodeError,
    ReplicasUnreachable,
    StorageUnavailable,
    block_name,
    names_by_node,
)
from tests.fixtures.processes import stop
from tests.fixtures.storage import HEARTBEAT_DEADLINE, MakeStorage, StorageCluster, start_node

MiB = 1024 * 1024


async def one_chunk(data: bytes) -> Any:
    yield data


async def collect(path: DataPath, run: BlockRun) -> bytes:
    return b"".join([chunk async for chunk in path.read([run])])


def wait_for(check: Any, run: Any, timeout: float) -> None:
    """Until `check()`, the loop running meanwhile (the directory probes in the background)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not true within {timeout} s"
        run(asyncio.sleep(0.1))


@pytest.fixture
def cluster(make_storage: MakeStorage) -> StorageCluster:
    return make_storage(nodes=2)


def test_a_killed_node_is_marked_at_once_and_chosen_again_when_it_answers(
    cluster: StorageCluster, run: Any
) -> None:
    directory = RegistryDirectory(cluster.store, HEARTBEAT_DEADLINE, cluster.client)
    path = DataPath(cluster.client, directory, block_size=MiB)  # replicas: the default
    dead, alive = cluster.nodes
    dead.kill()
    data = os.urandom(3 * MiB)

    # The registry still says both are alive: the first write tries both, loses one, and
    # goes on with one copy (the default number of copies is what the nodes allow).
    first = run(path.write(uuid7(), one_chunk(data)))
    assert first.sharks == [alive.shark]
    assert directory.unreachable(dead.shark)
    assert [n.shark for n in run(directory.writable_nodes())] == [alive.shark]
    second = run(path.write(uuid7(), one_chunk(data)))
    assert second.sharks == [alive.shark]

    cluster.restart(dead, run)
    wait_for(lambda: len(run(directory.writable_nodes())) == 2, run, 5)
    assert not directory.unreachable(dead.shark)
    third = run(path.write(uuid7(), one_chunk(data)))
    assert sorted(third.sharks) == sorted([dead.shark, alive.shark])


def test_a_configured_number_of_copies_is_not_lowered(cluster: StorageCluster, run: Any) -> None:
    path = cluster.data_path(replicas=2)
    cluster.nodes[0].kill()
    with pytest.raises(StorageUnavailable):
        run(path.write(uuid7(), one_chunk(os.urandom(MiB))))


def test_reads_that_reach_no_replica_are_retryable_and_missing_blocks_are_not(
    cluster: StorageCluster, run: Any
) -> None:
    path = cluster.data_path(replicas=1)
    data = os.urandom(MiB + 10)
    version = uuid7()
    written = run(path.write(version, one_chunk(data)))
    holder = cluster.node(written.sharks[0])
    other = next(n for n in cluster.nodes if n is not holder)
    stored = BlockRun(version, written.size, written.block_size, written.sharks)
    assert run(collect(path, stored)) == data

    # Asked of a node that answers and does not have it, nor has any other: not there.
    nowhere = BlockRun(uuid7(), written.size, written.block_size, [other.shark])
    with pytest.raises(DataUnavailable) as missing:
        run(collect(path, nowhere))
    assert not isinstance(missing.value, ReplicasUnreachable)

    # Its only replica does not answer: it may well be whole there (503, not 500).
    holder.kill()
    with pytest.raises(ReplicasUnreachable):
        run(collect(path, stored))
    # One replica unreachable, the other answering that it lacks the block: the unreachable
    # one may hold it, so this is retryable too.
    both = BlockRun(version, written.size, written.block_size, [holder.shark, other.shark])
    with pytest.raises(ReplicasUnreachable):
        run(collect(path, both))
    assert path.directory.unreachable(holder.shark)


def test_readiness_needs_the_shards_and_enough_nodes_to_write(
    cluster: StorageCluster, run: Any
) -> None:
    def readiness(replicas: int | None) -> Readiness:
        return Readiness(cluster.store, cluster.client, timedelta(seconds=30), replicas)

    default, two = readiness(None), readiness(2)
    for state in (default, two):
        run(state.refresh())
        assert state.ready, state.reason
    cluster.nodes[0].kill()
    run(default.refresh())
    run(two.refresh())
    assert default.ready  # one node takes a write of the default number of copies
    assert not two.ready and "1 storage node(s) answer, 2 needed" in two.reason
    assert not run(two.confirm())
    cluster.nodes[1].kill()
    run(default.refresh())
    assert not default.ready
    cluster.restart(cluster.nodes[0], run)
    assert run(default.confirm())  # checked again at once, not at the next round


def test_a_node_that_hangs_is_marked_at_its_first_missed_check_and_given_up_at_its_second(
    cluster: StorageCluster, run: Any
) -> None:
    directory = RegistryDirectory(cluster.store, HEARTBEAT_DEADLINE, cluster.client)
    path = DataPath(cluster.client, directory, block_size=MiB)
    readiness = Readiness(
        cluster.store, cluster.client, timedelta(seconds=30), None, node_silent=path.node_silent
    )
    hung = cluster.nodes[0]
    data = os.urandom(2 * MiB)
    version = uuid7()
    written = run(path.write(version, one_chunk(data)))
    assert len(written.sharks) == 2  # each of the two blocks is read first from another node
    blocks = BlockRun(version, len(data), MiB, written.sharks)

    async def read_while_checked() -> tuple[bytes, float]:
        started = time.monotonic()
        reading = asyncio.ensure_future(collect(path, blocks))
        await readiness.refresh()  # the first missed check: marked, its request left waiting
        assert directory.unreachable(hung.shark) and not reading.done()
        await readiness.refresh()  # the second: the request waiting on it is given up
        return await asyncio.wait_for(reading, 10), time.monotonic() - started

    try:
        stop(hung.process.pid)  # every thread stopped: it answers nothing sent from now on
        got, seconds = run(read_while_checked())
    finally:
        hung.process.send_signal(signal.SIGCONT)
    assert got == data and seconds < 10  # not the node client's 60 s


def test_deletes_on_a_node_that_hangs_are_given_up_in_seconds(
    cluster: StorageCluster, run: Any
) -> None:
    """What GC and the pipeline's tasks do, with no readiness check watching the nodes: the
    node is asked its /status while their deletes are out, and a hung one fails them within
    seconds (BlockClient.while_answering), not the node client's 60 s. The other node's
    blocks go; the hung node's wait for a later pass. A second pass finds the node marked
    and fails at once."""
    directory = RegistryDirectory(cluster.store, HEARTBEAT_DEADLINE, cluster.client)
    path = DataPath(cluster.client, directory, block_size=MiB, replicas=2)
    hung, alive = cluster.nodes
    versions = [uuid7() for _ in range(3)]
    written = [run(path.write(v, one_chunk(os.urandom(MiB)))) for v in versions]
    runs = [BlockRun(v, MiB, MiB, w.sharks) for v, w in zip(versions, written, strict=True)]
    names = names_by_node(runs)
    assert sorted(names) == sorted([hung.shark, alive.shark])
    access = ClientSettings(cluster.secret)
    rows = [(n.shark, n.url, name, name) for n in cluster.nodes for name in names[n.shark]]
    # Enough names for three rounds of requests to the hung node: only the first is sent.
    rows += [(hung.shark, hung.url, block_name(uuid7(), 0), None) for _ in range(9000)]

    def timed(work: Any) -> tuple[Any, float]:
        started = time.monotonic()
        return work(), time.monotonic() - started

    try:
        stop(hung.process.pid)
        first, first_seconds = timed(lambda: run(path.delete_names(names)))
        again, again_seconds = timed(lambda: run(path.delete_names(names)))
        # The pipeline's orphan deletes: a client of their own, no directory.
        orphans, orphans_seconds = timed(lambda: list(io.delete_blocks(rows, access)))
    finally:
        hung.process.send_signal(signal.SIGCONT)
    assert first.failed_nodes == [hung.shark] and first.deleted == 3
    assert "did not answer 2 checks" in first.reasons[hung.shark]
    assert first_seconds < 10  # two missed checks of a second each, and their wait
    assert again.failed_nodes == [hung.shark] and again_seconds < 3
    failed = [outcome for outcome in orphans if not outcome[1]]
    assert {outcome[3] for outcome in failed} == {hung.shark} and len(failed) == 10
    assert orphans_seconds < 6  # one round's checks, not three rounds'
    assert run(path.delete_names(names)).complete  # once it answers, the rest go
    assert hung.block_files() == []


def test_the_pipelines_reads_of_a_node_that_hangs_end_in_seconds(
    cluster: StorageCluster, run: Any
) -> None:
    """The audit's block reads and every job's inventory read: a node that hangs is found
    out within seconds, not after the node client's 60 s a read."""
    path = DataPath(
        cluster.client,
        RegistryDirectory(cluster.store, HEARTBEAT_DEADLINE, cluster.client),
        block_size=MiB,
        replicas=2,
    )
    hung, alive = cluster.nodes
    versions = [uuid7() for _ in range(40)]
    for version in versions:
        run(path.write(version, one_chunk(os.urandom(64 * 1024))))
    access = ClientSettings(cluster.secret)
    rows = [(n.shark, n.url, block_name(v, 0)) for v in versions for n in cluster.nodes]
    started = time.monotonic()
    try:
        stop(hung.process.pid)
        verdicts = list(io.verify_blocks(rows, access))
        read_seconds = time.monotonic() - started
        with pytest.raises(NodeError, match=f"{hung.shark}: its inventory could not be read"):
            list(io._inventory([(hung.shark, hung.url)], access))
        inventory_seconds = time.monotonic() - started - read_seconds
    finally:
        hung.process.send_signal(signal.SIGCONT)
    by_node = {
        shark: {v for s, _, v in verdicts if s == shark} for shark in (hung.shark, alive.shark)
    }
    assert by_node == {hung.shark: {"unreachable"}, alive.shark: {"ok"}}
    assert read_seconds < 10 and inventory_seconds < 10


def test_a_worker_takes_connections_once_ready_or_stopping(
    cluster: StorageCluster, run: Any
) -> None:
    """What a gateway worker process waits for before it serves (`serving_or_stopped`): the
    checks in the background finding it ready, or its stop."""
    down = cluster.nodes[0]
    down.kill()

    async def wait_for_the_node() -> None:
        state = Readiness(cluster.store, cluster.client, timedelta(seconds=30), 2)
        async with state.checking():
            waiting = asyncio.ensure_future(state.serving_or_stopped(asyncio.Event()))
            await asyncio.sleep(1.5)  # a check in the background has run meanwhile
            assert not waiting.done() and not state.serving, state.reason
            # Not cluster.restart: it waits by running the loop this coroutine runs on.
            restarted = start_node(
                cluster, down.name, down.datacenter, down.root.parent, down.port, down.admin_port
            )
            down.process = restarted.process
            await asyncio.wait_for(waiting, 60)  # a node process's start, on any load
            assert state.serving

    async def stop_while_waiting() -> None:
        state = Readiness(cluster.store, cluster.client, timedelta(seconds=30), 2)
        stop = asyncio.Event()
        async with state.checking():
            waiting = asyncio.ensure_future(state.serving_or_stopped(stop))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            stop.set()
            await asyncio.wait_for(waiting, 1)
            assert not state.serving

    run(wait_for_the_node())
    down.kill()
    run(stop_while_waiting())
