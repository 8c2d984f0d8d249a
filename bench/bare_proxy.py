"""B2: a bare aiohttp pass-through proxy (one shared ClientSession, no policy), the
baseline a policy gateway is measured against. Usage: bare_proxy.py PORT UPSTREAM."""

from __future__ import annotations

import sys

import aiohttp
from aiohttp import web

HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


async def forward(request: web.Request) -> web.Response:
    session: aiohttp.ClientSession = request.app["session"]
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
    body = await request.read()
    url = request.app["upstream"] + request.rel_url.path_qs
    async with session.request(request.method, url, headers=headers, data=body) as upstream:
        data = await upstream.read()
        kept = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP}
        kept.pop("Content-Encoding", None)
        return web.Response(status=upstream.status, body=data, headers=kept)


async def start(app: web.Application) -> None:
    app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100))


async def stop(app: web.Application) -> None:
    await app["session"].close()


def main() -> None:
    app = web.Application()
    app["upstream"] = sys.argv[2].rstrip("/")
    app.router.add_route("*", "/{tail:.*}", forward)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)


if __name__ == "__main__":
    main()
