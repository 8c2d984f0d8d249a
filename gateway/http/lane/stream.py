"""A streamed answer (``Streamed``): a response whose body comes from an async iterator of
chunks, never held whole, and its writing on a lane connection (``write_stream``), chunk by
chunk with the transport's flow control (as asyncio's ``drain``: each chunk written, then
waited for while the socket's buffer is past its high-water mark). The same object is
answered by aiohttp's server, which prepares it as it prepares a ``web.FileResponse``.

Why: a kept result (gateway/http/kept.py) is up to ``results.max_bytes`` (64 MiB by default);
read whole, 20 agents asking at once held over a gigabyte. Streamed, a connection holds a
chunk and the transport's buffer (its high-water mark) at most.

The iterator is closed however the answer ends (written, the client gone, a stop, an error
of the source), so what it reads from (a file, an S3 answer) is given back at once. It never
decides what comes next on the connection: the request cycle (cycle.py) does, once the
stream ended, so a pipelined request is answered after it, in order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Protocol, final

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.helpers import must_be_empty_body

from gateway.http.lane.flow import FlowControl
from gateway.http.lane.wire import internal_error, serialize, serialize_head

log = logging.getLogger("statusgate")


@final  # the lane tells it by its exact type: isinstance on a response costs ~120 ns
class Streamed(web.StreamResponse):
    """An answer whose body is ``chunks``; ``length`` (when known) is its Content-Length,
    else it is sent chunked (HTTP/1.1) or until the connection closes (HTTP/1.0)."""

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        *,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        length: int | None = None,
    ) -> None:
        super().__init__(status=status, headers=headers)
        self.chunks = chunks
        if length is not None:
            self.content_length = length

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        """On aiohttp's server (as ``web.FileResponse``): the head, then every chunk; a
        source ending short of the Content-Length closes the connection, as on the lane
        (else the next answer on it would be read as the rest of this body)."""
        try:
            writer = await super().prepare(request)
            if writer is not None and not must_be_empty_body(request.method, self.status):
                sent = 0
                async for chunk in self.chunks:
                    sent += len(chunk)
                    await self.write(chunk)
                if self.content_length is not None and sent < self.content_length:
                    log.warning(
                        "the streamed answer to %s %s ended after %d of %d bytes:"
                        " connection closed",
                        request.method,
                        request.path,
                        sent,
                        self.content_length,
                    )
                    self.force_close()
            return writer
        finally:
            await close(self.chunks)


async def close(chunks: AsyncIterator[bytes]) -> None:
    """Close ``chunks`` when it can be (an async generator, or any iterator with an
    ``aclose``, gives back what it holds)."""
    aclose = getattr(chunks, "aclose", None)
    if aclose is not None:
        await aclose()


class Prepended:
    """``first``, then the chunks of ``rest``; closing it closes ``rest``, even before its
    first chunk was asked for (an async generator's ``finally`` would not run then)."""

    __slots__ = ("_first", "_rest")

    def __init__(self, first: bytes, rest: AsyncIterator[bytes]) -> None:
        self._first: bytes | None = first
        self._rest = rest

    def __aiter__(self) -> Prepended:
        return self

    async def __anext__(self) -> bytes:
        first, self._first = self._first, None
        if first is not None:
            return first
        return await anext(self._rest)

    async def aclose(self) -> None:
        self._first = None
        await close(self._rest)


class Connection(Protocol):
    """What a stream writes through (gateway/http/lane/protocol.Lane)."""

    @property
    def transport(self) -> asyncio.Transport | None: ...

    @property
    def flow(self) -> FlowControl: ...

    def send(self, data: bytes) -> None: ...

    def flush(self) -> None: ...

    def end(self) -> None: ...


class Asked(Protocol):
    """What a stream reads of its request (gateway/http/lane/request.LaneRequest)."""

    @property
    def method(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def version(self) -> tuple[int, int]: ...

    @property
    def keep_alive(self) -> bool: ...


async def write_stream(lane: Connection, response: Streamed, request: Asked) -> bool:
    """Write ``response`` to ``request`` on ``lane``: the head (queued as any answer), then
    each chunk as it comes, waiting while the transport's buffer is full. Whether the
    connection stays open after it: not when the client went away, the source failed or
    ended short of its Content-Length (the head promised bytes that cannot come)."""
    chunks = response.chunks
    try:
        if lane.transport is None:
            return False
        head, keep, framing = _head(response, request)
        lane.send(head)
        if framing == "empty":
            return keep
        sent = await _body(lane, chunks, framing == "chunked", response.content_length)
        if sent is None:
            return False
        if framing == "chunked":
            lane.send(b"0\r\n\r\n")
        elif framing == "length" and sent != response.content_length:
            log.warning(
                "the streamed answer to %s %s ended after %d of %s bytes: connection closed",
                request.method,
                request.path,
                sent,
                response.content_length,
            )
            return False
        return keep and framing != "close"
    except asyncio.CancelledError:  # the client went away, or a stop past its grace
        lane.end()
        raise
    except Exception as exc:  # the source failed mid-answer: only a close can tell
        log.warning("the streamed answer to %s %s failed: %s", request.method, request.path, exc)
        return False
    finally:
        await close(chunks)


def _head(response: Streamed, request: Asked) -> tuple[bytes, bool, str]:
    """``serialize_head``; a 500 in its place for a head the lane cannot write (a
    handler's bug, never the agent's)."""
    method, version, keep_alive = request.method, request.version, request.keep_alive
    try:
        return serialize_head(response, method, version, keep_alive)
    except (TypeError, ValueError) as exc:
        log.error("cannot write the answer to %s %s: %s", method, request.path, exc)
        data, keep = serialize(internal_error(), method, version, keep_alive)
        return data, keep, "empty"


async def _body(
    lane: Connection, chunks: AsyncIterator[bytes], chunked: bool, length: int | None
) -> int | None:
    """Write the chunks; how many body bytes were written, None when the client went away.
    Past ``length`` nothing is written (as aiohttp's writer cuts a body at its length)."""
    flow = lane.flow
    sent = 0
    if length == 0:
        return sent
    async for chunk in chunks:
        transport = lane.transport
        if transport is None or transport.is_closing():
            return None
        if length is not None:
            chunk = chunk[: length - sent]
        if not chunk:
            continue
        sent += len(chunk)
        lane.flush()  # the head, and anything queued before it
        transport.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
        paused = flow.write_paused  # set by that write when the buffer passed its mark
        if paused is not None:
            await paused
        if sent == length:  # the rest, if any, is not read
            break
    return sent
