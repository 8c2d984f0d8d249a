"""A request body on a lane connection as it arrives: what ``gateway.http.bodies`` reads of
it (``iter_chunked``), with reading paused while more than BODY_HIGH bytes wait. Never
parses a byte: the connection's parser feeds it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator

from gateway.http.lane.flow import FlowControl

BODY_HIGH = 256 * 1024  # bytes of a body buffered before reading pauses


class Body:
    """One request's body (``LaneRequest.content``)."""

    __slots__ = ("_chunks", "_eof", "_error", "_flow", "_size", "_unread", "_waiter")

    def __init__(self, flow: FlowControl) -> None:
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._eof = False
        self._waiter: asyncio.Future[None] | None = None
        self._flow = flow
        self._unread = False  # answered without reading it all: the rest is dropped
        self._error: Exception | None = None  # the rest of the body cannot be framed

    def feed(self, chunk: bytes) -> None:
        if self._unread:
            return
        self._chunks.append(chunk)
        self._size += len(chunk)
        if self._size > BODY_HIGH:
            self._flow.pause("body")
        self._wake()

    def feed_eof(self) -> None:
        self._eof = True
        self._wake()

    def fail(self, error: Exception) -> None:
        """The body turned out malformed: its reader gets ``error`` once what came is read."""
        self._error = error
        self._wake()

    def drop(self) -> None:
        """The request is answered: what is left of the body is read and thrown away."""
        self._unread = True
        self._chunks.clear()
        self._size = 0
        self._flow.resume("body")

    @property
    def complete(self) -> bool:
        return self._eof or self._error is not None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def iter_chunked(self, n: int) -> AsyncIterator[bytes]:
        while True:
            while not self._chunks:
                if self._error is not None:
                    raise self._error
                if self._eof:
                    return
                self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
            chunk = self._chunks.popleft()
            self._size -= len(chunk)
            if self._size <= BODY_HIGH // 2:
                self._flow.resume("body")
            while len(chunk) > n:
                yield chunk[:n]
                chunk = chunk[n:]
            yield chunk
