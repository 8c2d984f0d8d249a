"""The agent lane (gateway/http/lane/) on real sockets: it frames answers byte for byte as
aiohttp does, keeps order across keep-alive, pipelining and the hand-over to aiohttp, reads
bodies with backpressure, refuses malformed heads, and stops gracefully. The rest of the
suite's agent tests run through it too (conftest.AgentServer)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gateway.http import lane
from gateway.http.lane import LaneSite
from gateway.http.lane.flow import Outbox
from gateway.http.lane.protocol import Lane

PAGE = web.AppKey("page", list[str])
GATE = web.AppKey("gate", asyncio.Event)


async def answer(request: web.Request) -> web.StreamResponse:
    """What both servers answer: chosen by the path's last segment."""
    tail = request.match_info.get("tail", "").rsplit("/", 1)[-1]
    if tail == "body":
        data = b"".join([c async for c in request.content.iter_chunked(1 << 16)])
        return web.Response(body=b"got %d:" % len(data) + data[:20])
    if tail == "empty":
        return web.Response(status=204, headers={"X-Kind": "empty"})
    if tail == "close":
        response = web.Response(text="bye", content_type="text/plain")
        response.force_close()
        return response
    if tail == "slow":
        request.app[PAGE].append("slow started")
        await asyncio.sleep(0.2)
        return web.Response(text="slow done")
    if tail == "gated":  # waits for the test to open the gate: answers made in one turn
        request.app[PAGE].append("gated")
        await request.app[GATE].wait()
        return web.Response(text="through")
    if tail == "uncancelled":  # a poll in the handler's task: not cancelled until its end
        assert isinstance(request, lane.LaneRequest)
        with request.uncancelled:
            request.app[PAGE].append("poll started")
            await asyncio.sleep(0.3)
            request.app[PAGE].append("poll done")
        return await until_cancelled(request, "cancelled after the poll")
    if tail == "polled":  # a forwarded poll: the answer once the provider's has come
        assert isinstance(request, lane.LaneRequest)
        with request.uncancelled:
            request.app[PAGE].append("poll started")
            await asyncio.sleep(0.2)
        return web.Response(text="polled")
    if tail == "held":
        request.app[PAGE].append("held started")
        return await until_cancelled(request, "held cancelled")
    if tail.startswith("streamed"):  # a body from an iterator, its length known or not
        length = None if tail == "streamed-chunked" else len(b"".join(STREAMED))
        if tail == "streamed-short" and length is not None:  # promises more than comes
            length += 10
        chunks = Source(request.app[PAGE], broken=tail == "streamed-broken")
        return lane.Streamed(chunks, headers={"X-Kind": "streamed"}, length=length)
    headers = {"Retry-After": "3600", "Statusgate-Operation": "op_1"}
    body = b'{"type":"/problems/too-early","status":429}'
    return web.Response(
        status=429, body=body, headers=headers, content_type="application/problem+json"
    )


STREAMED = [b"first chunk;", b"", b"second chunk;", b"x" * 70_000]  # an empty one is skipped


class Source:
    """STREAMED, a chunk a turn of the loop, from a source open from the start (as a kept
    copy's file is): "stream closed" on the page once it is closed, however the answer
    ended (HEAD: without a chunk asked for)."""

    def __init__(self, page: list[str], *, broken: bool = False) -> None:
        self.page = page
        self.chunks = iter(STREAMED[:1] if broken else STREAMED)
        self.broken = broken  # fails after its first chunk, as a store gone mid-read

    def __aiter__(self) -> Source:
        return self

    async def __anext__(self) -> bytes:
        await asyncio.sleep(0)
        chunk = next(self.chunks, None)
        if chunk is None and self.broken:
            raise OSError("the source failed")
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        self.page.append("stream closed")


async def until_cancelled(request: web.Request, line: str) -> web.Response:
    """Wait (30 s) until cancelled, then put ``line`` on the page."""
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        request.app[PAGE].append(line)
        raise
    return web.Response(text="never")


async def middleware(request: web.Request, handler: lane.Handler) -> web.StreamResponse:
    response = await handler(request)
    response.headers["X-Request-Id"] = "rid"
    return response


@web.middleware
async def aiohttp_middleware(request: web.Request, handler: lane.Handler) -> web.StreamResponse:
    return await middleware(request, handler)


