"""End-to-end: submission, idempotency, authentication and every agent-facing problem."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

from gateway.core.idempotency import forwarded_key

from conftest import AGENT_TOKEN, OTHER_TOKEN, PROVIDER_KEY, Harness


async def problem_of(response: Any, slug: str, status: int) -> dict[str, Any]:
    assert response.status == status, await response.text()
    assert response.headers["Content-Type"] == "application/problem+json"
    body: dict[str, Any] = await response.json()
    assert body["type"] == f"/problems/{slug}"
    assert body["status"] == status
    assert body["title"] and body["detail"]
    return body


def submits(harness: Harness) -> list[dict[str, Any]]:
    return [e for e in harness.provider.log if e["method"] == "POST"]


# -- idempotency ---------------------------------------------------------------------------


async def test_required_idempotency_key_missing(harness: Harness) -> None:
    """A policy that requires a key refuses a submit without one and forwards nothing."""
    await problem_of(await harness.submit(key=None), "idempotency-key-missing", 400)
    assert submits(harness) == []


async def test_same_key_same_request_replays_without_forwarding(harness: Harness) -> None:
    """A retried submit with the same key and body gets the stored answer; one provider job."""
    first = await harness.submit([{"state": "running"}])
    second = await harness.submit([{"state": "running"}])
    assert second.status == first.status == 202
    assert await second.json() == await first.json()
    assert second.headers["Statusgate-Operation"] == first.headers["Statusgate-Operation"]
    assert second.headers["Location"] == first.headers["Location"]
    assert len(submits(harness)) == 1


async def test_quoted_and_unquoted_keys_are_distinct_values(harness: Harness) -> None:
    """The key is taken as sent: a quoted key is its own value."""
    await harness.submit([{"state": "running"}], key='"abc"')
    conflict = await harness.submit([{"state": "queued"}], key='"abc"')
    await problem_of(conflict, "idempotency-key-conflict", 422)
    other = await harness.submit([{"state": "queued"}], key="abc")
    assert other.status == 202


async def test_same_key_other_request_is_a_conflict(harness: Harness) -> None:
    """The same key with another body is refused with 422 and nothing is forwarded."""
    await harness.submit([{"state": "running"}])
    response = await harness.submit([{"state": "queued"}])
    await problem_of(response, "idempotency-key-conflict", 422)
    assert len(submits(harness)) == 1


async def test_keys_are_scoped_per_account(harness: Harness) -> None:
    """Another account may use the same key value for its own submission."""
    first = await harness.submit([{"state": "running"}], key="shared")
    second = await harness.submit([{"state": "queued"}], key="shared", token=OTHER_TOKEN)
    assert first.status == second.status == 202
    assert first.headers["Statusgate-Operation"] != second.headers["Statusgate-Operation"]


async def test_key_in_use_while_original_in_flight(harness: Harness) -> None:
    """A retry while the original submit is still at the provider gets 409 in-use."""
    original = asyncio.create_task(harness.submit([{"state": "running"}], submit={"delay": 0.4}))
    await asyncio.sleep(0.15)
    retry = await harness.submit([{"state": "running"}], submit={"delay": 0.4})
    await problem_of(retry, "idempotency-key-in-use", 409)
    assert (await original).status == 202
    assert len(submits(harness)) == 1


async def test_lost_answer_without_provider_keys_is_outcome_unknown(make_harness: Any) -> None:
    """A submit that timed out after forwarding, to a provider that takes no key, is never
    resubmitted: retries get 409 submission-outcome-unknown."""
    harness = await make_harness(config_changes={"limits": {"upstream_timeout": "200ms"}})
    path = "/v1/batches"
    first = await harness.submit(provider="batch-api", path=path, submit={"delay": 0.6})
    await problem_of(first, "provider-timeout", 504)
    for _ in range(2):
        retry = await harness.submit(provider="batch-api", path=path, submit={"delay": 0.6})
        await problem_of(retry, "submission-outcome-unknown", 409)
    assert len(submits(harness)) == 1


async def test_lost_answer_with_provider_keys_may_be_retried(make_harness: Any) -> None:
    """When the provider takes the key (forward_header), a retry after a timeout is
    forwarded with the same key and the provider returns the job it already made."""
    harness = await make_harness(config_changes={"limits": {"upstream_timeout": "200ms"}})
    first = await harness.submit([{"state": "running"}], submit={"delay": 0.5})
    await problem_of(first, "provider-timeout", 504)
    await asyncio.sleep(0.4)
    retry = await harness.submit([{"state": "running"}], submit={"delay": 0.5})
    assert retry.status == 202
    sent = submits(harness)
    assert len(sent) == 2
    assert {e["headers"]["Idempotency-Key"] for e in sent} == {forwarded_key("team-a", "key-1")}
    assert len(harness.provider.jobs) == 1


async def test_provider_error_on_submit_passes_through_and_creates_nothing(
    harness: Harness,
) -> None:
    """A provider 4xx/5xx on submit reaches the agent as-is; no operation is created."""
    response = await harness.submit(submit={"http": 400})
    assert response.status == 400
    assert (await response.json())["error"]["code"] == "scripted"
    assert "Statusgate-Operation" not in response.headers


async def test_untrackable_submit_is_an_integration_failure(harness: Harness) -> None:
    """A 2xx submit without a valid job id answers 502; a retry is outcome-unknown."""
    response = await harness.submit(submit={"omit_id": True})
    await problem_of(response, "integration-failure", 502)
    retry = await harness.submit(submit={"omit_id": True})
    await problem_of(retry, "submission-outcome-unknown", 409)
    assert len(submits(harness)) == 1


# -- access --------------------------------------------------------------------------------


async def test_missing_and_unknown_tokens_are_unauthenticated(harness: Harness) -> None:
    """No token or an unknown token gets 401 with WWW-Authenticate: Bearer."""
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic x"}):
        response = await harness.client.get("/p/demo-jobs/v1/jobs/job_1", headers=headers)
        await problem_of(response, "unauthenticated", 401)
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert harness.provider.log == deque_empty(harness)


def deque_empty(harness: Harness) -> Any:
    return type(harness.provider.log)()


async def test_account_not_allowed_the_provider_is_forbidden(harness: Harness) -> None:
    """team-b may use demo-jobs only."""
    response = await harness.submit(provider="batch-api", path="/v1/batches", token=OTHER_TOKEN)
    await problem_of(response, "forbidden", 403)


async def test_unknown_provider_and_undeclared_routes(harness: Harness) -> None:
    """Unknown providers are 404 unknown-provider; undeclared paths and methods, and paths
    outside /p/, are 404 route-not-allowed: the gateway is not an open proxy."""
    auth = harness.auth()
    await problem_of(await harness.client.get("/p/nope/x", headers=auth), "unknown-provider", 404)
    for method, path in (
        ("GET", "/p/demo-jobs/v1/admin"),
        ("DELETE", "/p/demo-jobs/v1/jobs/job_1"),
        ("GET", "/p/demo-jobs/v1/jobs"),
        ("GET", "/p/demo-jobs/_demo/log"),
        ("GET", "/elsewhere"),
    ):
        response = await harness.client.request(method, path, headers=auth)
        await problem_of(response, "route-not-allowed", 404)
    assert harness.provider.log == deque_empty(harness)


async def test_bad_job_ids_are_invalid_requests(harness: Harness) -> None:
    """Encoded slashes, dot segments and odd characters never reach the provider."""
    for raw in ("a%2Fb", "..", "%2e%2e", "a%2e%2e%2Fx", "job%00", "x" * 201, "a;b"):
        response = await harness.client.get(f"/p/demo-jobs/v1/jobs/{raw}", headers=harness.auth())
        assert response.status in (400, 404)
        body = await response.json()
        assert body["type"] in ("/problems/invalid-request", "/problems/route-not-allowed")
    assert harness.provider.log == deque_empty(harness)


async def test_other_accounts_operation_is_unknown(harness: Harness) -> None:
    """Another account's job id is indistinguishable from a job that does not exist."""
    job = (await (await harness.submit([{"state": "running"}])).json())["id"]
    theirs = await harness.poll(job, token=OTHER_TOKEN)
    body = await problem_of(theirs, "unknown-operation", 404)
    none = await problem_of(await harness.poll("job_999999"), "unknown-operation", 404)
    assert body["detail"] == none["detail"]


