"""The operator console (SPEC section 14): one page and its few assets under ``/console``,
read from files inside this package.

It owns serving those files with strict headers and nothing more: the page calls the
operator API with the operator's bearer token like any other client (no cookies, so no
CSRF), so it adds no authority of its own. It must never serve a file outside ``ASSETS``,
inline script or style, or anything from a third-party host.
"""

from __future__ import annotations

import functools
from importlib import resources

from aiohttp import web

from gateway.flow.runtime import ROUTE
from gateway.http.problems import problem

PAGE = "index.html"
ASSETS = {
    PAGE: "text/html",
    "console.css": "text/css",
    "console.js": "text/javascript",
    "keys.js": "text/javascript",
    "logo.png": "image/png",
}
CSP = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "img-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",  # revalidate: an upgraded gateway serves its own console
}


def routes(app: web.Application) -> None:
    app.router.add_get("/console", page)
    app.router.add_get("/console/", page)
    app.router.add_get("/console/{name}", asset)


@functools.cache
def _read(name: str) -> bytes:
    return resources.files(__package__).joinpath(name).read_bytes()


def _serve(request: web.Request, name: str) -> web.Response:
    request[ROUTE] = "admin"
    kind = ASSETS[name]
    charset = "utf-8" if kind.startswith("text/") or kind.endswith("+xml") else None
    response = web.Response(body=_read(name), content_type=kind, charset=charset)
    response.headers.update(HEADERS)
    return response


async def page(request: web.Request) -> web.Response:
    return _serve(request, PAGE)


async def asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in ASSETS or name == PAGE:
        response = problem("route-not-allowed", "The console has no such file.")
        response.headers.update(HEADERS)
        return response
    return _serve(request, name)
