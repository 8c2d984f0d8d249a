"""End-to-end: a real gateway in front of the real demo provider, on loopback."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from conftest import Harness


async def job_of(response: Any) -> str:
    body = await response.json()
    return str(body["id"])


async def test_walkthrough_submit_refuse_poll_and_answer_from_record(harness: Harness) -> None:
    """Submit answers 202 with a gateway Location; early polls are refused without a provider
    call; due polls reach the provider; after success the record answers."""
    submitted = await harness.submit([{"state": "queued"}, {"state": "succeeded"}])
    assert submitted.status == 202
    assert submitted.headers["Statusgate-Operation"].startswith("op_")
    job = await job_of(submitted)
    assert submitted.headers["Location"] == f"http://gateway.test/p/demo-jobs/v1/jobs/{job}"
    assert (await submitted.json())["status_url"] == submitted.headers["Location"]
    assert int(submitted.headers["Retry-After"]) >= 1

    early = await harness.poll(job)
    assert early.status == 429
    assert early.headers["Content-Type"] == "application/problem+json"
    assert (await early.json())["type"] == "/problems/too-early"
    assert int(early.headers["Retry-After"]) >= 1
    assert harness.provider_calls(job) == []

    first = await harness.poll_when_due(job)
    assert first.status == 200
    assert first.headers["Statusgate-Provider-State"] == "queued"
    assert first.headers["Statusgate-Outcome"] == "pending"
    assert len(harness.provider_calls(job)) == 1

    done = await harness.poll_when_due(job)
    assert done.status == 200
    assert done.headers["Statusgate-Outcome"] == "succeeded"
    assert "Retry-After" not in done.headers
    assert len(harness.provider_calls(job)) == 2

    for _ in range(3):
        again = await harness.poll(job)
        assert again.status == 200
        assert (await again.json())["result"] == {"pages": 3}
    assert len(harness.provider_calls(job)) == 2
    record = await harness.record(job)
    assert record.status_requests_used == 2
    assert record.early_refusals == 1


async def escalation_of(response: Any) -> dict[str, Any]:
    assert response.status == 409, await response.text()
    body: dict[str, Any] = await response.json()
    assert body["type"] == "/problems/operation-escalated"
    assert body["status"] == 409
    assert response.headers["Statusgate-Outcome"] == "escalated"
    return body


async def run_until_answer(harness: Harness, script: list[dict[str, Any]], polls: int) -> Any:
    job = await job_of(await harness.submit(script))
    response = None
    for _ in range(polls):
        response = await harness.poll_when_due(job)
    return job, response


async def test_pending_answer_passes_through_with_retry_after(harness: Harness) -> None:
    """A pending 2xx schedules the next poll and passes the provider body with Retry-After."""
    job, response = await run_until_answer(harness, [{"state": "running"}], 1)
    assert response.status == 200
    assert (await response.json())["state"] == "running"
    record = await harness.record(job)
    assert int(response.headers["Retry-After"]) >= 1
    assert response.headers["Statusgate-Next-Poll-At"].endswith("Z")
    assert record.delay_source == "local_backoff"
    assert response.headers["Statusgate-Requests-Remaining"] == "11"


async def test_pending_after_own_expiry_is_an_integration_failure(harness: Harness) -> None:
    """A job still pending after its own expires_at is a contradiction."""
    _, response = await run_until_answer(harness, [{"state": "running", "expires_in": -5}], 1)
    body = await escalation_of(response)
    assert body["reason"] == "integration_failure"
    assert body["permitted_actions"] == ["abandon"]  # resume once the policy changed


async def test_success_with_required_field_is_terminal(harness: Harness) -> None:
    """Success with the required result field ends the operation as succeeded."""
    job, response = await run_until_answer(harness, [{"state": "succeeded"}], 1)
    assert response.status == 200
    assert response.headers["Statusgate-Outcome"] == "succeeded"
    assert (await harness.record(job)).final_response is not None


async def test_success_without_required_field_stays_pending(harness: Harness) -> None:
    """A success missing a success_requires field is still pending (Gemini reports
    SUCCEEDED before its output exists): polling goes on, and the answer that carries the
    field ends the operation succeeded."""
    script = [{"state": "succeeded", "omit": ["result"]}, {"state": "succeeded"}]
    job, response = await run_until_answer(harness, script, 1)
    assert response.status == 200
    assert response.headers["Statusgate-Outcome"] == "pending"
    assert "Retry-After" in response.headers
    done = await harness.poll_when_due(job)
    assert done.headers["Statusgate-Outcome"] == "succeeded"
    assert len(harness.provider_calls(job)) == 2


async def test_failure_cancelled_expired_are_terminal_with_provider_body(harness: Harness) -> None:
    """failed, cancelled and expired states end the operation; the provider body is kept."""
    for state, outcome in (
        ("failed", "failed"),
        ("cancelled", "cancelled"),
        ("expired", "expired"),
    ):
        job = await job_of(await harness.submit([{"state": state}], key=f"k-{state}"))
        response = await harness.poll_when_due(job)
        assert response.status == 200
        assert response.headers["Statusgate-Outcome"] == outcome
        body = await response.json()
        assert body["state"] == state
        again = await harness.poll(job)
        assert again.status == 200 and await again.json() == body
        assert len(harness.provider_calls(job)) == 1
        if state == "failed":
            assert body["error"]["code"] == "demo_failure"


async def test_unknown_state_and_missing_field_escalate(harness: Harness) -> None:
    """A state not in the table, or no state field at all, escalates unknown_state."""
    _, response = await run_until_answer(harness, [{"state": "paused"}], 1)
    body = await escalation_of(response)
    assert body["reason"] == "unknown_state"
    assert "paused" in body["message"]
    job = await job_of(await harness.submit([{"state": "running", "omit": ["state"]}], key="k2"))
    response = await harness.poll_when_due(job)
    assert (await escalation_of(response))["reason"] == "unknown_state"


async def test_non_json_and_oversized_bodies_escalate(harness: Harness) -> None:
    """A body that is not JSON, or larger than max_response_body, escalates."""
    script = [{"body": "<html>busy</html>", "content_type": "text/html"}]
    _, response = await run_until_answer(harness, script, 1)
    assert (await escalation_of(response))["reason"] == "integration_failure"
    huge = [{"state": "running", "pad": 70_000}]
    job = await job_of(await harness.submit(huge, key="k-huge"))
    response = await harness.poll_when_due(job)
    body = await escalation_of(response)
    assert body["reason"] == "integration_failure"
    assert "max_response_body" in body["detail"]


async def test_authorization_denied_escalates_without_retry(harness: Harness) -> None:
    """401 and 403 escalate authorization_denied; no further provider call follows."""
    for code in (401, 403):
        job = await job_of(await harness.submit([{"http": code}], key=f"k{code}"))
        response = await harness.poll_when_due(job)
        body = await escalation_of(response)
        assert body["reason"] == "authorization_denied"
        harness.clock.advance(600)
        assert (await harness.poll(job)).status == 409
        assert len(harness.provider_calls(job)) == 1


async def test_not_found_within_grace_is_pending_then_integration_failure(
    harness: Harness,
) -> None:
    """A 404 soon after submit is 'not visible yet'; a 404 after the grace escalates."""
    job = await job_of(await harness.submit([{"http": 404}]))
    response = await harness.poll_when_due(job)
    assert response.status == 503
    assert (await response.json())["type"] == "/problems/job-not-visible-yet"
    assert int(response.headers["Retry-After"]) >= 1
    record = await harness.record(job)
    assert record.transport_failures_used == 0
    assert record.status_requests_used == 1
    harness.clock.advance(31)
    response = await harness.poll_when_due(job)
    assert (await escalation_of(response))["reason"] == "integration_failure"


async def test_rate_limited_honours_retry_after_then_escalates(make_harness: Any) -> None:
    """429 counts rate_limited_used and waits at least Retry-After; too many escalate."""
    harness = await make_harness(policy_changes={"demo-jobs": {"polling": {"max_rate_limited": 2}}})
    job = await job_of(await harness.submit([{"http": 429, "retry_after": "7"}]))
    response = await harness.poll_when_due(job)
    assert response.status == 429
    assert (await response.json())["type"] == "/problems/provider-rate-limited"
    assert response.headers["Retry-After"] == "7"
    record = await harness.record(job)
    assert record.rate_limited_used == 1
    assert record.delay_source == "provider_retry_after"
    assert record.next_poll_at == harness.clock.now + 7
    await harness.poll_when_due(job)
    response = await harness.poll_when_due(job)
    body = await escalation_of(response)
    assert body["reason"] == "rate_limited"
    assert body["permitted_actions"] == ["extend", "abandon"]
    assert len(harness.provider_calls(job)) == 3


async def test_rate_limited_without_retry_after_multiplies_backoff(harness: Harness) -> None:
    """A 429 without Retry-After waits local backoff times rate_limited_multiplier."""
    job = await job_of(await harness.submit([{"http": 429}]))
    await harness.poll_when_due(job)
    record = await harness.record(job)
    delay = record.next_poll_at - harness.clock.now
    # base 1s, attempt 1 -> raw 2s, jitter [0.5, 1.0], x4
    assert 4.0 <= delay <= 8.0
    assert record.delay_source == "local_backoff"


async def test_server_errors_count_transport_failures_then_escalate(harness: Harness) -> None:
    """5xx answers count as transport failures; 503 Retry-After is honoured; the fourth
    failure (max 3) escalates provider_failure."""
    script = [{"http": 503, "retry_after": "20"}, {"http": 500}]
    job = await job_of(await harness.submit(script))
    response = await harness.poll_when_due(job)
    assert response.status == 503
    assert (await response.json())["type"] == "/problems/provider-unavailable"
    assert response.headers["Retry-After"] == "20"
    for _ in range(2):
        response = await harness.poll_when_due(job)
        assert response.status == 503
    assert (await harness.record(job)).transport_failures_used == 3
    body = await escalation_of(await harness.poll_when_due(job))
    assert body["reason"] == "provider_failure"
    assert body["permitted_actions"] == ["extend", "cancel_at_provider", "abandon"]
    assert (await harness.record(job)).status_requests_used == 4


async def test_connection_error_is_a_transport_failure(
    harness: Harness, provider_server: Any
) -> None:
    """With the provider gone, a due poll answers 503 provider-unavailable with Retry-After."""
    job = await job_of(await harness.submit([{"state": "running"}]))
    await provider_server.close()
    response = await harness.poll_when_due(job)
    assert response.status == 503
    assert (await response.json())["type"] == "/problems/provider-unavailable"
    assert "Retry-After" in response.headers
    record = await harness.record(job)
    assert record.transport_failures_used == 1
    assert record.status_requests_used == 1


async def test_timeout_is_a_transport_failure(make_harness: Any) -> None:
    """A provider slower than upstream_timeout gives 504 provider-timeout with Retry-After."""
    harness = await make_harness(config_changes={"limits": {"upstream_timeout": "300ms"}})
    job = await job_of(await harness.submit([{"state": "running", "delay": 1.5}]))
    response = await harness.poll_when_due(job)
    assert response.status == 504
    assert (await response.json())["type"] == "/problems/provider-timeout"
    assert "Retry-After" in response.headers
    assert (await harness.record(job)).transport_failures_used == 1


async def test_deadline_passed_escalates_without_provider_call(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """After the deadline no request is sent: the call escalates deadline_exceeded, and one
    warning says so in the gateway's log (operation, provider, account, reason)."""
    job = await job_of(await harness.submit([{"state": "running"}]))
    harness.clock.advance(601)
    with caplog.at_level(logging.WARNING, logger="statusgate"):
        body = await escalation_of(await harness.poll(job))
    assert body["reason"] == "deadline_exceeded"
    record = await harness.record(job)
    logged = [r for r in caplog.records if "escalated" in r.getMessage()]
    assert [r.getMessage().split(":")[0] for r in logged] == [
        f"operation {record.operation_id} of demo-jobs (account {record.account}) escalated"
    ]
    assert logged[0].reason == "deadline_exceeded"  # type: ignore[attr-defined]
    assert harness.provider_calls(job) == []
    assert "Safe options: extend by 15 minutes with 4 additional checks" in body["message"]


