"""The agent listener as a site of aiohttp's runner (``LaneSite``): its sockets
(gateway/http/listener.py: every waiting connection accepted at once), a ``Lane`` for each
connection, what the lanes share (the app, the middleware and handler, the Outbox, the
open connections and the running limits), and the admission of a new connection past
``limits.max_connections``. It never reads a byte.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from yarl import URL

from gateway.http.lane.connections import Connections, Refused
from gateway.http.lane.cycle import Handler, Middleware
from gateway.http.lane.flow import Outbox
from gateway.http.lane.protocol import Lane
from gateway.http.lane.wire import closing_answer
from gateway.http.listener import Listener, bind
from gateway.http.problems import problem
from gateway.settings.config import Limits

log = logging.getLogger("statusgate")
FULL = (
    "The gateway has as many connections open as it keeps (limits.max_connections) and none "
    "is idle; nothing was read. Retry after the Retry-After header."
)


class LaneSite(web.BaseSite):
    """A TCP listener whose agent calls take the lane and everything else aiohttp's own
    server, both under one AppRunner. Each lane connection is registered with the runner's
    ``web.Server`` as aiohttp's own are, so the runner's cleanup stops both alike: no new
    requests once it begins (``Lane.close``), the one in hand answered within the shutdown
    timeout (``Lane.shutdown``)."""

    __slots__ = (
        "_cap",
        "_host",
        "_limits",
        "_listener",
        "_on_refused",
        "_port",
        "_refusing",
        "_reuse_port",
        "_tls",
        "app",
        "connections",
        "handler",
        "manager",
        "middleware",
        "outbox",
    )

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        *,
        middleware: Middleware,
        handler: Handler,
        backlog: int = 128,
        reuse_port: bool | None = None,
        limits: Callable[[], Limits] = Limits,
        connection_cap: int | None = None,
        on_refused: Callable[[], None] = lambda: None,
        tls: Callable[[], ssl.SSLContext | None] | None = None,
    ) -> None:
        """``limits``: the running limits (header and keep-alive timeouts, read as each
        connection starts; ``max_connections``); ``connection_cap``: connections the
        process's open-files limit leaves room for, whatever max_connections says;
        ``on_refused``: told of each connection refused past the bound; ``tls``: the TLS
        context in force, asked as each connection is accepted (None: plain HTTP)."""
        super().__init__(runner, backlog=backlog)
        assert runner.server is not None
        self._host, self._port, self._reuse_port = host, port, reuse_port
        self.app = runner.app
        self.manager = runner.server
        self.middleware = middleware
        self.handler = handler
        self.outbox: Outbox
        self._listener: Listener | None = None
        self._limits, self._cap, self._on_refused = limits, connection_cap, on_refused
        self.connections = Connections()
        self._refusing = False  # a warning was logged for this spell of refusals
        self._tls = tls

    @property
    def name(self) -> str:
        scheme = "https" if self._tls is not None else "http"
        return str(URL.build(scheme=scheme, host=self._host, port=self._port))

    @property
    def port(self) -> int:
        """The port listened on (the one the system chose for port 0, once started)."""
        return self._port

    def aiohttp_handler(self) -> RequestHandler:
        return self.manager()

    def limits(self) -> Limits:
        return self._limits()

    def admit(self, lane: Lane) -> bool:
        """Whether ``lane``, a new connection, is served: past ``limits.max_connections``
        (or the open-files cap) the connection idle the longest is closed to make room;
        with none idle the new one is answered 503 overloaded and closed (``Refused``)."""
        bound = self._limits().max_connections
        if self._cap is not None:
            bound = self._cap if bound is None else min(bound, self._cap)
        if self.connections.admit(lane, bound):
            self._refusing = False
            return True
        self._on_refused()
        if not self._refusing:
            self._refusing = True
            log.warning(
                "%d agent connections are open (limits.max_connections), none idle: new"
                " connections are answered 503 overloaded",
                self.connections.open,
            )
        assert lane.transport is not None
        lane.transport.write(closing_answer(problem("overloaded", FULL, retry_after=1.0)))
        Refused(lane.transport)
        return False

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self.outbox = Outbox(loop)
        # at start, before anything is served: a name's lookup may hold the loop briefly
        sockets = bind(self._host, self._port, reuse_port=bool(self._reuse_port))
        listener = self._listener = Listener(
            sockets, lambda: Lane(self), backlog=self._backlog, tls=self._tls or (lambda: None)
        )
        self._server = cast(asyncio.AbstractServer, listener)  # what the runner reads of it
        if listener.sockets:
            self._port = listener.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """No new connection; those accepted before are registered with the runner's
        server before its shutdown begins, so it answers their requests as it answers the
        others' (a request read meanwhile is not cut off)."""
        await super().stop()
        if self._listener is not None:
            await self._listener.handed_over()
