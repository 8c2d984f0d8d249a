"""Issue 42, a fault probe of the agent lane through the whole gateway: a client that
half-closes after its status call, idle and slow connections, and the bound on open
connections."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from gateway.flow.runtime import RUNTIME
from gateway.http.lane import LaneSite

from conftest import AGENT_TOKEN, Harness, raw


def status_call(job: str) -> bytes:
    return (
        f"GET /p/demo-jobs/v1/jobs/{job} HTTP/1.1\r\nHost: gateway.test\r\n"
        f"Authorization: Bearer {AGENT_TOKEN}\r\n\r\n"
    ).encode()


async def test_a_half_closed_agent_gets_the_answer_of_its_forwarded_poll(
    make_harness: Any,
) -> None:
    """A status call followed at once by the client's FIN (``shutdown(SHUT_WR)``, as a
    client that sends a request and then only reads does): the poll is forwarded once, and
    its answer (the provider's status) comes before the connection closes, not an empty
    reply after the provider was paid for."""
    harness: Harness = await make_harness()
    job = (await (await harness.submit([{"state": "running", "delay": 0.2}])).json())["id"]
    record = await harness.record(job)
    harness.clock.now = record.next_poll_at
    server = harness.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(status_call(job))
    writer.write_eof()
    got = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    assert got.startswith(b"HTTP/1.1 200 OK"), got
    assert b'"running"' in got.partition(b"\r\n\r\n")[2]
    assert len(harness.provider_calls(job)) == 1


HEAD_START = b"GET /p/demo-jobs/v1/jobs/x HTTP/1.1\r\nHost: gateway.test\r\nX-Slow: "


async def opened(harness: Harness) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    server = harness.client.server
    return await asyncio.open_connection(server.host, server.port)


async def ending(reader: asyncio.StreamReader, seconds: float = 15.0) -> bytes:
    """What the gateway writes until it closes the connection (``<open>`` appended if it
    has not within ``seconds``: a generous bound, never reached when the code is right)."""
    got = b""
    try:
        async with asyncio.timeout(seconds):
            while chunk := await reader.read(65536):
                got += chunk
    except TimeoutError:
        return got + b"<open>"
    except ConnectionError:
        pass
    return got


async def slowloris(harness: Harness) -> bytes:
    """A connection that sends a head a byte every 50 ms and never ends it; what it got."""
    reader, writer = await opened(harness)
    writer.write(HEAD_START)

    async def dribble() -> None:
        with contextlib.suppress(ConnectionError):
            while not writer.is_closing():
                await asyncio.sleep(0.05)
                writer.write(b"x")

    dribbling = asyncio.create_task(dribble())
    try:
        return await ending(reader)
    finally:
        dribbling.cancel()
        writer.close()


async def test_a_head_that_dribbles_in_is_cut_at_the_header_timeout(make_harness: Any) -> None:
    """Fifty connections each sending a head a byte at a time and never ending it
    (slowloris): each is answered 408 request-timeout once ``limits.header_timeout`` has
    passed since its first byte, and closed; none is kept."""
    # 2 s: a head's first bytes are surely read before it passes, even on a loaded machine
    harness: Harness = await make_harness(config_changes={"limits": {"header_timeout": "2s"}})
    ends = await asyncio.gather(*(slowloris(harness) for _ in range(50)))
    for got in ends:
        assert got.startswith(b"HTTP/1.1 408 Request Timeout"), got[:80]
        assert b"request-timeout" in got and b"Connection: close" in got


async def test_a_connection_that_sends_nothing_is_closed_at_the_header_timeout(
    make_harness: Any,
) -> None:
    """A connection that never sends a byte is closed, without an answer, once
    ``limits.header_timeout`` has passed (it was kept for an hour)."""
    harness: Harness = await make_harness(config_changes={"limits": {"header_timeout": "200ms"}})
    reader, writer = await opened(harness)
    assert await ending(reader) == b""
    writer.close()


async def test_an_idle_keepalive_connection_is_closed_at_the_keepalive_timeout(
    make_harness: Any,
) -> None:
    """After an answer, a connection is kept ``limits.keepalive_timeout`` for the next
    request: requests coming sooner are answered on it, one after a pause longer than that
    finds it closed without a word."""
    limits = {"keepalive_timeout": "3s", "header_timeout": "30s"}
    harness: Harness = await make_harness(config_changes={"limits": limits})
    reader, writer = await opened(harness)
    for _ in range(10):  # every 50 ms, far inside the timeout
        writer.write(status_call("missing"))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 404"), head
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        await asyncio.sleep(0.05)
    assert await ending(reader) == b""
    writer.close()


def lane_site(harness: Harness) -> LaneSite:
    runner = harness.client.server.runner
    assert runner is not None
    return next(site for site in runner.sites if isinstance(site, LaneSite))


async def test_past_max_connections_the_connection_idle_longest_makes_room(
    make_harness: Any,
) -> None:
    """300 connections that send nothing against ``limits.max_connections: 20``: as each
    new one comes past the bound, the one idle the longest is closed, so 280 are closed,
    the gateway never holds more than 20, and an agent's status call on a new connection
    is answered as usual (not 503)."""
    limits = {"max_connections": 20, "header_timeout": "60s"}
    harness: Harness = await make_harness(config_changes={"limits": limits})
    idle = [await opened(harness) for _ in range(300)]
    ends = await asyncio.gather(*(ending(reader, 2.0) for reader, _ in idle))
    assert ends.count(b"") == 280 and ends.count(b"<open>") == 20
    assert ends[-20:] == [b"<open>"] * 20  # the oldest went first
    assert lane_site(harness).connections.open == 20
    status, _ = await raw(harness, status_call("missing"))
    assert status == 404
    for _, writer in idle:
        writer.close()


async def test_past_max_connections_with_none_idle_a_new_one_is_503_overloaded(
    make_harness: Any,
) -> None:
    """Five connections each in the middle of a head against ``limits.max_connections: 5``:
    none is idle, so a sixth is answered 503 overloaded (Retry-After 1, as past
    max_in_flight), counted as an overloaded request, and closed; the five are kept."""
    limits = {"max_connections": 5, "header_timeout": "60s"}
    harness: Harness = await make_harness(config_changes={"limits": limits})
    busy = [await opened(harness) for _ in range(5)]
    for _, writer in busy:
        writer.write(HEAD_START)
    site = lane_site(harness)
    async with asyncio.timeout(5):
        while site.connections.idle:
            await asyncio.sleep(0.01)
    reader, writer = await opened(harness)
    got = await ending(reader)
    writer.close()
    assert got.startswith(b"HTTP/1.1 503 Service Unavailable"), got
    assert b"overloaded" in got and b"Retry-After: 1\r\n" in got and b"Connection: close" in got
    registry = harness.client.app[RUNTIME].effects.metrics.registry
    assert registry.get_sample_value("statusgate_overloaded_requests_total") == 1
    assert site.connections.open == 5
    for _, writer in busy:
        writer.close()


async def test_connections_aiohttp_serves_count_but_only_idle_lane_ones_make_room(
    make_harness: Any,
) -> None:
    """Against ``limits.max_connections: 2``: a kept-alive connection whose first request
    was for another path (served by aiohttp) counts; a new connection past the bound closes
    the idle agent connection, never aiohttp's, which still answers afterwards."""
    limits = {"max_connections": 2, "header_timeout": "60s"}
    harness: Harness = await make_harness(config_changes={"limits": limits})
    health = b"GET /healthz HTTP/1.1\r\nHost: gateway.test\r\n\r\n"
    reader, writer = await opened(harness)
    writer.write(health)
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 200")
    await asyncio.wait_for(reader.readuntil(b"}"), 5)
    idle_reader, idle_writer = await opened(harness)
    status, _ = await raw(harness, status_call("missing"))  # a third connection
    assert status == 404
    assert await ending(idle_reader) == b""
    writer.write(health)
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 200")
    writer.close()
    idle_writer.close()
