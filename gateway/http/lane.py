"""The agent lane: the HTTP/1.1 connections that carry agents' ``/p/{provider}/...`` calls,
parsed with httptools (llhttp) and answered through the same middleware and handlers as
aiohttp would, without aiohttp's per-request server machinery (SPEC 1, 12, 13).

Why: a too-early refusal cost ~110 us of CPU of which aiohttp's server path (its request and
response objects, its router, its stream writer) was a third; the same llhttp parser with a
request of ten attributes and a response written as one ``bytes`` costs a few microseconds.

What it owns: framing (keep-alive, pipelining in order with reading paused past QUEUE_HIGH
waiting requests, ``Expect: 100-continue``, HEAD and bodiless statuses, ``Connection:
close``), the head as aiohttp reads it (8190 bytes of request target, 8190 of a field's
name and of its value as aiohttp's C parser counts them, 128 fields, ``Host`` required in
HTTP/1.1, no second singleton field such as ``Host`` or ``Content-Type``, no
trailing whitespace in a value, no fragment in the path), a body read as it arrives with
backpressure (an answered request's unread rest dropped for LINGER at most), the
cancellation of a handler whose client went away (``handler_cancellation``; a FIN taken as
its going away, see ``Lane.eof_received``), the timeouts of a head and of an idle connection
(``limits.header_timeout``, ``keepalive_timeout``), the bound on open connections
(``limits.max_connections``, ``Connections``), and a graceful stop with the aiohttp runner
it shares. Headers are written by aiohttp's own
serializer, so an answer here has the bytes aiohttp would send (Date, Server,
Content-Length, Content-Type, Connection).

Answers are written at the end of the turn of the event loop that made them, every lane's
together (``Outbox``), not one system call in the middle of the turn each: a send on
loopback wakes the client at once, which answers with its next request while this turn is
still running. Written together, the next turn reads the new requests of every connection
at once (measured, paired: +26% too-early refusals, +5% forwarded polls). A connection's
bytes keep their order: everything it writes (100 Continue, an answer, a 400) goes through
its own queue, flushed before it closes or hands itself to aiohttp.

What it never does: answer anything but an agent call. A connection whose first request is
not ``/p/...`` is handed to aiohttp whole (its bytes passed through); one that turns to
another path later is relayed to an aiohttp handler from that request on, in order, so the
admin API, the console, ``/mcp``, the health checks and the metrics are aiohttp's alone.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import httptools
from aiohttp import hdrs, web
from aiohttp.helpers import (
    must_be_empty_body,
    rfc822_formatted_time,
    should_remove_content_length,
)
from aiohttp.http import SERVER_SOFTWARE
from aiohttp.http_parser import SINGLETON_HEADERS
from aiohttp.http_writer import _serialize_headers
from aiohttp.tcp_helpers import tcp_nodelay
from aiohttp.web_protocol import RequestHandler
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from gateway.flow.requests import AgentRequest
from gateway.http.listener import Listener, bind
from gateway.http.problems import problem
from gateway.settings.config import Limits

log = logging.getLogger("statusgate")
Handler = Callable[[AgentRequest], Awaitable[web.StreamResponse]]
Middleware = Callable[["LaneRequest", Handler], Awaitable[web.StreamResponse]]

MAX_LINE = 8190  # bytes of a request target (aiohttp's max_line_size)
MAX_FIELD = 8190  # bytes of a header field's name or value (max_field_size, see on_header)
MAX_FIELDS = 128  # header fields (max_headers)
BODY_HIGH = 256 * 1024  # bytes of a body buffered before reading pauses
REFUSED_LINGER = 2.0  # seconds a connection refused 503 is read, and dropped, at most
# The agent's paths, as the aiohttp routes /p/{provider} and /p/{provider}/{tail:.*} take
# them: a provider name with no slash and no brace, then nothing or a slash and anything.
AGENT_PATH = re.compile(r"/p/([^{}/]+)(?:/(.*))?", re.S)
# The methods agents' calls use; a connection opening with any other (one llhttp may not
# know, that aiohttp's router answers) is aiohttp's.
FIRST_LINE = re.compile(rb"(?:GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS) (\S*)")
QUEUE_HIGH = 32  # pipelined requests waiting before reading pauses (aiohttp's bound)
LINGER = 10.0  # seconds the rest of an unread body is read and dropped before closing
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
MALFORMED = b"\x00 / HTTP/1.1\r\n\r\n"  # relayed in place of a malformed request: aiohttp 400s it
INTERNAL = "The gateway failed to handle this request."
FULL = (
    "The gateway has as many connections open as it keeps (limits.max_connections) and none "
    "is idle; nothing was read. Retry after the Retry-After header."
)


class Body:
    """A request body as it arrives: what ``gateway.http.bodies`` reads (``iter_chunked``),
    with reading paused while more than BODY_HIGH bytes wait."""

    __slots__ = ("_chunks", "_eof", "_error", "_lane", "_size", "_unread", "_waiter")

    def __init__(self, lane: Lane) -> None:
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._eof = False
        self._waiter: asyncio.Future[None] | None = None
        self._lane = lane
        self._unread = False  # answered without reading it all: the rest is dropped
        self._error: Exception | None = None  # the rest of the body cannot be framed

    def feed(self, chunk: bytes) -> None:
        if self._unread:
            return
        self._chunks.append(chunk)
        self._size += len(chunk)
        if self._size > BODY_HIGH:
            self._lane.pause("body")
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
        self._lane.resume("body")

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
                self._lane.resume("body")
            while len(chunk) > n:
                yield chunk[:n]
                chunk = chunk[n:]
            yield chunk


class LaneRequest(dict[Any, Any]):
    """What the agent handlers read of a request, as ``web.Request`` names it: ``app``,
    ``method``, ``path``, ``rel_url``, ``headers``, ``match_info``, ``transport``,
    ``content_length``, ``content``, ``version``, ``keep_alive``, and the request's own keys
    (``request[PROVIDER]``). tests/http/test_lane.py runs the agent tests through it."""

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
        "version",
    )

    def __init__(
        self,
        app: web.Application,
        method: str,
        rel_url: URL,
        headers: CIMultiDictProxy[str],
        provider: str,
        tail: str,
        transport: asyncio.Transport,
        content: Body,
        version: tuple[int, int],
        keep_alive: bool,
    ) -> None:
        super().__init__()
        self.app = app
        self.method = method
        self.rel_url = rel_url
        self.headers = headers
        self.match_info = {"provider": provider, "tail": tail}
        self.transport: asyncio.Transport | None = transport
        self.content = content
        self.version = version
        self.keep_alive = keep_alive
        self._content_length: int | None = -1

    @property
    def path(self) -> str:
        return self.rel_url.path

    @property
    def uncancelled(self) -> Uncancelled:
        """Entered, the lane does not cancel this request's handler until it is left."""
        return self.content._lane.uncancelled

    @property
    def content_length(self) -> int | None:
        if self._content_length == -1:
            value = self.headers.get(hdrs.CONTENT_LENGTH)
            self._content_length = int(value) if value is not None and value.isdigit() else None
        return self._content_length


