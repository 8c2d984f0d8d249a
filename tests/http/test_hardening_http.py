"""Gateway hardening (SPEC 16) seen from outside: overdue operations are escalated with nobody
asking, a second gateway on a SQLite file exits, stalled bodies get 408, and malformed
requests cost one log line each."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.core.models import OperationRecord, Outcome, Reason
from gateway.demo.provider import DemoProvider
from gateway.flow.runtime import RUNTIME
from gateway.flow.sweep import escalate_overdue
from gateway.http.bodies import read_limited
from gateway.http.middleware import Handler, failed

from conftest import (
    AGENT_TOKEN,
    Harness,
    Served,
    pending_record,
)

AUTH = {"Authorization": f"Bearer {AGENT_TOKEN}"}


# -- item 10: no operation outlives its deadline unseen ------------------------------------
@pytest.fixture
async def webhook() -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
    """A webhook receiver: what it was sent, and its URL."""
    received: list[dict[str, Any]] = []

    async def take(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", take)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield received, str(server.make_url("/hook"))
    await server.close()


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param in ("redis", "postgres"):
        return str(request.getfixturevalue(f"{request.param}_url"))
    return "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/g.db"


async def submitted(harness: Harness, key: str = "k") -> OperationRecord:
    response = await harness.submit([{"state": "running"}], key=key)
    assert response.status == 202
    return await harness.record((await response.json())["id"])


async def test_overdue_operation_is_escalated_with_nobody_asking(
    make_harness: Any, store_url: str, webhook: tuple[list[dict[str, Any]], str]
) -> None:
    """Past its deadline, a never-polled operation is escalated deadline_exceeded by the
    sweep step: audit line, metric and webhook as usual, and only once."""
    received, hook_url = webhook
    hook = {"escalation": {"webhook_url": hook_url}}
    harness: Harness = await make_harness(store_url=store_url, config_changes=hook)
    runtime = harness.client.app[RUNTIME]
    record = await submitted(harness)
    harness.clock.now = record.deadline_at - 0.001
    assert await escalate_overdue(runtime) == 0
    harness.clock.now = record.deadline_at + 1
    assert await escalate_overdue(runtime) == 1
    assert await escalate_overdue(runtime) == 0
    assert runtime.effects.notifier is not None
    await asyncio.wait_for(runtime.effects.notifier.drain(), 10)
    stored = await harness.record(record.provider_job_id)
    assert stored.outcome is Outcome.ESCALATED and stored.escalation is not None
    assert stored.escalation.reason is Reason.DEADLINE_EXCEEDED
    escalated = [line for line in harness.audit_lines() if line["event"] == "escalated"]
    assert [line["reason"] for line in escalated] == ["deadline_exceeded"]
    metrics = await (await harness.client.get("/metrics")).text()
    assert (
        'statusgate_escalations_total{provider="demo-jobs",reason="deadline_exceeded"} 1.0'
        in metrics
    )
    assert [notice["reason"] for notice in received] == ["deadline_exceeded"]
    assert harness.provider_calls(record.provider_job_id) == []


async def test_an_operation_whose_poll_is_in_flight_waits_for_the_next_sweep(
    harness: Harness,
) -> None:
    """The deadline sweeper leaves an operation whose poll holds the lease and escalates it
    once the lease is released."""
    runtime = harness.client.app[RUNTIME]
    record = await submitted(harness)
    harness.clock.now = record.deadline_at + 1
    lease = f"poll:{record.operation_id}"
    assert await runtime.store.acquire_lease(lease, "a-poll", harness.clock.now, 30)
    assert await escalate_overdue(runtime) == 0
    await runtime.store.release_lease(lease, "a-poll")
    assert await escalate_overdue(runtime) == 1


async def test_providers_no_longer_configured_are_left_alone(harness: Harness) -> None:
    """The sweeper never touches records of a provider that is no longer configured."""
    runtime = harness.client.app[RUNTIME]
    retired = pending_record(provider="retired", deadline_at=harness.clock.now - 60)
    await runtime.store.create(retired)
    assert await escalate_overdue(runtime) == 0
    assert await runtime.store.get(retired.operation_id) == retired


@pytest.fixture(params=["redis", "postgres"])
def shared_url(request: pytest.FixtureRequest) -> str:
    """A store several gateways share: Redis, PostgreSQL."""
    return str(request.getfixturevalue(f"{request.param}_url"))


async def test_two_replicas_escalate_an_overdue_operation_once(
    make_harness: Any, shared_url: str
) -> None:
    """Two gateways on one Redis (or PostgreSQL) sweep at the same moment: one escalation,
    one audit line."""
    first: Harness = await make_harness(store_url=shared_url)
    second: Harness = await make_harness(store_url=shared_url)
    record = await submitted(first)
    first.clock.now = record.deadline_at + 1
    counts = await asyncio.gather(
        *(escalate_overdue(h.client.app[RUNTIME]) for h in (first, second, first, second))
    )
    assert sum(counts) == 1
    lines = [*first.audit_lines(), *second.audit_lines()]
    assert [line["event"] for line in lines].count("escalated") == 1


# -- real gateway processes -----------------------------------------------------------------
async def test_a_real_gateway_escalates_an_overdue_operation_by_itself(
    tmp_path: Path, upstream: tuple[DemoProvider, str], gateways: list[Served]
) -> None:
    """A 1 s deadline, no agent polling: within a few seconds the record is escalated and
    the audit log says so."""
    demo, url = upstream
    deadline = {"demo-jobs": {"polling": {"deadline": "1s"}}}
    served = Served(tmp_path, url, tmp_path / "g.db", policy_changes=deadline)
    gateways.append(await served.up())
    async with aiohttp.ClientSession() as http:
        base = f"http://127.0.0.1:{served.port}/p/demo-jobs/v1/jobs"
        payload = {"demo_script": [{"state": "running"}]}
        headers = {**AUTH, "Idempotency-Key": "real"}
        async with http.post(base, json=payload, headers=headers) as response:
            assert response.status == 202
            job = (await response.json())["id"]
    started = time.monotonic()
    while not any(line["event"] == "escalated" for line in served.audit()):
        assert time.monotonic() - started < 8, "not escalated within 8 s"
        await asyncio.sleep(0.1)
    line = next(line for line in served.audit() if line["event"] == "escalated")
    assert (line["reason"], line["provider"]) == ("deadline_exceeded", "demo-jobs")
    with sqlite3.connect(served.db) as conn:
        (data,) = conn.execute("SELECT data FROM operations").fetchone()
    assert OperationRecord.from_dict(json.loads(data)).outcome is Outcome.ESCALATED
    assert not [e for e in demo.log if e["job_id"] == job and e["method"] == "GET"]
    assert "Traceback" not in served.stop()


async def test_a_second_gateway_on_one_sqlite_file_exits_1_naming_it(
    tmp_path: Path, upstream: tuple[DemoProvider, str], gateways: list[Served]
) -> None:
    """While one gateway holds the file a second one exits 1 with one line naming it; once
    the first is killed (the OS drops its lock) the second starts."""
    _, url = upstream
    db = tmp_path / "shared.db"
    first = Served(tmp_path / "a", url, db)
    second = Served(tmp_path / "b", url, db)
    gateways.extend([first, second])
    await first.up()
    refused = second.start()
    code = await asyncio.to_thread(refused.wait, 15)
    lines = second.stop().strip().splitlines()
    assert code == 1
    assert len(lines) == 1 and str(db) in lines[0] and "in use" in lines[0], lines
    first.stop(signal.SIGKILL)
    await second.up()
    assert "Traceback" not in second.stop()


async def raw_exchange(port: int, data: bytes, *, wait: float = 5.0) -> bytes:
    """Send ``data`` and keep the connection open; whatever comes back within ``wait``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(65536), wait)
    finally:
        writer.close()


