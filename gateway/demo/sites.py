"""One aiohttp app served on a free loopback port, for the demo's shows (never runtime code)."""

from __future__ import annotations

from aiohttp import web


async def start(app: web.Application) -> tuple[web.AppRunner, int]:
    """Serves ``app`` on 127.0.0.1 at a port the kernel picks; (runner, port)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, int(runner.addresses[0][1])
