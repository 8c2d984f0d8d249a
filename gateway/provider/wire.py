"""HTTP/1.1 to providers: a Connection per socket (an asyncio Protocol feeding httptools'
llhttp parser, the one uvicorn uses) and a Pool of kept-alive connections per origin.

A request is one ``transport.write`` and one parse. A connection goes back to the pool only
after an answer read to its end on a connection the server keeps open; one the server closed
while idle is never handed out again. Bodies are capped as they arrive, after decompression
(gzip and deflate decoded here, in bounded steps). This module never follows a redirect,
keeps a cookie, adds a User-Agent, re-quotes a URL or lets an exception other than an
UpstreamError out (timeouts are the caller's: it bounds the whole exchange).
"""

from __future__ import annotations

import asyncio
import functools
import re
import ssl
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import quote, urlsplit

from httptools import (
    HttpParserCallbackError,
    HttpParserError,
    HttpParserUpgrade,
    HttpResponseParser,
)
from multidict import CIMultiDict, CIMultiDictProxy

from gateway import UpstreamBodyTooLarge, UpstreamError, UpstreamUnavailable

# An idle connection is closed after this long. aiohttp's default, which the gateway used
# before: below the idle timeouts of nginx (75 s), AWS load balancers (60 s) and aiohttp
# servers (75 s), so we usually close first. Servers that close sooner (Node and uvicorn:
# 5 s) send a FIN we see while the connection is idle, and it is not reused.
IDLE_SECONDS = 15.0
# A request on a reused connection that the server closed before answering a byte is sent
# once more on a new connection when repeating it is harmless (aiohttp retried these too):
# the server dropped a connection it had just timed out, most likely without reading it.
# Not when the caller says every request counts (``retry=False``: a status poll spends its
# reservation on one request, SPEC 4 step 8): a proxy may have passed the first one on. A
# request that could not be written at all is always sent on a new connection.
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})  # Content-Length: 0 when sent without one
# Headers written here: the body's framing and the encodings we decode are ours; Host and
# Accept are the caller's when given.
OURS = frozenset({"content-length", "transfer-encoding", "accept-encoding", "host", "accept"})
URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/?#]*)([^#]*)")
# Every printable ASCII character but the space: a target made of these is sent as given.
VERBATIM = "".join(chr(c) for c in range(0x21, 0x7F))

HEADER_BYTES = ("utf-8", "surrogateescape")  # header bytes decoded as aiohttp did

Answer = tuple[int, CIMultiDictProxy[str], bytes]


@dataclass(frozen=True, slots=True)
class Origin:
    scheme: str
    host: str  # as connected to: no brackets around an IPv6 address
    port: int
    authority: str  # the Host header: brackets, and the port when it is not the default


def split(url: str) -> tuple[Origin, str]:
    """The origin of an absolute http(s) URL and its request target (path and query,
    without the fragment), already encoded by the caller and sent as given."""
    match = URL.match(url)
    if match is None:
        raise UpstreamUnavailable(f"not an absolute URL: {url[:80]!r}", sent=False)
    target = match[2] or "/"
    if target[0] != "/":
        target = "/" + target
    if not (target.isascii() and target.isprintable() and " " not in target):
        target = quote(target, safe=VERBATIM)  # only what cannot go on a request line
    return _origin(match[1]), target


@functools.lru_cache(maxsize=256)
def _origin(prefix: str) -> Origin:
    try:
        parts = urlsplit(prefix)
        scheme, host, port = parts.scheme.lower(), parts.hostname, parts.port
        if scheme not in ("http", "https") or not host or parts.username is not None:
            raise ValueError("an http(s) URL with a host and no user info")
        host = host.encode("idna").decode("ascii") if not host.isascii() else host
    except (ValueError, UnicodeError) as exc:
        raise UpstreamUnavailable(f"cannot send to {prefix!r}: {exc}", sent=False) from None
    default = 443 if scheme == "https" else 80
    authority = f"[{host}]" if ":" in host else host
    if port is not None and port != default:
        authority = f"{authority}:{port}"
    return Origin(scheme, host, port or default, authority)


