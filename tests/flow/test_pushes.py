"""End-to-end: provider pushes at /hooks/<provider>, signed for real, against a real gateway
in front of the real demo provider (SPEC 23)."""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
from datetime import UTC, datetime
from typing import Any

import pytest
from standardwebhooks import Webhook

from gateway.flow.runtime import RUNTIME

from conftest import Harness

SECRET = "whsec_" + base64.b64encode(b"demo-push-signing-key-32-bytes!!").decode()
OTHER_SECRET = "whsec_" + base64.b64encode(b"replicate-signing-key-32-bytes!!").decode()
DEMO_PUSH = {
    "verify": {"scheme": "standard-webhooks", "secret": SECRET, "tolerance": "5m"},
    "job_id": {"path": "data.id"},
    "state": {"path": "data.state"},
    "object": "data",
    "fallback_delay": "5m",
}
REPLICATE_PUSH = {
    "verify": {"scheme": "standard-webhooks", "secret": OTHER_SECRET},
    "job_id": {"path": "id"},
    "state": {"path": "status"},
}
PUSHES = {"demo-jobs": {"push": DEMO_PUSH}, "replicate": {"push": REPLICATE_PUSH}}


@pytest.fixture
async def pushed(make_harness: Any) -> Harness:
    h: Harness = await make_harness(policy_changes=PUSHES)
    return h


def signed(
    body: dict[str, Any], at: float, *, secret: str = SECRET, msg_id: str | None = None
) -> tuple[bytes, dict[str, str]]:
    """A push body and the Standard Webhooks headers the provider would send with it."""
    data = json.dumps(body).encode()
    msg_id = msg_id or f"msg_{secrets.token_hex(8)}"
    when = datetime.fromtimestamp(int(at), tz=UTC)
    signature = Webhook(secret).sign(msg_id, when, data)
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at)),
        "webhook-signature": signature,
        "Content-Type": "application/json",
    }
    return data, headers


async def push(
    h: Harness, body: dict[str, Any], provider: str = "demo-jobs", **kw: Any
) -> tuple[int, str]:
    data, headers = signed(body, h.clock.now, **kw)
    response = await h.client.post(f"/hooks/{provider}", data=data, headers=headers)
    return response.status, (await response.json())["result"]


async def submitted(h: Harness, script: list[dict[str, Any]], key: str = "key-1") -> str:
    response = await h.submit(script, key=key)
    assert response.status == 202, await response.text()
    return str((await response.json())["id"])


async def test_push_with_state_ends_operation_without_status_call(pushed: Harness) -> None:
    """A signed push carrying a success with its result ends the operation: the agent's
    status calls are answered from the record and the provider's status route is never
    called."""
    job = await submitted(pushed, [{"state": "running"}])
    status_object = {"id": job, "state": "succeeded", "result": {"pages": 3}}
    assert await push(pushed, {"type": "job.updated", "data": status_object}) == (200, "applied")
    record = await pushed.record(job)
    assert record.outcome.value == "succeeded"
    answer = await pushed.poll(job)
    assert answer.status == 200
    assert answer.headers["Statusgate-Outcome"] == "succeeded"
    assert (await answer.json())["result"] == {"pages": 3}
    assert pushed.provider_calls(job) == []
    events = [line["event"] for line in pushed.audit_lines() if line.get("operation_id")]
    assert "pushed" in events and "finished" in events


async def polled(h: Harness) -> None:
    """Wait for the background polls thin pushes started."""
    runtime = h.client.app[RUNTIME]
    while runtime.background:
        await asyncio.gather(*runtime.background, return_exceptions=True)


async def test_thin_push_polls_exactly_once(pushed: Harness) -> None:
    """A push naming only the job makes the gateway poll once at once; the record is updated
    from that answer and later status calls cost no provider call."""
    job = await submitted(pushed, [{"state": "succeeded"}])
    assert await push(pushed, {"type": "job.completed", "data": {"id": job}}) == (200, "polled")
    await polled(pushed)
    assert len(pushed.provider_calls(job)) == 1
    record = await pushed.record(job)
    assert record.outcome.value == "succeeded"
    for _ in range(3):
        answer = await pushed.poll(job)
        assert answer.headers["Statusgate-Outcome"] == "succeeded"
    assert len(pushed.provider_calls(job)) == 1


