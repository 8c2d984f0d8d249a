"""The HTTP/1.1 client under Upstream (gateway/provider/wire.py), against real aiohttp
servers and raw asyncio servers that answer byte for byte, malformed answers included."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import gc
import gzip
import ipaddress
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import uvloop
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway import UpstreamBodyTooLarge, UpstreamTimeout, UpstreamUnavailable
from gateway.provider import wire
from gateway.provider.client import Upstream

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


@dataclass
class Raw:
    """A server speaking bytes: ``answer(request_head, n)`` gives the bytes to send for the
    n-th request (None: close without a word); every request head is kept."""

    url: str
    heads: list[bytes] = field(default_factory=list)
    connections: int = 0
    closed_by_client: int = 0


Answerer = Callable[[bytes, int], Awaitable[bytes | None]]


@contextlib.asynccontextmanager
async def raw_server(answer: Answerer, *, close_after: float | None = None) -> AsyncIterator[Raw]:
    """``close_after``: seconds after an answer at which the server closes the connection."""
    raw = Raw("")

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.lower().split(b"\r\n")
                        if line.startswith(b"content-length:")
                    ),
                    0,
                )
                raw.heads.append(head + await reader.readexactly(length))
                data = await answer(head, len(raw.heads))
                if data is None:
                    break
                writer.write(data)
                await writer.drain()
                if close_after is not None:
                    await asyncio.sleep(close_after)
                    break
        except asyncio.IncompleteReadError as exc:
            raw.closed_by_client += not exc.partial
        except ConnectionError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    raw.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield raw
    finally:
        server.close()


@contextlib.asynccontextmanager
async def resetting(data: bytes) -> AsyncIterator[str]:
    """A server that reads a request, sends ``data``, then resets the connection (an RST,
    not a FIN): its base URL."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(data)
        await writer.drain()
        await asyncio.sleep(0.05)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


def always(data: bytes) -> Answerer:
    async def answer(head: bytes, n: int) -> bytes | None:
        return data

    return answer


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    client = Upstream(timeout=1.0, max_response_body=1024 * 1024)
    yield client
    await client.close()


@contextlib.asynccontextmanager
async def aiohttp_server(
    app: web.Application, tls: ssl.SSLContext | None = None
) -> AsyncIterator[str]:
    server = TestServer(app, host="127.0.0.1", scheme="https" if tls else "http")
    await server.start_server(ssl=tls)
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


