"""The request cycle of a lane connection (as uvicorn's RequestResponseCycle, one a
connection rather than one a request): a request's middleware and handler run in a task of
their own, the answer is made into bytes as aiohttp would write them and queued on the
connection in order (a streamed answer's chunks as they come, stream.py); and when that
task may be cancelled (its client gone, a stop past its grace): at once, but not while the
handler polls the provider (``Uncancelled``), then at the poll's end. It never reads a byte
and never decides what comes next on the connection (``Connection.next_request``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web

from gateway.flow.requests import AgentRequest
from gateway.http.lane import stream
from gateway.http.lane.body import Body
from gateway.http.lane.request import LaneRequest, Uncancelled
from gateway.http.lane.stream import Streamed, write_stream
from gateway.http.lane.wire import CONTINUE, internal_error, serialize

log = logging.getLogger("statusgate")
Handler = Callable[[AgentRequest], Awaitable[web.StreamResponse]]
Middleware = Callable[[LaneRequest, Handler], Awaitable[web.StreamResponse]]


class Connection(stream.Connection, Protocol):
    """What the cycle needs of its connection (gateway/http/lane/protocol.Lane): what a
    stream writes through, and stopping it."""

    def stop(self) -> None: ...

    def next_request(self) -> None: ...

    def linger(self, body: Body) -> None: ...


class Cycle:
    """One connection's answering: the task of the request in hand (``task``) and the
    cancel deferral its handler's polls ask for."""

    __slots__ = ("_due", "_handler", "_inside", "_lane", "_middleware", "task", "uncancelled")

    def __init__(self, lane: Connection, middleware: Middleware, handler: Handler) -> None:
        self._lane = lane
        self._middleware = middleware
        self._handler = handler
        self.task: asyncio.Task[None] | None = None
        self.uncancelled = Uncancelled(self)  # for the handler's poll (LaneRequest.uncancelled)
        self._inside = 0  # the handler is inside that many Uncancelled sections
        self._due = False  # a cancel of the handler waits for their end

    async def answer(self, request: LaneRequest, expects: bool) -> None:
        """Answer ``request`` (``expects``: a 100 Continue first); the connection runs it
        in a task of its own (``task``) and is told when it is done (``next_request``)."""
        lane = self._lane
        if lane.transport is None:
            return
        if expects:
            lane.send(CONTINUE)
        try:
            response: web.StreamResponse = await self._middleware(request, self._handler)
        except asyncio.CancelledError:
            lane.end()  # cancelled from within: no answer, no connection
            raise
        except web.HTTPException as exc:  # as aiohttp does: the exception is the answer
            response = exc
        except Exception:  # the middleware answers every error: this is a bug of ours
            log.exception("unhandled error on %s %s", request.method, request.path)
            response = internal_error()
            response.force_close()
        body = request.content
        body.drop()
        if not body.complete:  # the rest is read and dropped, for a while
            lane.linger(body)
        if type(response) is Streamed:  # a body from an iterator: a path of its own (12 ns)
            keep = await write_stream(lane, response, request)
        else:
            data, keep = _bytes(response, request)
            if lane.transport is None:
                return
            lane.send(data)
        paused = lane.flow.write_paused  # set by the flush of an earlier answer
        if paused is not None:
            await paused
        if not keep:
            lane.stop()
            return
        lane.next_request()

    @property
    def polling(self) -> bool:
        """The handler is inside an Uncancelled section (a poll under way)."""
        return self._inside > 0

    def defer_cancel(self) -> None:
        """The handler enters an Uncancelled section."""
        self._inside += 1

    def end_deferral(self) -> None:
        """The handler leaves it: a cancel that waited comes now, when it was the last."""
        self._inside -= 1
        if not self._inside and self._due:
            self._due = False
            self.cancel()

    def cancel(self) -> None:
        """Cancel the handler running, now, or once it left its Uncancelled sections."""
        task = self.task
        if task is None or task.done():
            return
        if self._inside:
            self._due = True
        else:
            task.cancel()


def _bytes(response: web.StreamResponse, request: LaneRequest) -> tuple[bytes, bool]:
    """The answer's bytes, and whether the connection stays open after it; a 500 for an
    answer the lane cannot write (a handler's bug, never the agent's)."""
    method, version, keep_alive = request.method, request.version, request.keep_alive
    try:
        return serialize(response, method, version, keep_alive)
    except (TypeError, ValueError) as exc:
        log.error("cannot write the answer to %s %s: %s", method, request.path, exc)
        return serialize(internal_error(), method, version, keep_alive)