async def test_oversized_request_body(harness: Harness) -> None:
    """A body over max_request_body is refused with 413 and not forwarded."""
    response = await harness.submit(body={"input": "x" * 70_000})
    await problem_of(response, "request-too-large", 413)
    assert submits(harness) == []


async def test_problem_pages_explain_each_slug(harness: Harness) -> None:
    """/problems/<slug> serves a short explanation."""
    response = await harness.client.get("/problems/too-early")
    assert response.status == 200
    assert "Retry-After" in await response.text()


async def test_escalated_operation_answers_409_until_an_operator_acts(harness: Harness) -> None:
    """An escalated operation is answered from the record with its escalation."""
    job = (await (await harness.submit([{"state": "weird"}])).json())["id"]
    await harness.poll_when_due(job)
    harness.clock.advance(100)
    again = await harness.poll(job)
    body = await problem_of(again, "operation-escalated", 409)
    assert body["reason"] == "unknown_state"
    assert body["escalated_at"].endswith("Z")
    assert body["operation_id"].startswith("op_")
    assert len(harness.provider_calls(job)) == 1


async def test_store_failure_fails_closed(make_harness: Any, tmp_path: Any) -> None:
    """With the SQLite file locked by another writer, calls get 503 store-unavailable with
    Retry-After and nothing reaches the provider."""
    db = tmp_path / "gw.db"
    harness = await make_harness(store_url=f"sqlite:///{db}?busy_timeout=200ms")
    job = (await (await harness.submit([{"state": "running"}])).json())["id"]
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        harness.clock.advance(60)
        before = len(harness.provider.log)
        response = await harness.poll(job)
        await problem_of(response, "store-unavailable", 503)
        assert "Retry-After" in response.headers
        submit = await harness.submit([{"state": "running"}], key="during-outage")
        await problem_of(submit, "store-unavailable", 503)
        assert len(harness.provider.log) == before
        assert (await harness.client.get("/readyz")).status == 503
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert (await harness.poll(job)).status == 200
    assert (await harness.client.get("/readyz")).status == 200


