"""SPEC 23: usage numbers recorded when an operation ends, and one signed
``operation.completed`` event a terminal operation, retried with backoff until delivered."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from test_pushes import PUSHES, push, submitted

from gateway.core.models import Outcome
from gateway.flow import completions
from gateway.flow.completions import Sender
from gateway.flow.runtime import RUNTIME

from conftest import AGENT_TOKEN, OPERATOR_TOKEN, Harness, pending_record

SECRET = "whsec_" + base64.b64encode(b"completion-test-key-0123456789ab").decode()
DONE = [{"state": "running"}, {"state": "succeeded"}]


class Receiver:
    """A webhook receiver that answers ``failures`` 500s first, then 204s (422 for ever to
    the events of the ``refused`` operations); it keeps every attempt (headers and raw body)."""

    def __init__(self, failures: int = 0, refused: frozenset[str] = frozenset()) -> None:
        self.failures = failures
        self.refused = refused
        self.attempts: list[tuple[dict[str, str], bytes]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.attempts.append((dict(request.headers), await request.read()))
        if json.loads(self.attempts[-1][1])["operation_id"] in self.refused:
            return web.Response(status=422)
        if len(self.attempts) <= self.failures:
            return web.Response(status=500)
        return web.Response(status=204)

    def operations(self) -> set[str]:
        return {json.loads(body)["operation_id"] for _, body in self.attempts}

    def delivered(self) -> list[tuple[dict[str, str], bytes]]:
        return self.attempts[self.failures :]


def verified(headers: dict[str, str], body: bytes) -> bool:
    """The Standard Webhooks check a receiver makes: HMAC-SHA256 of id.timestamp.body under
    the secret's base64 after ``whsec_``."""
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return headers["webhook-signature"] == f"v1,{expected}"


async def until(condition: Any, seconds: float = 20.0) -> None:
    """Wait (real time: the sender looks every second) until ``condition()`` holds."""
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.05)