def peers_app(peers: list[int]) -> web.Application:
    """Answers every path with its method; records each request's client port."""

    async def handle(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername")[1])
        kind = request.match_info["kind"]
        if kind == "chunked":
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            await response.prepare(request)
            for part in (b"one,", b"two,", b"three"):
                await response.write(part)
            await response.write_eof()
            return response
        if kind == "empty":
            return web.Response(status=204)
        if kind == "unchanged":
            return web.Response(status=304, headers={"ETag": '"v1"'})
        return web.Response(text=f"{request.method} {request.path_qs}")

    app = web.Application()
    app.router.add_route("*", "/{kind}", handle)
    return app


# -- keep-alive and the pool -----------------------------------------------------------


async def test_sequential_calls_share_one_kept_alive_connection(upstream: Upstream) -> None:
    """Ten calls one after another reach the server over a single connection."""
    peers: list[int] = []
    async with aiohttp_server(peers_app(peers)) as url:
        for n in range(10):
            answer = await upstream.send("GET", f"{url}/x?n={n}", {})
            assert answer.body == f"GET /x?n={n}".encode()
    assert len(peers) == 10 and len(set(peers)) == 1


async def test_an_answer_leaves_no_garbage_cycle(upstream: Upstream) -> None:
    """A settled answer is freed by reference counting alone: its parser, future, headers
    and body are no cycle left for the garbage collector (which, under load, ran several
    times a second for them). Answers and malformed answers alike (a timeout's traceback
    holds the exchange's frame, as any exception's does)."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        async with raw_server(always(OK)) as raw:
            for _ in range(20):
                assert (await upstream.send("GET", f"{raw.url}/x", {})).status == 200
        async with raw_server(always(b"HTTP/1.1 2oo OK\r\n\r\n")) as raw:
            with pytest.raises(UpstreamUnavailable):
                await upstream.send("GET", f"{raw.url}/x", {})
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, wire.Reading)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == []


async def test_a_connection_the_server_closed_while_idle_is_not_reused(
    upstream: Upstream,
) -> None:
    """The server closes each connection 50 ms after answering; the next call, later,
    opens a new one and succeeds (no error, nothing sent on the dead one)."""
    async with raw_server(always(OK), close_after=0.05) as raw:
        for _ in range(3):
            assert (await upstream.send("GET", f"{raw.url}/a", {})).body == b"ok"
            await asyncio.sleep(0.15)
    assert raw.connections == 3 and len(raw.heads) == 3


async def test_an_idempotent_call_is_sent_again_when_a_reused_connection_drops_it(
    upstream: Upstream,
) -> None:
    """The server reads the second request on a kept-alive connection and closes it
    unanswered (an idle timeout racing the request): a GET is sent once more on a new
    connection and succeeds; a POST is not repeated and fails as possibly sent."""

    async def answer(head: bytes, n: int) -> bytes | None:
        return None if n in (2, 5) else OK

    async with raw_server(answer) as raw:
        await upstream.send("GET", f"{raw.url}/a", {})
        assert (await upstream.send("GET", f"{raw.url}/a", {})).body == b"ok"
        assert raw.connections == 2 and len(raw.heads) == 3
        await upstream.send("POST", f"{raw.url}/a", {}, b"{}")
        with pytest.raises(UpstreamUnavailable) as failed:
            await upstream.send("POST", f"{raw.url}/a", {}, b"{}")
        assert failed.value.sent is True
        assert len(raw.heads) == 5


async def test_a_counted_call_is_never_sent_twice(upstream: Upstream) -> None:
    """``retry=False`` (a status poll: one reservation, one request): the reused connection
    dropped unanswered is a failure that may have been sent, and nothing is sent again (a
    proxy in front may have passed the first one on)."""

    async def answer(head: bytes, n: int) -> bytes | None:
        return None if n == 2 else OK

    async with raw_server(answer) as raw:
        await upstream.send("GET", f"{raw.url}/a", {}, retry=False)
        with pytest.raises(UpstreamUnavailable) as failed:
            await upstream.send("GET", f"{raw.url}/a", {}, retry=False)
        assert failed.value.sent is True
        assert len(raw.heads) == 2 and raw.connections == 1


async def test_a_request_that_could_not_be_written_goes_on_a_new_connection() -> None:
    """A kept connection found closed when writing (nothing went out) is replaced, even for
    a counted call."""
    pool = wire.Pool(4)
    async with raw_server(always(OK)) as raw:
        await pool.request("GET", f"{raw.url}/a", {}, None, 1024, retry=False)
        (host,) = pool._hosts.values()
        connection = host.idle[0]
        assert connection.transport is not None
        connection.transport.close()  # closing: its connection_lost not run yet, no await
        status, _, body = await pool.request("GET", f"{raw.url}/a", {}, None, 1024, retry=False)
        assert (status, body) == (200, b"ok")
        assert raw.connections == 2 and len(raw.heads) == 2
    pool.close()


async def test_calls_beyond_the_pool_size_wait_for_a_connection() -> None:
    """Twelve concurrent calls through a pool of two are all answered, never over more
    than two connections at a time."""
    active, most = 0, 0

    async def slow(request: web.Request) -> web.Response:
        nonlocal active, most
        active += 1
        most = max(most, active)
        await asyncio.sleep(0.05)
        active -= 1
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", slow)
    client = Upstream(timeout=2.0, max_response_body=1024, pool_size=2)
    try:
        async with aiohttp_server(app) as url:
            answers = await asyncio.gather(*(client.send("GET", f"{url}/", {}) for _ in range(12)))
    finally:
        await client.close()
    assert [a.status for a in answers] == [200] * 12
    assert most == 2


async def test_idle_connections_are_closed_after_a_while(
    upstream: Upstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection idle for IDLE_SECONDS is closed by the client."""
    monkeypatch.setattr(wire, "IDLE_SECONDS", 0.1)
    async with raw_server(always(OK)) as raw:
        await upstream.send("GET", f"{raw.url}/a", {})
        await asyncio.sleep(0.4)
        assert raw.closed_by_client == 1


# -- framing ---------------------------------------------------------------------------


async def test_chunked_bodies_are_joined(upstream: Upstream) -> None:
    peers: list[int] = []
    async with aiohttp_server(peers_app(peers)) as url:
        answer = await upstream.send("GET", f"{url}/chunked", {})
        again = await upstream.send("GET", f"{url}/again", {})
    assert answer.body == b"one,two,three"
    assert "Transfer-Encoding" not in answer.headers
    assert again.body == b"GET /again" and len(set(peers)) == 1


async def test_a_body_without_length_is_read_to_the_end_of_the_connection(
    upstream: Upstream,
) -> None:
    """No Content-Length, no chunking: the body ends with the connection, not reused."""
    data = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it"
    async with raw_server(always(data), close_after=0) as raw:
        for _ in range(2):
            assert (await upstream.send("GET", f"{raw.url}/a", {})).body == b"all of it"
    assert raw.connections == 2


async def test_a_body_without_length_cut_by_a_reset_is_no_answer(upstream: Upstream) -> None:
    """Only the server's end of file ends a body framed by the connection: a reset in the
    middle of it is a broken answer, never a truncated 200."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n"
    async with resetting(head + b'{"state": "succ') as url:
        with pytest.raises(UpstreamUnavailable) as broken:
            await upstream.send("GET", f"{url}/a", {})
    assert broken.value.sent is True


async def test_the_start_of_another_answer_retires_the_connection(upstream: Upstream) -> None:
    """An answer followed in the same read by the start of another: the connection is not
    reused (the next call gets a new one and its own answer)."""
    async with raw_server(always(OK + b"HTTP/1.1 500 Oops\r\n")) as raw:
        for _ in range(2):
            assert (await upstream.send("GET", f"{raw.url}/a", {})).body == b"ok"
    assert raw.connections == 2


async def test_agent_header_bytes_that_were_not_utf8_go_on_as_they_came(
    upstream: Upstream,
) -> None:
    """aiohttp's server hands a header byte that is not UTF-8 on as a lone surrogate: it
    is sent as the byte it was; text that cannot be bytes at all is refused unsent."""
    async with raw_server(always(OK)) as raw:
        await upstream.send("GET", f"{raw.url}/a", {"X-Name": "caf\udcff\udce9"})
        assert b"X-Name: caf\xff\xe9\r\n" in raw.heads[0]
        with pytest.raises(UpstreamUnavailable) as refused:
            await upstream.send("GET", f"{raw.url}/a", {"X-Name": "\ud800"})
        assert refused.value.sent is False and len(raw.heads) == 1


async def test_a_bad_host_name_was_not_sent_to(upstream: Upstream) -> None:
    for url in ("http://a..b/x", f"http://{'a' * 64}.example/x"):
        with pytest.raises(UpstreamUnavailable) as failed:
            await upstream.send("GET", url, {})
        assert failed.value.sent is False


async def test_connection_close_from_the_server_is_honoured(upstream: Upstream) -> None:
    """An answer with ``Connection: close`` is not followed by another request on the same
    connection, though the server leaves it open."""
    data = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    async with raw_server(always(data)) as raw:
        for _ in range(3):
            assert (await upstream.send("GET", f"{raw.url}/a", {})).body == b"ok"
    assert raw.connections == 3


async def test_head_204_and_304_have_no_body_and_keep_the_connection(
    upstream: Upstream,
) -> None:
    peers: list[int] = []
    async with aiohttp_server(peers_app(peers)) as url:
        head = await upstream.send("HEAD", f"{url}/page", {})
        empty = await upstream.send("GET", f"{url}/empty", {})
        unchanged = await upstream.send("GET", f"{url}/unchanged", {})
        after = await upstream.send("GET", f"{url}/after", {})
    assert (head.status, head.body) == (200, b"")
    assert (empty.status, empty.body) == (204, b"")
    assert (unchanged.status, unchanged.body, unchanged.headers["ETag"]) == (304, b"", '"v1"')
    assert after.body == b"GET /after"
    assert len(set(peers[1:])) == 1  # 204 and 304 leave the connection reusable


async def test_interim_answers_are_skipped(upstream: Upstream) -> None:
    """100 Continue and 103 Early Hints come before the answer; their headers are not in it."""
    data = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n" + OK
    async with raw_server(always(data)) as raw:
        answer = await upstream.send("POST", f"{raw.url}/a", {}, b"x")
    assert (answer.status, answer.body) == (200, b"ok")
    assert "Link" not in answer.headers


async def test_bytes_after_an_answer_retire_the_connection(upstream: Upstream) -> None:
    """A server that sends two answers to one request (in one write) is not asked again on
    that connection: the next call opens a new one and gets its own answer."""

    async def twice(head: bytes, n: int) -> bytes | None:
        return OK + OK if n == 1 else OK

    async with raw_server(twice) as raw:
        for _ in range(2):
            assert (await upstream.send("GET", f"{raw.url}/a", {})).body == b"ok"
    assert raw.connections == 2


async def test_repeated_headers_are_kept_and_cookies_are_not(upstream: Upstream) -> None:
    data = (
        b"HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nX-Seen: one\r\nX-Seen: two\r\n"
        b"Content-Length: 2\r\n\r\nok"
    )
    async with raw_server(always(data)) as raw:
        answer = await upstream.send("GET", f"{raw.url}/a", {})
        await upstream.send("GET", f"{raw.url}/a", {})
    assert answer.headers.getall("X-Seen") == ["one", "two"]
    assert b"cookie" not in raw.heads[1].lower()


# -- what is sent ----------------------------------------------------------------------


async def test_the_request_is_sent_as_given(upstream: Upstream) -> None:
    """Path and query unchanged, Host with the port, Accept-Encoding ours, no User-Agent,
    the body framed by our Content-Length, Content-Length: 0 for a POST without a body."""
    async with raw_server(always(OK)) as raw:
        port = raw.url.rsplit(":", 1)[1]
        headers = {"X-Key": "k", "content-length": "999", "Accept-Encoding": "br"}
        await upstream.send("PUT", f"{raw.url}/v1/a%2Fb/%7Ejob?x=%20y&z=1#frag", headers, b"hi")
        await upstream.send("POST", f"{raw.url}?q=1", {"Host": "provider.example"})
    first, second = raw.heads
    assert first.startswith(b"PUT /v1/a%2Fb/%7Ejob?x=%20y&z=1 HTTP/1.1\r\n")
    lines = first.split(b"\r\n")
    assert f"Host: 127.0.0.1:{port}".encode() in lines
    assert b"Accept-Encoding: gzip, deflate" in lines and b"X-Key: k" in lines
    assert b"Content-Length: 2" in lines and first.endswith(b"\r\n\r\nhi")
    assert b"user-agent" not in first.lower() and b"999" not in first and b"br" not in first
    assert second.startswith(b"POST /?q=1 HTTP/1.1\r\nHost: provider.example\r\n")
    assert b"Content-Length: 0" in second.split(b"\r\n")


async def test_a_line_break_in_a_header_is_refused_unsent(upstream: Upstream) -> None:
    async with raw_server(always(OK)) as raw:
        with pytest.raises(UpstreamUnavailable) as refused:
            await upstream.send("GET", f"{raw.url}/a", {"X-A": "1\r\nX-Injected: 2"})
    assert refused.value.sent is False and raw.heads == []


async def test_ipv6_literal_hosts(upstream: Upstream) -> None:
    try:
        server = await asyncio.start_server(lambda r, w: None, "::1", 0)
        server.close()
    except OSError:
        pytest.skip("no IPv6 loopback")
    app = web.Application()

    async def host(request: web.Request) -> web.Response:
        return web.Response(text=request.headers["Host"])

    app.router.add_get("/", host)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "::1", 0)
    await site.start()
    try:
        assert site._server is not None and site._server.sockets  # type: ignore[attr-defined]
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        answer = await upstream.send("GET", f"http://[::1]:{port}/", {})
        assert answer.body == f"[::1]:{port}".encode()
    finally:
        await runner.cleanup()


# -- failures --------------------------------------------------------------------------


async def test_a_malformed_status_line_may_have_been_sent(upstream: Upstream) -> None:
    async with raw_server(always(b"HTTX/1.1 200 OK\r\n\r\n")) as raw:
        with pytest.raises(UpstreamUnavailable) as broken:
            await upstream.send("GET", f"{raw.url}/a", {})
    assert broken.value.sent is True


async def test_unreachable_hosts_were_not_sent_to(upstream: Upstream) -> None:
    for url in ("http://127.0.0.1:9/none", "http://nothing.invalid/none"):
        with pytest.raises(UpstreamUnavailable) as refused:
            await upstream.send("GET", url, {})
        assert refused.value.sent is False, url


async def test_a_server_that_never_answers_times_out_on_time() -> None:
    async def never(head: bytes, n: int) -> bytes | None:
        await asyncio.sleep(10)
        return None

    client = Upstream(timeout=0.3, max_response_body=1024)
    try:
        async with raw_server(never) as raw:
            started = asyncio.get_running_loop().time()
            with pytest.raises(UpstreamTimeout):
                await client.send("GET", f"{raw.url}/a", {})
            took = asyncio.get_running_loop().time() - started
    finally:
        await client.close()
    assert 0.25 < took < 0.6, took


async def test_a_caller_waiting_for_a_connection_times_out_within_its_timeout() -> None:
    """With the one connection of the pool held by a call that gets no answer, a second
    caller's wait for it counts against its own timeout: both fail on time."""

    async def never(head: bytes, n: int) -> bytes | None:
        await asyncio.sleep(10)
        return None

    client = Upstream(timeout=0.3, max_response_body=1024, pool_size=1)
    try:
        async with raw_server(never) as raw:
            started = asyncio.get_running_loop().time()
            answers = await asyncio.gather(
                *(client.send("GET", f"{raw.url}/a", {}) for _ in range(2)),
                return_exceptions=True,
            )
            took = asyncio.get_running_loop().time() - started
    finally:
        await client.close()
    assert all(isinstance(a, UpstreamTimeout) for a in answers), answers
    assert took < 0.6, took
    assert raw.connections == 1


async def test_a_reset_mid_body_may_have_been_sent(upstream: Upstream) -> None:
    async with resetting(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial") as url:
        with pytest.raises(UpstreamUnavailable) as broken:
            await upstream.send("GET", f"{url}/a", {})
    assert broken.value.sent is True


async def test_a_content_length_over_the_cap_is_refused_before_reading(
    upstream: Upstream,
) -> None:
    """The server announces 10 MB and sends none of it: refused at once, not timed out."""
    data = b"HTTP/1.1 200 OK\r\nContent-Length: 10000000\r\n\r\n"
    async with raw_server(always(data)) as raw:
        with pytest.raises(UpstreamBodyTooLarge):
            await upstream.send("GET", f"{raw.url}/a", {})


async def test_a_chunked_gzip_bomb_stops_at_the_cap(upstream: Upstream) -> None:
    bomb = gzip.compress(b"0" * 20_000_000, compresslevel=9)
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(bomb[i : i + 4096]), bomb[i : i + 4096])
        for i in range(0, len(bomb), 4096)
    )
    data = (
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunks
        + b"0\r\n\r\n"
    )
    async with raw_server(always(data)) as raw:
        with pytest.raises(UpstreamBodyTooLarge):
            await upstream.send("GET", f"{raw.url}/a", {})