def stalled_submit(port: int) -> bytes:
    head = [
        "POST /p/demo-jobs/v1/jobs HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        f"Authorization: Bearer {AGENT_TOKEN}",
        "Idempotency-Key: slow",
        "Content-Type: application/json",
        "Content-Length: 100",
    ]
    return ("\r\n".join([*head, "", ""])).encode() + b'{"input": '  # 10 of 100 bytes


async def test_a_stalled_body_is_cut_with_408(
    tmp_path: Path, upstream: tuple[DemoProvider, str], gateways: list[Served]
) -> None:
    """An authenticated client that sends 10 of 100 body bytes and stalls gets 408
    request-timeout after limits.body_timeout (1 s here); nothing reaches the provider."""
    demo, url = upstream
    limits = {"limits": {"body_timeout": "1s"}}
    served = Served(tmp_path, url, tmp_path / "g.db", config=limits)
    gateways.append(await served.up())
    started = time.monotonic()
    answer = await raw_exchange(served.port, stalled_submit(served.port))
    assert time.monotonic() - started < 3
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b" ", 2)[1] == b"408", answer
    assert b"/problems/request-timeout" in body
    assert not demo.log
    assert "Traceback" not in served.stop()


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """What the gate does with an error, alone (no runtime behind it)."""
    try:
        return await handler(request)
    except Exception as exc:
        return failed(request, exc)


async def test_read_limited_answers_408_and_413_through_the_errors_middleware() -> None:
    """The body reader every handler uses: stalled past its timeout is 408, larger than its
    cap is 413, both as problem+json."""

    async def echo(request: web.Request) -> web.Response:
        return web.Response(body=await read_limited(request, 50, 0.5))

    app = web.Application(middlewares=[errors])
    app.router.add_post("/echo", echo)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        assert server.port is not None
        stalled = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n0123456789"
        started = time.monotonic()
        answer = await raw_exchange(server.port, stalled)
        assert answer.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 2
        assert b"application/problem+json" in answer and b"request-timeout" in answer
        big = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 60\r\n\r\n" + b"x" * 60
        assert (await raw_exchange(server.port, big)).startswith(b"HTTP/1.1 413")
        whole = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
        assert (await raw_exchange(server.port, whole)).endswith(b"hello")
    finally:
        await server.close()


MALFORMED = [
    b"GET / HTTP/9.9\r\n\r\n",
    b"GET /p/demo-jobs/v1/jobs?token=leak-me HTTP/1.1\r\nBad Header Line\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX-Huge: " + b"a" * 20_000 + b"\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"GET /\x01 HTTP/1.1\r\nHost: x\r\n\r\n",
]


async def test_malformed_requests_cost_one_short_line_each(
    tmp_path: Path, upstream: tuple[DemoProvider, str], gateways: list[Served]
) -> None:
    """Twenty requests the HTTP parser rejects: at most twenty log lines, no traceback, and
    nothing of the request line (a query string may hold a secret)."""
    _, url = upstream
    served = Served(tmp_path, url, tmp_path / "g.db")
    gateways.append(await served.up())
    for number in range(20):
        answer = await raw_exchange(served.port, MALFORMED[number % len(MALFORMED)])
        assert answer.startswith(b"HTTP/1."), answer
    stderr = served.stop()
    assert "Traceback" not in stderr
    assert "leak-me" not in stderr
    lines = [line for line in stderr.splitlines() if "rejected a malformed request" in line]
    assert len(lines) <= 20, stderr
    assert all(len(line) < 200 for line in lines), stderr
