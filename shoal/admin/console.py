"""The web console: read-only pages over the admin API, for the holder of the admin token.

A small static site (console/: two HTML pages, one script, one style sheet) that the
browser fills in itself from the JSON of the admin API (api.py), so that the console shows
exactly what `/admin/v1/` answers and needs no build step: the files are package data,
served as they are installed. Logging in and out, and the session that guards every page
but the login form, are the admin application's (app.py).

Every answer carries headers that keep the pages from being framed, from running any script
but console.js, and from being cached (the pages fill themselves with cluster data).
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

FILES = Path(__file__).with_name("console")
# What /console/static/ serves: these files only, never a path the request makes up.
STATIC_TYPES = {
    "console.js": "text/javascript",
    "console.css": "text/css",
    "favicon.svg": "image/svg+xml",
}
# Where the login page says that the last token given was wrong.
FAILED_MARK = "<!-- failed -->"
FAILED_NOTICE = '<p class="failed" role="alert">wrong token</p>'

SECURITY_HEADERS = {
    # Scripts and styles from the console's own files only: no inline script, no other host.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def console_routes() -> web.RouteTableDef:
    """GET /console/ (the app), /console/login (its form) and /console/static/<file>."""
    routes = web.RouteTableDef()

    @routes.get("/console/")
    async def console(request: web.Request) -> web.Response:
        return _page("index.html")

    @routes.get("/console")
    async def console_without_slash(request: web.Request) -> web.Response:
        raise web.HTTPSeeOther("/console/")

    @routes.get("/console/login")
    async def login(request: web.Request) -> web.Response:
        failed = request.query.get("failed") == "1"
        return _page("login.html", FAILED_NOTICE if failed else "")

    @routes.get("/console/static/{name}")
    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC_TYPES:
            raise web.HTTPNotFound()
        body = (FILES / name).read_bytes()
        return web.Response(
            body=body, content_type=STATIC_TYPES[name], charset="utf-8", headers=SECURITY_HEADERS
        )

    return routes


def _page(name: str, notice: str = "") -> web.Response:
    text = (FILES / name).read_text().replace(FAILED_MARK, notice)
    return web.Response(text=text, content_type="text/html", headers=SECURITY_HEADERS)