async def test_bytes_after_a_gzip_body_are_a_broken_answer(upstream: Upstream) -> None:
    """Whatever follows the end of a gzip member would be held undecoded and uncapped: the
    answer is broken, whatever its size."""
    packed = gzip.compress(b'{"state": "running"}') + b"x" * 4096
    head = f"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {len(packed)}\r\n\r\n"
    async with raw_server(always(head.encode() + packed)) as raw:
        with pytest.raises(UpstreamUnavailable) as broken:
            await upstream.send("GET", f"{raw.url}/a", {})
    assert broken.value.sent is True


async def test_an_unsupported_content_encoding_is_a_broken_answer(upstream: Upstream) -> None:
    data = b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 2\r\n\r\nok"
    async with raw_server(always(data)) as raw:
        with pytest.raises(UpstreamUnavailable) as broken:
            await upstream.send("GET", f"{raw.url}/a", {})
    assert broken.value.sent is True


async def test_a_gzip_body_is_decoded_and_its_framing_headers_dropped(
    upstream: Upstream,
) -> None:
    body = gzip.compress(b'{"ok": true}')
    data = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )
    async with raw_server(always(data)) as raw:
        answer = await upstream.send("GET", f"{raw.url}/a", {})
    assert answer.body == b'{"ok": true}'
    assert "Content-Encoding" not in answer.headers and "Content-Length" not in answer.headers


