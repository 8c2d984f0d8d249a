"""The agent listener (gateway/http/listener.py) on real sockets: a burst of connections is
accepted within a few turns of a busy loop (uvloop's own servers take one a turn), binding
says which address failed, and running out of descriptors pauses accepting instead of
spinning; with TLS a stalled handshake does not hold a stop. Counted in turns of the loop,
never timed."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import uvloop
from aiohttp import web

from gateway.http import listener
from gateway.http.lane import LaneSite
from gateway.http.listener import Listener, bind

BURST = 200


class Counted(asyncio.Protocol):
    def __init__(self, made: list[asyncio.Transport]) -> None:
        self.made = made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made.append(transport)  # type: ignore[arg-type]


async def busy_turns_to_accept(
    serve: Callable[[list[asyncio.Transport]], object],
    count: Callable[[list[asyncio.Transport]], int] = len,
) -> int:
    """Turns of a loop kept busy (each turn spins ~1 ms in Python, as a loaded gateway's
    turns do) until BURST connections opened at once are all made (``count`` of them);
    at most 4 * BURST."""
    made: list[asyncio.Transport] = []
    port = await serve(made)  # type: ignore[misc]
    clients = []
    for _ in range(BURST):
        client = socket.socket()
        client.setblocking(False)
        with pytest.raises(BlockingIOError):
            client.connect(("127.0.0.1", port))
        clients.append(client)
    loop = asyncio.get_running_loop()
    turns = 0
    while count(made) < BURST and turns < 4 * BURST:
        until = loop.time() + 0.001
        while loop.time() < until:
            pass
        await asyncio.sleep(0)
        turns += 1
    for transport in made:
        transport.close()
    for client in clients:
        client.close()
    return turns


def on_uvloop(test: Callable[[], object]) -> object:
    return asyncio.Runner(loop_factory=uvloop.new_event_loop).run(test())  # type: ignore[arg-type]


def test_a_burst_is_accepted_in_a_few_turns_of_a_busy_uvloop() -> None:
    """200 connections waiting at once are all served within a few turns of a busy uvloop
    loop; uvloop's own server (libuv accepts one per turn) needs a turn for each."""

    async def ours(made: list[asyncio.Transport]) -> int:
        sockets = bind("127.0.0.1", 0)
        server = Listener(sockets, lambda: Counted(made), backlog=4096)
        serving.append(server)
        return int(sockets[0].getsockname()[1])

    async def uvloops_own(made: list[asyncio.Transport]) -> int:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: Counted(made), "127.0.0.1", 0, backlog=4096)
        serving.append(server)
        return int(server.sockets[0].getsockname()[1])

    serving: list[Listener | asyncio.AbstractServer] = []

    async def both() -> tuple[int, int]:
        try:
            return await busy_turns_to_accept(ours), await busy_turns_to_accept(uvloops_own)
        finally:
            for server in serving:
                server.close()

    fast, slow = on_uvloop(both)  # type: ignore[misc]
    assert fast <= 10
    assert slow >= BURST // 2  # what the listener exists for: if this fails, libuv changed


async def test_closing_stops_accepting_and_frees_the_port() -> None:
    """After ``close`` no connection is accepted and the port can be bound again."""
    made: list[asyncio.Transport] = []
    sockets = bind("127.0.0.1", 0)
    port = sockets[0].getsockname()[1]
    server = Listener(sockets, lambda: Counted(made), backlog=16)
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(made) == 1
    server.close()
    writer.close()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)
    again = bind("127.0.0.1", port)
    again[0].close()
    for transport in made:
        transport.close()


def test_binding_a_taken_port_names_the_address() -> None:
    """A port in use fails with an OSError saying which address could not be bound."""
    taken = bind("127.0.0.1", 0)
    taken[0].listen(1)
    port = taken[0].getsockname()[1]
    try:
        with pytest.raises(OSError, match=rf"127\.0\.0\.1.*{port}.*address already in use"):
            bind("127.0.0.1", port)
    finally:
        taken[0].close()


def test_reuse_port_lets_workers_share_the_port() -> None:
    """With ``reuse_port`` (``--workers``) two sockets bind and listen on one port."""
    first = bind("127.0.0.1", 0, reuse_port=True)
    port = first[0].getsockname()[1]
    second = bind("127.0.0.1", port, reuse_port=True)
    try:
        first[0].listen(1)
        second[0].listen(1)
    finally:
        first[0].close()
        second[0].close()


class Exhausting(socket.socket):
    """A listening socket whose next ``accept`` fails as if the process were out of
    descriptors, ``failures`` times."""

    failures = 1

    def accept(self) -> tuple[socket.socket, object]:
        if self.failures:
            self.failures -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return super().accept()


