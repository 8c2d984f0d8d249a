"""The operator API: bounded decisions on escalated operations, audited with the operator."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from gateway.core import actions, decide
from gateway.core.escalation import message, problem_members, suggested_extension
from gateway.core.models import Reason
from gateway.flow.runtime import RUNTIME
from gateway.settings.policy import load_policy

from conftest import (
    AGENT_TOKEN,
    OPERATOR_TOKEN,
    OTHER_TOKEN,
    PROVIDER_KEY,
    Harness,
    pending_record,
)

ROOT = Path(__file__).resolve().parents[2]
OPS = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


def test_each_reason_offers_exactly_its_permitted_actions() -> None:
    """Each escalation reason permits exactly its bounded actions, with cancel only where the
    policy has a cancel route."""
    with_cancel = load_policy(ROOT / "policies/demo-jobs.yaml", "d", {"DEMO_API_KEY": "k"})
    without = load_policy(
        ROOT / "policies/azure-read.yaml", "a", {"DOCUMENTINTELLIGENCE_API_KEY": "k"}
    )
    expected = {
        Reason.DEADLINE_EXCEEDED: ("extend", "cancel_at_provider", "abandon"),
        Reason.REQUEST_BUDGET_EXHAUSTED: ("extend", "cancel_at_provider", "abandon"),
        Reason.PROVIDER_FAILURE: ("extend", "cancel_at_provider", "abandon"),
        Reason.RATE_LIMITED: ("extend", "abandon"),
        Reason.UNKNOWN_STATE: ("resume", "abandon"),
        Reason.INTEGRATION_FAILURE: ("resume", "abandon"),
        Reason.AUTHORIZATION_DENIED: ("resume", "abandon"),
        Reason.INPUT_REQUIRED: ("cancel_at_provider", "abandon"),  # only the caller can answer
    }
    assert set(expected) == set(Reason)
    fresh = pending_record()
    for reason, permitted in expected.items():
        assert decide.permitted_actions(reason, with_cancel, fresh) == permitted
        assert decide.permitted_actions(reason, without, fresh) == tuple(
            a for a in permitted if a != "cancel_at_provider"
        )


def test_offered_actions_are_only_those_that_can_succeed() -> None:
    """Issue 9.3: no extend once max_extension is spent, no second cancel at the provider,
    and the suggested extension fits in what is left."""
    policy = load_policy(ROOT / "policies/demo-jobs.yaml", "d", {"DEMO_API_KEY": "k"})
    bound = policy.escalation.max_extension
    spent = pending_record(extended_seconds=bound.time, extended_requests=1)
    assert decide.permitted_actions(Reason.DEADLINE_EXCEEDED, policy, spent) == (
        "cancel_at_provider",
        "abandon",
    )
    assert decide.permitted_actions(Reason.RATE_LIMITED, policy, spent) == ("abandon",)
    asked = pending_record(cancel_requested_at=1.0)
    assert "cancel_at_provider" not in decide.permitted_actions(
        Reason.REQUEST_BUDGET_EXHAUSTED, policy, asked
    )
    nearly = pending_record(extended_seconds=bound.time - 90, extended_requests=bound.requests - 1)
    escalated = decide.escalate(policy, nearly, Reason.DEADLINE_EXCEEDED, 0.0, "d").record
    assert suggested_extension(policy, escalated) == (90, 1)
    assert "extend by 1 minute with 1 additional checks" in message(escalated, policy)


def test_resume_is_offered_only_once_the_policy_or_credential_changed() -> None:
    """actions.offered leaves out a resume that could only be refused: an unknown state under
    the same policy offers abandon alone, under a changed policy resume too; a credential
    escalation needs a changed credential."""
    policy = load_policy(ROOT / "policies/demo-jobs.yaml", "d", {"DEMO_API_KEY": "k"})
    record = pending_record(
        policy_fingerprint=policy.fingerprint,
        credential_fingerprint=policy.credential_fingerprint,
    )
    unknown = decide.escalate(policy, record, Reason.UNKNOWN_STATE, 0.0, "d").record
    assert actions.offered(policy, unknown) == ("abandon",)
    changed = policy.model_copy(update={"retention": policy.retention + 1})
    assert actions.offered(changed, unknown) == ("resume", "abandon")
    denied = decide.escalate(policy, record, Reason.AUTHORIZATION_DENIED, 0.0, "d").record
    assert actions.offered(changed, denied) == ("abandon",)
    rotated = load_policy(ROOT / "policies/demo-jobs.yaml", "d", {"DEMO_API_KEY": "k2"})
    assert actions.offered(rotated, denied) == ("resume", "abandon")
    assert actions.offered(policy, record) == ()


async def escalate_budget(harness: Harness, key: str = "key-1") -> tuple[str, str]:
    response = await harness.submit([{"state": "running"}], key=key)
    job, operation = (await response.json())["id"], response.headers["Statusgate-Operation"]
    harness.clock.advance(601)
    escalated = await harness.poll(job)
    assert escalated.status == 409
    return job, operation


async def background(harness: Harness) -> None:
    """Wait for the gateway's background work (its poll after an operator's decision)."""
    runtime = harness.client.app[RUNTIME]
    while runtime.background:
        await asyncio.gather(*runtime.background)


async def act(harness: Harness, operation: str, action: str, body: Any = None, **kw: Any) -> Any:
    return await harness.client.post(
        f"/admin/operations/{operation}/{action}", json=body or {}, headers=kw.get("headers", OPS)
    )


async def test_agent_tokens_and_strangers_are_refused(harness: Harness) -> None:
    """Agent tokens get 403 forbidden and requests without a token 401 on every admin route."""
    _, operation = await escalate_budget(harness)
    agent = {"Authorization": f"Bearer {AGENT_TOKEN}"}
    for path in ("/admin/operations", f"/admin/operations/{operation}"):
        forbidden = await harness.client.get(path, headers=agent)
        assert forbidden.status == 403
        assert (await forbidden.json())["type"] == "/problems/forbidden"
        assert (await harness.client.get(path)).status == 401
    refused = await act(harness, operation, "extend", {"time": "5m"}, headers=agent)
    assert refused.status == 403


async def test_list_and_show(harness: Harness) -> None:
    """The operations list filters by outcome and one operation's view carries its record,
    escalation and story."""
    job, operation = await escalate_budget(harness)
    listed = await harness.client.get("/admin/operations?outcome=escalated", headers=OPS)
    assert [o["operation_id"] for o in (await listed.json())["operations"]] == [operation]
    none = await harness.client.get("/admin/operations?outcome=succeeded", headers=OPS)
    assert (await none.json())["operations"] == []
    shown = await (await harness.client.get(f"/admin/operations/{operation}", headers=OPS)).json()
    assert shown["record"]["provider_job_id"] == job
    assert shown["escalation"]["reason"] == "deadline_exceeded"
    assert shown["escalation"]["permitted_actions"] == ["extend", "cancel_at_provider", "abandon"]
    assert "Safe options: extend by 15 minutes with 4 additional checks" in shown["message"]
    assert shown["story"][0].split(" ", 1)[1].startswith("submitted")
    assert "escalated: deadline_exceeded" in shown["story"][-1]
    missing = await harness.client.get("/admin/operations/op_nope", headers=OPS)
    assert missing.status == 404


async def test_extend_within_bounds_reactivates_and_the_next_poll_goes_out(
    harness: Harness,
) -> None:
    """An extension within the policy's bounds makes the operation pending and lets the next
    poll reach the provider."""
    job, operation = await escalate_budget(harness)
    response = await act(
        harness, operation, "extend", {"time": "15m", "requests": 4, "reason": "big file"}
    )
    assert response.status == 200, await response.text()
    record = await harness.record(job)
    assert record.outcome == "pending"
    assert record.delay_source == "manual_extension"
    assert record.deadline_at == harness.clock.now + 900
    await background(harness)  # the gateway's own poll after the decision (SPEC 20)
    assert len(harness.provider_calls(job)) == 1
    polled = await harness.poll(job)  # the agent learns the state without another call
    assert polled.status in (200, 429)
    assert polled.headers["Statusgate-Outcome"] == "pending"
    assert len(harness.provider_calls(job)) == 1
    extended = [line for line in harness.audit_lines() if line["event"] == "extended"]
    assert extended[0]["actor"] == "alice"
    assert extended[0]["detail"] == "+15m, +4 requests: big file"


async def test_extend_over_bounds_is_refused_naming_the_limit(harness: Harness) -> None:
    """An extension over max_extension is a 409 that names the limit and changes nothing."""
    _, operation = await escalate_budget(harness)
    over = await act(harness, operation, "extend", {"time": "31m", "requests": 1})
    assert over.status == 409
    body = await over.json()
    assert body["type"] == "/problems/action-not-permitted"
    assert "max_extension of 30m and 8 requests" in body["detail"]
    assert (await act(harness, operation, "extend", {"time": "20m"})).status == 200
    # the bound is for the operation's whole life: 10 minutes are left
    harness.clock.advance(1300)
    job_record = await harness.client.get(f"/admin/operations/{operation}", headers=OPS)
    assert (await job_record.json())["record"]["extended_seconds"] == 1200
    await harness.poll((await job_record.json())["record"]["provider_job_id"])
    again = await act(harness, operation, "extend", {"time": "15m"})
    assert again.status == 409
    assert "10m and 8 requests left" in (await again.json())["detail"]


async def test_actions_not_permitted_for_the_reason_are_refused(harness: Harness) -> None:
    """Actions the escalation reason does not permit are refused with 409 naming the reason
    and the actions that can succeed now, the ones the escalation answer offers (resume only
    once the policy changed)."""
    job = (await (await harness.submit([{"state": "paused"}])).json())["id"]
    escalated = await harness.poll_when_due(job)
    operation = (await harness.record(job)).operation_id
    refused = await act(harness, operation, "extend", {"time": "5m"})
    assert refused.status == 409
    detail = (await refused.json())["detail"]
    assert "extend is not permitted for unknown_state" in detail
    assert (await escalated.json())["permitted_actions"] == ["abandon"]
    assert detail.endswith("(permitted now: abandon).")
    refused = await act(harness, operation, "cancel")
    assert refused.status == 409


async def test_resume_needs_a_changed_policy(harness: Harness, make_harness: Any) -> None:
    """Resume without a policy change is refused; after the policy learns the state, a
    gateway with the new policy on the same store may resume and polls again."""
    job = (await (await harness.submit([{"state": "paused"}, {"state": "succeeded"}])).json())["id"]
    await harness.poll_when_due(job)
    operation = (await harness.record(job)).operation_id
    refused = await act(harness, operation, "resume")
    assert refused.status == 409
    assert "policy has not changed" in (await refused.json())["detail"]
    fixed = await make_harness(
        store=_store(harness),
        policy_changes={"demo-jobs": {"states": {"pending": ["queued", "running", "paused"]}}},
    )
    resumed = await act(fixed, operation, "resume")
    assert resumed.status == 200, await resumed.text()
    polled = await fixed.poll(job)
    assert polled.status == 200
    assert polled.headers["Statusgate-Outcome"] == "succeeded"


def _store(harness: Harness) -> Any:
    from gateway.flow.runtime import RUNTIME

    return harness.client.app[RUNTIME].store


async def test_resume_after_authorization_denied_needs_a_new_credential(
    harness: Harness, make_harness: Any
) -> None:
    """The same credential under another config spelling is no change; a rotated key is."""
    job = (await (await harness.submit([{"state": "running"}])).json())["id"]
    harness.provider.api_key = "rotated-key-7781"  # the provider revoked our key
    await harness.poll_when_due(job)
    operation = (await harness.record(job)).operation_id
    refused = await act(harness, operation, "resume")
    assert "credential has not changed" in (await refused.json())["detail"]
    same = {"credential": {"header": "Authorization", "value": f"Bearer {PROVIDER_KEY}"}}
    respelled = await make_harness(store=_store(harness), policy_changes={"demo-jobs": same})
    assert (await act(respelled, operation, "resume")).status == 409
    new = {"credential": {"header": "Authorization", "value": "Bearer rotated-key-7781"}}
    rotated = await make_harness(store=_store(harness), policy_changes={"demo-jobs": new})
    assert (await act(rotated, operation, "resume")).status == 200
    polled = await rotated.poll(job)
    assert polled.status == 200
    assert polled.headers["Statusgate-Provider-State"] == "running"


async def test_abandon_and_cancel_at_provider(harness: Harness) -> None:
    """Cancel sends the provider's cancel route once and keeps waiting; abandon ends waiting for
    good."""
    job, operation = await escalate_budget(harness)
    cancelled = await act(harness, operation, "cancel", {"reason": "not needed"})
    assert cancelled.status == 200, await cancelled.text()
    assert (await cancelled.json())["record"]["outcome"] == "pending"
    assert [c["path"] for c in harness.provider.log if c["path"].endswith("/cancel")] == [
        f"/v1/jobs/{job}/cancel"
    ]
    final = await harness.poll_when_due(job)
    assert final.status == 200
    assert (await final.json())["state"] == "cancelled"
    assert final.headers["Statusgate-Outcome"] == "cancelled"
    other, operation2 = await escalate_budget(harness, key="key-2")
    abandoned = await act(harness, operation2, "abandon", {"reason": "gave up"})
    assert abandoned.status == 200
    answer = await harness.poll(other)
    assert answer.status == 409
    assert answer.headers["Statusgate-Outcome"] == "abandoned"
    events = [(line["event"], line["actor"]) for line in harness.audit_lines()]
    assert ("cancelled", "alice") in events and ("abandoned", "alice") in events


async def test_bad_action_bodies(harness: Harness) -> None:
    """Malformed action bodies are 400 and unknown actions 404."""
    _, operation = await escalate_budget(harness)
    for body in ({"time": "soon"}, {"requests": "4"}, {"requests": True}):
        response = await act(harness, operation, "extend", body)
        assert response.status == 400, body
    response = await harness.client.post(
        f"/admin/operations/{operation}/extend", data=b"[1,", headers=OPS
    )
    assert response.status == 400
    assert (await act(harness, operation, "explode")).status == 404


async def test_cancel_is_a_request_the_provider_outcome_decides(harness: Harness) -> None:
    """Issue 9.1: a cancel the provider accepts keeps the operation waiting on a small
    fresh budget; the provider's own later answer (here: the job finished anyway) is the
    outcome, and the cancel route's body is never served as the job's status."""
    script = [{"state": "running"}, {"state": "running"}, {"state": "succeeded"}]
    response = await harness.submit(script, submit={"cancel": "ignored"})
    job, operation = (await response.json())["id"], response.headers["Statusgate-Operation"]
    assert (await harness.poll_when_due(job)).status == 200
    cancelled = await act(harness, operation, "cancel", {"reason": "not needed"})
    assert cancelled.status == 200, await cancelled.text()
    record = (await cancelled.json())["record"]
    assert record["outcome"] == "pending" and record["cancel_requested_at"] is not None
    assert record["max_status_requests"] == record["status_requests_used"] + 5
    again = await act(harness, operation, "cancel", {"reason": "twice"})
    assert again.status == 409  # one cancel request per operation
    running = await harness.poll_when_due(job)
    assert (await running.json())["state"] == "running"
    assert running.headers["Statusgate-Outcome"] == "pending"
    done = await harness.poll_when_due(job)
    assert done.headers["Statusgate-Outcome"] == "succeeded"
    assert (await done.json())["state"] == "succeeded"
    assert len([c for c in harness.provider.log if c["path"].endswith("/cancel")]) == 1


async def test_resume_compares_with_what_was_in_force_at_the_escalation(
    make_harness: Any,
) -> None:
    """Issue 9.2: a resume with the credential that was refused is refused; after the fix
    it is accepted, even though the credential at submit was the same as the fixed one."""
    broken = {"demo-jobs": {"credential": {"value": "Bearer wrong-key"}}}
    good = await make_harness()
    response = await good.submit([{"state": "running"}])
    job, operation = (await response.json())["id"], response.headers["Statusgate-Operation"]
    bad = await make_harness(policy_changes=broken, store=good.client.app[RUNTIME].store)
    denied = await bad.poll_when_due(job)
    assert (await denied.json())["reason"] == "authorization_denied"
    refused = await act(bad, operation, "resume")
    assert refused.status == 409
    assert "credential has not changed" in (await refused.json())["detail"]
    fixed = await make_harness(store=good.client.app[RUNTIME].store)
    assert (await act(fixed, operation, "resume")).status == 200
    assert (await fixed.poll_when_due(job)).status == 200


async def _started(harness: Harness, key: str, token: str = AGENT_TOKEN) -> str:
    harness.clock.advance(1)
    response = await harness.submit([{"state": "running"}], key=key, token=token)
    assert response.status == 202, await response.text()
    return str(response.headers["Statusgate-Operation"])


async def _page(harness: Harness, query: str) -> dict[str, Any]:
    response = await harness.client.get(f"/admin/operations?{query}", headers=OPS)
    assert response.status == 200, await response.text()
    body: dict[str, Any] = await response.json()
    return body


async def test_operations_page_by_cursor_and_new_operations_never_disturb_paging(
    harness: Harness,
) -> None:
    """Pages newest first with an opaque next_cursor (null on the last page); operations
    started between pages appear on no later page and shift nothing; filters hold across
    pages."""
    made = [await _started(harness, f"k{n}") for n in range(5)]
    other = await _started(harness, "b1", token=OTHER_TOKEN)
    first = await _page(harness, "limit=2")
    assert [o["operation_id"] for o in first["operations"]] == [other, made[4]]
    seen = [o["operation_id"] for o in first["operations"]]
    cursor = first["next_cursor"]
    new: list[str] = []
    while cursor is not None:
        new.append(await _started(harness, f"new-{len(seen)}"))  # newer than any listed
        page = await _page(harness, f"limit=2&cursor={cursor}")
        seen += [o["operation_id"] for o in page["operations"]]
        cursor = page["next_cursor"]
    assert seen == [other, *reversed(made)]
    only = "account=team-a&outcome=pending&provider=demo-jobs&limit=4"
    mine = await _page(harness, only)
    assert len(mine["operations"]) == 4 and mine["next_cursor"] is not None
    rest = await _page(harness, f"{only}&cursor={mine['next_cursor']}")
    assert rest["next_cursor"] is None
    listed = [o["operation_id"] for o in mine["operations"] + rest["operations"]]
    assert len(new) == 2
    assert listed == [*reversed(new), *reversed(made)]
    everything = await _page(harness, "limit=500")
    assert everything["next_cursor"] is None and len(everything["operations"]) == 8


async def test_bad_limits_and_cursors_are_invalid_requests(harness: Harness) -> None:
    """A limit outside 1..500 or a cursor the API did not hand out is a 400 problem, never
    a 500."""
    import base64

    def encoded(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    cursors = [
        "x",
        "%%%",
        encoded(b"[1]"),
        encoded(b'{"a": 1, "b": 2}'),
        encoded(b'["1.5", "op"]'),
        encoded(b'[true, "op"]'),
        encoded(b'[1e999, "op"]'),
        encoded(b'[NaN, "op"]'),
        encoded(b"[" + b"9" * 400 + b', "op"]'),
        encoded(b"[1.5, 7]"),
        encoded(b"[" * 5000),
        "A" * 600,
    ]
    queries = [f"cursor={c}" for c in cursors] + ["limit=0", "limit=-1", "limit=501", "limit=x"]
    for query in queries:
        response = await harness.client.get(f"/admin/operations?{query}", headers=OPS)
        assert response.status == 400, query
        assert (await response.json())["type"] == "/problems/invalid-request"
    refused = await harness.client.get("/admin/escalations?limit=0", headers=OPS)
    assert refused.status == 400


async def test_escalation_queue_is_oldest_first_with_age_and_message(harness: Harness) -> None:
    """GET /admin/escalations lists escalated operations only, oldest escalation first,
    with reason, age by the gateway's clock, permitted actions and the message; agents are
    refused."""
    _, first = await escalate_budget(harness, "k1")
    _, second = await escalate_budget(harness, "k2")
    await _started(harness, "k3")  # pending: not in the queue
    harness.clock.advance(60)
    response = await harness.client.get("/admin/escalations", headers=OPS)
    body = await response.json()
    assert [e["operation_id"] for e in body["escalations"]] == [first, second]
    assert body["total"] == 2
    oldest = body["escalations"][0]
    assert oldest["reason"] == "deadline_exceeded"
    assert oldest["age_seconds"] == 601 + 1 + 60
    assert oldest["permitted_actions"] == ["extend", "cancel_at_provider", "abandon"]
    assert oldest["message"].startswith("External job needs a decision")
    assert (oldest["provider"], oldest["account"]) == ("demo-jobs", "team-a")
    limited = await harness.client.get("/admin/escalations?limit=1", headers=OPS)
    assert [e["operation_id"] for e in (await limited.json())["escalations"]] == [first]
    agent = {"Authorization": f"Bearer {AGENT_TOKEN}"}
    assert (await harness.client.get("/admin/escalations", headers=agent)).status == 403
    assert (await harness.client.get("/admin/escalations")).status == 401


async def test_show_tells_what_extension_is_left(harness: Harness) -> None:
    """The show endpoint's extension_left is the policy's max_extension less what was
    used, and null once it is spent."""
    _, operation = await escalate_budget(harness)
    shown = await (await harness.client.get(f"/admin/operations/{operation}", headers=OPS)).json()
    assert shown["extension_left"] == {
        "time": "30m",
        "seconds": 1800,
        "requests": 8,
        "max_time": "30m",
        "max_requests": 8,
    }
    assert (await act(harness, operation, "extend", {"time": "5m", "requests": 2})).status == 200
    shown = await (await harness.client.get(f"/admin/operations/{operation}", headers=OPS)).json()
    assert (shown["extension_left"]["time"], shown["extension_left"]["requests"]) == ("25m", 6)
    _, spent = await escalate_budget(harness, "key-2")
    assert (await act(harness, spent, "extend", {"time": "30m", "requests": 8})).status == 200
    shown = await (await harness.client.get(f"/admin/operations/{spent}", headers=OPS)).json()
    assert shown["extension_left"] is None


async def test_after_extend_the_gateway_polls_once_by_itself(harness: Harness) -> None:
    """SPEC 20: an extend makes the gateway poll the provider once at the next permitted
    instant, spending one request of the new budget, with the usual audit line; an agent
    last told 409 then reads the new state without a provider call of its own."""
    job, operation = await escalate_budget(harness)
    before = len(harness.provider_calls(job))
    assert (await act(harness, operation, "extend", {"time": "5m"})).status == 200
    await background(harness)
    assert len(harness.provider_calls(job)) == before + 1
    record = await harness.record(job)
    assert record.outcome == "pending" and record.last_known_state == "running"
    polled = [line for line in harness.audit_lines() if line["event"] == "polled"]
    assert polled[-1]["actor"] == "gateway"
    answer = await harness.poll(job)
    assert answer.headers["Statusgate-Provider-State"] == "running"
    assert len(harness.provider_calls(job)) == before + 1


async def test_resume_is_offered_only_once_the_policy_changed(harness: Harness) -> None:
    """SPEC 20: an action that can only be refused is not offered: an unknown_state
    escalation offers abandon alone until the policy changes, then resume too."""
    runtime = harness.client.app[RUNTIME]
    record = pending_record()
    policy = runtime.settings.policies[record.provider]
    escalated = decide.escalate(policy, record, Reason.UNKNOWN_STATE, 0.0, "state 'odd'").record
    members = problem_members(escalated, policy)
    assert members["permitted_actions"] == ["abandon"]
    assert "resume" not in message(escalated, policy)
    polling = policy.polling.model_copy(update={"max_delay": policy.polling.max_delay + 1})
    changed = policy.model_copy(update={"polling": polling})
    assert problem_members(escalated, changed)["permitted_actions"] == ["resume", "abandon"]


async def test_a_malformed_audit_line_is_skipped_and_said_not_a_500(harness: Harness) -> None:
    """Lines of the operation in the audit file that cannot be told (a seq that is not a
    number, missing fields, a field of the wrong type, broken JSON) are left out of the
    story and counted in its note; the operation's view still answers 200."""
    _, operation = await escalate_budget(harness)
    good = await (await harness.client.get(f"/admin/operations/{operation}", headers=OPS)).json()
    assert good["story_note"] is None
    bad = [
        {"seq": "x", "at": "2026-12-01T10:00:00.000Z", "operation_id": operation, "event": "x"},
        {"operation_id": operation},
        {"seq": 999, "at": 5, "operation_id": operation, "event": "polled", "http_status": "x"},
    ]
    with harness.audit_path.open("a") as handle:
        handle.writelines(json.dumps(line) + "\n" for line in bad)
        handle.write(f'{{"operation_id": "{operation}", "seq": \n')
    shown = await harness.client.get(f"/admin/operations/{operation}", headers=OPS)
    assert shown.status == 200, await shown.text()
    body = await shown.json()
    assert body["story"] == good["story"]
    assert body["story_note"] == "4 lines unreadable (left out)"
