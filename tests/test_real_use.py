"""What real clients, a real provider and abuse probes found (issue 9, SPEC 12 and 16), each
against a real gateway in front of the real demo provider."""

from __future__ import annotations

from typing import Any

from gateway.core.idempotency import forwarded_key
from gateway.core.models import OperationFilter
from gateway.core.routing import RouteTable, fill
from gateway.demo.provider import output_file
from gateway.flow.runtime import RUNTIME

from conftest import AGENT_TOKEN, OPERATOR_TOKEN, OTHER_TOKEN, PROVIDER_KEY, Harness, raw

OPS = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


async def slug(response: Any) -> str:
    return str((await response.json())["type"]).removeprefix("/problems/")


# -- 4: SDKs can tell final from retryable ---------------------------------------------------


async def test_final_answers_say_do_not_retry_and_retryable_ones_say_when(
    harness: Harness,
) -> None:
    """Item 4: too-early carries X-Should-Retry: true with Retry-After and the exact
    Retry-After-Ms; escalated, unknown-operation and route-not-allowed say false."""
    job = (await (await harness.submit([{"state": "running"}])).json())["id"]
    await harness.poll_when_due(job)
    early = await harness.poll(job)
    assert early.status == 429
    assert early.headers["X-Should-Retry"] == "true"
    record = await harness.record(job)
    exact = record.next_poll_at - harness.clock.now
    assert abs(int(early.headers["Retry-After-Ms"]) - exact * 1000) <= 1
    assert int(early.headers["Retry-After"]) * 1000 >= int(early.headers["Retry-After-Ms"])
    unknown = await harness.poll("job_nope")
    assert (unknown.status, unknown.headers["X-Should-Retry"]) == (404, "false")
    other = await harness.client.delete("/p/demo-jobs/v1/jobs", headers=harness.auth())
    assert other.headers["X-Should-Retry"] == "false"
    harness.clock.advance(3600)
    escalated = await harness.poll(job)
    assert (escalated.status, escalated.headers["X-Should-Retry"]) == (409, "false")


async def test_early_calls_hold_waits_for_the_next_poll_and_answers_it(
    make_harness: Any,
) -> None:
    """Item 4: with ``early_calls: hold`` a call that comes too early is held until the
    next permitted poll and gets that poll's answer (pending included), not a 429."""
    harness = await make_harness(policy_changes={"demo-jobs": {"polling": {"early_calls": "hold"}}})
    script = [{"state": "running"}, {"state": "running"}, {"state": "succeeded"}]
    job = (await (await harness.submit(script)).json())["id"]
    first = await harness.poll(job)  # due at once after submit
    assert first.status == 200
    due = (await harness.record(job)).next_poll_at
    held = await harness.poll(job)  # too early: held, then polled
    assert held.status == 200, await held.text()
    assert (await held.json())["state"] == "running"
    assert harness.clock.now >= due
    assert "Preference-Applied" not in held.headers
    assert len(harness.provider_calls(job)) == 2
    far = await make_harness(
        policy_changes={"demo-jobs": {"polling": {"early_calls": "hold", "max_hold": "1s"}}}
    )
    job2 = (await (await far.submit([{"state": "running"}], key="k2")).json())["id"]
    await far.poll(job2)
    refused = await far.poll(job2)  # the next poll is more than max_hold away
    assert refused.status == 429


# -- 5: the provider refusing the gateway's credential on submit ------------------------------