class BadHead(Exception):
    """A request head the lane refuses as aiohttp would: a line or field past its limits,
    or an HTTP/1.1 request without Host (RFC 9112, 3.2)."""


def agent_target(rel_url: URL) -> tuple[str, str] | None:
    """(provider, tail) when ``rel_url`` is an agent call, matched as aiohttp's router
    matches ``/p/{provider}`` and ``/p/{provider}/{tail:.*}`` (on ``path_safe``)."""
    match = AGENT_PATH.fullmatch(rel_url.path_safe)
    return None if match is None else (match.group(1), match.group(2) or "")


def wants_lane(first: bytes) -> bool | None:
    """Whether a connection whose first bytes are ``first`` starts with an agent call; None
    while too few have come to tell."""
    match = FIRST_LINE.match(first)
    if match is None:
        method = first.partition(b" ")[0]
        waiting = b" " not in first and len(first) <= 16 and method.isalpha() and method.isupper()
        return None if waiting or not first else False
    target = match.group(1)
    if match.end() == len(first) and b"/p/".startswith(target):
        return None  # "GET /p" so far
    return target.startswith(b"/p/")


def body_framing(fields: list[tuple[bytes, bytes]]) -> bytes | None:
    """The field framing the body of a request with these header fields, if it has one."""
    framing = None
    for name, value in fields:
        lower = name.lower()
        if lower == b"transfer-encoding" and b"chunked" in value.lower():
            return b"Transfer-Encoding: chunked"
        if lower == b"content-length" and value.strip() not in (b"", b"0"):
            framing = b"Content-Length: " + value.strip()
    return framing