def request_head(
    method: str, origin: Origin, target: str, headers: Mapping[str, str], body: bytes | None
) -> bytes:
    """The request line and headers. Host and Accept are the caller's when given;
    Accept-Encoding is ours (we decode the answer); the body is framed by Content-Length."""
    host, accept = origin.authority, "*/*"
    lines = [f"{method} {target} HTTP/1.1", ""]
    for name, value in headers.items():
        lower = name.lower()
        if lower in OURS:
            if lower == "host":
                host = value
            elif lower == "accept":
                accept = value
            continue
        lines.append(f"{name}: {value}")
    lines[1] = f"Host: {host}"
    lines.append(f"Accept: {accept}")
    lines.append("Accept-Encoding: gzip, deflate")
    if body or method in BODY_METHODS:
        lines.append(f"Content-Length: {len(body or b'')}")
    text = "\r\n".join(lines)
    breaks = len(lines) - 1
    if text.count("\n") != breaks or text.count("\r") != breaks or "\0" in text:
        raise UpstreamUnavailable("a line break or NUL in a header", sent=False)
    try:  # bytes an agent sent that were not UTF-8 go on as they came (HEADER_BYTES)
        return (text + "\r\n\r\n").encode(*HEADER_BYTES)
    except UnicodeEncodeError:
        raise UpstreamUnavailable("a header that is not text", sent=False) from None


class Body:
    """An answer's body as it arrives: decoded in steps (gzip, deflate), never held past
    ``cap`` bytes of output."""

    def __init__(self, encoding: str, cap: int) -> None:
        self._decoder = _decoder(encoding.strip().lower())
        self._cap = cap
        self.decoded = self._decoder is not None
        self._size = 0
        self._parts: list[bytes] = []

    def add(self, chunk: bytes) -> None:
        if self._decoder is None:
            self._keep(chunk)
            return
        data = chunk
        while data:
            self._keep(self._decoder.decompress(data, self._cap + 1 - self._size))
            data = self._decoder.unconsumed_tail
        if self._decoder.eof and self._decoder.unused_data:  # never held, never capped
            raise _broken("bytes after the end of the compressed body")

    def end(self) -> bytes:
        if self._decoder is not None:
            self._keep(self._decoder.flush())
        return b"".join(self._parts)

    def _keep(self, piece: bytes) -> None:
        self._size += len(piece)
        if self._size > self._cap:
            raise UpstreamBodyTooLarge(f"body over {self._cap} bytes")
        self._parts.append(piece)


def _decoder(encoding: str) -> zlib._Decompress | None:
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(wbits=31)
    if encoding == "deflate":
        return zlib.decompressobj(wbits=15)
    if encoding in ("identity", ""):
        return None
    raise UpstreamUnavailable(f"unsupported Content-Encoding {encoding!r}", sent=True)


class Unsent(UpstreamUnavailable):
    """The request could not be written: the connection had closed. Nothing went out."""

    def __init__(self) -> None:
        super().__init__("the connection closed before the request was written", sent=False)


class Unanswered(UpstreamUnavailable):
    """The connection closed before a byte of the answer arrived."""

    def __init__(self) -> None:
        super().__init__("the connection closed before an answer", sent=True)


