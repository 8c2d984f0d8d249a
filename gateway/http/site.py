"""A site of aiohttp's runner on the gateway's own Listener (gateway/http/listener.py), for
the admin listener: aiohttp's server answers every request, and with TLS the context in
force is asked as each connection is accepted, so a reload's new certificate is served
without a restart (aiohttp's TCPSite fixes its context when it starts). It never reads a
byte itself.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import cast

from aiohttp import web
from yarl import URL

from gateway.http.listener import Listener, bind


class ListenerSite(web.BaseSite):
    """Connections accepted by a Listener, each served by the runner's ``web.Server``."""

    __slots__ = ("_host", "_listener", "_port", "_reuse_port", "_tls")

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        *,
        backlog: int = 128,
        reuse_port: bool = False,
        tls: Callable[[], ssl.SSLContext | None] | None = None,
    ) -> None:
        """``tls``: the context in force (asked per connection); None: plain HTTP."""
        super().__init__(runner, backlog=backlog)
        self._host, self._port, self._reuse_port, self._tls = host, port, reuse_port, tls
        self._listener: Listener | None = None

    @property
    def name(self) -> str:
        scheme = "https" if self._tls is not None else "http"
        return str(URL.build(scheme=scheme, host=self._host, port=self._port))

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        sockets = bind(self._host, self._port, reuse_port=self._reuse_port)
        listener = self._listener = Listener(
            sockets, server, backlog=self._backlog, tls=self._tls or (lambda: None)
        )
        self._server = cast(asyncio.AbstractServer, listener)  # what the runner reads of it
        if listener.sockets:
            self._port = listener.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """No new connection; those accepted before are the server's before it shuts down."""
        await super().stop()
        if self._listener is not None:
            await self._listener.handed_over()