async def test_out_of_descriptors_pauses_accepting_then_resumes(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """EMFILE stops accepting for RETRY with one warning (the socket stays readable: no
    spinning on it), then the waiting connection is accepted."""
    monkeypatch.setattr(listener, "RETRY", 0.05)
    sock = Exhausting(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    made: list[asyncio.Transport] = []
    server = Listener([sock], lambda: Counted(made), backlog=16)
    try:
        with caplog.at_level(logging.WARNING, logger="statusgate"):
            _, writer = await asyncio.open_connection(*sock.getsockname())
            for _ in range(5):
                await asyncio.sleep(0)
            assert made == []  # paused, not spinning: one failed accept
            assert sock.failures == 0
            for _ in range(100):
                await asyncio.sleep(0.01)
                if made:
                    break
        assert len(made) == 1
        warnings = [r.getMessage() for r in caplog.records if "cannot accept" in r.getMessage()]
        assert len(warnings) == 1 and "ulimit -n" in warnings[0]
        writer.close()
    finally:
        server.close()
        for transport in made:
            transport.close()


def test_the_agent_site_takes_a_burst_in_a_few_turns_of_a_busy_uvloop() -> None:
    """The agent listener (LaneSite) is the one that accepts a burst at once: 200
    connections are the runner's within a few turns of a busy uvloop loop."""

    async def agent_site(made: list[asyncio.Transport]) -> int:
        async def handler(request: web.Request) -> web.StreamResponse:
            return web.Response(text="ok")

        runner = web.AppRunner(web.Application())
        await runner.setup()
        site = LaneSite(
            runner, "127.0.0.1", 0, middleware=lambda r, h: h(r), handler=handler, backlog=4096
        )
        await site.start()
        runners.append(runner)
        return site.port

    def registered(_: list[asyncio.Transport]) -> int:
        server = runners[0].server
        return len(server.connections) if server is not None else 0

    runners: list[web.AppRunner] = []

    async def run() -> int:
        try:
            return await busy_turns_to_accept(agent_site, registered)
        finally:
            for runner in runners:
                await runner.cleanup()

    assert on_uvloop(run) <= 10  # type: ignore[operator]


def test_a_connection_accepted_as_the_listener_closes_is_handed_over_whole() -> None:
    """A connection accepted just before ``close`` still gets its transport and protocol,
    and is not closed by the listener: ``handed_over`` returns once the server has it (a
    request read meanwhile is answered by the server's graceful stop, not cut off)."""

    async def run() -> None:
        made: list[asyncio.Transport] = []
        sockets = bind("127.0.0.1", 0)
        server = Listener(sockets, lambda: Counted(made), backlog=16)
        loop = asyncio.get_running_loop()
        client = socket.socket()
        client.setblocking(False)
        with pytest.raises(BlockingIOError):
            client.connect(sockets[0].getsockname())
        for _ in range(50):  # accepted, its transport not made yet
            await asyncio.sleep(0)
            if server._starting:
                break
        assert server._starting and not made
        server.close()
        await server.handed_over()
        assert len(made) == 1 and not made[0].is_closing()
        made[0].write(b"still open")
        await asyncio.sleep(0.05)
        assert await loop.sock_recv(client, 64) == b"still open"
        made[0].close()
        client.close()

    on_uvloop(run)


def test_a_socket_that_cannot_listen_leaves_none_open() -> None:
    """When one of a host's sockets cannot listen (its port taken meanwhile), every socket
    is closed: none is left accepting with no one to stop it."""

    async def run() -> None:
        first = bind("127.0.0.1", 0)  # bound, not listening: the port can be bound again
        port = first[0].getsockname()[1]
        second = bind("127.0.0.1", port)
        second[0].listen(1)  # taken by a listener: first[0].listen now fails
        try:
            with pytest.raises(OSError):
                Listener([*bind("127.0.0.1", 0), first[0]], lambda: Counted([]), backlog=16)
            assert first[0].fileno() == -1
        finally:
            second[0].close()

    on_uvloop(run)


def test_an_address_family_the_machine_lacks_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a kernel without IPv6 every-interface binding listens on IPv4 alone, as
    ``loop.create_server`` does, instead of refusing to start; with no family at all it
    says why."""
    real = socket.socket

    def no_ipv6(family: int = socket.AF_INET, *args: object) -> socket.socket:
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return real(family, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(listener.socket, "socket", no_ipv6)
    monkeypatch.setattr(
        listener.socket,
        "getaddrinfo",
        lambda *a, **k: [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", 0, 0, 0)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0)),
        ],
    )
    sockets = bind("", 0)
    try:
        assert [s.family for s in sockets] == [socket.AF_INET]
    finally:
        for sock in sockets:
            sock.close()
    monkeypatch.setattr(
        listener.socket,
        "getaddrinfo",
        lambda *a, **k: [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", 0, 0, 0))],
    )
    with pytest.raises(OSError, match="not supported"):
        bind("", 0)


def test_a_tls_handshake_in_progress_is_cut_when_the_listener_hands_over() -> None:
    """With TLS, a client that connected but never sends its ClientHello holds no stop:
    ``handed_over`` cuts its handshake (no request was read on it; the client reads the
    end of the connection) instead of waiting out HANDSHAKE; no protocol is ever made."""
    pytest.importorskip("cryptography")
    from certs import TestCA

    async def run(folder: Path) -> None:
        issued = TestCA(folder).issue("server")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(issued.cert, issued.key)
        made: list[asyncio.Transport] = []
        sockets = bind("127.0.0.1", 0)
        server = Listener(sockets, lambda: Counted(made), backlog=16, tls=lambda: context)
        reader, writer = await asyncio.open_connection(*sockets[0].getsockname()[:2])
        for _ in range(200):  # accepted: its handshake waits for a ClientHello
            await asyncio.sleep(0)
            if server._handshaking:
                break
        assert server._handshaking
        server.close()
        await asyncio.wait_for(server.handed_over(), listener.HANDSHAKE / 2)
        assert not server._starting and not made
        assert await asyncio.wait_for(reader.read(), 30) == b""
        writer.close()

    with tempfile.TemporaryDirectory() as folder:
        on_uvloop(lambda: run(Path(folder)))