def make_app() -> web.Application:
    app = web.Application(middlewares=[aiohttp_middleware])
    app[PAGE] = []
    app[GATE] = asyncio.Event()
    app.router.add_route("*", "/p/{provider}/{tail:.*}", answer)
    app.router.add_get("/healthz", healthz)
    app.router.add_post("/echo", echo)
    return app


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def echo(request: web.Request) -> web.Response:
    return web.Response(body=b"echo:" + await request.read())


@contextlib.asynccontextmanager
async def listening(
    app: web.Application, handler: lane.Handler, lane_middleware: lane.Middleware = middleware
) -> AsyncIterator[tuple[int, int]]:
    """(lane port, aiohttp port): one app, one runner, a lane and an aiohttp listener."""
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = LaneSite(runner, "127.0.0.1", 0, middleware=lane_middleware, handler=handler)
    await site.start()
    plain = web.TCPSite(runner, "127.0.0.1", 0)
    await plain.start()
    try:
        yield site.port, plain.port
    finally:
        await runner.cleanup()


async def lane_only(app: web.Application) -> tuple[web.AppRunner, int]:
    """A started runner with a lane listener alone, for tests that stop it themselves."""
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = LaneSite(runner, "127.0.0.1", 0, middleware=middleware, handler=answer)
    await site.start()
    return runner, site.port


@pytest.fixture
async def servers() -> AsyncIterator[tuple[int, int, web.Application]]:
    """(lane port, plain aiohttp port, app) of the test app."""
    app = make_app()
    async with listening(app, answer) as (lane_port, plain_port):
        yield lane_port, plain_port, app


async def exchange(port: int, data: bytes, answers: int = 1, *, wait: float = 5.0) -> bytes:
    """Send ``data`` on one connection; what came back once ``answers`` answers or EOF did."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    got = b""
    try:
        async with asyncio.timeout(wait):
            while len(split(got)) < answers:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                got += chunk
    except TimeoutError:
        pass  # what came (a HEAD answer's Content-Length frames no body)
    finally:
        writer.close()
    return got


def split(data: bytes) -> list[bytes]:
    """Whole HTTP answers in ``data`` (Content-Length framed, or cut at EOF)."""
    answers = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            break
        if head.startswith(b"HTTP/1.1 100 "):
            data = rest
            continue
        length = re.search(rb"(?im)^content-length: (\d+)", head)
        size = int(length.group(1)) if length else 0
        if head.split(b" ")[1] in (b"204", b"304"):
            size = 0
        if len(rest) < size:
            break
        answers.append(head + sep + rest[:size])
        data = rest[size:]
    return answers


def without_date(answer: bytes) -> bytes:
    return re.sub(rb"(?m)^Date: .*\r\n", b"", answer)


def answer_end(data: bytes, method: bytes) -> int | None:
    """Where the first whole answer in ``data`` to a ``method`` request ends (interim 100
    answers skipped; HEAD, 204 and 304 answers without a body), None while incomplete."""
    start = 0
    while True:
        head_end = data.find(b"\r\n\r\n", start)
        if head_end < 0:
            return None
        head = data[start:head_end]
        if not head.startswith(b"HTTP/1.1 100 "):
            break
        start = head_end + 4
    length = re.search(rb"(?im)^content-length: (\d+)", head)
    size = int(length.group(1)) if length else 0
    if method == b"HEAD" or head.split(b" ")[1] in (b"204", b"304"):
        size = 0
    elif re.search(rb"(?im)^transfer-encoding: chunked", head):  # up to the last chunk
        last = data.find(b"\r\n0\r\n\r\n", head_end)
        return None if last < 0 else last + 7
    end = head_end + 4 + size
    return end if len(data) >= end else None


async def talk(port: int, parts: list[bytes], *, wait: float = 2.0) -> bytes:
    """Send each request of ``parts`` on one connection once the answer to the one before
    came: everything that came back, with ``<closed>`` where the server ended the connection
    and ``<silent>`` where no answer came within ``wait`` seconds."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    got, buffer = b"", b""
    try:
        for part in parts:
            writer.write(part)
            method = part.split(b" ", 1)[0]
            try:
                async with asyncio.timeout(wait):
                    while (end := answer_end(buffer, method)) is None:
                        chunk = await reader.read(65536)
                        if not chunk:
                            return got + buffer + b"<closed>"
                        buffer += chunk
            except TimeoutError:
                got += b"<silent>"
                continue
            except ConnectionError:
                return got + buffer + b"<closed>"
            got, buffer = got + buffer[:end], buffer[end:]
        try:  # the connection closes now, or stays open with nothing more to say
            async with asyncio.timeout(0.2):
                buffer += await reader.read(65536) or b"<closed>"
        except (TimeoutError, ConnectionError):
            pass
        return got + buffer
    finally:
        writer.close()


