"""Kept results served (SPEC 23) without the copy ever held whole: on the agent lane a copy
is a streamed answer (gateway/http/lane/stream.py), written chunk by chunk as the client
reads, the next pipelined request answered after it, its file closed when the client goes
away; and MCP's get_result answers from the copy, with no provider call. Real sockets, the
real app, the provider a real aiohttp double."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from gateway.flow.runtime import RUNTIME
from gateway.http.lane.protocol import Lane
from gateway.store.results import CHUNK

from conftest import AGENT_TOKEN, FakeClock
from kept_doubles import AUTH, ResultDouble, gateway, kept_config, result_body, serve, succeeded_job

MIB = 1024 * 1024


def lanes(client: TestClient[Any, Any]) -> list[Lane]:
    """The lane connections open on the gateway's agent listener."""
    runner = client.server.runner
    assert runner is not None
    return [c for c in runner.server.connections if isinstance(c, Lane)]  # type: ignore[misc]


def paused(client: TestClient[Any, Any]) -> list[Lane]:
    """The lane connections waiting for their client to read."""
    return [lane for lane in lanes(client) if lane.flow.write_paused is not None]


def open_copies(folder: Path) -> list[str]:
    """The kept copies in ``folder`` this process has open (its file descriptors)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(folder)) and "/.partial/" not in target:
                found.append(target)
    return found


async def until(condition: Callable[[], bool], seconds: float = 60.0) -> None:
    """Wait (generously: a loaded machine) until ``condition`` holds."""
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.01)


async def slow_reader(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection whose socket takes little (a small receive buffer, no autotuning) and
    whose reader pauses past 64 KiB unread: what it does not read stays at the gateway."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock, limit=64 * 1024)


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {AGENT_TOKEN}\r\n\r\n".encode()


def answers(data: bytes) -> list[tuple[bytes, bytes]]:
    """The whole (head, body) answers at the start of ``data``, Content-Length framed."""
    found = []
    while (end := data.find(b"\r\n\r\n")) >= 0:
        head = data[:end]
        size = int(re.search(rb"(?im)^content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
        if len(data) < end + 4 + size:
            break
        found.append((head, data[end + 4 : end + 4 + size]))
        data = data[end + 4 + size :]
    return found


async def kept_gateway(
    tmp_path: Path, body: bytes
) -> tuple[ResultDouble, Any, TestClient[Any, Any], FakeClock, str]:
    """The gateway on the lane keeping results in ``tmp_path/results``, with a job whose
    result (``body``) it is keeping."""
    double = ResultDouble(body)
    server, upstream = await serve(double)
    clock = FakeClock()
    folder = tmp_path / "results"
    config = kept_config(tmp_path, upstream, results_store=f"file://{folder}")
    client = await gateway(config, clock)
    job = await succeeded_job(client, clock)
    return double, server, client, clock, job


async def test_a_large_copy_streams_to_a_slow_reader_with_its_buffer_bounded(
    tmp_path: Path,
) -> None:
    """A 20 MiB kept copy to a client that reads slowly: while it does not read, the
    gateway's transport holds at most its high-water mark and one chunk (not the copy), and
    the client gets the whole copy, byte for byte, with no provider call."""
    body = result_body(20 * MIB)
    double, server, client, _, job = await kept_gateway(tmp_path, body)
    try:
        reader, writer = await slow_reader(client.server.port)
        writer.write(get(f"/p/demo-jobs/v1/jobs/{job}/result"))
        await until(lambda: bool(paused(client)))
        (lane,) = paused(client)
        assert lane.transport is not None
        _, high = lane.transport.get_write_buffer_limits()
        most, got = 0, b""
        while len(answers(got)) < 1:
            most = max(most, lane.transport.get_write_buffer_size())
            chunk = await asyncio.wait_for(reader.read(16 * 1024), 60)
            assert chunk, "the connection closed mid-answer"
            got += chunk
        writer.close()
    finally:
        await client.close()
        await server.close()
    ((head, served),) = answers(got)
    assert b"Statusgate-Result: kept" in head and served == body
    assert 0 < most <= high + CHUNK
    assert double.result_calls == 1


async def test_a_request_pipelined_after_a_streamed_copy_is_answered_after_it(
    tmp_path: Path,
) -> None:
    """Three requests in one write, a kept copy, a status call and the copy again: answered
    in that order on the one connection, each copy whole."""
    body = result_body(2 * MIB)
    _, server, client, _, job = await kept_gateway(tmp_path, body)
    result, status = f"/p/demo-jobs/v1/jobs/{job}/result", f"/p/demo-jobs/v1/jobs/{job}"
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", client.server.port)
        writer.write(get(result) + get(status) + get(result))
        got = b""
        while len(answers(got)) < 3:
            chunk = await asyncio.wait_for(reader.read(1 << 16), 60)
            assert chunk, "the connection closed"
            got += chunk
        writer.close()
    finally:
        await client.close()
        await server.close()
    (head1, body1), (head2, body2), (head3, body3) = answers(got)
    assert b"Statusgate-Result: kept" in head1 and body1 == body
    assert b"Statusgate-Result" not in head2 and b'"succeeded"' in body2
    assert b"Statusgate-Result: kept" in head3 and body3 == body


async def test_a_client_gone_mid_stream_closes_the_copy(tmp_path: Path) -> None:
    """A client that goes away in the middle of a kept copy: the gateway closes the copy's
    file and the connection, and serves the copy whole to the next client."""
    body = result_body(20 * MIB)
    _, server, client, _, job = await kept_gateway(tmp_path, body)
    folder = tmp_path / "results"
    try:
        reader, writer = await slow_reader(client.server.port)
        writer.write(get(f"/p/demo-jobs/v1/jobs/{job}/result"))
        await until(lambda: bool(paused(client)))
        assert open_copies(folder), "the copy is being read as it is written"
        assert await reader.read(1024)  # the answer has begun
        writer.close()
        await until(lambda: not open_copies(folder) and not paused(client))
        again = await client.get(f"/p/demo-jobs/v1/jobs/{job}/result", headers=AUTH)
        assert again.headers["Statusgate-Result"] == "kept"
        assert await again.read() == body
    finally:
        await client.close()
        await server.close()
    assert not open_copies(folder)


async def test_mcp_get_result_answers_from_the_kept_copy(tmp_path: Path) -> None:
    """MCP's get_result (the official client) answers from the kept copy, with no provider
    call and no result fetch counted: it works once the provider's result route answers
    404."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    body = result_body(100_000)
    double, server, client, _, job = await kept_gateway(tmp_path, body)
    try:
        first = await client.get(f"/p/demo-jobs/v1/jobs/{job}/result", headers=AUTH)
        assert first.headers["Statusgate-Result"] == "kept"  # the copy is made
        double.gone = True
        runtime = client.app[RUNTIME]
        stored = await runtime.store.find("team-a", "demo-jobs", job)
        assert stored is not None
        url = str(client.make_url("/mcp"))
        async with (
            httpx2.AsyncClient(headers=AUTH, timeout=30) as http,
            Client(streamable_http_client(url, http_client=http)) as mcp,
        ):
            got = await mcp.call_tool("get_result", {"operation_id": stored.operation_id})
        after = await runtime.store.find("team-a", "demo-jobs", job)
    finally:
        await client.close()
        await server.close()
    assert not got.is_error, got.content
    result = got.structured_content["result"]
    assert result["status"] == 200 and result["kept"] is True
    assert result["body"].encode() == body and result["content_type"] == "application/jsonl"
    assert double.result_calls == 1
    assert after is not None and after.result_fetches == stored.result_fetches == 1
