"""The node client against a server on loopback that answers wrongly on purpose: bodies cut
short, bodies too large to allocate, heads that never end, replies split in tiny pieces,
bytes changed on the way."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from shoal.storage import BlockClient, NodeUnavailable, NodeUnreachable
from shoal.storage.blockfile import checksum_of
from shoal.storage.client import MAX_BODY_BYTES, MAX_HEAD_BYTES, BlockCorrupted
from shoal.storage.datapath import reuse_block_memory

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
SECRET = b"s" * 32


@asynccontextmanager
async def node_answering(answer: Answer) -> AsyncIterator[str]:
    """A server on 127.0.0.1 that reads one request head per connection, then `answer`s."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            await answer(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


async def get_from(answer: Answer) -> bytes:
    client = BlockClient(SECRET)
    try:
        async with node_answering(answer) as url:
            return await client.get_block(url, "01a20000-0000-7000-8000-000000000000.0")
    finally:
        await client.close()


def block_reply(body: bytes, declared: int | None = None, sent: bytes | None = None) -> bytes:
    """A node's answer with `body`'s checksum; `sent` goes on the wire instead of `body`."""
    length = len(body) if declared is None else declared
    head = (
        f"HTTP/1.1 200 OK\r\nContent-Length: {length}\r\n"
        f"X-Shoal-Checksum: {checksum_of(body)}\r\n\r\n"
    )
    return head.encode() + (body if sent is None else sent)


def test_a_body_sent_in_small_pieces_arrives_whole(run: Any) -> None:
    body = bytes(range(256)) * 1200  # 300 KiB: past the connection's own 64 KiB buffer

    async def trickle(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reply = block_reply(body)
        for start in range(0, len(reply), 7_777):
            writer.write(reply[start : start + 7_777])
            await writer.drain()
            await asyncio.sleep(0)

    assert run(get_from(trickle)) == body


def test_a_block_arrives_byte_for_byte_in_memory_that_held_another(run: Any) -> None:
    # The client receives into a buffer it does not zero first. With freed blocks kept by
    # malloc (as a gateway keeps them), the buffer is most likely the memory of the block
    # freed just before: every byte must still come from the node.
    size = 4 * 1024 * 1024
    reuse_block_memory(size)
    earlier = bytearray(b"\xa5") * size
    del earlier
    body = bytes(range(256)) * (size // 256)

    async def in_pieces(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reply = block_reply(body)
        for start in range(0, len(reply), 300_000):
            writer.write(reply[start : start + 300_000])
            await writer.drain()

    assert run(get_from(in_pieces)) == body


@pytest.mark.parametrize("changed", [10, 200_000, 4 * 1024 * 1024 - 1])
def test_a_byte_changed_on_the_way_is_a_corrupted_block(run: Any, changed: int) -> None:
    # The first bytes of a block come in with the response head (into the connection's own
    # buffer), the rest straight into the block: a change in either must fail the block.
    body = bytes(range(256)) * (4 * 1024 * 1024 // 256)
    sent = bytearray(body)
    sent[changed] ^= 0x01

    async def in_pieces(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        reply = block_reply(body, sent=bytes(sent))
        for start in range(0, len(reply), 300_000):
            writer.write(reply[start : start + 300_000])
            await writer.drain()

    with pytest.raises(BlockCorrupted, match="does not match its checksum"):
        run(get_from(in_pieces))


def test_a_body_cut_short_is_an_unavailable_node(run: Any) -> None:
    async def cut(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(block_reply(b"x" * 1000, declared=5000))
        await writer.drain()

    with pytest.raises(NodeUnavailable, match="reading the body"):
        run(get_from(cut))


def test_a_body_too_large_to_allocate_is_refused_before_allocating(run: Any) -> None:
    async def huge(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(block_reply(b"", declared=MAX_BODY_BYTES + 1))
        await writer.drain()

    with pytest.raises(NodeUnavailable, match="over"):
        run(get_from(huge))


def test_a_head_that_never_ends_is_an_unavailable_node(run: Any) -> None:
    async def endless(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"p" * (2 * MAX_HEAD_BYTES))
        await writer.drain()
        await asyncio.sleep(5)  # holds the connection open: only the head's size can end it

    with pytest.raises(NodeUnavailable, match="too long"):
        run(get_from(endless))


def test_requests_waiting_on_a_silent_node_are_given_up_and_not_sent_again(run: Any) -> None:
    heads = 0

    async def silent(reader: asyncio.StreamReader, _: asyncio.StreamWriter) -> None:
        nonlocal heads
        heads += 1
        await reader.read()  # a hung node: nothing is answered, until the client hangs up

    async def scenario() -> tuple[list[BaseException | bytes], float]:
        client = BlockClient(SECRET)
        try:
            async with node_answering(silent) as url:
                names = [f"01a20000-0000-7000-8000-000000000000.{i}" for i in range(3)]
                waiting = [asyncio.ensure_future(client.get_block(url, n)) for n in names]
                while heads < len(names):
                    await asyncio.sleep(0.01)
                started = asyncio.get_running_loop().time()
                client.abandon(url, "did not answer 2 checks")
                outcomes = await asyncio.gather(*waiting, return_exceptions=True)
                return outcomes, asyncio.get_running_loop().time() - started
        finally:
            await client.close()

    outcomes, seconds = run(scenario())
    assert seconds < 1
    assert all(isinstance(o, NodeUnreachable) for o in outcomes), outcomes
    assert "did not answer 2 checks" in str(outcomes[0])
    assert heads == 3  # each was sent once: a given-up request is not tried again


def test_a_token_the_node_read_after_its_expiry_is_an_unreachable_node(run: Any) -> None:
    async def late(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        refusal = b"expired token"
        writer.write(
            b"HTTP/1.1 401 Unauthorized\r\nContent-Length: %d\r\n\r\n%s" % (len(refusal), refusal)
        )
        await writer.drain()

    with pytest.raises(NodeUnreachable, match="read too late"):
        run(get_from(late))


def test_a_status_check_does_not_wait_behind_the_node_s_busy_connections(run: Any) -> None:
    """Every pooled connection to the node is held by a transfer that goes on: a /status
    still gets an answer, on a connection of its own."""
    status = (
        b'{"name": "n1", "datacenter": "dc", "shark": "dc:n1", "capacity_bytes": 1,'
        b' "free_bytes": 1, "block_count": 0}'
    )

    async def slow_or_status(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # The head was read: a GET /status is answered, anything else is held.
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(status), status))
        await writer.drain()

    async def scenario() -> Any:
        client = BlockClient(SECRET, connections_per_node=1)
        held = asyncio.Event()

        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            held.set()
            await reader.read()  # a transfer that does not end while the test runs

        first = True

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal first
            if first:
                first = False
                await hold(reader, writer)
            else:
                await slow_or_status(reader, writer)

        try:
            async with node_answering(answer) as url:
                busy = asyncio.ensure_future(
                    client.get_block(url, "01a20000-0000-7000-8000-000000000000.0")
                )
                await held.wait()  # the node's one pooled connection is taken
                answered = await asyncio.wait_for(client.status(url), 5)
                client.abandon(url, "the test is over")
                await asyncio.gather(busy, return_exceptions=True)
                return answered
        finally:
            await client.close()

    assert run(scenario()).shark == "dc:n1"