GET = b"GET /p/demo/v1/jobs/%s HTTP/1.1\r\nHost: x\r\n\r\n"
AFTER = GET % b"after"  # a second request on the connection, when it stays open
H2C = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQ\r\n"
WEBSOCKET = (
    b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
)
UPGRADES = {  # what curl --http2 and Java's HttpClient send on http:// URLs, and others
    "h2c": [b"GET /p/demo/v1/jobs/j1 HTTP/1.1\r\nHost: x\r\n" + H2C + b"\r\n", AFTER],
    "h2c submit": [
        b"POST /p/demo/body HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n" + H2C + b"\r\nhello",
        AFTER,
    ],
    "h2c head": [b"HEAD /p/demo/v1/jobs/j1 HTTP/1.1\r\nHost: x\r\n" + H2C + b"\r\n", AFTER],
    "h2c http/1.0": [
        b"GET /p/demo/j1 HTTP/1.0\r\nConnection: Upgrade, keep-alive\r\nUpgrade: h2c\r\n\r\n",
        AFTER,
    ],
    "h2c close": [
        b"GET /p/demo/j1 HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, close\r\nUpgrade: h2c\r\n\r\n",
        AFTER,
    ],
    "h2c second": [GET % b"j1", b"GET /p/demo/j2 HTTP/1.1\r\nHost: x\r\n" + H2C + b"\r\n", AFTER],
    "websocket": [b"GET /p/demo/j1 HTTP/1.1\r\nHost: x\r\n" + WEBSOCKET + b"\r\n", AFTER],
    "upgrade without connection": [
        b"GET /p/demo/j1 HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\n\r\n",
        AFTER,
    ],
    "connect": [GET % b"j1", b"CONNECT /p/demo/j2 HTTP/1.1\r\nHost: x\r\n\r\n", AFTER],
    "h2c for aiohttp": [  # relayed to aiohttp after an agent call
        GET % b"j1",
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n" + H2C + b"\r\nhello",
        AFTER,
    ],
    "chunked h2c": [
        b"POST /p/demo/body HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        + H2C
        + b"\r\n3\r\nabc\r\n0\r\n\r\n",
        AFTER,
    ],
}


@pytest.mark.parametrize(
    "parts",
    [
        [GET % b"j1", AFTER],
        [b"HEAD /p/demo/v1/jobs/j1 HTTP/1.1\r\nHost: x\r\n\r\n", AFTER],
        [GET % b"empty", AFTER],
        [GET % b"close", AFTER],
        [b"GET /p/demo/v1/jobs/j1 HTTP/1.0\r\n\r\n", AFTER],
        [b"GET /p/demo/v1/jobs/j1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", AFTER],
        [b"GET /p/demo/v1/jobs/j1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", AFTER],
        [b"POST /p/demo/body HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", AFTER],
        [
            b"POST /p/demo/body HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n0\r\n\r\n",
            AFTER,
        ],
        *UPGRADES.values(),
        [GET % b"streamed", AFTER],
        [b"HEAD /p/demo/v1/streamed HTTP/1.1\r\nHost: x\r\n\r\n", AFTER],
        [GET % b"streamed-chunked", AFTER],
        [b"GET /p/demo/streamed HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", AFTER],
        [b"GET /p/demo/streamed HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", AFTER],
    ],
    ids=[
        "get",
        "head",
        "204",
        "force-close",
        "http/1.0",
        "1.0 keep-alive",
        "close",
        "body",
        "chunked",
        *UPGRADES,
        "streamed",
        "streamed head",
        "streamed chunked",
        "streamed 1.0 keep-alive",
        "streamed close",
    ],
)
async def test_an_answer_has_the_bytes_aiohttp_writes(
    servers: tuple[int, int, web.Application], parts: list[bytes]
) -> None:
    """The same requests, each sent once the one before was answered, through the lane and
    through aiohttp's server: the same answers, byte for byte but the Date header (status
    line, header order, Content-Length, Content-Type, Server, Connection, HEAD and 204
    without a body), and the connection kept or closed alike. A request asking to upgrade
    (``Upgrade: h2c`` as curl --http2 and Java's HttpClient send it, a WebSocket handshake,
    CONNECT) is answered once, as HTTP/1.1, and the connection goes on. A streamed answer
    (a body from an iterator) too: with its length, chunked without it, HEAD without a body,
    its source closed on both servers."""
    lane_port, plain_port, app = servers
    ours = await talk(lane_port, parts)
    theirs = await talk(plain_port, parts)
    assert ours.startswith(b"HTTP/1.") and without_date(ours) == without_date(theirs)
    assert app[PAGE].count("stream closed") == (2 if b"streamed" in parts[0] else 0)