# -- https -----------------------------------------------------------------------------


def _self_signed(folder: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


async def test_https_verifies_certificates_and_sends_sni(tmp_path: Path) -> None:
    """A self-signed certificate fails verification with the default context (nothing
    sent); trusted through an injected context the call succeeds, with SNI."""
    pytest.importorskip("cryptography")
    cert, key = _self_signed(tmp_path)
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)
    sni: list[str | None] = []
    served.sni_callback = lambda sock, name, context: sni.append(name)  # type: ignore[assignment,return-value]
    peers: list[int] = []
    async with aiohttp_server(peers_app(peers), tls=served) as url:
        url = url.replace("127.0.0.1", "localhost")
        assert url.startswith("https://")
        default = Upstream(timeout=2.0, max_response_body=1024)
        trusted = Upstream(
            timeout=2.0,
            max_response_body=1024,
            ssl_context=ssl.create_default_context(cafile=str(cert)),
        )
        try:
            with pytest.raises(UpstreamUnavailable) as refused:
                await default.send("GET", f"{url}/a", {})
            assert refused.value.sent is False
            for _ in range(3):
                assert (await trusted.send("GET", f"{url}/a", {})).body == b"GET /a"
        finally:
            await default.close()
            await trusted.close()
    assert sni[-1] == "localhost"
    assert len(peers) == 3 and len(set(peers)) == 1


