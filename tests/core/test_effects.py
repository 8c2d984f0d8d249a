"""Effects as data (gateway/core/effects.py): what a step writes to the audit log, which
metrics it changes and which webhook notices it sends, built by pure functions from the
decisions of the core; nothing here runs a server, a clock or a store."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.core import decide, effects
from gateway.core.decide import Decision
from gateway.core.effects import Count, Line, Notice
from gateway.core.models import Event, OperationRecord, Outcome, ProviderAnswer, Reason
from gateway.observe.metrics import Metrics
from gateway.settings.policy import ProviderPolicy, load_policy

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0
JSON = "application/json"


@pytest.fixture(scope="module")
def policy() -> ProviderPolicy:
    return load_policy(ROOT / "policies/demo-jobs.yaml", "demo-jobs.yaml", {"DEMO_API_KEY": "k"})


def opened(policy: ProviderPolicy) -> OperationRecord:
    answer = ProviderAnswer(202, b'{"id": "j", "state": "queued"}', JSON)
    return decide.open_operation(
        policy,
        operation_id="op_1",
        account="team-a",
        job_id="j",
        fingerprint="f",
        idempotency_key="k",
        answer=answer,
        now=NOW,
        u=1.0,
    ).record


def answered(policy: ProviderPolicy, answer: ProviderAnswer, at: float = NOW + 2) -> Decision:
    """The decision about ``answer`` to the first poll, reserved when it was due."""
    reserved = decide.take(policy, opened(policy), at)
    assert reserved.forward
    return decide.classify(policy, reserved.record, answer, at + 0.1, 0.5)


def lines(found: effects.Effects) -> list[dict[str, object]]:
    return [dict(effect.fields) for effect in found if isinstance(effect, Line)]


def counts(found: effects.Effects) -> list[Count]:
    return [effect for effect in found if isinstance(effect, Count)]


def notices(found: effects.Effects) -> list[Notice]:
    return [effect for effect in found if isinstance(effect, Notice)]


def test_a_pending_answer_is_one_polled_line_and_its_guidance_count(
    policy: ProviderPolicy,
) -> None:
    """A pending answer with a Retry-After: one ``polled`` line saying the state, the next
    poll and where its delay came from, one ``provider_guidance`` count, no notice."""
    answer = ProviderAnswer(200, b'{"id": "j", "state": "running"}', JSON, retry_after="7")
    decision = answered(policy, answer)
    found = effects.of_decision(policy, decision, NOW + 3, http_status=200, detail="d")
    [line] = lines(found)
    assert line["event"] == "polled" and line["decision"] == "pending"
    assert line["provider_state"] == "running" and line["http_status"] == 200
    assert line["delay_source"] == "provider_retry_after" and line["next_poll_at"] is not None
    assert line["requests_used"] == 1 and line["account"] == "team-a"
    assert line["at"] == effects.iso(NOW + 3) and line["actor"] == "gateway"
    assert counts(found) == [Count("provider_guidance", ("demo-jobs", "provider_retry_after"))]
    assert notices(found) == []


def test_an_ending_answer_counts_the_outcome_and_the_requests_it_took(
    policy: ProviderPolicy,
) -> None:
    """A terminal answer: a ``finished`` line without a next poll, the finished count by
    outcome and one observation of the requests the operation used."""
    answer = ProviderAnswer(200, b'{"id": "j", "state": "succeeded", "result": 1}', JSON)
    decision = answered(policy, answer)
    assert decision.record.outcome is Outcome.SUCCEEDED
    found = effects.of_decision(policy, decision, NOW + 3, http_status=200)
    [line] = lines(found)
    assert line["event"] == "finished" and line["decision"] == "succeeded"
    assert line["next_poll_at"] is None and line["delay_source"] is None
    assert counts(found) == [
        Count("operations_finished", ("demo-jobs", "succeeded")),
        Count("requests_per_operation", ("demo-jobs",), 1.0, observe=True),
    ]
    assert notices(found) == []


def test_an_escalation_is_a_line_a_count_and_a_notice(policy: ProviderPolicy) -> None:
    """An answer the state table does not know escalates: the ``escalated`` line carries
    the reason and the escalation's own detail, the escalations count names the reason,
    and the ``operation.escalated`` notice goes to the webhook."""
    answer = ProviderAnswer(200, b'{"id": "j", "state": "bogus"}', JSON)
    decision = answered(policy, answer)
    found = effects.of_decision(policy, decision, NOW + 3, http_status=200)
    [line] = lines(found)
    assert decision.record.escalation is not None
    assert line["event"] == "escalated" and line["reason"] == "unknown_state"
    assert line["detail"] == decision.record.escalation.detail
    assert counts(found) == [Count("escalations", ("demo-jobs", "unknown_state"))]
    [notice] = notices(found)
    assert notice.kind == "operation.escalated" and notice.record == decision.record
    body = effects.notice_body(notice, "msg_1", NOW + 4)
    assert body["type"] == "operation.escalated" and body["id"] == "msg_1"
    assert body["reason"] == "unknown_state" and body["operation_id"] == "op_1"
    assert body["timestamp"] == effects.iso(NOW + 4)


def test_a_decision_without_an_event_has_no_effects(policy: ProviderPolicy) -> None:
    """An answer from the record (here: the final answer of an ended job) writes, counts
    and notifies nothing: its refusals are folded elsewhere."""
    record = opened(policy).evolve(outcome=Outcome.SUCCEEDED)
    decision = decide.admit(policy, record, NOW)
    assert decision.event is None
    assert effects.of_decision(policy, decision, NOW) == effects.NONE


def test_an_operators_action_notifies_and_an_agents_cancel_does_not(
    policy: ProviderPolicy,
) -> None:
    """An operator's cancel: a ``cancelled`` line with the operator as actor and an
    ``operation.decided`` notice naming the action; an agent's own cancel: one
    ``cancel_requested`` line with ``account:<id>`` as actor, no notice, no count, and a
    refused one says why."""
    record = opened(policy).evolve(cancel_requested_at=NOW + 5)
    by_operator = effects.of_action(
        policy, record, Event.CANCELLED, NOW + 5, actor="alice", detail="why", http_status=200
    )
    [line] = lines(by_operator)
    assert line["event"] == "cancelled" and line["actor"] == "alice"
    [notice] = notices(by_operator)
    assert notice.kind == "operation.decided"
    assert dict(notice.extra) == {"action": "cancel", "actor": "alice", "detail": "why"}
    by_agent = effects.of_agent_cancel(
        policy, record, "team-a", NOW + 5, http_status=200, accepted="accepted", refusal=None
    )
    [line] = lines(by_agent)
    assert line["event"] == "cancel_requested" and line["actor"] == "account:team-a"
    assert line["detail"] == "accepted" and line["account"] == "team-a"
    assert len(by_agent) == 1
    refused = effects.of_agent_cancel(
        policy, record, "team-a", NOW + 5, http_status=409, accepted=None, refusal="HTTP 409"
    )
    assert lines(refused)[0]["detail"] == "not accepted: HTTP 409"


def test_refusals_hold_and_delivery_effects(policy: ProviderPolicy) -> None:
    """A closed window of early calls is one ``refused`` line with its count and window; a
    hold past its bound is one count by bound; a webhook delivery is counted by result
    word and has a ``notified`` line."""
    record = opened(policy)
    [line] = lines(effects.of_refusals(record, 4, NOW + 0.1, NOW + 1, NOW + 1.5))
    assert line["event"] == "refused" and line["decision"] == "too-early"
    assert line["count"] == 4 and line["next_poll_at"] == effects.iso(NOW + 1)
    assert line["detail"] == f"first at {effects.iso(NOW + 0.1)}"
    assert effects.of_hold_declined("demo-jobs", "account") == (
        Count("holds_declined", ("demo-jobs", "account")),
    )
    notice = {"operation_id": "op_1", "provider": "demo-jobs", "account": "team-a", "reason": None}
    for outcome, word in [
        ("delivered (HTTP 204)", "delivered"),
        ("dropped, not delivered: shutdown", "dropped"),
        ("HTTP 500 after 4 attempts", "failed"),
    ]:
        found = effects.of_delivery(notice, outcome, NOW)
        assert counts(found) == [Count("webhook_deliveries", (word,))]
        assert lines(found)[0]["event"] == "notified" and lines(found)[0]["detail"] == outcome


def test_every_count_names_a_metric_with_its_labels(policy: ProviderPolicy) -> None:
    """Every metric change the builders return names a collector of observe/metrics.py
    with as many label values as it has labels, so carrying it out cannot fail."""
    record = opened(policy)
    escalated = decide.escalate(policy, record, Reason.DEADLINE_EXCEEDED, NOW, "late")
    found: effects.Effects = (
        *effects.of_decision(policy, escalated, NOW),
        *effects.of_decision(
            policy,
            answered(policy, ProviderAnswer(200, b'{"state": "running"}', JSON, retry_after="7")),
            NOW,
        ),
        *effects.of_decision(
            policy,
            answered(policy, ProviderAnswer(200, b'{"state": "failed"}', JSON)),
            NOW,
        ),
        *effects.of_action(
            policy, record, Event.ABANDONED, NOW, actor="alice", detail=None, http_status=None
        ),
        *effects.of_hold_declined("demo-jobs", "total"),
        *effects.of_delivery(
            {"operation_id": None, "provider": "p", "account": "a", "reason": None},
            "delivered",
            NOW,
        ),
    )
    metrics = Metrics()
    names = {count.metric for count in counts(found)}
    assert names == {
        "escalations",
        "provider_guidance",
        "operations_finished",
        "requests_per_operation",
        "holds_declined",
        "webhook_deliveries",
    }
    for count in counts(found):
        if count.observe:
            metrics.histogram(count.metric, *count.labels).observe(count.value)
        else:
            metrics.counter(count.metric, *count.labels).inc(count.value)