async def test_agent_credentials_never_reach_the_provider(harness: Harness) -> None:
    """Agent Authorization, cookies, proxy and hop-by-hop headers are stripped; the policy
    credential is injected."""
    headers = {
        "Authorization": f"Bearer {AGENT_TOKEN}",
        "Cookie": "session=agent",
        "Proxy-Authorization": "Basic abc",
        "Connection": "close, X-Secret-Hop",
        "X-Secret-Hop": "hop",
        "X-Forwarded-For": "10.9.9.9",
        "Idempotency-Key": "hdr",
        "X-Request-Id": "keep-me",
    }
    response = await harness.client.post(
        "/p/demo-jobs/v1/jobs", json={"demo_script": [{"state": "running"}]}, headers=headers
    )
    assert response.status == 202
    job = (await response.json())["id"]
    await harness.poll_when_due(job)
    for entry in harness.provider.log:
        sent = {k.lower(): v for k, v in entry["headers"].items()}
        assert sent["authorization"] == f"Bearer {PROVIDER_KEY}"
        assert AGENT_TOKEN not in str(entry)
        for name in ("cookie", "proxy-authorization", "x-secret-hop", "x-forwarded-for"):
            assert name not in sent
    first = {k.lower(): v for k, v in harness.provider.log[0]["headers"].items()}
    assert first["x-request-id"] == "keep-me"


async def test_problem_bodies_carry_the_error_envelope_sdks_print(harness: Harness) -> None:
    """SPEC 20: every problem body also has error.message/type/code, the message being the
    detail and type/code the slug, so an OpenAI-compatible SDK's exception names it."""
    response = await harness.client.get("/p/demo-jobs/v1/jobs/no-such-job", headers=harness.auth())
    body = await response.json()
    assert response.status == 404
    assert body["error"] == {
        "message": body["detail"],
        "type": "unknown-operation",
        "code": "unknown-operation",
    }