class Reading:
    """One answer being parsed (llhttp's callbacks). 1xx interim answers are skipped; an
    answer with neither Content-Length nor chunked framing ends when the connection does."""

    def __init__(self, done: asyncio.Future[Answer], head_only: bool, cap: int) -> None:
        self.parser = HttpResponseParser(self)  # holds this Reading: see release
        self.received = False
        self.keep_alive = False  # True once the answer ended on a connection kept open
        self._done, self._head_only, self._cap = done, head_only, cap
        self._raw: list[tuple[str, str]] = []
        self._status = 0
        self._headers: CIMultiDict[str] = CIMultiDict()
        self._body: Body | None = None
        self._to_eof = False

    def feed(self, data: bytes) -> None:
        self.received = True
        if self._done.done():  # bytes after the answer ended: the connection is not reused
            self.keep_alive = False
            return
        try:
            self.parser.feed_data(data)
        except HttpParserCallbackError as exc:
            cause = exc.__context__  # what a callback below raised (httptools keeps it there)
            self.fail(cause if isinstance(cause, UpstreamError) else _broken(repr(cause)))
        except (HttpParserError, HttpParserUpgrade) as exc:
            self.fail(_broken(f"malformed answer: {exc!r}"))

    def release(self) -> None:
        """Once the answer is settled: the parser holds this Reading's callbacks, a cycle
        per answer (future, headers and body with it) that only the garbage collector would
        free, thousands of objects a second under load. Every later call (bytes after
        the answer, the connection closing) stops at ``self._done.done()`` before the
        parser."""
        del self.parser

    def ended(self, *, clean: bool = False) -> None:
        """The connection closed: ``clean``, by the server's end of file, which alone ends
        an answer framed by the connection's end; else a reset, or closed here."""
        if clean and self._to_eof and self._body is not None and not self._done.done():
            try:
                self.on_message_complete()
            except UpstreamError as exc:
                self.fail(exc)
            except zlib.error as exc:
                self.fail(_broken(repr(exc)))
        self.fail(_broken("the connection closed mid-answer") if self.received else Unanswered())

    def fail(self, error: UpstreamError) -> None:
        self.keep_alive = False
        if not self._done.done():
            self._done.set_exception(error)

    def on_message_begin(self) -> None:
        if self._done.done():  # another answer after this one: the connection is not reused
            self.keep_alive = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw.append((name.decode(*HEADER_BYTES), value.decode(*HEADER_BYTES)))

    def on_headers_complete(self) -> None:
        if self._done.done():  # another answer after this one: the connection is not reused
            self.keep_alive = False
            return
        self._status = status = self.parser.get_status_code()
        if status < 200:  # an interim answer: its headers are not the answer's
            self._raw.clear()
            return
        headers = self._headers = CIMultiDict(self._raw)
        encoding = headers.popall("Content-Encoding", [""])[-1]
        length = headers.popall("Content-Length", None)
        chunked = headers.popall("Transfer-Encoding", [""])[-1].lower().endswith("chunked")
        self._body = Body(encoding, self._cap)
        if self._head_only or status in (204, 304):
            self.on_message_complete()
            return
        self._to_eof = length is None and not chunked
        if not self._body.decoded and length and _int(length[0]) > self._cap:
            raise UpstreamBodyTooLarge(f"Content-Length {length[0]} over the cap")

    def on_body(self, chunk: bytes) -> None:
        if self._body is None or self._done.done():
            self.keep_alive = False  # a body where none belongs (after a HEAD answer)
            return
        self._body.add(chunk)

    def on_message_complete(self) -> None:
        if self._status < 200 or self._done.done():
            return
        assert self._body is not None
        body = self._body.end()
        self.keep_alive = self.parser.should_keep_alive() and not self._to_eof
        self._done.set_result((self._status, CIMultiDictProxy(self._headers), body))


def _int(text: str) -> int:
    return int(text) if text.strip().isdigit() else 0


def _broken(reason: str) -> UpstreamUnavailable:
    return UpstreamUnavailable(reason, sent=True)