async def test_provider_refusing_the_gateway_credential_is_502_not_401(
    make_harness: Any,
) -> None:
    """Item 5: 502 provider-credential-rejected, no operation, a submit_rejected audit line,
    and the upstream 4xx counted; the agent's own token is not blamed."""
    harness = await make_harness(
        policy_changes={"demo-jobs": {"credential": {"value": "Bearer revoked-key"}}}
    )
    response = await harness.submit([{"state": "running"}])
    assert response.status == 502
    assert await slug(response) == "provider-credential-rejected"
    assert response.headers["X-Should-Retry"] == "false"
    assert "WWW-Authenticate" not in response.headers
    lines = harness.audit_lines()
    assert [line["event"] for line in lines] == ["submit_rejected"]
    assert lines[0]["http_status"] == 401 and lines[0]["account"] == "team-a"
    metrics = await (await harness.client.get("/metrics")).text()
    assert (
        'statusgate_upstream_requests_total{provider="demo-jobs",route="submit",'
        'status_class="4xx"} 1.0' in metrics
    )
    assert await harness.client.app[RUNTIME].store.list(OperationFilter()) == []


# -- 6: policy shapes real providers need ----------------------------------------------------


async def test_success_with_a_null_result_is_success_when_allowed(make_harness: Any) -> None:
    """Item 6: ``{path: result, allow_null: true}``: a task returning None succeeds; a
    missing field leaves it pending, shown with a pending state."""
    allow = {"states": {"success_requires": [{"path": "result", "allow_null": True}]}}
    harness = await make_harness(policy_changes={"demo-jobs": allow})
    job = (await (await harness.submit([{"state": "succeeded", "set": {"result": None}}])).json())[
        "id"
    ]
    done = await harness.poll_when_due(job)
    assert done.headers["Statusgate-Outcome"] == "succeeded"
    missing = [{"state": "succeeded", "omit": ["result"]}]
    job2 = (await (await harness.submit(missing, key="k2")).json())["id"]
    still = await harness.poll_when_due(job2)
    assert still.headers["Statusgate-Outcome"] == "pending"
    assert (await still.json())["state"] != "succeeded"


async def test_routes_with_a_fixed_query_send_it_as_written(make_harness: Any) -> None:
    """Item 6: a cancel route ``?terminate=true`` reaches the provider with its query."""
    cancel = {"routes": {"cancel": {"method": "POST", "path": "/v1/jobs/{job_id}/cancel?force=1"}}}
    harness = await make_harness(policy_changes={"demo-jobs": cancel})
    response = await harness.submit([{"state": "running"}])
    job, operation = (await response.json())["id"], response.headers["Statusgate-Operation"]
    answer = await harness.client.post(
        f"/admin/operations/{operation}/cancel", json={}, headers=OPS
    )
    assert answer.status == 200, await answer.text()
    assert [e["path"] for e in harness.provider.log if e["method"] == "POST"][-1] == (
        f"/v1/jobs/{job}/cancel?force=1"
    )


def test_path_templates_name_any_segment(harness: Harness) -> None:
    """Item 6: named segments match one valid segment each and fill back in order."""
    policy = harness.client.app[RUNTIME].settings.policies["batch-api"]
    table = RouteTable(policy)
    upload = table.match("POST", "/v1/files")
    assert upload is not None and upload.kind == "passthrough"
    result = table.match("GET", "/v1/files/batch_1/content")
    assert result is not None and (result.kind, result.job_id) == ("result", "batch_1")
    assert table.match("GET", "/v1/files/a/b/content") is None
    assert fill("/api/task/async-apply/{task}?x=1", {"task": "t.add"}, "y=2") == (
        "/api/task/async-apply/t.add?x=1&y=2"
    )


async def test_passthrough_routes_are_forwarded_with_the_credential_and_audited(
    harness: Harness,
) -> None:
    """Item 6: a declared passthrough (file upload) reaches the provider with the gateway's
    credential, not the agent's token, and is audited; undeclared calls stay refused."""
    upload = await harness.client.post(
        "/p/batch-api/v1/files", data=b'{"custom_id": "r1"}\n', headers=harness.auth()
    )
    assert upload.status == 200, await upload.text()
    file_id = (await upload.json())["id"]
    sent = [e for e in harness.provider.log if e["path"] == "/v1/files"][-1]
    assert sent["headers"]["Authorization"] == f"Bearer {PROVIDER_KEY}"
    assert harness.provider.files[file_id] == b'{"custom_id": "r1"}\n'
    line = harness.audit_lines()[-1]
    assert (line["event"], line["http_status"], line["account"]) == ("passthrough", 200, "team-a")
    listing = await harness.client.get("/p/batch-api/v1/files", headers=harness.auth())
    assert await slug(listing) == "route-not-allowed"


