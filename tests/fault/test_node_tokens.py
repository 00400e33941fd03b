"""A captured storage-node request, replayed and altered: the node refuses all but the genuine
request, and that one only once (docs/durability.md, "Traffic and files inside Shoal").

The nodes run two processes each, so replays on new connections meet both of them.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any
from urllib.parse import urlsplit

import pytest

from shoal.ids import uuid7
from shoal.storage import block_name
from shoal.storage.auth import Signed, sign
from shoal.storage.blockfile import checksum_of
from tests.fixtures.storage import MakeStorage, StorageCluster, head_block, node_token

REPLAYS = 8  # each on a new connection: the kernel deals them over the node's processes


@pytest.fixture(scope="module")
def cluster(make_storage: MakeStorage) -> StorageCluster:
    return make_storage(nodes=2, node_workers=2)


def request(
    url: str, method: str, target: str, token: str, body: bytes = b"", **headers: str
) -> bytes:
    """The exact bytes of one request, as an eavesdropper would capture them."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {urlsplit(url).netloc}"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    lines += [f"Authorization: {token}", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def send(url: str, raw: bytes) -> tuple[int, bytes]:
    """One request on a connection of its own: the status and body of the answer."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        writer.write(raw)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        return int(head.split(b" ")[1]), await reader.readexactly(length)
    finally:
        writer.close()


def store_blocks(cluster: StorageCluster, run: Any, count: int) -> list[str]:
    """`count` blocks, each on both nodes."""
    names = [block_name(uuid7(), 0) for _ in range(count)]
    for name in names:
        for node in cluster.nodes:
            run(cluster.client.put_block(node.url, name, os.urandom(5000)))
    return names


def present(cluster: StorageCluster, url: str, name: str) -> bool:
    return head_block(cluster.secret, url, name) is not None


def delete_request(cluster: StorageCluster, url: str, names: list[str], token: str) -> bytes:
    body = json.dumps({"names": names}).encode()
    return request(url, "POST", "/blocks/delete", token, body, Content_Type="application/json")


def test_a_captured_delete_works_once_and_cannot_become_another(
    cluster: StorageCluster, run: Any
) -> None:
    a, b = store_blocks(cluster, run, 2)
    url, other_node = cluster.nodes[0].url, cluster.nodes[1].url
    body = json.dumps({"names": [a]}).encode()
    token = node_token(cluster.secret, url, "POST", "/blocks/delete", body=body)
    genuine = delete_request(cluster, url, [a], token)

    # Altered before the genuine request arrives: each is refused for what it changed.
    altered = {
        "body (block B)": delete_request(cluster, url, [b], token),
        "body (A and B)": delete_request(cluster, url, [a, b], token),
        "query": request(url, "POST", "/blocks/delete?names=" + b, token, body),
        "path": request(url, "DELETE", f"/blocks/{b}", token),
    }
    for what, raw in altered.items():
        status, answer = run(send(url, raw))
        assert (status, answer) == (401, b"bad signature"), what
    # The same request to the other node, which holds replicas of both blocks.
    status, answer = run(send(other_node, genuine))
    assert status == 401 and b"another node" in answer
    assert present(cluster, url, a) and present(cluster, url, b)
    assert present(cluster, other_node, a)

    status, answer = run(send(url, genuine))
    assert status == 200 and json.loads(answer) == {"deleted": 1, "missing": 0}
    assert not present(cluster, url, a)

    for _ in range(REPLAYS):
        assert run(send(url, genuine)) == (401, b"token already used")
    assert run(send(url, delete_request(cluster, url, [b], token)))[0] == 401
    assert present(cluster, url, b) and present(cluster, other_node, a)


def test_an_expired_token_is_refused(cluster: StorageCluster, run: Any) -> None:
    (a,) = store_blocks(cluster, run, 1)
    url = cluster.nodes[0].url
    body = json.dumps({"names": [a]}).encode()
    signed = Signed.request(urlsplit(url).netloc, "POST", "/blocks/delete", body=body)
    old = sign(cluster.secret, signed, now=time.time() - 60)
    assert run(send(url, delete_request(cluster, url, [a], old))) == (401, b"expired token")
    assert present(cluster, url, a)


def test_a_captured_query_opens_no_other_query(cluster: StorageCluster, run: Any) -> None:
    url = cluster.nodes[0].url
    token = node_token(cluster.secret, url, "GET", "/inventory", query="after=&limit=1")
    wider = request(url, "GET", "/inventory?after=&limit=10000", token)
    assert run(send(url, wider)) == (401, b"bad signature")
    status, answer = run(send(url, request(url, "GET", "/inventory?after=&limit=1", token)))
    assert status == 200 and len(json.loads(answer)["blocks"]) <= 1
    status, _ = run(send(url, request(url, "GET", "/inventory?after=&limit=1", token)))
    assert status == 401


def test_a_captured_block_write_cannot_write_other_bytes_or_another_block(
    cluster: StorageCluster, run: Any
) -> None:
    url = cluster.nodes[0].url
    name, other_name = block_name(uuid7(), 0), block_name(uuid7(), 0)
    data, other = os.urandom(5000), os.urandom(5000)
    checksum = checksum_of(data)
    headers = {"X-Shoal-Checksum": checksum}
    token = node_token(cluster.secret, url, "PUT", f"/blocks/{name}", body=data, headers=headers)

    def put(target: str, body: bytes, block_checksum: str, token: str) -> tuple[int, bytes]:
        raw = request(url, "PUT", target, token, body, X_Shoal_Checksum=block_checksum)
        return run(send(url, raw))  # type: ignore[no-any-return]

    # Other bytes with their own checksum: the token bound the first checksum.
    assert put(f"/blocks/{name}", other, checksum_of(other), token) == (401, b"bad signature")
    # Another block.
    assert put(f"/blocks/{other_name}", data, checksum, token) == (401, b"bad signature")
    # Other bytes under the captured checksum: the node checks the bytes against it (this
    # uses up a token of its own: a token is spent when it is accepted, whatever follows).
    spare = node_token(cluster.secret, url, "PUT", f"/blocks/{name}", body=data, headers=headers)
    assert put(f"/blocks/{name}", other, checksum, spare)[0] == 422
    assert not present(cluster, url, name) and not present(cluster, url, other_name)
    # The genuine write, once.
    assert put(f"/blocks/{name}", data, checksum, token)[0] == 201
    assert put(f"/blocks/{name}", data, checksum, token) == (401, b"token already used")
    assert run(cluster.client.get_block(url, name)) == data
