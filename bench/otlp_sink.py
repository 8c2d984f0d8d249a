"""An OTLP/HTTP sink for the tracing rows of `make bench`: accepts trace exports, keeps none.

Usage: otlp_sink.py PORT
"""

from __future__ import annotations

import sys

from aiohttp import web


async def export(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=b"", content_type="application/x-protobuf")


def main() -> None:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", export)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)


if __name__ == "__main__":
    main()
