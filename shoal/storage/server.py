"""The storage node: an HTTP service for the blocks of one disk.

    PUT    /blocks/{name}       store a block (X-Shoal-Checksum, Content-Length); never overwrites
    GET    /blocks/{name}       the block's data, or a byte range of it (Range: bytes=a-b)
    HEAD   /blocks/{name}       its size and checksum
    DELETE /blocks/{name}       remove it (a missing block is already deleted: 204)
    POST   /blocks/delete       remove many: {"names": [...]} -> {"deleted": n, "missing": m}
    GET    /inventory?after=&limit=   a page of {name, size, mtime, checksum}, in a stable order
    GET    /status              name, datacenter, capacity, free bytes, block count

Every request carries a token signed with the cluster secret (auth.py). The HTTP layer only
translates: the disk is blockfile.BlockStore's business.
"""

from __future__ import annotations

import logging
import multiprocessing
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from shoal.storage import auth
from shoal.storage.blockfile import (
    BlockCorrupt,
    BlockError,
    BlockExists,
    BlockInfo,
    BlockNotFound,
    BlockStore,
    ChecksumMismatch,
    InvalidBlockName,
    OutOfSpace,
    in_thread,
)

log = logging.getLogger("shoal.storage")

CHECKSUM_HEADER = "X-Shoal-Checksum"  # XXH3-128 of the block, 32 hex digits (blockfile.py)
MAX_BATCH_DELETE = 10000
MAX_INVENTORY_PAGE = 10000
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class NodeIdentity:
    name: str
    datacenter: str

    @property
    def shark(self) -> str:
        """How object rows name this node (RFD 149's sharks: datacenter and storage id)."""
        return f"{self.datacenter}:{self.name}"


class BlockCount:
    """Blocks held, counted once at start and kept current by writes and deletes.

    A node's processes (workers.py) share it: each adds to its own slot of shared memory (so
    no process waits for a lock, and one event loop thread per slot needs none), and every
    process reports the sum of the slots.
    """

    def __init__(self, value: int, processes: int = 1) -> None:
        self._slots = multiprocessing.get_context("spawn").RawArray("q", processes)
        self._slots[0] = value
        self.slot = 0  # this process's: 0 in the node process, its number in a worker

    @property
    def value(self) -> int:
        return sum(self._slots)

    def add(self, blocks: int) -> None:
        self._slots[self.slot] += blocks