class Uncancelled:
    """Entered by a handler that polls the provider in its own task (gateway/flow/polls.py):
    until it leaves, its client going away or a stop past its grace does not cancel the
    handler; the cancel waits for the poll's end, as if the poll had a task of its own."""

    __slots__ = ("_lane",)

    def __init__(self, lane: Lane) -> None:
        self._lane = lane

    def __enter__(self) -> None:
        self._lane.defer_cancel()

    def __exit__(self, *exc: object) -> None:
        self._lane.end_deferral()


class Outbox:
    """The lanes with answers to write, written at the end of this turn of the loop."""

    __slots__ = ("_lanes", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lanes: list[Lane] = []

    def add(self, lane: Lane) -> None:
        if not self._lanes:
            self._loop.call_soon(self._flush)
        self._lanes.append(lane)

    def _flush(self) -> None:
        lanes, self._lanes = self._lanes, []
        for lane in lanes:
            try:
                lane.flush()
            except Exception:  # one connection's failure leaves the others' answers to go
                log.exception("writing an answer failed")


class Connections:
    """The agent listener's open connections and, of those, the idle ones (no request in
    hand, no head begun) in the order they became idle: what ``limits.max_connections``
    bounds, and where room is made past it."""

    __slots__ = ("_open", "idle")

    def __init__(self) -> None:
        self._open: dict[Lane, None] = {}
        self.idle: dict[Lane, None] = {}

    @property
    def open(self) -> int:
        return len(self._open)

    def admit(self, lane: Lane, bound: int | None) -> bool:
        """Count ``lane`` in, closing the connection idle the longest to make room past
        ``bound``; False when every connection is busy (``lane`` is then not counted)."""
        if bound is not None and len(self._open) >= bound:
            victim = next(iter(self.idle), None)
            if victim is None:
                return False
            self.forget(victim)
            victim.evict()
        self._open[lane] = None
        self.idle[lane] = None
        return True

    def forget(self, lane: Lane) -> None:
        self._open.pop(lane, None)
        self.idle.pop(lane, None)


class Refused(asyncio.Protocol):
    """A connection past ``limits.max_connections`` once its 503 is written: the sending
    side is shut after it (a FIN, not a reset that could destroy the answer unread), what
    the client still sends is read and dropped, and the connection closes at the client's
    own FIN or after REFUSED_LINGER."""

    def __init__(self, transport: asyncio.Transport) -> None:
        transport.set_protocol(self)
        if transport.can_write_eof():
            transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(REFUSED_LINGER, transport.close)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool | None:
        return None  # the transport closes

    def connection_lost(self, exc: BaseException | None) -> None:
        self._timer.cancel()


class Lane(asyncio.Protocol):
    """One agent connection (see the module docstring)."""

    def __init__(self, site: LaneSite) -> None:
        self.site = site
        self.app = site.app
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._out: list[bytes] = []  # written at the end of this turn (Outbox)
        self.parser: httptools.HttpRequestParser | None = None
        self._first = b""
        self._queue: deque[tuple[LaneRequest, bool]] = deque()  # answered in order
        self._task: asyncio.Task[None] | None = None
        self._task_handler = None  # read by aiohttp's web.Server.connection_lost
        self._stopping = False  # the runner stops, or the agent asked to close: no new requests
        self._owed: bytes | None = None  # the 400 of a malformed request, after those before it
        # the timeouts (_tick): one timer a connection, never asleep longer than _step
        self._timer: asyncio.TimerHandle | None = None
        self._idle_lanes = site.connections.idle  # this lane is in it while idle
        self._received = 0.0  # loop time of the last bytes read
        self._free_at = 0.0  # loop time it last had nothing in hand: its start, an answer
        self._head_at: float | None = None  # loop time the head being read began
        self._served = False  # a request was answered: keepalive_timeout, not header_timeout
        self._header_timeout = self._keepalive_timeout = self._step = 0.0
        self._paused: set[str] = set()  # why reading is paused (a full body, queue, relay)
        self._write_paused: asyncio.Future[None] | None = None
        # the request being parsed
        self._url: list[bytes] = []
        self._fields: list[tuple[bytes, bytes]] = []
        self._body: Body | None = None
        self._relaying = False  # this request on is relayed to aiohttp
        self._relay: RequestHandler | None = None
        self._relay_waiting: list[bytes] = []
        self._chunked = False
        self._framing: bytes | None = None  # how the body of an upgrade request is framed
        self._reframing = False  # a parser is told that framing (_reframe)
        self.uncancelled = Uncancelled(self)  # for the handler's poll (LaneRequest.uncancelled)
        self._uncancelled = 0  # the handler is inside that many of them
        self._cancel_due = False  # a cancel of the handler waits for their end

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        site = self.site
        self.transport = cast(asyncio.Transport, transport)
        if not site.admit(self):
            return  # answered 503 and handed to a Refused protocol
        tcp_nodelay(self.transport, True)
        site.manager.connection_made(cast(RequestHandler, self), self.transport)
        limits = site.limits()
        self._header_timeout = limits.header_timeout
        self._keepalive_timeout = limits.keepalive_timeout
        self._step = min(self._header_timeout, self._keepalive_timeout)
        self._free_at = now = self.loop.time()
        self._timer = self.loop.call_at(now + self._step, self._tick)

    def data_received(self, data: bytes) -> None:
        self._received = self.loop.time()
        if self.parser is None:
            if self._relay is not None:  # handed to aiohttp whole (_hand_over)
                self._relay.data_received(data)
                return
            if self._head_at is None:
                self._head_at = self._received
                self._idle_lanes.pop(self, None)
            first = self._first + data
            wanted = wants_lane(first)
            if wanted is None:
                self._first = first
                return
            self._first = b""
            if not wanted:
                self._hand_over(first)
                return
            self.parser = httptools.HttpRequestParser(self)
            data = first
        try:
            self._feed(self.parser, data)
        except httptools.HttpParserError as exc:  # a callback's own error is its context
            cause = exc.__context__
            if isinstance(cause, BadHead):
                self._bad_request(str(cause), type(cause).__name__)
            else:
                detail = "The request is not valid HTTP/1.1."
                self._bad_request(detail, type(exc).__name__)

    def _feed(self, parser: httptools.HttpRequestParser, data: bytes) -> None:
        """Parse ``data``. llhttp stops after a request asking for another protocol
        (``Upgrade: h2c``, a WebSocket handshake, CONNECT): the lane ignores the upgrade, as
        RFC 9110 7.8 lets a server and aiohttp's server does, answers the request as any
        other and parses the bytes after it as the next request. httptools skips the body
        of such a request; a parser of its own reads it (``_reframe``)."""
        while True:
            try:
                parser.feed_data(data)
                return
            except httptools.HttpParserUpgrade as upgrade:
                data = data[upgrade.args[0] :]
                if self._framing is not None:
                    parser = self._reframe(self._framing)
                if not data:
                    return

    def _reframe(self, framing: bytes) -> httptools.HttpRequestParser:
        """A new parser for the rest of the connection, starting inside the body of the
        upgrade request just read: told how that body is framed by a head of its own,
        which is no request (``_reframing``)."""
        self._framing = None
        parser = self.parser = httptools.HttpRequestParser(self)
        chunked = self._chunked
        self._reframing = True
        try:
            parser.feed_data(b"PUT / HTTP/1.1\r\n%s\r\n\r\n" % framing)
        finally:
            self._reframing = False
        self._chunked = chunked
        return parser

    def eof_received(self) -> bool | None:
        """The client sent its last byte (a FIN): it is gone, as aiohttp and nginx take it,
        since a client that closed and one that only shut its sending side look alike
        here. No request is read or answered after this. The connection closes at the end
        of this turn of the loop, once what is queued to write (answers of this turn
        included) is written, and a handler still running is then cancelled; but a
        handler polling the provider (``Uncancelled``) is let finish first, and what it
        answers without waiting further is written before the connection closes: the
        provider call is made and paid for, and a client that only half-closed
        (``shutdown(SHUT_WR)``) is still reading."""
        if self._relay is not None:
            self._relay.eof_received()
            return None
        self._stopping = True
        if self._uncancelled:
            self._cancel_due = True  # at the poll's end: the answer, or the cancel of a wait
        else:
            self.loop.call_soon(self._close)
        return True

    def connection_lost(self, exc: BaseException | None) -> None:
        self.site.manager.connection_lost(cast(RequestHandler, self), exc)
        self.site.connections.forget(self)
        if self._timer is not None:
            self._timer.cancel()
        if self._body is not None:
            self._body.feed_eof()
        self._cancel()  # the client went away (aiohttp's handler_cancellation)
        if self._write_paused is not None and not self._write_paused.done():
            self._write_paused.set_result(None)
        if self._relay is not None:
            self._relay.connection_lost(exc)
        self.transport = None
        self._out = []

    def pause_writing(self) -> None:
        if self._relay is not None:
            self._relay.pause_writing()
            return
        self._write_paused = self.loop.create_future()

    def resume_writing(self) -> None:
        if self._relay is not None:
            self._relay.resume_writing()
            return
        if self._write_paused is not None and not self._write_paused.done():
            self._write_paused.set_result(None)
        self._write_paused = None

    # -- httptools callbacks ------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._head_at is None:
            self._head_at = self._received
            self._idle_lanes.pop(self, None)
        self._url = []
        self._fields = []
        self._chunked = False

    def on_url(self, url: bytes) -> None:
        self._url.append(url)
        if sum(map(len, self._url)) > MAX_LINE:
            raise BadHead("The request line or a header field is too long.")

    def on_header(self, name: bytes, value: bytes) -> None:
        """A header field, held to aiohttp's limits as its C parser counts them when a
        name arrives in one read (``cb_on_header_field``, ``cb_on_header_value``): a value
        of at most MAX_FIELD bytes, trailing whitespace included, and a name too, but the
        name is counted with the name of the field before it and the first field's value
        with its name (the parser checks a name before it files the field before);
        MAX_FIELDS fields."""
        fields = self._fields
        if fields:
            named, valued = len(fields[-1][0]) + len(name), len(value)
        else:
            named = len(name)
            valued = named + len(value)
        if named > MAX_FIELD or valued > MAX_FIELD or len(fields) >= MAX_FIELDS:
            raise BadHead("The request line or a header field is too long.")
        fields.append((name, value.rstrip(b" \t")))  # trailing OWS is no part of it

    def on_headers_complete(self) -> None:
        self._head_at = None
        if self._reframing:  # the head framing an upgrade request's body (_reframe)
            return
        parser = self.parser
        assert parser is not None and self.transport is not None
        target = b"".join(self._url)
        method = parser.get_method().decode("ascii", "replace")
        if parser.should_upgrade() and method != "CONNECT":
            self._framing = body_framing(self._fields)
        found = rel_url = None
        if not self._relaying and target.startswith(b"/p/") and method != "CONNECT":
            raw_path, _, query = target.partition(b"#")[0].partition(b"?")
            rel_url = URL.build(
                path=raw_path.decode("latin-1"), query_string=query.decode("latin-1"), encoded=True
            )
            found = agent_target(rel_url)
        if found is None or rel_url is None:
            self._relaying = True
            self._relay_head(method, target)
            return
        headers: CIMultiDict[str] = CIMultiDict()
        for name, value in self._fields:
            key = name.decode("latin-1")
            if key in headers and key.lower() in SINGLETON_HEADERS:
                raise BadHead(f"The request carries {key} twice.")
            headers.add(key, value.decode("utf-8", "surrogateescape"))
        version = parser.get_http_version()
        if version != "1.0" and hdrs.HOST not in headers:
            raise BadHead("An HTTP/1.1 request must carry a Host header.")
        body = Body(self)
        request = LaneRequest(
            self.app,
            method,
            rel_url,
            CIMultiDictProxy(headers),
            found[0],
            found[1],
            self.transport,
            body,
            (1, 0) if version == "1.0" else (1, 1),
            parser.should_keep_alive(),
        )
        self._body = body
        expects = headers.get(hdrs.EXPECT, "").lower() == "100-continue" and version != "1.0"
        self._queue.append((request, expects))
        if len(self._queue) >= QUEUE_HIGH:
            self.pause("queue")
        if self._task is None:
            self._next()

    def on_body(self, body: bytes) -> None:
        if self._relaying:
            self._relay_bytes(b"%x\r\n%s\r\n" % (len(body), body) if self._chunked else body)
        elif self._body is not None:
            self._body.feed(body)

    def on_message_complete(self) -> None:
        if self._framing is not None:  # httptools skipped the body of an upgrade request
            return
        if self._relaying:
            if self._chunked:
                self._relay_bytes(b"0\r\n\r\n")
            return
        if self._body is not None:
            self._body.feed_eof()
            self._body = None

    # -- answering ------------------------------------------------------------------------

    def _next(self) -> None:
        """Answer the next request in line; none left: the bytes waiting for a relay, the
        400 owed for a malformed request, the close of a stop, or the idle timer."""
        if self._queue and not self._stopping:
            request, expects = self._queue.popleft()
            if len(self._queue) <= QUEUE_HIGH // 2:
                self.resume("queue")
            self._task = self.loop.create_task(self._answer(request, expects))
            return
        self._task = None
        transport = self.transport
        if transport is None:
            return
        if self._stopping:  # no aiohttp handler is started once a stop began
            if self._relay is None:
                self._close()
        elif self._relay_waiting:
            self._start_relay()
        elif self._owed is not None:
            self._send(self._owed)
            self._close()
        elif self._relay is None:
            self._rest()

    async def _answer(self, request: LaneRequest, expects: bool) -> None:
        if self.transport is None:
            return
        if expects:
            self._send(CONTINUE)
        try:
            response: web.StreamResponse = await self.site.middleware(request, self.site.handler)
        except asyncio.CancelledError:
            self._close()  # cancelled from within: no answer, no connection
            raise
        except web.HTTPException as exc:  # as aiohttp does: the exception is the answer
            response = exc
        except Exception:  # the middleware answers every error: this is a bug of ours
            log.exception("unhandled error on %s %s", request.method, request.path)
            response = problem("internal-error", INTERNAL)
            response.force_close()
        body = request.content
        body.drop()
        if not body.complete:  # the rest is read and dropped, for LINGER at most
            self.loop.call_later(LINGER, self._linger_end, body)
        try:
            data, keep = serialize(response, request)
        except (TypeError, ValueError) as exc:  # a handler's bug, never the agent's
            log.error("cannot write the answer to %s %s: %s", request.method, request.path, exc)
            data, keep = serialize(problem("internal-error", INTERNAL), request)
        if self.transport is None:
            return
        self._send(data)
        if self._write_paused is not None:  # set by the flush of an earlier answer
            await self._write_paused
        if not keep:
            self._stopping = True
            self._close()
            return
        self._next()

    def defer_cancel(self) -> None:
        """The handler enters an Uncancelled section."""
        self._uncancelled += 1

    def end_deferral(self) -> None:
        """The handler leaves it: a cancel that waited comes now, when it was the last."""
        self._uncancelled -= 1
        if not self._uncancelled and self._cancel_due:
            self._cancel_due = False
            self._cancel()

    def _cancel(self) -> None:
        """Cancel the handler running, now, or once it left its Uncancelled sections."""
        task = self._task
        if task is None or task.done():
            return
        if self._uncancelled:
            self._cancel_due = True
        else:
            task.cancel()

    def _send(self, data: bytes) -> None:
        """``data`` to be written at the end of this turn of the loop, after what this
        connection queued before it."""
        if not self._out:
            self.site.outbox.add(self)
        self._out.append(data)

    def flush(self) -> None:
        """Write what this connection queued (the Outbox, at the end of a turn)."""
        out, self._out = self._out, []
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def _close(self) -> None:
        """Close the connection once what it queued is written."""
        if self.transport is not None:
            self.flush()
            self.transport.close()

    def _bad_request(self, detail: str, kind: str) -> None:
        """A request that cannot be framed: 400 once what came before it is answered, then
        the connection closes (nothing after it can be framed). Inside the body of an agent
        call, that call's handler meets the error as it reads (answered 400 by the
        middleware); on a relayed connection aiohttp answers it, in order."""
        peer = self.transport.get_extra_info("peername") if self.transport else None
        where = peer[0] if isinstance(peer, tuple) and peer else "unknown"
        # one short line, as aiohttp's parser errors get (ParserNoise): never the request
        log.warning("rejected a malformed request from %s: %s (400)", where, kind)
        self.parser = httptools.HttpRequestParser(_Discard())
        if self._relaying:
            self._relay_bytes(MALFORMED)
            return
        if self._body is not None:
            self._body.fail(web.HTTPBadRequest(reason=detail))
            self._body = None
            self._owed = b""  # the handler answers it; then the connection closes
        else:
            self._owed = bad_request(detail)
        if self._task is None:
            self._next()

    def _linger_end(self, body: Body) -> None:
        """An answered request's body still arriving after LINGER: the connection ends."""
        if not body.complete:
            self._close()

    def pause(self, reason: str) -> None:
        """Stop reading for ``reason`` (a full body buffer, the queue, bytes for a relay)."""
        if not self._paused and self.transport is not None:
            self.transport.pause_reading()
        self._paused.add(reason)

    def resume(self, reason: str) -> None:
        if reason in self._paused:
            self._paused.discard(reason)
            if not self._paused and self.transport is not None:
                self.transport.resume_reading()

    def _rest(self) -> None:
        """Every request read is answered: the connection idles (unless the next head has
        begun) and its timeouts count from now."""
        self._free_at = self.loop.time()
        self._served = True
        if self._head_at is None:
            self._idle_lanes[self] = None

    def _tick(self) -> None:
        """The connection's timeouts, checked by one timer that never sleeps longer than
        the shorter of the two: a head not whole ``header_timeout`` after it began (or
        after the answer before it) is answered 408 and the connection closes; a
        connection with nothing in hand closes silently ``keepalive_timeout`` after its
        last answer, or ``header_timeout`` after its start when it never sent a byte. A
        request in hand is bounded elsewhere (body_timeout, the handlers' own); a relayed
        connection by aiohttp (its keepalive_timeout). No timer a request: a timer moved
        at each request measured ~2 us."""
        self._timer = None
        if self.transport is None or self._relay is not None:
            return
        now = self.loop.time()
        if self._task is not None or self._queue or self._stopping:
            due = now + self._step
        elif self._head_at is not None:
            due = max(self._head_at, self._free_at) + self._header_timeout
            if now >= due:
                self._head_timeout()
                return
        else:
            limit = self._keepalive_timeout if self._served else self._header_timeout
            due = self._free_at + limit
            if now >= due:
                self._close()
                return
        self._timer = self.loop.call_at(min(due, now + self._step), self._tick)

    def _head_timeout(self) -> None:
        peer = self.transport.get_extra_info("peername") if self.transport else None
        where = peer[0] if isinstance(peer, tuple) and peer else "unknown"
        log.warning(
            "closed a connection from %s: its request head did not come within"
            " limits.header_timeout (408)",
            where,
        )
        detail = (
            f"The request head did not arrive within limits.header_timeout"
            f" ({self._header_timeout:g}s)."
        )
        self._send(closing_answer(problem("request-timeout", detail)))
        self._close()

    def evict(self) -> None:
        """Closed to make room for a new connection (``Connections.admit``): idle, it
        loses nothing."""
        self._close()

    # -- graceful stop (called by aiohttp's runner through LaneSite) -----------------------

    def close(self) -> None:
        """No new requests; close once the one in hand is answered."""
        self._stopping = True
        if self._task is None and self._relay is None:
            self._close()

    async def shutdown(self, timeout: float | None) -> None:
        self.close()
        task = self._task
        if task is not None and not task.done():
            done, _ = await asyncio.wait([task], timeout=timeout)
            if not done:
                self._cancel()
        if self._relay is None:
            self._close()

    # -- relaying to aiohttp ----------------------------------------------------------------

    def _hand_over(self, first: bytes) -> None:
        """The connection starts with another path: aiohttp serves it from its first byte,
        the lane passing its bytes through (so it stays counted in ``Connections``)."""
        self.site.manager.connection_lost(cast(RequestHandler, self), None)  # aiohttp's is
        self._relaying = True
        self._relay_waiting.append(first)
        self._start_relay()

    def _relay_head(self, method: str, target: bytes) -> None:
        """A request for aiohttp, framed again as it came (a chunked body chunked again)."""
        parser = self.parser
        assert parser is not None
        version = parser.get_http_version().encode()
        lines = [b"%s %s HTTP/%s\r\n" % (method.encode(), target, version)]
        for name, value in self._fields:
            lines.append(b"%s: %s\r\n" % (name, value))
            if name.lower() == b"transfer-encoding" and b"chunked" in value.lower():
                self._chunked = True
        lines.append(b"\r\n")
        self._relay_bytes(b"".join(lines))

    def _relay_bytes(self, data: bytes) -> None:
        if self._relay is not None:
            self._relay.data_received(data)
            return
        self._relay_waiting.append(data)
        if sum(map(len, self._relay_waiting)) > BODY_HIGH:
            self.pause("relay")
        if self._task is None and not self._stopping:
            self._start_relay()

    def _start_relay(self) -> None:
        if self._relay is None:
            if self.transport is None:
                return
            self.flush()  # the lane's last answers go first
            self._relay = self.site.aiohttp_handler()
            self._relay.connection_made(self.transport)
            paused = self._write_paused
            if paused is not None:  # that flush filled the buffer: aiohttp waits for it too
                self._relay.pause_writing()
                self._write_paused = None
                if not paused.done():
                    paused.set_result(None)

        self._idle_lanes.pop(self, None)
        waiting, self._relay_waiting = self._relay_waiting, []
        self.resume("relay")
        self._relay.data_received(b"".join(waiting))


class _Discard:
    """Parser callbacks that ignore what follows a malformed request."""


def serialize(response: web.StreamResponse, request: LaneRequest) -> tuple[bytes, bool]:
    """The bytes aiohttp would write for ``response`` (a whole ``web.Response``) and whether
    the connection stays open after it."""
    if not isinstance(response, web.Response) or response.prepared:
        raise TypeError("the agent lane writes whole web.Response answers only")
    body = response.body
    if body is None:
        body = b""
    elif not isinstance(body, (bytes, bytearray)):
        raise TypeError("the agent lane writes bytes bodies only")
    headers = response.headers
    status, method = response.status, request.method
    empty = must_be_empty_body(method, status)
    sized = len(body) or (status != 304 and method != hdrs.METH_HEAD)
    if hdrs.CONTENT_LENGTH not in headers and sized:  # web.Response._start
        headers[hdrs.CONTENT_LENGTH] = str(len(body))
    if empty:  # StreamResponse._prepare_headers
        if hdrs.CONTENT_LENGTH in headers and should_remove_content_length(method, status):
            del headers[hdrs.CONTENT_LENGTH]
        headers.pop(hdrs.TRANSFER_ENCODING, None)
    elif len(body):
        headers.setdefault(hdrs.CONTENT_TYPE, "application/octet-stream")
    if hdrs.DATE not in headers:
        headers[hdrs.DATE] = rfc822_formatted_time()
    headers.setdefault(hdrs.SERVER, SERVER_SOFTWARE)
    keep = response.keep_alive if response.keep_alive is not None else request.keep_alive
    version = request.version
    if hdrs.CONNECTION not in headers:
        if keep:
            if version == (1, 0):
                headers[hdrs.CONNECTION] = "keep-alive"
        elif version == (1, 1):
            headers[hdrs.CONNECTION] = "close"
    line = f"HTTP/{version[0]}.{version[1]} {status} {response.reason}"
    head = _serialize_headers(line, headers)
    return (head if empty else head + bytes(body)), bool(keep)


def bad_request(detail: str) -> bytes:
    return closing_answer(problem("invalid-request", detail))


def closing_answer(response: web.Response) -> bytes:
    """The bytes of ``response`` as the last answer on a connection (Connection: close)."""
    response.force_close()
    request = cast(LaneRequest, _Head())
    return serialize(response, request)[0]


class _Head:
    method = "GET"
    version = (1, 1)
    keep_alive = False


class LaneSite(web.BaseSite):
    """A TCP listener (gateway/http/listener.py: every waiting connection accepted at once)
    whose agent calls take the lane and everything else aiohttp's own server, both under
    one AppRunner. Each lane connection is registered with the runner's
    ``web.Server`` as aiohttp's own are, so the runner's cleanup stops both alike: no new
    requests once it begins (``close``), the one in hand answered within the shutdown
    timeout (``shutdown``)."""

    __slots__ = (
        "_cap",
        "_host",
        "_limits",
        "_listener",
        "_on_refused",
        "_port",
        "_refusing",
        "_reuse_port",
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
    ) -> None:
        """``limits``: the running limits (header and keep-alive timeouts, read as each
        connection starts; ``max_connections``); ``connection_cap``: connections the
        process's open-files limit leaves room for, whatever max_connections says;
        ``on_refused``: told of each connection refused past the bound."""
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

    @property
    def name(self) -> str:
        return str(URL.build(scheme="http", host=self._host, port=self._port))

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
        listener = self._listener = Listener(sockets, lambda: Lane(self), backlog=self._backlog)
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