class Connection(asyncio.Protocol):
    """One socket to an origin, carrying one exchange at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, gone: Callable[[Connection], None]):
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.idle_since = 0.0
        self._loop, self._gone = loop, gone
        self._reading: Reading | None = None

    async def exchange(self, head: bytes, body: bytes | None, head_only: bool, cap: int) -> Answer:
        done: asyncio.Future[Answer] = self._loop.create_future()
        reading = self._reading = Reading(done, head_only, cap)
        try:
            if self.lost or self.transport is None or self.transport.is_closing():
                raise ConnectionError
            self.transport.write(head + body if body else head)
        except (OSError, RuntimeError):  # uvloop raises RuntimeError on a closed handle
            reading.fail(Unsent())
        try:
            return await done
        finally:
            reading.release()

    def reusable(self) -> bool:
        return not self.lost and self._reading is not None and self._reading.keep_alive

    def park(self, now: float) -> None:
        self._reading, self.idle_since = None, now

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it

    def data_received(self, data: bytes) -> None:
        if self._reading is None:  # unasked bytes on an idle connection: it is not reused
            self.close()
            return
        self._reading.feed(data)

    def eof_received(self) -> bool:
        self.lost = True
        if self._reading is not None:
            self._reading.ended(clean=True)
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._reading is not None:
            self._reading.ended()
        self._gone(self)


@dataclass(slots=True)
class Host:
    """The connections to one origin: at most ``size`` open, the idle ones newest last."""

    slots: asyncio.Semaphore
    idle: deque[Connection] = field(default_factory=deque)


class Pool:
    """Kept-alive connections per origin, at most ``size`` open to each; callers beyond
    that wait for one to come back (within the caller's timeout)."""

    def __init__(self, size: int, ssl_context: ssl.SSLContext | None = None) -> None:
        self._size = size
        self._ssl = ssl_context
        self._hosts: dict[Origin, Host] = {}
        self._open: set[Connection] = set()
        self._sweep: asyncio.TimerHandle | None = None

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | None,
        cap: int,
        *,
        retry: bool = True,
    ) -> Answer:
        origin, target = split(url)
        head = request_head(method, origin, target, headers, body)
        host = self._hosts.get(origin) or self._hosts.setdefault(
            origin, Host(asyncio.Semaphore(self._size))
        )
        head_only = method == "HEAD"
        async with host.slots:
            connection = self._reuse(host)
            try:
                if connection is not None:
                    try:
                        return await connection.exchange(head, body, head_only, cap)
                    except Unsent:
                        connection.close()
                        connection = None
                    except Unanswered:
                        if not retry or method not in IDEMPOTENT:
                            raise
                        connection.close()
                connection = await self._connect(origin, again=connection is not None)
                return await connection.exchange(head, body, head_only, cap)
            finally:
                if connection is not None:
                    self._release(host, connection)

    def close(self) -> None:
        for connection in list(self._open):
            connection.close()
        self._hosts.clear()
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None

    def _reuse(self, host: Host) -> Connection | None:
        fresh_since = asyncio.get_running_loop().time() - IDLE_SECONDS
        while host.idle:
            connection = host.idle.pop()
            if not connection.lost and connection.idle_since > fresh_since:
                return connection
            connection.close()
        return None

    async def _connect(self, origin: Origin, *, again: bool = False) -> Connection:
        """A new connection; failing, UpstreamUnavailable, sent only ``again`` (a request
        went out on a reused connection first)."""
        loop = asyncio.get_running_loop()
        context = None
        if origin.scheme == "https":
            context = self._ssl = self._ssl or ssl.create_default_context()
        try:
            _, connection = await loop.create_connection(
                lambda: Connection(loop, self._open.discard),
                origin.host,
                origin.port,
                ssl=context,
            )
        except (OSError, UnicodeError) as exc:  # refused, unreachable, DNS, TLS, a bad name
            raise UpstreamUnavailable(f"cannot connect: {exc}", sent=again) from None
        self._open.add(connection)
        return connection

    def _release(self, host: Host, connection: Connection) -> None:
        if not connection.reusable():
            connection.close()
            return
        loop = asyncio.get_running_loop()
        connection.park(loop.time())
        host.idle.append(connection)
        if self._sweep is None:
            self._sweep = loop.call_later(IDLE_SECONDS, self._close_idle)

    def _close_idle(self) -> None:
        loop = asyncio.get_running_loop()
        fresh_since = loop.time() - IDLE_SECONDS
        oldest: float | None = None
        for host in self._hosts.values():
            while host.idle and (host.idle[0].lost or host.idle[0].idle_since <= fresh_since):
                host.idle.popleft().close()
            if host.idle:
                first = host.idle[0].idle_since
                oldest = first if oldest is None else min(oldest, first)
        self._sweep = None
        if oldest is not None:
            self._sweep = loop.call_at(oldest + IDLE_SECONDS, self._close_idle)