async def test_success_push_without_required_field_is_thin(pushed: Harness) -> None:
    """A push reporting success without what success_requires needs is not trusted: one
    poll, whose answer ends the operation."""
    job = await submitted(pushed, [{"state": "succeeded"}])
    body = {"type": "job.updated", "data": {"id": job, "state": "succeeded"}}
    assert await push(pushed, body) == (200, "polled")
    await polled(pushed)
    assert len(pushed.provider_calls(job)) == 1
    assert (await pushed.record(job)).outcome.value == "succeeded"


async def test_bad_signature_is_refused_and_counted(pushed: Harness) -> None:
    """A push signed with another secret, or outside the tolerance, is answered 401, changes
    nothing and is counted as refused."""
    job = await submitted(pushed, [{"state": "running"}])
    body = {"type": "job.updated", "data": {"id": job, "state": "failed"}}
    assert await push(pushed, body, secret=OTHER_SECRET) == (401, "refused")
    data, headers = signed(body, pushed.clock.now - 3600)
    late = await pushed.client.post("/hooks/demo-jobs", data=data, headers=headers)
    assert late.status == 401
    assert (await pushed.record(job)).outcome.value == "pending"
    scrape = await (await pushed.client.get("/metrics")).text()
    assert 'statusgate_pushes_total{provider="demo-jobs",result="refused"} 2.0' in scrape
    assert SECRET not in pushed.audit_path.read_text()


async def test_replayed_delivery_is_ignored(pushed: Harness) -> None:
    """The same delivery sent twice (a provider's retry, or a replay) is handled once: the
    second is answered 200 and polls nothing."""
    job = await submitted(pushed, [{"state": "running"}, {"state": "succeeded"}])
    body = {"type": "job.completed", "data": {"id": job}}
    assert await push(pushed, body, msg_id="msg_same") == (200, "polled")
    assert await push(pushed, body, msg_id="msg_same") == (200, "replayed")
    await polled(pushed)
    assert len(pushed.provider_calls(job)) == 1


async def test_a_thin_push_is_answered_before_its_poll_ends(pushed: Harness) -> None:
    """The provider's webhook call is answered while the poll it asked for still waits on
    the provider's status route (a sender gives a few seconds; a poll may take the
    upstream timeout): the answer does not hang on the provider's own slowness."""
    job = await submitted(pushed, [{"state": "succeeded"}])
    release = asyncio.Event()

    async def held(job_id: str) -> None:
        await release.wait()

    pushed.provider.before_answer = held
    try:
        body = {"type": "job.completed", "data": {"id": job}}
        answer = await asyncio.wait_for(push(pushed, body), 60)  # waiting on it: never
        assert answer == (200, "polled")
        async with asyncio.timeout(60):
            while pushed.provider.in_flight.get(job) != 1:  # the poll is out, held
                await asyncio.sleep(0.01)
        assert (await pushed.record(job)).outcome.value == "pending"
    finally:
        release.set()
        await polled(pushed)
        pushed.provider.before_answer = None
    assert (await pushed.record(job)).outcome.value == "succeeded"


async def test_unknown_job_is_accepted_and_ignored(pushed: Harness) -> None:
    """A verified push for a job the gateway does not track is answered 202 and counted."""
    assert await push(pushed, {"type": "job.completed", "data": {"id": "job_nobody"}}) == (
        202,
        "unknown_job",
    )
    scrape = await (await pushed.client.get("/metrics")).text()
    assert 'statusgate_pushes_total{provider="demo-jobs",result="unknown_job"} 1.0' in scrape


async def test_push_never_crosses_providers(pushed: Harness) -> None:
    """A push verified for one provider, naming another provider's job, touches nothing."""
    job = await submitted(pushed, [{"state": "running"}])
    body = {"id": job, "status": "succeeded", "output": None}
    assert await push(pushed, body, provider="replicate", secret=OTHER_SECRET) == (
        202,
        "unknown_job",
    )
    assert (await pushed.record(job)).outcome.value == "pending"
    assert await push(pushed, body, provider="replicate") == (401, "refused")  # demo's secret


async def test_polls_fall_back_to_fallback_delay(pushed: Harness) -> None:
    """While pushes are configured, the next permitted poll after a pending answer is at
    least fallback_delay away (the demo policy alone would poll within a second), never
    past the last poll before the deadline."""
    job = await submitted(pushed, [{"state": "running"}])
    record = await pushed.record(job)
    assert record.next_poll_at >= pushed.clock.now + 300
    answer = await pushed.poll_when_due(job)
    assert answer.status == 200
    assert int(answer.headers["Retry-After"]) >= 299
    record = await pushed.record(job)
    assert record.next_poll_at == record.deadline_at - 1  # 10m deadline, 1s final margin