def make_app(
    store: BlockStore, secret: bytes, identity: NodeIdentity, count: BlockCount
) -> web.Application:
    app = web.Application(middlewares=[_errors, _authenticate(secret)], client_max_size=1024**2)

    async def put_block(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        checksum = request.headers.get(CHECKSUM_HEADER, "")
        if not re.fullmatch(r"[0-9a-f]{32}", checksum):
            raise web.HTTPBadRequest(text=f"{CHECKSUM_HEADER} must be 32 hex digits")
        if request.content_length is None:
            raise web.HTTPLengthRequired(text="Content-Length is required")
        created = await store.write(
            name, request.content.iter_any(), request.content_length, checksum
        )
        if created:
            count.add(1)
        return web.Response(status=201 if created else 200)

    async def get_block(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        range_header = request.headers.get("Range")
        if request.method == "HEAD":
            info = await in_thread(store.info, name)
            start, end = _byte_range(range_header, info.size)
            response = _block_response(info, start, end, range_header is not None)
            await response.prepare(request)
            return response
        reader = await store.read(name, lambda size: _byte_range(range_header, size))
        try:
            partial = range_header is not None
            response = _block_response(reader.info, reader.start, reader.end, partial)
            await response.prepare(request)
            async for piece in reader.pieces():
                await response.write(piece)
        finally:
            reader.close()
        await response.write_eof()
        return response

    async def delete_block(request: web.Request) -> web.Response:
        if await in_thread(store.delete, request.match_info["name"]):
            count.add(-1)
        return web.Response(status=204)

    async def delete_blocks(request: web.Request) -> web.Response:
        try:
            names = (await request.json())["names"]
        except (ValueError, KeyError, TypeError):
            raise web.HTTPBadRequest(text='body must be {"names": [...]}') from None
        if not isinstance(names, list) or len(names) > MAX_BATCH_DELETE:
            raise web.HTTPBadRequest(text=f"names must be a list of at most {MAX_BATCH_DELETE}")
        for name in names:
            store.path_of(name)  # refuse the whole batch if any name is invalid
        deleted = sum(await in_thread(lambda: [store.delete(n) for n in names]))
        count.add(-deleted)
        return web.json_response({"deleted": deleted, "missing": len(names) - deleted})

    async def inventory(request: web.Request) -> web.Response:
        after = request.query.get("after", "")
        try:
            limit = int(request.query.get("limit", "1000"))
        except ValueError:
            raise web.HTTPBadRequest(text="limit must be an integer") from None
        if not 1 <= limit <= MAX_INVENTORY_PAGE:
            raise web.HTTPBadRequest(text=f"limit must be between 1 and {MAX_INVENTORY_PAGE}")
        page = await in_thread(store.inventory, after, limit)
        return web.json_response(
            {
                "blocks": [b.__dict__ for b in page],
                "next": page[-1].name if len(page) == limit else None,
            }
        )

    async def status(request: web.Request) -> web.Response:
        capacity, free = await in_thread(store.usage)
        return web.json_response(
            {
                "name": identity.name,
                "datacenter": identity.datacenter,
                "shark": identity.shark,
                "capacity_bytes": capacity,
                "free_bytes": free,
                "block_count": count.value,
            }
        )

    app.router.add_put("/blocks/{name}", put_block)
    app.router.add_get("/blocks/{name}", get_block)
    app.router.add_delete("/blocks/{name}", delete_block)
    app.router.add_post("/blocks/delete", delete_blocks)
    app.router.add_get("/inventory", inventory)
    app.router.add_get("/status", status)
    return app


def _authenticate(secret: bytes) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            auth.verify(secret, request.method, request.path, request.headers.get("Authorization"))
        except auth.InvalidToken as exc:
            raise web.HTTPUnauthorized(text=str(exc)) from None
        return await handler(request)

    return middleware


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Block-store refusals to HTTP statuses, in one place."""
    try:
        return await handler(request)
    except InvalidBlockName as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None
    except BlockNotFound as exc:
        raise web.HTTPNotFound(text=f"no block {exc}") from None
    except BlockExists as exc:
        raise web.HTTPConflict(text=str(exc)) from None
    except ChecksumMismatch as exc:
        raise web.HTTPUnprocessableEntity(text=str(exc)) from None
    except OutOfSpace as exc:
        raise web.HTTPInsufficientStorage(text=str(exc)) from None
    except BlockCorrupt as exc:
        log.error("corrupt block on this node: %s", exc)
        raise web.HTTPInternalServerError(text=str(exc)) from None
    except BlockError as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None


def _block_response(info: BlockInfo, start: int, end: int, partial: bool) -> web.StreamResponse:
    response = web.StreamResponse(status=206 if partial else 200)
    response.content_length = end - start
    response.headers[CHECKSUM_HEADER] = info.checksum
    response.headers["Accept-Ranges"] = "bytes"
    if partial:
        response.headers["Content-Range"] = f"bytes {start}-{end - 1}/{info.size}"
    return response


def _byte_range(header: str | None, size: int) -> tuple[int, int]:
    """[start, end) of a `Range: bytes=a-b` header (suffix and open-ended forms included)."""
    if header is None:
        return 0, size
    match = _RANGE.match(header.strip())
    if not match or match.groups() == ("", ""):
        raise web.HTTPRequestRangeNotSatisfiable(headers={"Content-Range": f"bytes */{size}"})
    first, last = match.groups()
    if first == "":
        start, end = max(0, size - int(last)), size
    else:
        start = int(first)
        end = size if last == "" else min(size, int(last) + 1)
    if start >= size or start >= end:
        raise web.HTTPRequestRangeNotSatisfiable(headers={"Content-Range": f"bytes */{size}"})
    return start, end