async def test_budget_exhausted_escalates_without_provider_call(make_harness: Any) -> None:
    """Once max_status_requests are used, the next call escalates and sends nothing."""
    harness = await make_harness(
        policy_changes={"demo-jobs": {"polling": {"max_status_requests": 2}}}
    )
    job = await job_of(await harness.submit([{"state": "running"}]))
    for _ in range(2):
        assert (await harness.poll_when_due(job)).status == 200
    body = await escalation_of(await harness.poll_when_due(job))
    assert body["reason"] == "request_budget_exhausted"
    assert "Status requests: 2 of 2" in body["message"]
    assert len(harness.provider_calls(job)) == 2


async def test_poll_hint_replaces_local_backoff_with_a_floor(harness: Harness) -> None:
    """poll_after_seconds guides the next poll; a hint of 0 is floored at base x jitter.min."""
    job = await job_of(
        await harness.submit(
            [
                {"state": "running", "poll_after_seconds": 9},
                {"state": "running", "poll_after_seconds": 0},
            ]
        )
    )
    await harness.poll_when_due(job)
    record = await harness.record(job)
    assert record.next_poll_at == harness.clock.now + 9
    assert record.delay_source == "provider_poll_hint"
    await harness.poll_when_due(job)
    record = await harness.record(job)
    assert record.next_poll_at == harness.clock.now + 0.5


