"""A lane connection's requests relayed to aiohttp's own server: from the first byte when
the connection does not start with an agent call (its bytes passed through as they come,
so the lane still counts the connection), or from the request on which it turns to another
path, in order (each head framed again as it came, a chunked body chunked again). The
admin API, the console, ``/mcp``, the health checks and the metrics are thus aiohttp's
alone. It never answers a request itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp.web_protocol import RequestHandler

from gateway.http.lane.body import BODY_HIGH
from gateway.http.lane.flow import FlowControl


class Relay:
    """The aiohttp handler a connection is relayed to (``handler``, once started) and the
    bytes waiting for it meanwhile (the lane answers its own requests first)."""

    __slots__ = ("_flow", "_make", "_size", "_waiting", "chunked", "handler")

    def __init__(self, make: Callable[[], RequestHandler], flow: FlowControl) -> None:
        self._make = make
        self._flow = flow
        self.handler: RequestHandler | None = None
        self._waiting: list[bytes] = []
        self._size = 0
        self.chunked = False  # the request being relayed has a chunked body

    @property
    def waiting(self) -> bool:
        return bool(self._waiting)

    def head(
        self, method: str, target: bytes, version: str, fields: list[tuple[bytes, bytes]]
    ) -> None:
        """A request head for aiohttp, framed again as it came."""
        lines = [b"%s %s HTTP/%s\r\n" % (method.encode(), target, version.encode())]
        self.chunked = False
        for name, value in fields:
            lines.append(b"%s: %s\r\n" % (name, value))
            if name.lower() == b"transfer-encoding" and b"chunked" in value.lower():
                self.chunked = True
        lines.append(b"\r\n")
        self.feed(b"".join(lines))

    def body(self, chunk: bytes) -> None:
        self.feed(b"%x\r\n%s\r\n" % (len(chunk), chunk) if self.chunked else chunk)

    def end(self) -> None:
        if self.chunked:
            self.feed(b"0\r\n\r\n")

    def feed(self, data: bytes) -> None:
        """Bytes for aiohttp: given at once once it serves the connection, else kept
        (reading paused past BODY_HIGH of them) until ``start``."""
        if self.handler is not None:
            self.handler.data_received(data)
            return
        self._waiting.append(data)
        self._size += len(data)
        if self._size > BODY_HIGH:
            self._flow.pause("relay")

    def start(self, transport: asyncio.Transport) -> None:
        """aiohttp serves the connection from here on (the lane wrote its last answers):
        the bytes kept are given to it. Writing paused for the lane stays paused for it."""
        if self.handler is None:
            handler = self.handler = self._make()
            handler.connection_made(transport)
            if self._flow.hand_over():
                handler.pause_writing()
        waiting, self._waiting, self._size = self._waiting, [], 0
        self._flow.resume("relay")
        self.handler.data_received(b"".join(waiting))