@pytest.mark.parametrize(
    ("tail", "end"),
    [(b"streamed-broken", b"\r\n\r\nfirst chunk;<closed>"), (b"streamed-short", b"xxx<closed>")],
    ids=["fails", "short"],
)
@pytest.mark.parametrize("server", ["lane", "aiohttp"])
async def test_a_streamed_answer_whose_source_fails_closes_the_connection(
    servers: tuple[int, int, web.Application], tail: bytes, end: bytes, server: str
) -> None:
    """A streamed answer whose source fails after its head and first chunk went, or ends
    short of its Content-Length: the connection closes (the length promised cannot be
    met), the request pipelined after it is not answered, and the source is closed; on the
    lane and on aiohttp's own server (which answers a TLS listener)."""
    lane_port, plain_port, app = servers
    port = lane_port if server == "lane" else plain_port
    got = await talk(port, [GET % tail + AFTER], wait=10.0)
    assert got.startswith(b"HTTP/1.1 200 OK\r\n") and got.endswith(end)
    assert app[PAGE] == ["stream closed"]


async def test_an_upgrade_request_pipelined_with_another_leaves_it_answered(
    servers: tuple[int, int, web.Application],
) -> None:
    """An h2c upgrade request and the request after it in one write: both are answered, in
    order, and the connection stays open. (aiohttp's own server drops the second request
    when both come in one read, answering nothing to it: the lane does not copy that.)"""
    lane_port, _, _ = servers
    got = split(await exchange(lane_port, UPGRADES["h2c"][0] + GET % b"j2", answers=3, wait=1))
    assert [a.split(b"\r\n", 1)[0] for a in got] == [b"HTTP/1.1 429 Too Many Requests"] * 2


async def test_pipelined_requests_are_answered_in_order_across_the_hand_over(
    servers: tuple[int, int, web.Application],
) -> None:
    """Agent calls, then another path (served by aiohttp from there on), then an agent call
    again, pipelined in one write: every answer comes, in the order asked, the slow first
    one included."""
    lane_port, _, app = servers
    data = GET % b"slow" + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + GET % b"j2"
    got = split(await exchange(lane_port, data, answers=3))
    assert [a.split(b"\r\n", 1)[0] for a in got] == [
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 429 Too Many Requests",
    ]
    assert got[0].endswith(b"slow done") and got[1].endswith(b'{"status": "ok"}')
    assert app[PAGE] == ["slow started"]


async def test_a_chunked_body_for_aiohttp_is_framed_again(
    servers: tuple[int, int, web.Application],
) -> None:
    """A chunked request relayed to aiohttp after an agent call reaches its handler whole."""
    lane_port, _, _ = servers
    body = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    body += b"2\r\nab\r\n3\r\ncde\r\n0\r\n\r\n"
    got = split(await exchange(lane_port, GET % b"j1" + body, answers=2))
    assert got[1].endswith(b"echo:abcde")


async def test_a_connection_that_starts_elsewhere_is_aiohttps(
    servers: tuple[int, int, web.Application],
) -> None:
    """A first request for another path hands the connection to aiohttp whole, even when
    its request line arrives a byte at a time."""
    lane_port, _, _ = servers
    reader, writer = await asyncio.open_connection("127.0.0.1", lane_port)
    for byte in b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n":
        writer.write(bytes([byte]))
        await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    writer.close()
    assert head.startswith(b"HTTP/1.1 200 OK")


async def test_a_body_larger_than_the_buffer_is_read_with_backpressure(
    servers: tuple[int, int, web.Application],
) -> None:
    """A body of several times the lane's buffer arrives whole (reading pauses and
    resumes)."""
    lane_port, _, _ = servers
    size = lane.BODY_HIGH * 6
    head = b"POST /p/demo/body HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size
    got = split(await exchange(lane_port, head + b"x" * size))
    assert got and b"got %d:" % size in got[0]


