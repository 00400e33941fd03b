"""A storage node that writes blocks by O_DIRECT ([storage] direct_writes), killed with
kill -9 in the middle of a block: after its restart the half-written block is nowhere (not
readable, nothing of it left in tmp/), the block acknowledged before it is whole, and the
same block can be written again."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import pytest

from shoal.ids import uuid7
from shoal.storage import BlockMissing, block_name
from shoal.storage.blockfile import checksum_of
from tests.fault.load import wait_until
from tests.fixtures.storage import MakeStorage, NodeProcess, files_in_tmp, node_token

MiB = 1024 * 1024


def bytes_in_tmp(node: NodeProcess) -> int:
    """What the node's temporary files hold: blocks being written, and empty spares."""
    return sum(path.stat().st_size for path in files_in_tmp(node.root))


def test_a_node_killed_mid_direct_write_keeps_only_whole_blocks(
    make_storage: MakeStorage, run: Callable[..., Any]
) -> None:
    cluster = make_storage(nodes=1, direct_writes=True)
    node = cluster.nodes[0]
    if not node.readiness()[1].get("direct_writes"):
        pytest.skip(f"the file system under {node.root} refuses O_DIRECT")
    kept, kept_data = block_name(uuid7(), 0), os.urandom(3 * MiB + 5)
    assert run(cluster.client.put_block(node.url, kept, kept_data))

    # Half of a 4 MiB block, sent by hand so that the rest never comes.
    name, data = block_name(uuid7(), 0), os.urandom(4 * MiB)
    checksum, path = checksum_of(data), f"/blocks/{name}"
    headers = {"X-Shoal-Checksum": checksum}
    token = node_token(cluster.secret, node.url, "PUT", path, body=data, headers=headers)
    head = (
        f"PUT {path} HTTP/1.1\r\nHost: 127.0.0.1:{node.port}\r\n"
        f"Content-Length: {len(data)}\r\nX-Shoal-Checksum: {checksum}\r\n"
        f"Authorization: {token}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", node.port)) as connection:
        connection.sendall(head.encode() + data[: 2 * MiB])
        wait_until(lambda: bytes_in_tmp(node) >= MiB, 20, 0.05)  # a piece is on the disk
        node.kill()

    cluster.restart(node, run)
    with pytest.raises(BlockMissing):
        run(cluster.client.get_block(node.url, name))
    assert bytes_in_tmp(node) == 0  # only empty spares, if any, made since the restart
    assert run(cluster.client.get_block(node.url, kept)) == kept_data
    assert run(cluster.client.put_block(node.url, name, data))
    assert run(cluster.client.get_block(node.url, name)) == data
