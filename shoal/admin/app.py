"""The admin listener: what operators and their tools ask a Shoal process, apart from S3.

Every long-running Shoal process (the gateway of `shoal serve`, each storage node) answers on
its own admin port:

- `GET /health`: 200 while the process serves (what a supervisor restarts it on);
- `GET /ready`: 200 when it can do its work now, 503 when not, with a JSON body that says
  what is wrong (what a load balancer routes by);
- `GET /metrics`: Prometheus metrics of all the process's workers;

and, where the process has them, the admin API under `/admin/` and the console under
`/console/`, both for the holder of the admin token only (auth.py). Health and metrics need
no token: load balancers and Prometheus scrape without one, and neither shows a secret.

aiohttp's web framework serves it rather than the gateway's own HTTP server (s3/http.py): a
few requests a second need routing, forms and cookies, not the S3 port's speed.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, Protocol

from aiohttp import web
from prometheus_client.registry import Collector

from shoal import telemetry
from shoal.admin.auth import SESSION_COOKIE, SESSION_SECONDS, AdminToken

CONSOLE = "/console/"
LOGIN = "/console/login"
# What the console serves without a session: its login page and what that page loads.
OPEN_CONSOLE_PATHS = (LOGIN, "/console/static/")


class Health(Protocol):
    """What /ready asks: whether the process can do its work, and the details."""

    async def check(self) -> tuple[bool, dict[str, Any]]: ...


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
TOKEN: web.AppKey[AdminToken | None] = web.AppKey("token", AdminToken)


def admin_app(
    health: Health,
    *,
    token: AdminToken | None = None,
    collectors: Iterable[Collector] = (),
    routes: Iterable[web.RouteTableDef] = (),
) -> web.Application:
    """The admin application of one process. Without `token`, it has no admin API or
    console (a storage node): `routes` need one."""
    app = web.Application(middlewares=[_admin_only])
    app[TOKEN] = token
    extra = tuple(collectors)

    async def alive(request: web.Request) -> web.Response:
        return json_answer({"status": "alive", "pid": os.getpid()})

    async def ready(request: web.Request) -> web.Response:
        is_ready, details = await health.check()
        return json_answer({"ready": is_ready, **details}, status=200 if is_ready else 503)

    async def metrics(request: web.Request) -> web.Response:
        body, content_type = telemetry.exposition(extra)
        return web.Response(body=body, headers={"Content-Type": content_type})

    app.router.add_get("/health", alive)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    if token is not None:
        app.router.add_post(LOGIN, _log_in)
        app.router.add_post("/console/logout", _log_out)
        for table in routes:
            app.router.add_routes(table)
    return app


@web.middleware
async def _admin_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The admin API for a bearer token or a console session; the console for a session,
    else its login page."""
    path = request.path
    token = request.app[TOKEN]
    if path.startswith("/admin/"):
        if token is None or not _admitted(token, request, bearer=True):
            return json_answer({"error": "the admin token is needed (Authorization: Bearer)"}, 401)
        return await handler(request)
    console_page = path.startswith(CONSOLE) and not path.startswith(OPEN_CONSOLE_PATHS)
    if console_page and (token is None or not _admitted(token, request, bearer=False)):
        raise web.HTTPSeeOther(LOGIN)
    return await handler(request)


def _admitted(token: AdminToken, request: web.Request, *, bearer: bool) -> bool:
    if bearer and "Authorization" in request.headers:
        # A wrong token (or an S3 signature) is refused even beside a good cookie.
        return token.accepts_bearer(request.headers["Authorization"])
    return token.accepts_session(request.cookies.get(SESSION_COOKIE))


async def _log_in(request: web.Request) -> web.StreamResponse:
    token = request.app[TOKEN]
    assert token is not None  # the route exists only with a token
    form = await request.post()
    given = form.get("token")
    if not isinstance(given, str) or not token.accepts_token(given):
        raise web.HTTPSeeOther(f"{LOGIN}?failed=1")
    response = web.HTTPSeeOther(CONSOLE)
    response.set_cookie(
        SESSION_COOKIE,
        token.new_session(),
        max_age=SESSION_SECONDS,
        path="/",
        httponly=True,
        samesite="Strict",
        secure=request.secure,
    )
    return response


async def _log_out(request: web.Request) -> web.StreamResponse:
    response = web.HTTPSeeOther(LOGIN)
    response.del_cookie(SESSION_COOKIE, path="/")
    return response


def json_answer(
    body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """Every JSON answer of the admin listener (timestamps and UUIDs as strings)."""
    return web.Response(
        text=json.dumps(body, default=str),
        status=status,
        content_type="application/json",
        headers=headers,
    )


@contextlib.asynccontextmanager
async def serving(app: web.Application, sock: socket.socket) -> AsyncIterator[None]:
    """`app` on the listening socket `sock` while the context lasts."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.SockSite(runner, sock).start()
        yield
    finally:
        await runner.cleanup()
