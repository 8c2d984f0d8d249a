"""An open-loop load generator: requests leave on a fixed schedule whatever the answers do,
and latency is measured from each request's scheduled start (no coordinated omission).

Usage: openloop.py [--uvloop] [--aiohttp] RATE SECONDS URLS_FILE [HEADER: VALUE ...]; prints
one JSON line: the latency percentiles; the rate the answers came back at (``achieved_rps``:
answers over the span from the first to the last, so a server that falls behind shows its own
pace); how late the generator itself sent (``late_p99_ms``: the client's figure, not the
server's); per kind of answer ("200", "503 overloaded", "error") its count and its latency
measured from the moment the request left; and how many connections were opened and how many
of those took SLOW_CONNECT or longer. A request unanswered after TIMEOUT counts as an error,
so a run ends within SECONDS + TIMEOUT.

The generator shares this 2-core machine with the server it measures, so the CPU it spends is
taken from the server and shows in the latency; its engine is kept lean for that. Each request
is a plain GET written as one bytes object built before the run, on an HTTP/1.1 keep-alive
connection (asyncio protocols; an idle one is reused, else one is opened, at most LIMIT at
once; past that a request waits for one, and the wait counts in its latency), and its answer
is parsed by httptools. A timer sends every request due each time it fires: no task and no
sleep per request. Here it costs 230-280 us of CPU per request at 500/s and 130-150 at
1,500/s, where aiohttp's client costs 710-950 and 520-630 (the interpreter's start left out,
70 and 200 ms; at 500/s most of what is left is the process waking twice per request, ~95 us
each here for an empty timer alone). ``--aiohttp`` runs that earlier engine, to compare
figures with the rounds measured on it. ``--uvloop`` runs the generator on uvloop: 180-250
and 105-125 us per request, and it sends 12,000/s on time here (p99 2-4 ms late; the plain
loop is 20-40 ms late at 8,000/s), for bursts past a server's capacity; the fixed-rate rows
keep the plain loop.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import math
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httptools
import uvloop

if TYPE_CHECKING:
    import aiohttp

TIMEOUT = 10.0  # seconds from the moment a request leaves (pool wait and connect included)
SLOW_CONNECT = 1.0  # seconds: a connection this slow to open had its SYN retried
LIMIT = 512  # connections open at once, like aiohttp's TCPConnector(limit=512)
PROBLEM = b"application/problem+json"


@dataclass(frozen=True)
class Answer:
    scheduled: float
    sent: float
    done: float
    kind: str  # the status, with the problem slug for problem answers; "error" without one
    connect: float | None  # seconds spent opening a new connection; None: one was reused


def connect_tracing() -> aiohttp.TraceConfig:
    """Times the opening of each new connection into the request's trace context (a dict):
    past a full listen queue the kernel drops the SYN and the client retries it after 1 s,
    a wait that is the server's accept path, not its request handling."""
    import aiohttp

    tracing = aiohttp.TraceConfig()

    async def started(_: object, context: SimpleNamespace, __: object) -> None:
        context.trace_request_ctx["opening"] = time.perf_counter()

    async def opened(_: object, context: SimpleNamespace, __: object) -> None:
        box = context.trace_request_ctx
        box["connect"] = time.perf_counter() - box["opening"]

    tracing.on_connection_create_start.append(started)
    tracing.on_connection_create_end.append(opened)
    return tracing


def kind_from(status: int, problem: bool, payload: bytes) -> str:
    """The status, with the last segment of the JSON ``type`` for a problem answer."""
    if not problem:
        return str(status)
    try:
        slug = str(json.loads(payload)["type"]).rsplit("/", 1)[-1]
    except (ValueError, KeyError, TypeError):
        return str(status)
    return f"{status} {slug}"


async def kind_of(response: aiohttp.ClientResponse) -> str:
    payload = await response.read()
    return kind_from(response.status, response.content_type == PROBLEM.decode(), payload)


async def run_aiohttp(
    rate: float, seconds: float, urls: list[str], headers: dict[str, str]
) -> list[Answer]:
    """The earlier engine, on aiohttp's client: a task per request."""
    import aiohttp

    answers: list[Answer] = []
    total = int(rate * seconds)
    connector = aiohttp.TCPConnector(limit=LIMIT)
    tracing = [connect_tracing()]
    timeout = aiohttp.ClientTimeout(total=TIMEOUT)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, trace_configs=tracing
    ) as http:

        async def one(url: str, scheduled: float) -> None:
            sent, box = time.perf_counter(), dict[str, float]()
            try:
                async with http.get(url, headers=headers, trace_request_ctx=box) as response:
                    kind = await kind_of(response)
            except (TimeoutError, aiohttp.ClientError):
                kind = "error"
            done = time.perf_counter()
            answers.append(Answer(scheduled, sent, done, kind, box.get("connect")))

        start = time.perf_counter() + 0.05
        tasks = []
        for i in range(total):
            scheduled = start + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(urls[i % len(urls)], scheduled)))
        await asyncio.gather(*tasks)
    return answers


