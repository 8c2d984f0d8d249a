"""One agent connection (``Lane``, as uvicorn's HttpToolsProtocol): an asyncio protocol on
httptools (llhttp) that reads requests, answers agents' calls in order through the request
cycle (cycle.py), relays any other request to aiohttp (relay.py), and keeps the
connection's timeouts. What the lane as a whole owns and why: the package's docstring.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Protocol, cast

import httptools
from aiohttp import hdrs, web
from aiohttp.tcp_helpers import tcp_nodelay
from aiohttp.web_protocol import RequestHandler
from multidict import CIMultiDictProxy

from gateway.http.lane.body import Body
from gateway.http.lane.connections import Connections
from gateway.http.lane.cycle import Cycle, Handler, Middleware
from gateway.http.lane.flow import FlowControl, Outbox
from gateway.http.lane.head import (
    MAX_FIELD,
    MAX_FIELDS,
    MAX_LINE,
    TOO_LONG,
    BadHead,
    agent_url,
    body_framing,
    field_fits,
    headers_of,
    wants_lane,
)
from gateway.http.lane.relay import Relay
from gateway.http.lane.request import LaneRequest
from gateway.http.lane.wire import MALFORMED, bad_request, closing_answer
from gateway.http.problems import problem
from gateway.settings.config import Limits

log = logging.getLogger("statusgate")
QUEUE_HIGH = 32  # pipelined requests waiting before reading pauses (aiohttp's bound)
LINGER = 10.0  # seconds the rest of an unread body is read and dropped before closing


class Site(Protocol):
    """What a connection reads of its listener (gateway/http/lane/site.LaneSite)."""

    @property
    def app(self) -> web.Application: ...

    @property
    def manager(self) -> web.Server: ...

    @property
    def connections(self) -> Connections: ...

    @property
    def outbox(self) -> Outbox: ...

    @property
    def middleware(self) -> Middleware: ...

    @property
    def handler(self) -> Handler: ...

    def limits(self) -> Limits: ...

    def admit(self, lane: Lane) -> bool: ...

    def aiohttp_handler(self) -> RequestHandler: ...


class Lane(asyncio.Protocol):
    """One agent connection."""

    def __init__(self, site: Site) -> None:
        self.site = site
        self.app = site.app
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.flow = FlowControl()
        self.cycle = Cycle(self, site.middleware, site.handler)
        self.relay: Relay | None = None  # this connection's requests go to aiohttp from some on
        self._out: list[bytes] = []  # written at the end of this turn (Outbox)
        self.parser: httptools.HttpRequestParser | None = None
        self._first = b""  # a connection's first bytes, until they tell who serves it
        self._queue: deque[tuple[LaneRequest, bool]] = deque()  # answered in order
        self._task_handler = None  # read by aiohttp's web.Server.connection_lost
        self._stopping = False  # the runner stops, or the client ends: no new requests
        self._owed: bytes | None = None  # the 400 of a malformed request, after those before it
        # the timeouts (_tick): one timer a connection, never asleep longer than _step
        self._timer: asyncio.TimerHandle | None = None
        self._idle_lanes = site.connections.idle  # this lane is in it while idle
        self._received = 0.0  # loop time of the last bytes read
        self._free_at = 0.0  # loop time it last had nothing in hand: its start, an answer
        self._head_at: float | None = None  # loop time the head being read began
        self._served = False  # a request was answered: keepalive_timeout, not header_timeout
        self._half_open = True  # a FIN keeps the transport open to write (not over TLS)
        self._header_timeout = self._keepalive_timeout = self._step = 0.0
        # the request being parsed
        self._url: list[bytes] = []
        self._fields: list[tuple[bytes, bytes]] = []
        self._before = 0  # bytes of the name of the field before (head.field_fits)
        self._body: Body | None = None
        self._relaying = False  # this request on is relayed to aiohttp
        self._framing: bytes | None = None  # how the body of an upgrade request is framed
        self._reframing = False  # a parser is told that framing (_reframe)

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        site = self.site
        self.transport = self.flow.transport = cast(asyncio.Transport, transport)
        if not site.admit(self):
            return  # answered 503 and handed to a Refused protocol
        tcp_nodelay(self.transport, True)
        self._half_open = transport.get_extra_info("sslcontext") is None
        site.manager.connection_made(cast(RequestHandler, self), self.transport)
        limits = site.limits()
        self._header_timeout = limits.header_timeout
        self._keepalive_timeout = limits.keepalive_timeout
        self._step = min(self._header_timeout, self._keepalive_timeout)
        self._free_at = now = self.loop.time()
        self._timer = self.loop.call_at(now + self._step, self._tick)

    def data_received(self, data: bytes) -> None:
        self._received = self.loop.time()
        parser = self.parser
        if parser is None:
            parser = self._first_bytes(data)
            if parser is None:
                return
            data, self._first = self._first, b""
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self._after_upgrade(data[upgrade.args[0] :])
        except httptools.HttpParserError as exc:
            self._unframed(exc)

    def _first_bytes(self, data: bytes) -> httptools.HttpRequestParser | None:
        """The connection's first bytes: kept until they tell who serves the connection;
        a parser of the lane's once they start an agent call (they are in ``_first``)."""
        relay = self.relay
        if relay is not None and relay.handler is not None:  # passed through (_hand_over)
            relay.handler.data_received(data)
            return None
        if self._head_at is None:
            self._head_at = self._received
            self._idle_lanes.pop(self, None)
        first = self._first + data
        wanted = wants_lane(first)
        self._first = b"" if wanted is False else first
        if wanted is None:
            return None
        if not wanted:
            self._hand_over(first)
            return None
        parser = self.parser = httptools.HttpRequestParser(self)
        return parser

    def _after_upgrade(self, data: bytes) -> None:
        """llhttp stops after a request asking for another protocol (``Upgrade: h2c``, a
        WebSocket handshake, CONNECT): the lane ignores the upgrade, as RFC 9110 7.8 lets a
        server and aiohttp's server does, answers the request as any other and parses the
        bytes after it (``data``) as the next request. httptools skips the body of such a
        request; a parser of its own reads it (``_reframe``)."""
        parser = self.parser
        while parser is not None:
            if self._framing is not None:
                parser = self._reframe(self._framing)
            if not data:
                return
            try:
                parser.feed_data(data)
                return
            except httptools.HttpParserUpgrade as upgrade:
                data = data[upgrade.args[0] :]
            except httptools.HttpParserError as exc:
                self._unframed(exc)
                return

    def _reframe(self, framing: bytes) -> httptools.HttpRequestParser:
        """A new parser for the rest of the connection, starting inside the body of the
        upgrade request just read: told how that body is framed by a head of its own,
        which is no request (``_reframing``)."""
        self._framing = None
        parser = self.parser = httptools.HttpRequestParser(self)
        self._reframing = True
        try:
            parser.feed_data(b"PUT / HTTP/1.1\r\n%s\r\n\r\n" % framing)
        finally:
            self._reframing = False
        return parser

    def _unframed(self, exc: httptools.HttpParserError) -> None:
        cause = exc.__context__  # a callback's own error
        if isinstance(cause, BadHead):
            self._bad_request(str(cause), type(cause).__name__)
        else:
            self._bad_request("The request is not valid HTTP/1.1.", type(exc).__name__)

    def eof_received(self) -> bool | None:
        """The client sent its last byte (a FIN): it is gone, as aiohttp and nginx take it,
        since a client that closed and one that only shut its sending side look alike
        here. No request is read or answered after this. The connection closes at the end
        of this turn of the loop, once what is queued to write (answers of this turn
        included) is written, and a handler still running is then cancelled; but a
        handler polling the provider (``Uncancelled``) is let finish first, and what it
        answers without waiting further is written before the connection closes: the
        provider call is made and paid for, and a client that only half-closed
        (``shutdown(SHUT_WR)``) is still reading. Over TLS a client's close_notify ends
        the connection as the transport closes it (TLS has no half-close)."""
        relay = self.relay
        if relay is not None and relay.handler is not None:
            relay.handler.eof_received()
            return None
        self._stopping = True
        if self.cycle.polling:
            self.cycle.cancel()  # at the poll's end: the answer, or the cancel of a wait
        else:
            self.loop.call_soon(self.end)
        return True if self._half_open else None

    def connection_lost(self, exc: BaseException | None) -> None:
        self.site.manager.connection_lost(cast(RequestHandler, self), exc)
        self.site.connections.forget(self)
        if self._timer is not None:
            self._timer.cancel()
        if self._body is not None:
            self._body.feed_eof()
        self.cycle.cancel()  # the client went away (aiohttp's handler_cancellation)
        self.flow.lost()
        relay = self.relay
        if relay is not None and relay.handler is not None:
            relay.handler.connection_lost(exc)
        self.transport = None
        self._out = []

    def pause_writing(self) -> None:
        relay = self.relay
        if relay is not None and relay.handler is not None:
            relay.handler.pause_writing()
        else:
            self.flow.pause_writing()

    def resume_writing(self) -> None:
        relay = self.relay
        if relay is not None and relay.handler is not None:
            relay.handler.resume_writing()
        else:
            self.flow.resume_writing()

    # -- httptools callbacks ------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._head_at is None:
            self._head_at = self._received
            self._idle_lanes.pop(self, None)
        self._url = []
        self._fields = []
        self._before = 0

    def on_url(self, url: bytes) -> None:
        self._url.append(url)
        if sum(map(len, self._url)) > MAX_LINE:
            raise BadHead(TOO_LONG)

    def on_header(self, name: bytes, value: bytes) -> None:
        fields = self._fields
        before = self._before
        if before + len(name) + len(value) > MAX_FIELD or len(fields) >= MAX_FIELDS:
            field_fits(before, name, value, len(fields))  # the exact rule; raises BadHead
        self._before = len(name)
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
        call = None
        if not self._relaying and target.startswith(b"/p/") and method != "CONNECT":
            call = agent_url(target)
        if call is None:
            self._relaying = True
            if self.relay is None:
                self.relay = Relay(self.site.aiohttp_handler, self.flow)
            self.relay.head(method, target, parser.get_http_version(), self._fields)
            self._relay_started()
            return
        version = parser.get_http_version()
        headers = headers_of(self._fields, version)
        body = self._body = Body(self.flow)
        rel_url, provider, tail = call
        request = LaneRequest(
            self.app,
            method,
            rel_url,
            CIMultiDictProxy(headers),
            {"provider": provider, "tail": tail},
            self.transport,
            body,
            (1, 0) if version == "1.0" else (1, 1),
            parser.should_keep_alive(),
            self.cycle.uncancelled,
        )
        expects = headers.get(hdrs.EXPECT, "").lower() == "100-continue" and version != "1.0"
        self._queue.append((request, expects))
        if len(self._queue) >= QUEUE_HIGH:
            self.flow.pause("queue")
        if self.cycle.task is None:
            self.next_request()

    def on_body(self, body: bytes) -> None:
        if self._relaying:
            assert self.relay is not None
            self.relay.body(body)
            self._relay_started()
        elif self._body is not None:
            self._body.feed(body)

    def on_message_complete(self) -> None:
        if self._framing is not None:  # httptools skipped the body of an upgrade request
            return
        if self._relaying:
            assert self.relay is not None
            self.relay.end()
            self._relay_started()
        elif self._body is not None:
            self._body.feed_eof()
            self._body = None

    # -- answering ------------------------------------------------------------------------

    def next_request(self) -> None:
        """Answer the next request in line; none left: the bytes waiting for a relay, the
        400 owed for a malformed request, the close of a stop, or rest."""
        cycle = self.cycle
        if self._queue and not self._stopping:
            request, expects = self._queue.popleft()
            if len(self._queue) <= QUEUE_HIGH // 2:
                self.flow.resume("queue")
            cycle.task = self.loop.create_task(cycle.answer(request, expects))
            return
        cycle.task = None
        if self.transport is None:
            return
        relay = self.relay
        if self._stopping:  # no aiohttp handler is started once a stop began
            if relay is None or relay.handler is None:
                self.end()
        elif relay is not None and relay.waiting:
            self._start_relay()
        elif self._owed is not None:
            self.send(self._owed)
            self.end()
        elif relay is None:
            self._rest()

    def _rest(self) -> None:
        """Every request read is answered: the connection idles (unless the next head has
        begun) and its timeouts count from now."""
        self._free_at = self.loop.time()
        self._served = True
        if self._head_at is None:
            self._idle_lanes[self] = None

    def send(self, data: bytes) -> None:
        """``data`` to be written at the end of this turn of the loop, after what this
        connection queued before it."""
        if not self._out:
            self.site.outbox.add(self)
        self._out.append(data)

    def flush(self) -> None:
        """Write what this connection queued (the Outbox, at the end of a turn; a streamed
        answer before each chunk it writes itself, stream.py)."""
        out, self._out = self._out, []
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def end(self) -> None:
        """Close the connection once what it queued is written."""
        if self.transport is not None:
            self.flush()
            self.transport.close()

    def stop(self) -> None:
        """The answer just queued is the connection's last (Connection: close)."""
        self._stopping = True
        self.end()

    def linger(self, body: Body) -> None:
        """An answered request's body is still arriving: read and dropped for LINGER at
        most, then the connection ends."""
        self.loop.call_later(LINGER, self._linger_end, body)

    def _linger_end(self, body: Body) -> None:
        if not body.complete:
            self.end()

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
        if self._relaying and self.relay is not None:
            self.relay.feed(MALFORMED)
            self._relay_started()
            return
        if self._body is not None:
            self._body.fail(web.HTTPBadRequest(reason=detail))
            self._body = None
            self._owed = b""  # the handler answers it; then the connection closes
        else:
            self._owed = bad_request(detail)
        if self.cycle.task is None:
            self.next_request()

    # -- timeouts and room ------------------------------------------------------------------

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
        if self.transport is None or self.relay is not None:
            return
        now = self.loop.time()
        if self.cycle.task is not None or self._queue or self._stopping:
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
                self.end()
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
        self.send(closing_answer(problem("request-timeout", detail)))
        self.end()

    def evict(self) -> None:
        """Closed to make room for a new connection (``Connections.admit``): idle, it
        loses nothing."""
        self.end()

    # -- graceful stop (called by aiohttp's runner through its web.Server) ----------------

    def close(self) -> None:
        """No new requests; close once the one in hand is answered."""
        self._stopping = True
        if self.cycle.task is None and self.relay is None:
            self.end()

    async def shutdown(self, timeout: float | None) -> None:
        self.close()
        task = self.cycle.task
        if task is not None and not task.done():
            done, _ = await asyncio.wait([task], timeout=timeout)
            if not done:
                self.cycle.cancel()
        if self.relay is None or self.relay.handler is None:
            self.end()

    # -- relaying to aiohttp ----------------------------------------------------------------

    def _hand_over(self, first: bytes) -> None:
        """The connection starts with another path: aiohttp serves it from its first byte,
        the lane passing its bytes through (so it stays counted in ``Connections``)."""
        self.site.manager.connection_lost(cast(RequestHandler, self), None)  # aiohttp's is
        self._relaying = True
        relay = self.relay = Relay(self.site.aiohttp_handler, self.flow)
        relay.feed(first)
        self._start_relay()

    def _relay_started(self) -> None:
        """Bytes were given to the relay: it starts when the lane has nothing in hand."""
        relay = self.relay
        idle = self.cycle.task is None and not self._stopping
        if relay is not None and relay.handler is None and idle:
            self._start_relay()

    def _start_relay(self) -> None:
        relay, transport = self.relay, self.transport
        if relay is None or transport is None:
            return
        if relay.handler is None:
            self.flush()  # the lane's last answers go first
        self._idle_lanes.pop(self, None)
        relay.start(transport)


class _Discard:
    """Parser callbacks that ignore what follows a malformed request."""