async def test_result_path_filled_from_the_final_answer(harness: Harness) -> None:
    """Item 6: the batch result is fetched from ``/v1/files/{final.output_file_id}``; a
    completed batch whose requests all failed (output_file_id null) is a success whose
    result is not-ready, naming the field."""
    path = "/v1/batches"
    ok = await harness.submit([{"state": "completed"}], provider="batch-api", path=path, key="a")
    batch = (await ok.json())["id"]
    done = await harness.poll_when_due(batch, provider="batch-api", path=path + "/{job_id}")
    assert done.headers["Statusgate-Outcome"] == "succeeded"
    result = await harness.client.get(
        f"/p/batch-api/v1/files/{batch}/content", headers=harness.auth()
    )
    assert result.status == 200, await result.text()
    assert b"request-1" in await result.read()
    assert harness.provider.log[-1]["path"] == f"/v1/files/{output_file(batch)}/content"
    all_failed = [{"state": "completed", "set": {"output_file_id": None, "error_file_id": "f"}}]
    bad = await harness.submit(all_failed, provider="batch-api", path=path, key="b")
    failed_batch = (await bad.json())["id"]
    answer = await harness.poll_when_due(
        failed_batch, provider="batch-api", path=path + "/{job_id}"
    )
    assert answer.headers["Statusgate-Outcome"] == "succeeded"
    calls = len(harness.provider.log)
    none = await harness.client.get(
        f"/p/batch-api/v1/files/{failed_batch}/content", headers=harness.auth()
    )
    assert (none.status, await slug(none)) == (409, "not-ready")
    assert "output_file_id" in (await none.json())["detail"]
    assert len(harness.provider.log) == calls


# -- 7, 8: idempotency keys ------------------------------------------------------------------


async def test_two_accounts_with_one_key_never_meet_at_the_provider(harness: Harness) -> None:
    """Item 7: account B sending A's key gets a job of its own; the provider is sent a
    key derived from the account, never the raw one."""
    a = await harness.submit([{"state": "running"}], key="shared")
    b = await harness.submit([{"state": "running"}], key="shared", token=OTHER_TOKEN)
    assert a.status == b.status == 202
    job_a, job_b = (await a.json())["id"], (await b.json())["id"]
    assert job_a != job_b
    keys = [e["headers"]["Idempotency-Key"] for e in harness.provider.log if e["method"] == "POST"]
    assert keys == [forwarded_key("team-a", "shared"), forwarded_key("team-b", "shared")]
    assert "shared" not in keys
    stolen = await harness.poll(job_a, token=OTHER_TOKEN)
    assert stolen.status == 404


async def test_an_idempotency_key_that_is_not_visible_ascii_is_400(harness: Harness) -> None:
    """Item 8: a non-UTF-8 (or otherwise invisible) key is 400 invalid-request, not 500."""
    body = b'{"input": "x"}'
    head = (
        b"POST /p/demo-jobs/v1/jobs HTTP/1.1\r\nHost: gateway.test\r\n"
        + f"Authorization: Bearer {AGENT_TOKEN}\r\n".encode()
        + b"Idempotency-Key: caf\xe9-\xff\xfe\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
    )
    status, answer = await raw(harness, head + body)
    assert status == 400, answer
    assert b"invalid-request" in answer
    spaced = await harness.submit([{"state": "running"}], key="has space")
    assert spaced.status == 400
    assert [e for e in harness.provider.log if e["method"] == "POST"] == []


# -- 9: result fetches are bounded and audited -----------------------------------------------