async def test_pending_push_changes_nothing(pushed: Harness) -> None:
    """A push saying the job still runs is acknowledged and costs no provider call."""
    job = await submitted(pushed, [{"state": "running"}])
    before = await pushed.record(job)
    body = {"type": "job.updated", "data": {"id": job, "state": "running"}}
    assert await push(pushed, body) == (200, "pending")
    assert pushed.provider_calls(job) == []
    assert (await pushed.record(job)).version == before.version


async def test_hooks_of_a_provider_without_pushes_are_not_served(harness: Harness) -> None:
    """A provider whose policy declares no pushes (or whose secret is unset) has no hook."""
    response = await harness.client.post("/hooks/demo-jobs", data=b"{}")
    assert response.status == 404


LONG = {"polling": {"deadline": "40m", "max_status_requests": 200, "max_hold": "60s"}}


async def naive_job(h: Harness, *, pushing: bool) -> dict[str, int]:
    """One 30-minute job, 10 agents each polling every 5 s until it ends, one agent then
    fetching the result; with ``pushing`` the provider sends a thin push when it ends.
    The provider calls it cost, by kind."""
    script = [{"state": "running", "until": 1800}, {"state": "succeeded"}]
    job = await submitted(h, script, key=f"naive-{pushing}")
    start, done = h.clock.now, False
    while not done:
        h.clock.now += 5
        if pushing and h.clock.now - start >= 1800:
            await push(h, {"type": "job.completed", "data": {"id": job}})
        for _ in range(10):
            answer = await h.poll(job)
            done = done or answer.headers.get("Statusgate-Outcome") == "succeeded"
        assert h.clock.now - start < 2400, "the job never ended"
    fetched = await h.client.get(f"/p/demo-jobs/v1/jobs/{job}/result", headers=h.auth())
    assert fetched.status == 200
    calls: dict[str, int] = {}
    for entry in h.provider.log:
        if entry["job_id"] == job:
            calls[entry["kind"]] = calls.get(entry["kind"], 0) + 1
    return calls


async def test_provider_calls_per_job_with_pushes_and_without(make_harness: Any) -> None:
    """The issue's measure: a 30-minute job with 10 naive agents costs, with pushes, the
    submit, at most the fallback polls (30m / 10m, the last before the push) plus the one
    poll a thin push asks for, and one result fetch; without pushes the schedule's polls."""
    changes = {"demo-jobs": {**LONG, "push": {**DEMO_PUSH, "fallback_delay": "10m"}}}
    with_pushes = await naive_job(await make_harness(policy_changes=changes), pushing=True)
    polling = await naive_job(await make_harness(policy_changes={"demo-jobs": LONG}), pushing=False)
    print(f"\nprovider calls per job: with pushes {with_pushes}, polling only {polling}")
    assert with_pushes["submit"] == 1 and with_pushes["result"] == 1
    assert with_pushes["status"] <= 3 + 1
    assert polling["status"] > with_pushes["status"]


async def test_shipped_replicate_policy_takes_the_prediction_from_its_push(
    make_harness: Any,
) -> None:
    """The shipped replicate policy, its secret set: a signed push whose body is the final
    prediction (as Replicate sends it) ends the operation with no status call, and the
    agent's next call is answered from the record with that prediction."""
    h: Harness = await make_harness(
        policy_changes={"replicate": {"push": {"verify": {"secret": OTHER_SECRET}}}}
    )
    h.provider.default_scripts["replicate"] = [{"state": "processing"}]
    created = await h.client.post(
        "/p/replicate/v1/predictions",
        json={"version": "v1", "input": {"prompt": "a cat"}},
        headers=h.auth(),
    )
    assert created.status == 201, await created.text()
    prediction = await created.json()
    job = prediction["id"]
    final = {**prediction, "status": "succeeded", "output": ["https://replicate.delivery/x.png"]}
    assert await push(h, final, provider="replicate", secret=OTHER_SECRET) == (200, "applied")
    answer = await h.client.get(f"/p/replicate/v1/predictions/{job}", headers=h.auth())
    assert answer.headers["Statusgate-Outcome"] == "succeeded"
    assert (await answer.json())["output"] == ["https://replicate.delivery/x.png"]
    assert [e for e in h.provider.log if e["job_id"] == job and e["kind"] == "status"] == []