class Request:
    """One request that left: where it waits for its answer and whether it has one."""

    __slots__ = ("conn", "connect", "done", "opening", "payload", "pool", "scheduled", "sent")

    def __init__(self, pool: Pool, payload: bytes, scheduled: float, sent: float) -> None:
        self.pool, self.payload, self.scheduled, self.sent = pool, payload, scheduled, sent
        self.conn: Connection | None = None  # the connection it was written to
        self.opening: asyncio.Task[None] | None = None  # the connection being opened for it
        self.connect: float | None = None
        self.done = False


class Pool:
    """The idle keep-alive connections to one host:port (the last one released is reused
    first) and its addresses, resolved once before the run."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.addresses: list[tuple[str, int]] = []
        self.idle: list[Connection] = []


class Connection(asyncio.BufferedProtocol):
    """An HTTP/1.1 keep-alive connection carrying one request at a time; httptools parses
    each answer for its status, its Content-Type and, for a problem answer, its body. It reads
    into the engine's one buffer (each read is parsed before the next one), not into a new
    bytes object per read (asyncio's Protocol allocates 256 KiB for each)."""

    def __init__(self, engine: Engine, pool: Pool) -> None:
        self.engine, self.pool = engine, pool
        self.parser = httptools.HttpResponseParser(self)
        self.transport: Any = None
        self.request: Request | None = None
        self.closed = True  # out of the engine's count until it adopts the connection
        self.idle = False
        self.problem = False  # the answer is application/problem+json
        self.framed = False  # the answer gives its length (else the connection's end does)
        self.headed = False  # the answer's headers are in
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def send(self, request: Request) -> None:
        request.conn, self.request, self.idle = self, request, False
        self.problem = self.framed = self.headed = False
        self.body = []
        self.transport.write(request.payload)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.engine.buffer

    def buffer_updated(self, nbytes: int) -> None:
        try:
            self.parser.feed_data(self.engine.buffer[:nbytes])
        except httptools.HttpParserCallbackError:
            raise  # a fault of this file's, not the server's
        except httptools.HttpParserError:
            self.engine.drop(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.request is not None and self.headed and not self.framed:
            self.on_message_complete()  # an answer that ends with its connection
        self.engine.drop(self, abort=False)

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-type":
            self.problem = value.split(b";", 1)[0].strip().lower() == PROBLEM
        elif name in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.headed = True

    def on_body(self, body: bytes) -> None:
        if self.problem:
            self.body.append(body)

    def on_message_complete(self) -> None:
        request, self.request = self.request, None
        if request is None:  # an answer to no request (a server's notice before it closes)
            self.engine.drop(self)
            return
        request.conn = None
        status = self.parser.get_status_code()
        self.engine.answered(request, kind_from(status, self.problem, b"".join(self.body)))
        if self.parser.should_keep_alive():
            self.engine.release(self)
        else:
            self.engine.drop(self)


class Engine:
    """Connections to hand the requests: a pool per host:port, at most LIMIT open at once
    (past that a request waits in line for one), and TIMEOUT kept by one timer set for the
    oldest request still unanswered."""

    def __init__(self, headers: dict[str, str]) -> None:
        self.loop = asyncio.get_running_loop()
        self.headers = headers
        self.pools: dict[tuple[str, int], Pool] = {}
        self.open = 0  # connections open or being opened
        self.waiting: deque[Request] = deque()  # for a connection, past LIMIT
        self.flight: deque[Request] = deque()  # in the order they left, for the timeout
        self.timer: asyncio.TimerHandle | None = None
        self.answers: list[Answer] = []
        self.unanswered = 0
        self.sending = True
        self.finished: asyncio.Future[None] = self.loop.create_future()
        self.buffer = memoryview(bytearray(256 * 1024))

    async def target(self, url: str) -> tuple[Pool, bytes]:
        """The pool for a URL's host:port and the request for it, built once."""
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise SystemExit(f"openloop.py: not an http:// URL: {url}")
        host, port = parts.hostname, parts.port or 80
        pool = self.pools.get((host, port))
        if pool is None:
            pool = self.pools[host, port] = Pool(host, port)
            try:
                ipaddress.ip_address(host)
                pool.addresses = [(host, port)]
            except ValueError:  # a name: resolved here, once, not for each connection
                try:
                    infos = await self.loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                except OSError:
                    infos = []  # every connection to it fails: its requests are errors
                for *_, address in infos:
                    if (str(address[0]), port) not in pool.addresses:
                        pool.addresses.append((str(address[0]), port))
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        lines = [f"GET {path} HTTP/1.1"]
        if not any(name.lower() == "host" for name in self.headers):
            lines.append(f"Host: {parts.netloc.rsplit('@', 1)[-1]}")
        lines += [f"{name}: {value}" for name, value in self.headers.items()]
        return pool, ("\r\n".join(lines) + "\r\n\r\n").encode()

    def leave(self, pool: Pool, payload: bytes, scheduled: float) -> None:
        request = Request(pool, payload, scheduled, time.perf_counter())
        self.unanswered += 1
        self.flight.append(request)
        if self.timer is None:
            self.timer = self.loop.call_later(TIMEOUT, self.expire)
        if pool.idle:
            pool.idle.pop().send(request)
        elif self.open < LIMIT or self.evict():
            self.connect(request)
        else:
            self.waiting.append(request)

    def evict(self) -> bool:
        """Closes an idle connection to another host:port to make room; False if none."""
        for pool in self.pools.values():
            if pool.idle:
                self.close(pool.idle.pop())
                return True
        return False

    def connect(self, request: Request) -> None:
        self.open += 1
        request.opening = self.loop.create_task(self.opening(request))

    async def opening(self, request: Request) -> None:
        pool, began = request.pool, time.perf_counter()
        try:
            conn = await self.dial(pool)
        except asyncio.CancelledError:  # its request timed out
            self.open -= 1
            self.free()
            raise
        except Exception:
            self.open -= 1
            request.opening = None
            if not request.done:
                self.answered(request, "error")
            self.free()
            return
        request.opening, conn.closed = None, False
        if conn.transport.is_closing():  # the server closed it before it could be used
            request.conn, conn.request = conn, request
            self.drop(conn, abort=False)
        elif request.done:
            self.release(conn)
        else:
            request.connect = time.perf_counter() - began
            conn.send(request)

    async def dial(self, pool: Pool) -> Connection:
        error = OSError(f"no address for {pool.host}")
        for host, port in pool.addresses:
            try:
                _, conn = await self.loop.create_connection(
                    lambda: Connection(self, pool), host, port
                )
            except OSError as failure:
                error = failure
            else:
                return conn
        raise error

    def answered(self, request: Request, kind: str) -> None:
        request.done = True
        self.answers.append(
            Answer(request.scheduled, request.sent, time.perf_counter(), kind, request.connect)
        )
        self.unanswered -= 1
        if not self.unanswered and not self.sending and not self.finished.done():
            self.finished.set_result(None)

    def sent_all(self) -> None:
        self.sending = False
        if not self.unanswered and not self.finished.done():
            self.finished.set_result(None)

    def release(self, conn: Connection) -> None:
        """A connection free again: to the first request in line, else to its pool."""
        if conn.closed:
            return
        while self.waiting:
            request = self.waiting.popleft()
            if request.done:
                continue
            if request.pool is conn.pool:
                conn.send(request)
            else:
                self.close(conn)
                self.connect(request)
            return
        conn.idle = True
        conn.pool.idle.append(conn)

    def close(self, conn: Connection, abort: bool = True) -> None:
        """Takes a connection out of the count; a request on it is an error."""
        if conn.closed:
            return
        conn.closed = True
        self.open -= 1
        if conn.idle:
            conn.idle = False
            conn.pool.idle.remove(conn)
        request, conn.request = conn.request, None
        if request is not None:
            request.conn = None
            if not request.done:
                self.answered(request, "error")
        if abort:
            conn.transport.abort()

    def drop(self, conn: Connection, abort: bool = True) -> None:
        """Closes a connection and opens one in its place for the first request in line."""
        self.close(conn, abort)
        self.free()

    def free(self) -> None:
        while self.waiting and self.open < LIMIT:
            request = self.waiting.popleft()
            if not request.done:
                self.connect(request)

    def expire(self) -> None:
        """Answers "error" for each request unanswered after TIMEOUT."""
        now, flight = time.perf_counter(), self.flight
        while flight and (flight[0].done or flight[0].sent + TIMEOUT <= now):
            request = flight.popleft()
            if request.done:
                continue
            if request.conn is not None:
                self.drop(request.conn)
                continue
            if request.opening is not None:
                request.opening.cancel()
            self.answered(request, "error")  # one in line is skipped when its turn comes
        self.timer = None
        if flight:
            wait = math.ceil((flight[0].sent + TIMEOUT - now) * 1000) / 1000
            self.timer = self.loop.call_later(wait, self.expire)

    def shut(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        for pool in self.pools.values():
            for conn in pool.idle:
                conn.transport.close()


async def run(
    rate: float, seconds: float, urls: list[str], headers: dict[str, str]
) -> list[Answer]:
    """Request i leaves at start + i/rate: each time the loop wakes, every request due is
    written, and a timer is set for the next one (no task or sleep per request)."""
    engine = Engine(headers)
    targets = [await engine.target(url) for url in urls]
    total = int(rate * seconds)
    loop = asyncio.get_running_loop()
    # uvloop rounds a timer's wait down to whole ms (a shorter one would come back at once,
    # over and over): there the wait is rounded up; asyncio's timers keep the exact time
    whole_ms = not isinstance(loop, asyncio.BaseEventLoop)
    start = time.perf_counter() + 0.05
    i = 0

    def send_due() -> None:
        nonlocal i
        try:
            while i < total:
                scheduled, now = start + i / rate, time.perf_counter()
                if scheduled > now:
                    wait = scheduled - now
                    loop.call_later(math.ceil(wait * 1000) / 1000 if whole_ms else wait, send_due)
                    return
                pool, payload = targets[i % len(targets)]
                i += 1
                engine.leave(pool, payload, scheduled)
            engine.sent_all()
        except Exception as error:
            if not engine.finished.done():
                engine.finished.set_exception(error)

    loop.call_soon(send_due)
    try:
        await engine.finished
    finally:
        engine.shut()
    return engine.answers


def pct(values: list[float], p: float) -> float:
    """The p-quantile of sorted seconds, in milliseconds."""
    return values[min(len(values) - 1, int(p * len(values)))] * 1000


def kinds(answers: list[Answer]) -> dict[str, dict[str, float]]:
    """Per kind of answer, the waits from the moment each request left, and the same not
    counting the opening of a new connection (the server's request handling alone)."""
    grouped: dict[str, list[Answer]] = {}
    for answer in answers:
        grouped.setdefault(answer.kind, []).append(answer)
    summary = {}
    for kind, group in sorted(grouped.items()):
        waits = sorted(a.done - a.sent for a in group)
        served = sorted(a.done - a.sent - (a.connect or 0.0) for a in group)
        summary[kind] = {
            "count": len(waits),
            "p50_ms": pct(waits, 0.50),
            "p99_ms": pct(waits, 0.99),
            "max_ms": waits[-1] * 1000,
            "connected_p99_ms": pct(served, 0.99),
            "connected_max_ms": served[-1] * 1000,
        }
    return summary


def summarise(answers: list[Answer]) -> dict[str, Any]:
    latencies = sorted(a.done - a.scheduled for a in answers)
    done = sorted(a.done for a in answers)
    span = done[-1] - done[0]
    errors = sum(a.kind == "error" or a.kind[0] == "5" for a in answers)
    connects = [a.connect for a in answers if a.connect is not None]
    return {
        "sent": len(answers),
        "errors": errors,
        "p50_ms": pct(latencies, 0.50),
        "p99_ms": pct(latencies, 0.99),
        "max_ms": latencies[-1] * 1000,
        "achieved_rps": (len(done) - 1) / span if span > 0 else 0.0,
        "elapsed_s": done[-1] - min(a.scheduled for a in answers),
        "late_p99_ms": pct(sorted(a.sent - a.scheduled for a in answers), 0.99),
        "kinds": kinds(answers),
        "connections": len(connects),
        "slow_connects": sum(c >= SLOW_CONNECT for c in connects),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--uvloop", action="store_true")
    parser.add_argument("--aiohttp", action="store_true")
    parser.add_argument("rate", type=float)
    parser.add_argument("seconds", type=float)
    parser.add_argument("urls_file")
    parser.add_argument("headers", nargs="*")
    args = parser.parse_args()
    with open(args.urls_file) as handle:
        urls = [line.strip() for line in handle if line.strip()]
    headers = dict(h.split(": ", 1) for h in args.headers)
    if args.uvloop:
        uvloop.install()
    engine: Callable[..., Any] = run_aiohttp if args.aiohttp else run
    print(json.dumps(summarise(asyncio.run(engine(args.rate, args.seconds, urls, headers)))))


if __name__ == "__main__":
    main()