@pytest.mark.parametrize(
    "bad",
    [
        b"GET /p/demo/x HTTP/1.1\r\nBad Header\r\n\r\n",
        b"GET /p/demo/" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n",
        b"GET /p/demo/x HTTP/1.1\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n",
        b"GET /p/demo/x HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n",
        b"GET /p/demo/x HTTP/1.1\r\nAccept: */*\r\n\r\n",
    ],
    ids=["malformed", "long target", "long field", "too many fields", "no host"],
)
async def test_a_malformed_head_is_400_problem_and_the_connection_closes(
    servers: tuple[int, int, web.Application], bad: bytes
) -> None:
    """Bad framing or a head past aiohttp's limits: 400 problem+json, then the end of the
    connection (nothing after it can be framed); an answer owed before it comes first."""
    lane_port, _, _ = servers
    got = await exchange(lane_port, GET % b"j1" + bad, answers=3)
    answers = split(got)
    assert len(answers) == 2
    assert answers[0].startswith(b"HTTP/1.1 429")
    assert answers[1].startswith(b"HTTP/1.1 400 Bad Request")
    assert b"application/problem+json" in answers[1] and b"Connection: close" in answers[1]


async def test_expect_continue_is_answered_before_the_body(
    servers: tuple[int, int, web.Application],
) -> None:
    """``Expect: 100-continue``: the interim answer comes before the body is sent."""
    lane_port, _, _ = servers
    reader, writer = await asyncio.open_connection("127.0.0.1", lane_port)
    writer.write(
        b"POST /p/demo/body HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
        b"Expect: 100-continue\r\n\r\n"
    )
    interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    writer.write(b"abc")
    final = await asyncio.wait_for(reader.readuntil(b"got 3:abc"), 5)
    writer.close()
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n" and final.startswith(b"HTTP/1.1 200")


async def page_shows(app: web.Application, line: str | None, seconds: float = 1.0) -> None:
    """Wait up to ``seconds`` until the app's page holds ``line`` (any line, for None)."""
    for _ in range(int(seconds / 0.01)):
        if (line in app[PAGE]) if line is not None else app[PAGE]:
            return
        await asyncio.sleep(0.01)


async def test_a_client_that_goes_away_cancels_its_handler(
    servers: tuple[int, int, web.Application],
) -> None:
    """As aiohttp's handler_cancellation: the handler of a closed connection is cancelled."""
    lane_port, _, app = servers
    _, writer = await asyncio.open_connection("127.0.0.1", lane_port)
    writer.write(GET % b"held")
    await page_shows(app, None)
    writer.close()
    await page_shows(app, "held cancelled")
    assert app[PAGE] == ["held started", "held cancelled"]


async def test_a_gone_clients_handler_is_cancelled_only_after_its_poll(
    servers: tuple[int, int, web.Application],
) -> None:
    """A handler that polls in its own task (``request.uncancelled``) is not cancelled when
    its client goes away mid-poll: the cancel waits for the poll's end, then comes at once,
    as if the poll had had a task of its own."""
    lane_port, _, app = servers
    _, writer = await asyncio.open_connection("127.0.0.1", lane_port)
    writer.write(GET % b"uncancelled")
    await page_shows(app, None)
    writer.close()
    await asyncio.sleep(0.1)
    assert app[PAGE] == ["poll started"]  # the client is gone; the poll goes on
    await page_shows(app, "cancelled after the poll")
    assert app[PAGE] == ["poll started", "poll done", "cancelled after the poll"]


async def test_the_runners_cleanup_answers_the_call_in_hand_then_closes() -> None:
    """A graceful stop: the call being answered gets its answer; the connection then ends
    and the port listens no more."""
    app = make_app()
    runner, port = await lane_only(app)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(GET % b"slow")
    while not app[PAGE]:
        await asyncio.sleep(0.01)
    await runner.cleanup()
    got = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert got.startswith(b"HTTP/1.1 200 OK") and got.endswith(b"slow done")
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)


@pytest.mark.parametrize(
    ("first", "wanted"),
    [
        (b"GET /p/demo/x HTTP/1.1\r\n", True),
        (b"GET /p", None),
        (b"GE", None),
        (b"GET /healthz HTTP/1.1\r\n", False),
        (b"POST /mcp HTTP/1.1\r\n", False),
        (b"get /p/demo/x HTTP/1.1\r\n", False),
        (b"FETCH /p/demo/x HTTP/1.1\r\n", False),
        (b"OPTIONS /p/demo/x HTTP/1.1\r\n", True),
        (b"\x16\x03\x01\x02\x00", False),
    ],
)
def test_the_first_bytes_decide_who_serves_the_connection(
    first: bytes, wanted: bool | None
) -> None:
    """Agent calls start the lane; anything else (or what aiohttp rejects) is aiohttp's; too
    few bytes to tell wait for more."""
    assert lane.wants_lane(first) is wanted