async def test_guidance_past_the_deadline_escalates_now(harness: Harness) -> None:
    """A provider asking to wait past the deadline escalates deadline_exceeded at once."""
    job = await job_of(await harness.submit([{"state": "running", "next_check_in": 3600}]))
    body = await escalation_of(await harness.poll_when_due(job))
    assert body["reason"] == "deadline_exceeded"


async def test_result_route_is_gated_on_success_and_spends_no_budget(harness: Harness) -> None:
    """The result route answers not-ready before success, then is forwarded for free."""
    job = await job_of(await harness.submit([{"state": "running"}, {"state": "succeeded"}]))
    early = await harness.poll(job, path="/v1/jobs/{job_id}/result")
    assert early.status == 409
    assert (await early.json())["type"] == "/problems/not-ready"
    await harness.poll_when_due(job)
    await harness.poll_when_due(job)
    used = (await harness.record(job)).status_requests_used
    result = await harness.poll(job, path="/v1/jobs/{job_id}/result")
    assert result.status == 200
    assert (await result.json())["data"] == {"pages": 3}
    assert (await harness.record(job)).status_requests_used == used


async def test_cancel_route_needs_an_operator(harness: Harness) -> None:
    """An agent's cancel call is refused with approval-required and never forwarded."""
    job = await job_of(await harness.submit([{"state": "running"}]))
    response = await harness.client.post(
        f"/p/demo-jobs/v1/jobs/{job}/cancel", headers=harness.auth()
    )
    assert response.status == 403
    assert (await response.json())["type"] == "/problems/approval-required"
    assert not [c for c in harness.provider.log if c["path"].endswith("/cancel")]


