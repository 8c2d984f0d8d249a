"""The escalation webhook: one POST per escalation, delivered off the request path."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.flow.runtime import RUNTIME

from conftest import OPERATOR_TOKEN, Harness


class Receiver:
    def __init__(self, hang: float = 0.0) -> None:
        self.received: list[dict[str, Any]] = []
        self.hang = hang

    async def handle(self, request: web.Request) -> web.Response:
        if self.hang:
            await asyncio.sleep(self.hang)
        self.received.append(await request.json())
        return web.Response(status=204)


async def serve(receiver: Receiver) -> TestServer:
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    the_receiver = Receiver()
    server = await serve(the_receiver)
    yield the_receiver, str(server.make_url("/hook"))
    await server.close()


def hook(url: str, **more: str | int) -> dict[str, Any]:
    return {"escalation": {"webhook_url": url, "webhook_backoff": "50ms", **more}}


async def drain(harness: Harness) -> None:
    notifier = harness.client.app[RUNTIME].effects.notifier
    assert notifier is not None
    await asyncio.wait_for(notifier.drain(), 10)


async def escalate(harness: Harness, state: str, key: str) -> str:
    job = (await (await harness.submit([{"state": state}], key=key)).json())["id"]
    response = await harness.poll_when_due(job)
    assert response.status == 409
    return str(job)


async def test_one_post_per_escalation(make_harness: Any, receiver: tuple[Receiver, str]) -> None:
    the_receiver, url = receiver
    harness: Harness = await make_harness(config_changes=hook(url))
    await escalate(harness, "odd", "a")
    await escalate(harness, "stranger", "b")
    await drain(harness)
    assert len(the_receiver.received) == 2
    first = the_receiver.received[0]
    assert first["reason"] == "unknown_state"
    assert first["permitted_actions"] == ["abandon"]  # resume only once the policy changed
    assert first["message"].startswith("External job needs a decision")
    assert first["operation_id"].startswith("op_")
    notified = [line for line in harness.audit_lines() if line["event"] == "notified"]
    assert len(notified) == 2
    assert notified[0]["detail"].startswith("delivered (attempt 1")


async def test_an_extend_is_followed_by_the_state_the_gateway_found(
    make_harness: Any, receiver: tuple[Receiver, str]
) -> None:
    """SPEC 20: after an operator's extend the gateway polls once by itself and notifies
    ``operation.updated`` with the provider state it found, after ``operation.decided``."""
    the_receiver, url = receiver
    harness: Harness = await make_harness(config_changes=hook(url))
    job = (await (await harness.submit([{"state": "running"}], key="x")).json())["id"]
    harness.clock.advance(601)
    escalated = await harness.poll(job)
    operation = escalated.headers["Statusgate-Operation"]
    extend = await harness.client.post(
        f"/admin/operations/{operation}/extend",
        json={"time": "5m"},
        headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
    )
    assert extend.status == 200
    runtime = harness.client.app[RUNTIME]
    while runtime.background:
        await asyncio.gather(*runtime.background)
    await drain(harness)
    kinds = [notice["type"] for notice in the_receiver.received]
    assert kinds == ["operation.escalated", "operation.decided", "operation.updated"]
    updated = the_receiver.received[-1]
    assert updated["outcome"] == "pending" and updated["provider_state"] == "running"


async def test_dead_receiver_is_retried_then_given_up_and_audited(make_harness: Any) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    harness: Harness = await make_harness(
        config_changes=hook(f"http://127.0.0.1:{port}/hook", webhook_attempts=3)
    )
    await escalate(harness, "odd", "a")
    await drain(harness)
    notified = [line for line in harness.audit_lines() if line["event"] == "notified"]
    assert notified[0]["detail"].startswith("failed after 3 attempts")


async def test_hanging_receiver_never_slows_status_calls(make_harness: Any) -> None:
    """With a receiver that hangs past the webhook timeout, status calls stay prompt."""
    slow = Receiver(hang=30)
    server = await serve(slow)
    try:
        harness: Harness = await make_harness(
            config_changes=hook(str(server.make_url("/hook")), webhook_timeout="2s")
        )
        for i in range(3):
            job = (await (await harness.submit([{"state": "odd"}], key=f"k{i}")).json())["id"]
            await harness.poll_when_due(job)
            started = time.perf_counter()
            for _ in range(5):
                assert (await harness.poll(job)).status == 409
            assert time.perf_counter() - started < 1.0
    finally:
        await server.close()
