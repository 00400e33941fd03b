"""The storage nodes' client: every call a Shoal process makes to a node goes through here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from shoal.storage import auth
from shoal.storage.blockfile import BlockInfo, checksum_of
from shoal.storage.server import CHECKSUM_HEADER

CONNECT_TIMEOUT_SECONDS = 5
# A block transfer that stalls this long is a failed replica, not a slow one.
READ_TIMEOUT_SECONDS = 60


class NodeError(Exception):
    """A storage node failed a request; `retryable` when another replica may succeed."""

    retryable = True

    def __init__(self, node: str, message: str) -> None:
        super().__init__(f"{node}: {message}")
        self.node = node


class NodeUnavailable(NodeError):
    """Connection refused or reset, a timeout, or a 5xx."""


class BlockMissing(NodeError):
    pass


class BlockCorrupted(NodeError):
    """The bytes a node returned do not match the block's checksum."""


class NodeRefused(NodeError):
    """The node refused the request itself (bad name, bad token, conflict): no retry helps."""

    retryable = False


@dataclass(frozen=True)
class NodeStatus:
    name: str
    datacenter: str
    shark: str
    capacity_bytes: int
    free_bytes: int
    block_count: int


class BlockClient:
    """One connection pool for all the nodes a process talks to."""

    def __init__(self, secret: bytes, connections_per_node: int = 32) -> None:
        self.secret = secret
        self._connections = connections_per_node
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit_per_host=self._connections, limit=0),
                timeout=aiohttp.ClientTimeout(
                    sock_connect=CONNECT_TIMEOUT_SECONDS, sock_read=READ_TIMEOUT_SECONDS
                ),
                auto_decompress=False,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def put_block(
        self, url: str, name: str, data: bytes, checksum: str | None = None
    ) -> bool:
        """Store a block on one node; True if it was new there."""
        headers = {CHECKSUM_HEADER: checksum or checksum_of(data)}
        async with self._request("PUT", url, f"/blocks/{name}", data=data, headers=headers) as r:
            return r.status == 201

    async def get_block(self, url: str, name: str) -> bytes:
        """A whole block, verified against its checksum."""
        async with self._request("GET", url, f"/blocks/{name}") as response:
            expected = response.headers.get(CHECKSUM_HEADER, "")
            try:
                data = await response.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise NodeUnavailable(url, f"read of {name} failed: {exc!r}") from None
        if checksum_of(data) != expected:
            raise BlockCorrupted(url, f"block {name} does not match its checksum")
        return data

    async def get_range(self, url: str, name: str, start: int, end: int) -> AsyncIterator[bytes]:
        """Bytes [start, end) of a block, streamed (not verified: the range is partial)."""
        headers = {"Range": f"bytes={start}-{end - 1}"}
        async with self._request("GET", url, f"/blocks/{name}", headers=headers) as response:
            try:
                async for chunk in response.content.iter_chunked(256 * 1024):
                    yield chunk
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise NodeUnavailable(url, f"read of {name} failed: {exc!r}") from None

    async def head_block(self, url: str, name: str) -> tuple[int, str]:
        """(size, checksum) of a block."""
        async with self._request("HEAD", url, f"/blocks/{name}") as response:
            return int(response.headers["Content-Length"]), response.headers[CHECKSUM_HEADER]

    async def delete_block(self, url: str, name: str) -> None:
        async with self._request("DELETE", url, f"/blocks/{name}"):
            pass

    async def delete_blocks(self, url: str, names: Sequence[str]) -> int:
        """Delete many blocks in one request; returns how many were there."""
        async with self._request("POST", url, "/blocks/delete", json={"names": list(names)}) as r:
            return int((await r.json())["deleted"])

    async def inventory(self, url: str, page_size: int = 1000) -> AsyncIterator[BlockInfo]:
        """Every block a node holds, a page at a time."""
        after = ""
        while True:
            path = "/inventory"
            params = {"after": after, "limit": str(page_size)}
            async with self._request("GET", url, path, params=params) as response:
                page = await response.json()
            for block in page["blocks"]:
                yield BlockInfo(**block)
            if page["next"] is None:
                return
            after = page["next"]

    async def status(self, url: str) -> NodeStatus:
        async with self._request("GET", url, "/status") as response:
            return NodeStatus(**(await response.json()))

    def _request(self, method: str, url: str, path: str, **kwargs: Any) -> _Call:
        headers = kwargs.pop("headers", {})
        headers["Authorization"] = auth.sign(self.secret, method, path)
        return _Call(self.session, method, url, path, headers, kwargs)


class _Call:
    """`async with` one request: connection failures and error statuses become NodeErrors."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        method: str,
        url: str,
        path: str,
        headers: dict[str, str],
        kwargs: dict[str, Any],
    ) -> None:
        self.args = (session, method, url, path, headers, kwargs)
        self.response: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> aiohttp.ClientResponse:
        session, method, url, path, headers, kwargs = self.args
        try:
            self.response = await session.request(method, url + path, headers=headers, **kwargs)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise NodeUnavailable(url, f"{method} {path}: {exc!r}") from None
        status = self.response.status
        if status < 400:
            return self.response
        text = (await self.response.text())[:200] if method != "HEAD" else ""
        self.response.release()
        if status == 404:
            raise BlockMissing(url, f"{method} {path}: not found")
        if status >= 500:
            raise NodeUnavailable(url, f"{method} {path}: {status} {text}")
        raise NodeRefused(url, f"{method} {path}: {status} {text}")

    async def __aexit__(self, *exc: object) -> None:
        if self.response is not None:
            self.response.release()
