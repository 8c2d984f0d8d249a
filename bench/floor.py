"""B3: the fastest an aiohttp server on uvloop answers anything: every request gets a fixed
429 problem answer like a too-early refusal, with no work behind it. The ceiling for any
answer the gateway serves (a refusal can only be slower). Usage: floor.py PORT."""

from __future__ import annotations

import asyncio
import sys

import uvloop
from aiohttp import web

BODY = (
    b'{"type":"/problems/too-early","title":"Too early","status":429,'
    b'"detail":"The next status request is permitted in 3600 s.",'
    b'"operation_id":"op_01M8NKNAZWY117BNGY40CH48TX","retry_after":3600}'
)
HEADERS = {"Retry-After": "3600", "Content-Type": "application/problem+json"}


async def answer(request: web.Request) -> web.Response:
    return web.Response(status=429, body=BODY, headers=HEADERS)


def main() -> None:
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)


if __name__ == "__main__":
    main()
