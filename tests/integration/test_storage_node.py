"""The storage node's HTTP service: tokens, names, ranges, inventory, status, registry, worker
processes."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from yarl import URL

from shoal.cluster import MIN_FREE_BYTES, RegistryDirectory
from shoal.ids import uuid7
from shoal.storage import BlockClient, BlockMissing, NodeUnavailable, block_name
from shoal.storage.blockfile import HEADER, SPARE_FILES, checksum_of
from shoal.storage.datapath import BlockRun
from shoal.workers import listening_socket
from tests.fixtures.storage import (
    MakeStorage,
    StorageCluster,
    files_in_tmp,
    head_block,
    node_token,
)

SHOAL = str(Path(sys.executable).parent / "shoal")


@pytest.fixture(scope="module")
def cluster(make_storage: MakeStorage) -> StorageCluster:
    return make_storage(nodes=2)


async def raw(
    cluster: StorageCluster, method: str, path: str, token: str | None = "good", **kwargs: Any
) -> tuple[int, bytes]:
    """One HTTP request with an exact path (no client-side normalization)."""
    node = cluster.nodes[0]
    headers = kwargs.pop("headers", {})
    if token == "good":
        body = kwargs.get("data", b"")
        target = URL(path, encoded=True)
        headers["Authorization"] = node_token(
            cluster.secret,
            node.url,
            method,
            target.path,
            query=target.raw_query_string,
            body=body,
            headers=headers,
        )
    elif token is not None:
        headers["Authorization"] = token
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, URL(node.url + path, encoded=True), headers=headers, **kwargs
        ) as response,
    ):
        return response.status, await response.read()


@pytest.mark.parametrize(
    "path",
    [
        "/blocks/..%2F..%2Fetc%2Fpasswd",
        "/blocks/%2Fetc%2Fpasswd",
        "/blocks/abc%00.0",
        "/blocks/..",
        "/blocks/0192f0e0-0000-7000-8000-000000000000.0%2F..",
        "/blocks/0192F0E0-0000-7000-8000-000000000000.0",
    ],
    ids=["dotdot-slash", "absolute", "nul", "dotdot", "trailing-slash", "uppercase"],
)
def test_names_outside_the_block_namespace_are_refused(
    cluster: StorageCluster, run: Any, path: str
) -> None:
    status, _ = run(raw(cluster, "GET", path))
    assert status in (400, 404)
    status, _ = run(
        raw(
            cluster,
            "PUT",
            path,
            data=b"x",
            headers={"X-Shoal-Checksum": checksum_of(b"x")},
        )
    )
    assert status in (400, 404, 405)
    for node in cluster.nodes:
        assert not (node.root / "etc").exists()


@pytest.mark.parametrize(
    "token",
    [None, "Shoal-Token 99999999999:00", "Bearer x", "Shoal-Token 1:deadbeef"],
    ids=["missing", "forged", "other-scheme", "expired"],
)
def test_requests_without_a_valid_token_are_refused(
    cluster: StorageCluster, run: Any, token: str | None
) -> None:
    assert run(raw(cluster, "GET", "/status", token=token))[0] == 401


def test_a_token_opens_only_its_own_method_and_path(cluster: StorageCluster, run: Any) -> None:
    url = cluster.nodes[0].url
    token = node_token(cluster.secret, url, "GET", "/status")
    assert run(raw(cluster, "GET", "/status", token=token))[0] == 200
    assert run(raw(cluster, "GET", "/inventory", token=token))[0] == 401
    other = node_token(b"another cluster's secret", url, "GET", "/status")
    assert run(raw(cluster, "GET", "/status", token=other))[0] == 401


def test_put_verifies_and_never_overwrites(cluster: StorageCluster, run: Any) -> None:
    name = block_name(uuid7(), 0)
    data = os.urandom(1000)
    good = {"X-Shoal-Checksum": checksum_of(data)}
    assert run(raw(cluster, "PUT", f"/blocks/{name}", data=data[:-1], headers=good))[0] == 422
    assert run(raw(cluster, "GET", f"/blocks/{name}"))[0] == 404
    assert run(raw(cluster, "PUT", f"/blocks/{name}", data=data, headers=good))[0] == 201
    assert run(raw(cluster, "PUT", f"/blocks/{name}", data=data, headers=good))[0] == 200
    other = os.urandom(1000)
    conflict = {"X-Shoal-Checksum": checksum_of(other)}
    assert run(raw(cluster, "PUT", f"/blocks/{name}", data=other, headers=conflict))[0] == 409
    assert run(raw(cluster, "GET", f"/blocks/{name}")) == (200, data)
    # A folder per worker process, holding no block's bytes: only the empty files made ahead
    # for the next writes.
    left = files_in_tmp(cluster.nodes[0].root)
    assert all(path.stat().st_size == 0 for path in left) and len(left) <= SPARE_FILES


def test_ranges_head_and_idempotent_delete(cluster: StorageCluster, run: Any) -> None:
    name = block_name(uuid7(), 3)
    data = os.urandom(5000)
    url = cluster.nodes[0].url
    assert run(cluster.client.put_block(url, name, data))
    for header, expected in [
        ("bytes=0-0", data[:1]),
        ("bytes=4999-", data[4999:]),
        ("bytes=-10", data[-10:]),
        ("bytes=100-199", data[100:200]),
        ("bytes=4000-99999", data[4000:]),
    ]:
        assert run(raw(cluster, "GET", f"/blocks/{name}", headers={"Range": header})) == (
            206,
            expected,
        )
    assert run(raw(cluster, "GET", f"/blocks/{name}", headers={"Range": "bytes=5000-"}))[0] == 416
    assert head_block(cluster.secret, url, name) == (5000, checksum_of(data))
    run(cluster.client.delete_block(url, name))
    run(cluster.client.delete_block(url, name))  # already gone: still fine
    with pytest.raises(BlockMissing):
        run(cluster.client.get_block(url, name))


def test_inventory_pages_and_status(cluster: StorageCluster, run: Any) -> None:
    node = cluster.nodes[1]
    before = run(cluster.client.status(node.url)).block_count
    version = uuid7()
    blocks = {block_name(version, i): os.urandom(100 + i) for i in range(25)}
    for name, data in blocks.items():
        run(cluster.client.put_block(node.url, name, data))

    async def everything() -> list[Any]:
        return [b async for b in cluster.client.inventory(node.url, page_size=7)]

    listed = {b.name: b for b in run(everything())}
    for name, data in blocks.items():
        assert listed[name].size == len(data)
        assert listed[name].checksum == checksum_of(data)
    status = run(cluster.client.status(node.url))
    assert status.block_count == before + 25 == len(listed)
    assert status.shark == node.shark and 0 < status.free_bytes <= status.capacity_bytes
    assert run(cluster.client.delete_blocks(node.url, [*blocks, block_name(version, 99)])) == 25
    assert run(cluster.client.status(node.url)).block_count == before


def test_silent_or_full_nodes_receive_no_new_blocks(make_storage: MakeStorage, run: Any) -> None:
    cluster = make_storage(nodes=3)
    directory = RegistryDirectory(cluster.store, timedelta(seconds=30), cluster.client)
    assert len(run(directory.writable_nodes())) == 3
    silent, full = cluster.nodes[0], cluster.nodes[1]
    # Stopped, not killed: a killed node's heartbeat in flight could land after the UPDATEs
    # below and undo them.
    silent.stop()
    full.stop()

    async def age_and_fill() -> None:
        async with cluster.store.shards.catalog.pool.connection() as conn:
            await conn.execute(
                "UPDATE shoal.storage_node SET heartbeat = current_timestamp - interval '1 hour'"
                " WHERE name = %s",
                (silent.name,),
            )
            await conn.execute(
                "UPDATE shoal.storage_node SET free_bytes = %s WHERE name = %s",
                (MIN_FREE_BYTES - 1, full.name),
            )

    run(age_and_fill())
    fresh = RegistryDirectory(cluster.store, timedelta(seconds=30), cluster.client)
    assert [n.name for n in run(fresh.writable_nodes())] == [cluster.nodes[2].name]
    # A silent node is still known for reads of what it holds.
    assert run(fresh.url_of(silent.shark)) == silent.url


def child_pids(pid: int) -> set[int]:
    children: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        children |= {int(p) for p in (task / "children").read_text().split()}
    return children


def test_worker_processes_share_the_port_the_count_and_the_node_s_fate(
    make_storage: MakeStorage, run: Any
) -> None:
    cluster = make_storage(nodes=1, node_workers=3)
    node = cluster.nodes[0]
    deadline = time.monotonic() + 60
    while not all((node.root / "tmp" / f"w{i}").is_dir() for i in range(3)):
        assert time.monotonic() < deadline, "the worker processes did not start"
        time.sleep(0.1)
    workers = child_pids(node.process.pid)
    assert len(workers) >= 2  # (and multiprocessing's resource tracker)
    version = uuid7()
    blocks = {block_name(version, i): os.urandom(70_000 + i) for i in range(48)}

    async def put_each_on_a_new_connection() -> None:
        async def put(name: str, data: bytes) -> None:
            client = BlockClient(cluster.secret)  # a connection of its own: any process
            try:
                assert await client.put_block(node.url, name, data)
            finally:
                await client.close()

        await asyncio.gather(*(put(name, data) for name, data in blocks.items()))

    run(put_each_on_a_new_connection())
    for name, data in blocks.items():
        assert run(cluster.client.get_block(node.url, name)) == data
    assert run(cluster.client.status(node.url)).block_count == len(blocks)
    assert run(cluster.client.delete_blocks(node.url, list(blocks)[:10])) == 10
    assert run(cluster.client.status(node.url)).block_count == len(blocks) - 10

    node.kill()  # kill -9 of the node process: its workers must not keep serving
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in workers):
        assert time.monotonic() < deadline, "worker processes outlived their node"
        time.sleep(0.1)
    with pytest.raises(NodeUnavailable):
        run(cluster.client.status(node.url))
    cluster.restart(node, run)
    assert run(cluster.client.status(node.url)).block_count == len(blocks) - 10


def test_a_kept_connection_the_node_dropped_is_replaced(
    make_storage: MakeStorage, run: Any
) -> None:
    cluster = make_storage(nodes=1)
    node = cluster.nodes[0]
    client = BlockClient(cluster.secret)  # its own pool: one kept connection to the node
    first, second = block_name(uuid7(), 0), block_name(uuid7(), 1)
    try:
        assert run(client.put_block(node.url, first, b"before")) is True
        node.kill()  # the kept connection now leads nowhere
        cluster.restart(node, run)
        assert run(client.put_block(node.url, second, b"after")) is True
        assert run(client.get_block(node.url, first)) == b"before"
    finally:
        run(client.close())


async def exchange(url: str, requests: list[bytes]) -> list[bytes]:
    """Requests sent one after the other on one connection; each response's head."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    heads = []
    try:
        for request in requests:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(
                next(
                    (
                        line.split(b":")[1]
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    b"0",
                )
            )
            await reader.readexactly(length)
            heads.append(head)
    finally:
        writer.close()
    return heads


def test_a_refused_body_is_read_and_the_connection_kept(cluster: StorageCluster, run: Any) -> None:
    name = block_name(uuid7(), 0)
    path = f"/blocks/{name}"
    url = cluster.nodes[0].url
    host = URL(url).raw_authority
    put = node_token(
        cluster.secret, url, "PUT", path, body=bytes(5000), headers={"X-Shoal-Checksum": "nope"}
    )
    bad_checksum = (
        f"PUT {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: {put}"
        "\r\nX-Shoal-Checksum: nope\r\nContent-Length: 5000\r\n\r\n"
    ).encode() + bytes(5000)
    status = (
        f"GET /status HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: {node_token(cluster.secret, url, 'GET', '/status')}\r\n\r\n"
    ).encode()
    first, second = run(exchange(cluster.nodes[0].url, [bad_checksum, status]))
    assert first.startswith(b"HTTP/1.1 400") and b"Connection: close" not in first
    assert second.startswith(b"HTTP/1.1 200")


def test_an_unauthenticated_body_closes_the_connection(cluster: StorageCluster, run: Any) -> None:
    request = (
        f"PUT /blocks/{block_name(uuid7(), 0)} HTTP/1.1\r\nHost: node\r\n"
        "Content-Length: 5000\r\n\r\n"
    ).encode()
    (head,) = run(exchange(cluster.nodes[0].url, [request]))
    assert head.startswith(b"HTTP/1.1 401") and b"Connection: close" in head


@pytest.mark.parametrize(
    "request_head, status",
    [
        (b"GET /status\r\n\r\n", b"400"),
        (b"GET /status HTTP/1.0\r\n\r\n", b"400"),
        (b"GET /status HTTP/1.1\r\nno colon here\r\n\r\n", b"400"),
        (b"GET /status HTTP/1.1\r\n" + b"X-Many: 1\r\n" * 100 + b"\r\n", b"431"),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", b"400"),
    ],
    ids=["no-version", "http-1.0", "bad-header", "too-many-headers", "long-line"],
)
def test_malformed_requests_get_an_error_and_the_connection_closes(
    cluster: StorageCluster, run: Any, request_head: bytes, status: bytes
) -> None:
    (head,) = run(exchange(cluster.nodes[0].url, [request_head]))
    assert head.startswith(b"HTTP/1.1 " + status) and b"Connection: close" in head


def test_a_client_can_be_used_from_one_event_loop_after_another(cluster: StorageCluster) -> None:
    """Pipeline tasks run node I/O in loops of their own, closing the client in each."""
    client = BlockClient(cluster.secret)
    url = cluster.nodes[0].url

    async def status_then_close() -> str:
        try:
            return (await client.status(url)).name
        finally:
            await client.close()

    assert asyncio.run(status_then_close()) == asyncio.run(status_then_close())


def test_nodes_with_direct_writes_store_and_serve_objects_whole(
    make_storage: MakeStorage, run: Any
) -> None:
    """[storage] direct_writes: blocks written by O_DIRECT, by the node process and its
    workers alike, read back whole and in ranges; /ready says the setting is in effect."""
    cluster = make_storage(nodes=2, node_workers=2, direct_writes=True)
    for node in cluster.nodes:
        status, report = node.readiness()
        assert status == 200
        if not report["direct_writes"]:
            pytest.skip(f"the file system under {node.root} refuses O_DIRECT")
    path = cluster.data_path(replicas=2)
    lengths: dict[str, int] = {}  # block name -> its data's length
    for size in (5000, 4 * 1024 * 1024 + 1, 9 * 1024 * 1024 + 12345):
        data = os.urandom(size)
        version = uuid7()

        async def chunks(body: bytes = data) -> AsyncIterator[bytes]:
            for start in range(0, len(body), 300_000):
                yield body[start : start + 300_000]

        result = run(path.write(version, chunks()))
        block = BlockRun(version, result.size, result.block_size, result.sharks)

        async def read(run_: BlockRun, start: int = 0, end: int | None = None) -> bytes:
            return b"".join([piece async for piece in path.read([run_], start, end)])

        assert run(read(block)) == data
        assert run(read(block, size // 3, size - 7)) == data[size // 3 : size - 7]
        for index, name in enumerate(block.block_names()):
            lengths[name] = min(block.block_size, size - index * block.block_size)
    for node in cluster.nodes:  # each block's last write was padded, then cut back
        files = node.block_files()
        assert sorted(f.name for f in files) == sorted(lengths)
        for file in files:
            assert file.stat().st_size == HEADER.size + lengths[file.name]


def test_a_node_refuses_an_inherited_descriptor_that_is_not_its_listener(
    make_storage: MakeStorage, tmp_path: Path
) -> None:
    """`--listen-fd` (how `shoal serve` and the tests start nodes on sockets they bound)
    takes only a listening socket on --port: anything else is one line and exit 1."""
    cluster = make_storage(nodes=1)
    port = cluster.nodes[0].port  # a port the node's socket is not on
    with (
        listening_socket("127.0.0.1", 0) as elsewhere,
        socket.socket(socket.AF_INET, socket.SOCK_STREAM) as unbound,
        open(tmp_path / "file", "w") as file,
    ):
        cases = {
            elsewhere.fileno(): f"listens on port {elsewhere.getsockname()[1]}, not {port}",
            unbound.fileno(): "is not a listening TCP socket",
            file.fileno(): "is not an open socket",
            1000: "is not an open socket",
        }
        for fd, said in cases.items():
            node = ("--dir", str(tmp_path / "n9"), "--name", "n9", "--port", str(port))
            result = subprocess.run(
                [
                    SHOAL,
                    "storage-node",
                    "--config",
                    str(cluster.config_file),
                    *node,
                    "--listen-fd",
                    str(fd),
                ],
                capture_output=True,
                text=True,
                pass_fds=(fd,) if fd != 1000 else (),
                timeout=60,
            )
            assert result.returncode == 1, result.stderr
            assert result.stderr == f"shoal: error: file descriptor {fd} {said}\n"