# -- review findings: each of these fails against the lane as it is ----------------------


async def test_a_body_answered_unread_does_not_stall_the_connection(
    servers: tuple[int, int, web.Application],
) -> None:
    """A handler that answers without reading a body larger than the buffer (here after a
    wait, as a forwarded status call does): the rest is read and dropped and the next
    request on the connection is answered, as aiohttp does."""
    lane_port, _, _ = servers
    size = lane.BODY_HIGH * 4
    head = b"POST /p/demo/slow HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size
    got = split(await exchange(lane_port, head + b"x" * size + GET % b"j2", answers=2, wait=3))
    assert len(got) == 2


async def test_a_malformed_chunk_fails_the_body_being_read(
    servers: tuple[int, int, web.Application],
) -> None:
    """A chunked body that turns out malformed ends in a 400, not in a handler waiting for
    the rest of it for ever."""
    lane_port, _, _ = servers
    head = b"POST /p/demo/body HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    bad = head + b"3\r\nabc\r\nzz\r\n"
    got = await exchange(lane_port, bad, wait=3)
    assert got.startswith(b"HTTP/1.1 400")


async def test_a_handler_error_is_a_500_not_a_hung_connection() -> None:
    """An exception out of the middleware or handler: aiohttp answers 500; the lane must
    not leave the connection open with no answer and no idle timer."""

    async def broken(request: web.Request, handler: lane.Handler) -> web.StreamResponse:
        raise RuntimeError("bug")

    async with listening(make_app(), answer, broken) as (lane_port, _):
        got = await exchange(lane_port, GET % b"j1", wait=2)
    assert got.startswith(b"HTTP/1.1 500")


async def _slow_aiohttp(request: web.Request) -> web.Response:
    await asyncio.sleep(0.3)
    return web.Response(text="slowa")