async def test_concurrent_due_polls_make_one_provider_call(harness: Harness) -> None:
    """Step 7: twenty agents calling at once while a poll is in flight share its answer."""
    job = await job_of(await harness.submit([{"state": "running", "delay": 0.3}]))
    record = await harness.record(job)
    harness.clock.now = record.next_poll_at
    responses = await asyncio.gather(*(harness.poll(job) for _ in range(20)))
    assert [r.status for r in responses] == [200] * 20
    bodies = {await r.text() for r in responses}
    assert len(bodies) == 1
    assert len(harness.provider_calls(job)) == 1
    assert (await harness.record(job)).status_requests_used == 1


async def test_gateway_downtime_does_not_let_agents_catch_up(harness: Harness) -> None:
    """After a long silence one poll goes out when due, then the schedule applies again."""
    job = await job_of(await harness.submit([{"state": "running"}]))
    harness.clock.advance(300)
    assert (await harness.poll(job)).status == 200
    assert (await harness.poll(job)).status == 429
    assert len(harness.provider_calls(job)) == 1


async def test_finished_operations_are_purged_after_their_retention(harness: Harness) -> None:
    """Past the policy's retention (24h for demo-jobs) a finished operation is forgotten."""
    from gateway.flow.runtime import RUNTIME
    from gateway.flow.sweep import purge_finished

    job = await job_of(await harness.submit([{"state": "succeeded"}]))
    assert (await harness.poll_when_due(job)).status == 200
    runtime = harness.client.app[RUNTIME]
    assert await purge_finished(runtime) == 0
    harness.clock.advance(86400 + 1)
    assert await purge_finished(runtime) == 1
    assert (await harness.poll(job)).status == 404