# -- under uvloop, the gateway's loop ----------------------------------------------------


def test_keep_alive_idle_close_failures_and_tls_under_uvloop(tmp_path: Path) -> None:
    """The same connection bookkeeping holds on uvloop (the loop of statusgate serve), TLS
    included (uvloop has its own TLS transport)."""
    cert, key = _self_signed(tmp_path)
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)
    trusted = ssl.create_default_context(cafile=str(cert))

    async def scenario() -> None:
        client = Upstream(timeout=1.0, max_response_body=1024, ssl_context=trusted)
        try:
            async with raw_server(always(OK)) as raw:
                for _ in range(3):
                    assert (await client.send("GET", f"{raw.url}/a", {})).body == b"ok"
                assert raw.connections == 1
            async with raw_server(always(OK), close_after=0.05) as raw:
                for _ in range(3):
                    assert (await client.send("GET", f"{raw.url}/a", {})).body == b"ok"
                    await asyncio.sleep(0.15)
                assert raw.connections == 3
            cut = b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nx"  # then the server closes
            async with raw_server(always(cut), close_after=0) as raw:
                with pytest.raises(UpstreamUnavailable) as broken:
                    await client.send("GET", f"{raw.url}/a", {})
                assert broken.value.sent is True
            peers: list[int] = []
            async with aiohttp_server(peers_app(peers), tls=served) as url:
                for _ in range(3):
                    answer = await client.send("GET", f"{url}/tls", {})
                    assert answer.body == b"GET /tls"
            assert len(peers) == 3 and len(set(peers)) == 1
        finally:
            await client.close()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())