async def test_a_relayed_answer_is_not_overtaken_by_a_later_400() -> None:
    """Agent call, then a slow request for aiohttp (relayed), then a malformed request:
    aiohttp's answer comes before the 400, as on aiohttp's own listener."""
    app = make_app()
    app.router.add_get("/slowa", _slow_aiohttp)
    async with listening(app, answer) as (lane_port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", lane_port)
        got = b""
        for data in (
            GET % b"j1",
            b"GET /slowa HTTP/1.1\r\nHost: x\r\n\r\n",
            b"BAD REQUEST\r\n\r\n",
        ):
            writer.write(data)
            await asyncio.sleep(0.05)
        async with asyncio.timeout(3):
            while chunk := await reader.read(65536):
                got += chunk
        writer.close()
    assert [a.split(b" ", 2)[1] for a in split(got)][:3] == [b"429", b"200", b"400"]


async def test_cleanup_starts_no_relay_and_closes_the_connection() -> None:
    """A stop while an agent call is in hand with a request for aiohttp pipelined behind
    it: the call is answered, then the connection closes (no aiohttp handler is started
    for the pipelined request after the runner began to stop), as aiohttp's listener does."""
    app = make_app()
    runner, port = await lane_only(app)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(GET % b"slow" + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    while not app[PAGE]:
        await asyncio.sleep(0.01)
    await runner.cleanup()
    got, closed = b"", False
    try:
        async with asyncio.timeout(2):
            got = await reader.read()  # EOF, not a connection left open
            closed = True
    except TimeoutError:
        pass
    finally:
        writer.close()
    assert closed and len(split(got)) == 1


async def both(handler: lane.Handler, request_bytes: bytes) -> tuple[bytes, bytes]:
    """What ``handler`` answers ``request_bytes`` on the lane, and on aiohttp's listener."""
    app = web.Application()
    app.router.add_route("*", "/p/{provider}/{tail:.*}", handler)
    async with listening(app, handler) as (lane_port, plain_port):
        ours = await exchange(lane_port, request_bytes, wait=1.0)
        theirs = await exchange(plain_port, request_bytes, wait=1.0)
    return ours, theirs


async def _headers(request: web.Request) -> web.Response:
    return web.Response(text=repr(list(request.headers.items())))


def head(*fields: bytes, target: bytes = b"/p/demo/x") -> bytes:
    return b"GET %s HTTP/1.1\r\n%s\r\n" % (target, b"".join(f + b"\r\n" for f in fields))


FIELD = lane.MAX_FIELD  # aiohttp's max_field_size (8190)
HEADS = {
    "trailing OWS": head(b"Host: x", b"X-A: v  "),
    "duplicate Host": head(b"Host: x", b"Host: y"),
    # a field's value: up to max_field_size bytes, trailing whitespace counted
    "value at the limit": head(b"Host: x", b"X-Big: " + b"v" * FIELD),
    "value past the limit": head(b"Host: x", b"X-Big: " + b"v" * (FIELD + 1)),
    "long name and value": head(b"Host: x", b"X-" + b"n" * 4000 + b": " + b"v" * 8000),
    "value with OWS past the limit": head(b"Host: x", b"X-Big: " + b"v" * (FIELD - 3) + b"    "),
    # the first field: its name and value together (aiohttp's C parser, see head.field_fits)
    "first field at the limit": head(b"X-Big: " + b"v" * (FIELD - 5), b"Host: x"),
    "first field past the limit": head(b"X-Big: " + b"v" * (FIELD - 4), b"Host: x"),
    # a name: with the name of the field before it (aiohttp's C parser again)
    "name at the limit": head(b"Host: x", b"N" * (FIELD - 4) + b": v"),
    "name past the limit": head(b"Host: x", b"N" * (FIELD - 3) + b": v"),
    "first name past the limit": head(b"N" * (FIELD + 1) + b": v", b"Host: x"),
    # max_headers fields, and max_line_size bytes of request target
    "128 fields": head(b"Host: x", *(b"X-%d: 1" % i for i in range(127))),
    "129 fields": head(b"Host: x", *(b"X-%d: 1" % i for i in range(128))),
    "target at the limit": head(b"Host: x", target=b"/p/demo/" + b"t" * (lane.MAX_LINE - 8)),
    "target past the limit": head(b"Host: x", target=b"/p/demo/" + b"t" * (lane.MAX_LINE - 7)),
}


@pytest.mark.parametrize("request_bytes", HEADS.values(), ids=HEADS)
async def test_the_head_is_read_as_aiohttp_reads_it(request_bytes: bytes) -> None:
    """A head is refused (400) on the lane exactly when aiohttp's server refuses it: the
    limits of a field's name, its value, the number of fields and the request target, at
    and past each; trailing whitespace is not part of a value (RFC 9110 5.5) and a second
    Host is refused. Otherwise one agent request means two things depending on the
    connection's history."""
    ours, theirs = await both(_headers, request_bytes)
    assert ours.split(b" ", 2)[1] == theirs.split(b" ", 2)[1]
    if not ours.startswith(b"HTTP/1.1 400"):  # a 400's body is problem+json on the lane
        assert ours.partition(b"\r\n\r\n")[2] == theirs.partition(b"\r\n\r\n")[2]


async def _where(request: web.Request) -> web.Response:
    url = request.rel_url
    seen = (request.path, url.raw_path, url.raw_query_string, request.match_info["provider"])
    return web.Response(text=repr(seen))


@pytest.mark.parametrize(
    "target",
    [b"/p/demo/v1/jobs/j1#frag", b"/p/demo/v1/jobs/a%20b?x=1&y=%2F", b"/p/de%6Do/x?q#f"],
    ids=["fragment", "escapes and query", "escaped provider"],
)
async def test_the_target_is_read_as_aiohttp_reads_it(target: bytes) -> None:
    """Path (decoded), raw path, query and provider as the handler sees them: the same on
    the lane as on aiohttp's listener (a fragment is no part of the path)."""
    ours, theirs = await both(_where, b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % target)
    assert ours.startswith(b"HTTP/1.1 200")
    assert ours.partition(b"\r\n\r\n")[2] == theirs.partition(b"\r\n\r\n")[2]


async def test_pipelined_requests_past_the_bound_pause_reading(
    servers: tuple[int, int, web.Application],
) -> None:
    """A client pipelining far more requests than QUEUE_HIGH behind a slow one: reading
    pauses (memory stays bounded) and every answer still comes, in order."""
    lane_port, _, _ = servers
    count = lane.QUEUE_HIGH * 4
    got = split(await exchange(lane_port, GET % b"slow" + GET % b"j1" * count, count + 1))
    assert len(got) == count + 1 and got[0].endswith(b"slow done")


async def test_answers_are_written_at_the_end_of_the_turn_that_made_them(
    servers: tuple[int, int, web.Application], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Answers are not written from inside a handler's step but at the end of the turn, the
    answers of every connection of that turn in one pass (Outbox: eight handlers released
    together, eight connections written in one pass), each connection's bytes in order; a
    connection that closes after its answer (the last of four pipelined requests asks for
    ``Connection: close``) writes it before it closes."""
    lane_port, _, app = servers
    passes: list[int] = []
    flush = Outbox._flush

    def counted(outbox: Outbox) -> None:
        passes.append(len(outbox._lanes))
        flush(outbox)

    monkeypatch.setattr(Outbox, "_flush", counted)
    gated = [asyncio.ensure_future(exchange(lane_port, GET % b"gated")) for _ in range(8)]
    while app[PAGE].count("gated") < 8:
        await asyncio.sleep(0.01)
    app[GATE].set()  # the eight handlers end in one turn of the loop
    for got in await asyncio.gather(*gated):
        assert split(got)[0].endswith(b"through")
    assert passes == [8]
    closing = b"GET /p/demo/j3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    got = split(await exchange(lane_port, GET % b"j1" + GET % b"j2" * 2 + closing, answers=4))
    assert [a.split(b"\r\n", 1)[0] for a in got] == [b"HTTP/1.1 429 Too Many Requests"] * 4
    assert b"Connection: close" in got[3]


async def test_a_client_that_half_closes_after_its_request_gets_its_answer(
    servers: tuple[int, int, web.Application],
) -> None:
    """A request followed at once by the client's FIN (``shutdown(SHUT_WR)``): the answer
    made in that turn of the loop is written before the connection closes, though answers
    wait for the end of the turn."""
    lane_port, _, _ = servers
    for _ in range(20):
        reader, writer = await asyncio.open_connection("127.0.0.1", lane_port)
        writer.write(GET % b"j1")
        writer.write_eof()
        got = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        assert got.startswith(b"HTTP/1.1 429"), got


async def half_closed(port: int, request: bytes) -> bytes:
    """Send ``request`` and at once the client's FIN; everything read until the server
    closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    writer.write_eof()
    try:
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


async def test_a_half_closed_client_gets_the_answer_of_a_poll_under_way(
    servers: tuple[int, int, web.Application],
) -> None:
    """A status call whose handler is polling the provider when the client's FIN comes:
    the poll is never cut short, and its answer is written once it ends, then the
    connection closes (the client may still be reading: ``shutdown(SHUT_WR)``)."""
    lane_port, _, app = servers
    got = await half_closed(lane_port, GET % b"polled")
    assert got.startswith(b"HTTP/1.1 200 OK") and got.endswith(b"polled")
    assert app[PAGE] == ["poll started"]


async def test_a_half_closed_clients_waiting_handler_is_cancelled_as_aiohttp_does(
    servers: tuple[int, int, web.Application],
) -> None:
    """A handler that waits without polling (a held call) when the client's FIN comes is
    cancelled and the connection closes without an answer, as aiohttp's server takes a FIN
    (the client is gone), and so are requests pipelined behind a poll under way."""
    lane_port, plain_port, app = servers
    for port in (lane_port, plain_port):
        assert await half_closed(port, GET % b"held") == b""
        await page_shows(app, "held cancelled")
        assert app[PAGE] == ["held started", "held cancelled"]
        app[PAGE].clear()
    got = split(await half_closed(lane_port, GET % b"polled" + GET % b"held"))
    assert len(got) == 1 and got[0].endswith(b"polled") and app[PAGE] == ["poll started"]


async def test_a_relay_starts_paused_when_the_lanes_last_answer_filled_the_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lane answer large enough to fill the socket, pipelined with a request for aiohttp,
    and a client that reads nothing: aiohttp's handler, which takes the connection over
    right after that answer is written, starts paused, so its own answers wait for the
    client instead of piling up in memory."""
    big = b"x" * (16 << 20)

    async def large(request: web.Request) -> web.Response:
        return web.Response(body=big)

    app = web.Application()
    app.router.add_get("/other", large)
    lanes: list[Lane] = []
    made = Lane.connection_made

    def kept(self: Lane, transport: asyncio.BaseTransport) -> None:
        lanes.append(self)
        made(self, transport)

    monkeypatch.setattr(Lane, "connection_made", kept)
    async with listening(app, large) as (lane_port, _):
        _, writer = await asyncio.open_connection("127.0.0.1", lane_port)
        writer.write(GET % b"a" + b"GET /other HTTP/1.1\r\nHost: x\r\n\r\n")
        for _ in range(200):
            if lanes and lanes[0].relay is not None and lanes[0].relay.handler is not None:
                break
            await asyncio.sleep(0.01)
        relay = lanes[0].relay.handler if lanes[0].relay is not None else None
        assert relay is not None and relay._paused  # aiohttp's own pause flag
        assert lanes[0].flow.write_paused is None
        writer.close()
