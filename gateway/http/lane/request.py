"""An agent call's request on the lane (``LaneRequest``): what the handlers read of a
request (gateway/flow/requests.AgentRequest), under the names ``web.Request`` gives them,
and nothing else; and ``Uncancelled``, which a handler enters while it polls the provider.
Holds what the connection parsed, never parses or writes itself.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from aiohttp import hdrs, web
from multidict import CIMultiDictProxy
from yarl import URL

from gateway.flow.requests import AgentRequest
from gateway.http.lane.body import Body


class Deferring(Protocol):
    """What defers the cancel of a handler (the connection's request cycle)."""

    def defer_cancel(self) -> None: ...

    def end_deferral(self) -> None: ...


class Uncancelled:
    """Entered by a handler that polls the provider in its own task (gateway/flow/polls.py):
    until it leaves, its client going away or a stop past its grace does not cancel the
    handler; the cancel waits for the poll's end, as if the poll had a task of its own."""

    __slots__ = ("_cycle",)

    def __init__(self, cycle: Deferring) -> None:
        self._cycle = cycle

    def __enter__(self) -> None:
        self._cycle.defer_cancel()

    def __exit__(self, *exc: object) -> None:
        self._cycle.end_deferral()


class LaneRequest(dict[Any, Any]):
    """What the agent handlers read of a request, as ``web.Request`` names it: ``app``,
    ``method``, ``path``, ``rel_url``, ``headers``, ``match_info``, ``transport``,
    ``content_length``, ``content``, ``version``, ``keep_alive``, the request's own keys
    (``request[PROVIDER]``), and ``uncancelled`` (gateway/http/proxy.py enters it around a
    poll). tests/http/test_lane.py runs the agent tests through it."""

    __slots__ = (
        "_content_length",
        "app",
        "content",
        "headers",
        "keep_alive",
        "match_info",
        "method",
        "rel_url",
        "transport",
        "uncancelled",
        "version",
    )

    def __init__(
        self,
        app: web.Application,
        method: str,
        rel_url: URL,
        headers: CIMultiDictProxy[str],
        match_info: dict[str, str],
        transport: asyncio.Transport,
        content: Body,
        version: tuple[int, int],
        keep_alive: bool,
        uncancelled: Uncancelled,
    ) -> None:
        super().__init__()
        self.app = app
        self.method = method
        self.rel_url = rel_url
        self.headers = headers
        self.match_info = match_info
        self.transport: asyncio.Transport | None = transport
        self.content = content
        self.version = version
        self.keep_alive = keep_alive
        self.uncancelled = uncancelled
        self._content_length: int | None = -1

    @property
    def path(self) -> str:
        return self.rel_url.path

    @property
    def content_length(self) -> int | None:
        if self._content_length == -1:
            value = self.headers.get(hdrs.CONTENT_LENGTH)
            self._content_length = int(value) if value is not None and value.isdigit() else None
        return self._content_length


# Both requests are what the handlers read: mypy checks it here, as the lane hands its own
# to the same middleware and handlers aiohttp hands its web.Request to.
READ_ALIKE: tuple[type[AgentRequest], ...] = (LaneRequest, web.Request)