@pytest.fixture
async def receiver_of(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    """Starts a receiver (real aiohttp server); the config changes that send it the events."""
    monkeypatch.setenv("COMPLETION_TEST_SECRET", SECRET)
    servers: list[TestServer] = []

    async def start(
        failures: int = 0, refused: frozenset[str] = frozenset()
    ) -> tuple[Receiver, dict[str, Any]]:
        receiver = Receiver(failures, refused)
        app = web.Application()
        app.router.add_post("/hook", receiver.handle)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        hook = {
            "webhook_url": str(server.make_url("/hook")),
            "webhook_secret_env": "COMPLETION_TEST_SECRET",
            "webhook_backoff": "2s",
        }
        return receiver, {"escalation": hook}

    yield start
    for server in servers:
        await server.close()


async def finish(harness: Harness, key: str = "k1") -> str:
    """A demo job that succeeds at its second poll; its job id."""
    job = str((await (await harness.submit(DONE, key=key)).json())["id"])
    for _ in range(2):
        response = await harness.poll_when_due(job)
        assert response.status == 200, await response.text()
    assert (await harness.record(job)).outcome is Outcome.SUCCEEDED
    return job


async def test_an_ended_operation_records_usage_and_sends_one_signed_event(
    make_harness: Any, receiver_of: Any
) -> None:
    """The demo job's final answer reports tokens and pages: they are on the record, in
    the admin view and in the one operation.completed event, whose signature verifies;
    looking at the outbox again sends nothing more."""
    receiver, hook = await receiver_of()
    harness: Harness = await make_harness(config_changes=hook)
    job = await finish(harness)
    record = await harness.record(job)
    usage = {"input_tokens": 1200, "output_tokens": 350, "pages": 3}
    assert dict(record.usage) == usage and record.announce
    await until(lambda: len(receiver.attempts) == 1)
    headers, body = receiver.attempts[0]
    assert verified(headers, body)
    event = json.loads(body)
    assert event == {
        "type": "operation.completed",
        "id": f"completed_{record.operation_id}",
        "operation_id": record.operation_id,
        "provider": "demo-jobs",
        "account": "team-a",
        "outcome": "succeeded",
        "provider_state": "succeeded",
        "usage": usage,
        "ended_at": event["ended_at"],
    }
    assert headers["webhook-id"] == event["id"]
    runtime = harness.client.app[RUNTIME]
    assert await Sender(runtime).send_owed() == 0
    assert await runtime.store.owed_completions(10) == []
    assert len(receiver.attempts) == 1
    admin = await harness.client.get(
        f"/admin/operations/{record.operation_id}",
        headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
    )
    assert (await admin.json())["record"]["usage"] == usage
    notified = [x for x in harness.audit_lines() if x["decision"] == "operation.completed"]
    assert [x["detail"] for x in notified] == ["delivered"]
    metrics = await (await harness.client.get("/metrics")).text()
    for kind, number in usage.items():
        series = f'statusgate_usage_total{{account="team-a",kind="{kind}",provider="demo-jobs"}}'
        assert f"{series} {float(number)}" in metrics
    assert 'statusgate_completion_deliveries_total{result="delivered"} 1.0' in metrics


async def test_the_event_of_a_kept_result_names_its_gateway_url(
    make_harness: Any, receiver_of: Any
) -> None:
    """With results.keep the event waits for the copy (made just after success) and carries
    result_url, the gateway's URL of the kept result, which answers from the copy."""
    receiver, hook = await receiver_of()
    harness: Harness = await make_harness(
        config_changes=hook, policy_changes={"demo-jobs": {"results": {"keep": True}}}
    )
    job = await finish(harness)
    await until(lambda: len(receiver.attempts) == 1)
    record = await harness.record(job)
    assert record.kept_result is not None and record.kept_result.kept
    event = json.loads(receiver.attempts[0][1])
    runtime = harness.client.app[RUNTIME]
    base = runtime.settings.file.public_base_url
    assert event["result_url"] == f"{base}/p/demo-jobs/v1/jobs/{job}/result"
    path = event["result_url"].removeprefix(base)
    kept = await harness.client.get(path, headers=harness.auth(AGENT_TOKEN))
    assert kept.status == 200 and kept.headers["Statusgate-Result"] == "kept"


async def test_a_receiver_failing_twice_gets_the_event_once_after_backoff(
    make_harness: Any, receiver_of: Any
) -> None:
    """500, 500, then 204: three attempts, one webhook-id, each only after the backoff
    (the injected clock must pass it), and the event is delivered once."""
    receiver, hook = await receiver_of(failures=2)
    harness: Harness = await make_harness(config_changes=hook)
    await finish(harness)
    await until(lambda: len(receiver.attempts) == 1)
    await asyncio.sleep(2.5)  # two more looks at the outbox: the backoff holds it
    assert len(receiver.attempts) == 1
    for attempts in (2, 3):
        harness.clock.advance(600)  # past any retry delay (jittered doubling from 2 s)
        await until(lambda n=attempts: len(receiver.attempts) == n)
    harness.clock.advance(600)
    await asyncio.sleep(2.5)
    assert len(receiver.attempts) == 3 and len(receiver.delivered()) == 1
    assert len({headers["webhook-id"] for headers, _ in receiver.attempts}) == 1
    assert all(verified(headers, body) for headers, body in receiver.attempts)
    runtime = harness.client.app[RUNTIME]
    assert await runtime.store.owed_completions(10) == []
    details = [x["detail"] for x in harness.audit_lines() if x["decision"] == "operation.completed"]
    assert details[-1] == "delivered" and all(d.startswith("failed") for d in details[:2])


async def test_without_a_webhook_nothing_is_owed(make_harness: Any) -> None:
    """No webhook configured: usage is still recorded, no event is owed."""
    harness: Harness = await make_harness()
    job = await finish(harness)
    record = await harness.record(job)
    assert dict(record.usage)["pages"] == 3 and not record.announce
    assert await harness.client.app[RUNTIME].store.owed_completions(10) == []


async def test_a_push_that_ends_the_operation_records_usage_and_owes_the_event(
    make_harness: Any, receiver_of: Any
) -> None:
    """A verified push carrying the final status object ends the operation with no provider
    call: its usage numbers are recorded and the one completion event goes out."""
    receiver, hook = await receiver_of()
    harness: Harness = await make_harness(config_changes=hook, policy_changes=PUSHES)
    job = await submitted(harness, [{"state": "running"}])
    final = {"id": job, "state": "succeeded", "result": {"pages": 7}, "usage": {"input_tokens": 5}}
    assert await push(harness, {"type": "job.updated", "data": final}) == (200, "applied")
    record = await harness.record(job)
    assert dict(record.usage) == {"input_tokens": 5, "pages": 7} and record.announce
    assert harness.provider_calls(job) == []
    await until(lambda: len(receiver.attempts) == 1)
    assert json.loads(receiver.attempts[0][1])["usage"] == {"input_tokens": 5, "pages": 7}


async def test_events_a_receiver_keeps_refusing_never_starve_the_others(
    make_harness: Any, receiver_of: Any
) -> None:
    """A full batch of the oldest owed events refused for good (their retries backed off,
    on a clock that does not move) does not keep a later event from being sent."""
    refused = frozenset(f"op_bad{n:03d}" for n in range(completions.BATCH))
    receiver, hook = await receiver_of(refused=refused)
    harness: Harness = await make_harness(config_changes=hook)
    store = harness.client.app[RUNTIME].store
    ended = harness.clock() - 100
    for n, operation_id in enumerate([*sorted(refused), "op_good"]):
        made = await store.create(
            pending_record(operation_id=operation_id, provider_job_id=f"j{n}")
        )
        done = made.evolve(outcome=Outcome.FAILED, ended_at=ended + n, announce=True)
        assert await store.save(done)
    await until(lambda: "op_good" in receiver.operations())
    assert await store.owed_completions(completions.BATCH + 1) == sorted(refused)


async def test_a_backed_off_event_no_longer_owed_is_forgotten(
    make_harness: Any, receiver_of: Any
) -> None:
    """A sender forgets the failures of an event no longer owed (its record purged while
    backed off), so the events it backs off never widen its looks for good."""
    _, hook = await receiver_of()
    harness: Harness = await make_harness(config_changes=hook)
    runtime = harness.client.app[RUNTIME]
    sender = Sender(runtime, failures={"op_purged": 3})
    try:
        assert await sender.send_owed() == 0
        assert sender.failures == {}
    finally:
        await sender.close()


async def _owing(harness: Harness, operation_id: str, ended_at: float) -> None:
    """A failed record owing its completion event, ended at ``ended_at``."""
    store = harness.client.app[RUNTIME].store
    made = await store.create(
        pending_record(operation_id=operation_id, provider_job_id=operation_id)
    )
    assert await store.save(made.evolve(outcome=Outcome.FAILED, ended_at=ended_at, announce=True))


def _details(harness: Harness, operation_id: str) -> list[str]:
    lines = harness.audit_lines()
    return [
        x["detail"]
        for x in lines
        if x["decision"] == "operation.completed" and x.get("operation_id") == operation_id
    ]


async def test_an_event_owed_past_the_give_up_bound_is_marked_sent_unposted(
    make_harness: Any, receiver_of: Any
) -> None:
    """An event owed longer than COMPLETION_GIVE_UP (from ended_at, on the injected clock)
    is given up: never posted, no longer owed (so purge may take its record), audited once
    and counted as given_up; one owed a little less is still posted."""
    receiver, hook = await receiver_of()
    harness: Harness = await make_harness(config_changes=hook)
    now = harness.clock()
    await _owing(harness, "op_old", now - completions.COMPLETION_GIVE_UP - 1)
    await _owing(harness, "op_new", now - completions.COMPLETION_GIVE_UP + 3600)
    store = harness.client.app[RUNTIME].store
    await until(lambda: "op_new" in receiver.operations())
    await until(lambda: _details(harness, "op_old") != [])
    assert "op_old" not in receiver.operations()
    assert not await store.completion_owed("op_old")
    assert _details(harness, "op_old") == ["given up after 7 days"]
    metrics = await (await harness.client.get("/metrics")).text()
    assert 'statusgate_completion_deliveries_total{result="given_up"} 1.0' in metrics


async def test_owed_events_are_dropped_once_no_webhook_is_configured(make_harness: Any) -> None:
    """Owed events (made while a webhook was configured) with no webhook any more are
    marked sent unposted and audited once each, so purge can take their records."""
    harness: Harness = await make_harness()
    store = harness.client.app[RUNTIME].store
    for operation_id in ("op_a", "op_b"):
        await _owing(harness, operation_id, harness.clock() - 100)
    sender = Sender(harness.client.app[RUNTIME])
    try:
        await sender.send_owed()
        await sender.send_owed()
    finally:
        await sender.close()
    assert await store.owed_completions(10) == []
    for operation_id in ("op_a", "op_b"):
        assert _details(harness, operation_id) == ["dropped: no webhook configured"]
    metrics = await (await harness.client.get("/metrics")).text()
    assert 'statusgate_completion_deliveries_total{result="dropped"} 2.0' in metrics