async def test_result_fetches_are_audited_and_bounded(make_harness: Any) -> None:
    """Item 9: every forwarded result call is a result_fetched audit line; past
    max_result_fetches the agent gets 409 result-budget-exhausted and the provider nothing."""
    harness = await make_harness(
        policy_changes={"demo-jobs": {"polling": {"max_result_fetches": 2}}}
    )
    job = (await (await harness.submit([{"state": "succeeded"}])).json())["id"]
    await harness.poll_when_due(job)
    for _ in range(2):
        fetched = await harness.poll(job, path="/v1/jobs/{job_id}/result")
        assert fetched.status == 200
    over = await harness.poll(job, path="/v1/jobs/{job_id}/result")
    assert (over.status, await slug(over)) == (409, "result-budget-exhausted")
    results = [e for e in harness.provider.log if e["path"].endswith("/result")]
    assert len(results) == 2
    lines = [line for line in harness.audit_lines() if line["event"] == "result_fetched"]
    assert len(lines) == 2 and all(line["http_status"] == 200 for line in lines)
    assert (await harness.record(job)).result_fetches == 2


# -- 12: agents' query strings ---------------------------------------------------------------


async def test_agent_query_strings_are_not_forwarded_on_status_calls(
    make_harness: Any,
) -> None:
    """Item 12: only the route's ``query_params`` reach the provider."""
    allowed = {"routes": {"status": {"query_params": ["api-version"]}}}
    harness = await make_harness(policy_changes={"demo-jobs": allowed})
    job = (await (await harness.submit([{"state": "running"}])).json())["id"]
    await harness.poll_when_due(
        job, params={"api_key": "steal", "api-version": "2024-01-01", "x": "1"}
    )
    assert harness.provider_calls(job)[-1]["path"] == f"/v1/jobs/{job}?api-version=2024-01-01"
    plain = await make_harness()
    job2 = (await (await plain.submit([{"state": "running"}], key="k2")).json())["id"]
    await plain.poll_when_due(job2, params={"api_key": "steal"})
    assert plain.provider_calls(job2)[-1]["path"] == f"/v1/jobs/{job2}"


# -- 14: a provider-wide pause cannot outlast deadlines --------------------------------------


async def test_a_provider_pause_past_the_deadline_escalates(make_harness: Any) -> None:
    """Item 14: one 429 with Retry-After of 29 days pauses the provider (for at most
    max_provider_pause, here max_delay's 2m), and an operation whose deadline comes first
    is escalated deadline_exceeded at its next call instead of being told to come back."""
    polling = {"deadline": "60s", "max_delay": "2m"}
    harness = await make_harness(policy_changes={"demo-jobs": {"polling": polling}})
    first = (
        await (await harness.submit([{"http": 429, "retry_after": "2505600"}], key="a")).json()
    )["id"]
    second = (await (await harness.submit([{"state": "running"}], key="b")).json())["id"]
    await harness.poll_when_due(first)
    answer = await harness.poll_when_due(second)
    assert answer.status == 409, await answer.text()
    body = await answer.json()
    assert body["reason"] == "deadline_exceeded"
    assert harness.provider_calls(second) == []


# -- 17: hostile operator input --------------------------------------------------------------


async def test_deeply_nested_json_to_an_operator_action_is_400(harness: Harness) -> None:
    """Item 17: nesting deeper than the JSON parser's recursion limit (30k levels, under
    the test's 64 KiB body cap) is a bad request, not a 500."""
    response = await harness.submit([{"state": "running"}])
    operation = response.headers["Statusgate-Operation"]
    depth = 30_000
    answer = await harness.client.post(
        f"/admin/operations/{operation}/extend",
        data=b"[" * depth + b"]" * depth,
        headers={**OPS, "Content-Type": "application/json"},
    )
    assert answer.status == 400, await answer.text()
    deep = b'{"reason": ' + b"[" * 900 + b"]" * 900 + b"}"
    answer = await harness.client.post(
        f"/admin/operations/{operation}/abandon", data=deep, headers=OPS
    )
    assert answer.status == 400
