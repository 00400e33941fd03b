"""The admin API, v1: the census as JSON (docs/operations.md, "Admin API").

Only GETs, each a reading of the census (census.py). Authentication is the admin
application's (app.py), before any of these handlers runs. A catalog shard that does not
answer (or a schema older than this code's) makes a call that needs it 503 with
`{"error": ...}`; a call that reads every shard shows the others and marks the silent one
(`reachable: false`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from shoal.admin.app import json_answer
from shoal.admin.census import PIPELINE_RUNS_SHOWN, Census, CensusUnavailable

PREFIX = "/admin/v1"
MAX_PIPELINE_RUNS = 1000

Reading = Callable[[], Awaitable[dict[str, Any]]]


def api_routes(census: Census) -> web.RouteTableDef:
    """Every GET of the contract but /admin/v1/requests (the gateway's rates, not census's)."""
    routes = web.RouteTableDef()
    # The readings a GET answers as they are, with no parameters.
    plain: dict[str, Reading] = {
        "cluster": census.cluster,
        "nodes": census.nodes,
        "accounts": census.accounts,
        "usage": census.usage,
        "gc": census.gc,
    }
    for name, read in plain.items():
        routes.get(f"{PREFIX}/{name}")(_answering(read))

    @routes.get(f"{PREFIX}/pipeline")
    async def pipeline(request: web.Request) -> web.Response:
        """Newest first; `?job=meter` for one job's, `?limit=N` for N of them (default 50)."""
        job = request.query.get("job") or None
        limit = request.query.get("limit", str(PIPELINE_RUNS_SHOWN))
        if not limit.isdigit() or not 1 <= int(limit) <= MAX_PIPELINE_RUNS:
            return json_answer(
                {"error": f"limit must be a number from 1 to {MAX_PIPELINE_RUNS}"}, 400
            )
        return await _answer(lambda: census.pipeline(job, int(limit)))

    return routes


def _answering(read: Reading) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        return await _answer(read)

    return handler


async def _answer(read: Reading) -> web.Response:
    try:
        return json_answer(await read())
    except CensusUnavailable as exc:
        return json_answer({"error": str(exc)}, 503, headers={"Retry-After": "5"})
