"""The decision rules of SPEC section 4, on the pure core: no server, no clock, no sleep."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core import decide
from gateway.core.decide import Reply
from gateway.core.models import (
    Failure,
    LastAnswer,
    OperationRecord,
    Outcome,
    ProviderAnswer,
    Reason,
)
from gateway.settings.policy import ProviderPolicy, load_policy

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0


@pytest.fixture(scope="module")
def policy() -> ProviderPolicy:
    return load_policy(ROOT / "policies/demo-jobs.yaml", "demo-jobs.yaml", {"DEMO_API_KEY": "k"})


def opened(
    policy: ProviderPolicy, body: bytes = b'{"id": "j", "state": "queued"}'
) -> OperationRecord:
    decision = decide.open_operation(
        policy,
        operation_id="op_1",
        account="team-a",
        job_id="j",
        fingerprint="f",
        idempotency_key="k",
        answer=ProviderAnswer(202, body, "application/json"),
        now=NOW,
        u=1.0,
    )
    return decision.record


def test_first_poll_uses_attempt_zero_backoff(policy: ProviderPolicy) -> None:
    """The submit answer schedules the first poll at base_delay x jitter draw."""
    record = opened(policy)
    assert record.next_poll_at == NOW + 1.0
    assert record.last_known_state == "queued"
    assert record.deadline_at == NOW + 600


def test_submit_guidance_sets_the_first_poll(policy: ProviderPolicy) -> None:
    """A poll hint in the submit answer sets the first permitted poll and its source."""
    record = opened(policy, b'{"id": "j", "state": "queued", "poll_after_seconds": 12}')
    assert record.next_poll_at == NOW + 12
    assert record.delay_source == "provider_poll_hint"


def test_admit_checks_in_spec_order(policy: ProviderPolicy) -> None:
    """Terminal, escalated, deadline, budget, then too-early, then forward."""
    record = opened(policy)
    assert decide.admit(policy, record, NOW).problem == "too-early"
    assert decide.admit(policy, record, NOW + 1).forward
    spent = record.evolve(status_requests_used=12)
    assert (
        decide.admit(policy, spent, NOW).record.escalation.reason == Reason.REQUEST_BUDGET_EXHAUSTED
    )  # type: ignore[union-attr]
    late = spent.evolve(deadline_at=NOW)
    assert decide.admit(policy, late, NOW).record.escalation.reason == Reason.DEADLINE_EXCEEDED  # type: ignore[union-attr]
    escalated = decide.admit(policy, late, NOW).record
    assert decide.admit(policy, escalated, NOW).problem == "operation-escalated"
    assert not decide.admit(policy, escalated, NOW).changed
    done = record.evolve(outcome=Outcome.SUCCEEDED)
    assert decide.admit(policy, done.evolve(deadline_at=NOW), NOW).reply is Reply.FINAL


def test_reserve_spends_before_sending_and_folds_refusals(policy: ProviderPolicy) -> None:
    """Reserving a poll spends one status request before sending and folds the early refusals
    into the record."""
    record = decide.reserve(opened(policy), NOW + 2, refusals=5)
    assert record.status_requests_used == 1
    assert record.early_refusals == 5
    assert record.last_polled_at == NOW + 2


def test_transport_failures_count_and_escalate_past_the_maximum(policy: ProviderPolicy) -> None:
    """Transport failures are counted one by one and escalate provider_failure past
    max_transport_failures."""
    record = opened(policy)
    for i in range(3):
        decision = decide.classify(
            policy, record, ProviderAnswer(None, failure=Failure.TIMEOUT), NOW, 0.5
        )
        assert decision.problem == "provider-timeout"
        record = decision.record
        assert record.transport_failures_used == i + 1
    decision = decide.classify(policy, record, ProviderAnswer(502), NOW, 0.5)
    assert decision.record.outcome is Outcome.ESCALATED
    assert decision.record.escalation.reason is Reason.PROVIDER_FAILURE  # type: ignore[union-attr]


def test_unexpected_status_is_an_integration_failure(policy: ProviderPolicy) -> None:
    """A status code the rules do not expect escalates integration_failure."""
    for status in (301, 400, 409, 410, 422):
        decision = decide.classify(policy, opened(policy), ProviderAnswer(status), NOW, 0.5)
        assert decision.record.escalation.reason is Reason.INTEGRATION_FAILURE  # type: ignore[union-attr]


def test_hint_rejected_is_recorded_on_the_plan(policy: ProviderPolicy) -> None:
    """A junk poll hint is rejected, noted on the plan, and local backoff is used instead."""
    body = b'{"state": "running", "poll_after_seconds": -3}'
    decision = decide.classify(policy, opened(policy), ProviderAnswer(200, body), NOW, 1.0)
    assert decision.plan is not None and decision.plan.hint_rejected
    assert decision.record.delay_source == "local_backoff"


ANSWERS = st.one_of(
    st.sampled_from(
        [
            ProviderAnswer(200, b'{"state": "running"}'),
            ProviderAnswer(200, b'{"state": "queued", "poll_after_seconds": 0}'),
            ProviderAnswer(200, b'{"state": "running", "poll_after_seconds": 7.5}'),
            ProviderAnswer(200, b'{"state": "succeeded", "result": 1}'),
            ProviderAnswer(200, b'{"state": "succeeded"}'),
            ProviderAnswer(200, b'{"state": "failed"}'),
            ProviderAnswer(200, b'{"state": "mystery"}'),
            ProviderAnswer(200, b"not json"),
            ProviderAnswer(404),
            ProviderAnswer(401),
            ProviderAnswer(500),
            ProviderAnswer(None, failure=Failure.CONNECTION),
            ProviderAnswer(None, failure=Failure.TIMEOUT),
        ]
    ),
    st.builds(
        lambda ra: ProviderAnswer(429, retry_after=ra), st.sampled_from(["0", "3", "x", None])
    ),
    st.builds(lambda ra: ProviderAnswer(503, retry_after=ra), st.sampled_from(["1", "30", "-1"])),
)


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.floats(min_value=0, max_value=90), ANSWERS, st.floats(0, 1, exclude_max=True)),
        max_size=60,
    )
)
def test_no_call_early_late_or_over_budget(policy: ProviderPolicy, events: list) -> None:  # type: ignore[type-arg]
    """Over random answers and call times: the provider is never asked before next_poll_at,
    at or after the deadline, or beyond max_status_requests; terminal outcomes never change;
    counters never decrease."""
    record = opened(policy)
    now = NOW
    sent = 0
    for gap, answer, u in events:
        now += gap
        before = record
        decision = decide.admit(policy, record, now)
        if decision.forward:
            assert now >= before.next_poll_at
            assert now < before.deadline_at
            assert before.status_requests_used < before.max_status_requests
            sent += 1
            record = decide.reserve(record, now)
            record = decide.classify(policy, record, answer, now, u).record
        elif decision.changed:
            record = decision.record
        if before.outcome is not Outcome.PENDING:
            assert record.outcome is before.outcome
            assert record.final_response == before.final_response
        for counter in (
            "status_requests_used",
            "transport_failures_used",
            "rate_limited_used",
        ):
            assert getattr(record, counter) >= getattr(before, counter)
    assert sent == record.status_requests_used <= policy.polling.max_status_requests


def test_a_reservation_is_in_flight_until_its_answer_is_recorded(policy: ProviderPolicy) -> None:
    """Issue 9.15: reserving marks the request in flight; any recorded answer clears it; a
    reservation found still in flight under the lease was cut short, and says when."""
    record = opened(policy).evolve(next_poll_at=NOW)
    taken = decide.take(policy, record, NOW)
    assert taken.forward and taken.record.inflight_at == NOW and taken.cut_at is None
    answered = decide.classify(
        policy, taken.record, ProviderAnswer(200, b'{"state": "running"}'), NOW + 1, 1.0
    )
    assert answered.record.inflight_at is None
    again = decide.take(policy, taken.record.evolve(next_poll_at=NOW + 5), NOW + 5)
    assert again.cut_at == NOW and again.record.inflight_at == NOW + 5
    early = decide.take(policy, taken.record.evolve(next_poll_at=NOW + 50), NOW + 5)
    assert early.problem == "too-early" and early.changed and early.cut_at == NOW
    assert early.record.inflight_at is None
    recovered = decide.recover(taken.record)
    assert recovered is not None and recovered.cut_at == NOW
    assert recovered.record.inflight_at is None
    assert decide.recover(answered.record) is None


def test_overdue_escalates_only_pending_operations_past_their_deadline(
    policy: ProviderPolicy,
) -> None:
    """Issue 9.10: the sweeper's rule: nothing before the deadline, deadline_exceeded at it."""
    record = opened(policy)
    assert decide.overdue(policy, record, record.deadline_at - 0.001) is None
    decision = decide.overdue(policy, record, record.deadline_at)
    assert decision is not None and decision.changed
    assert decision.record.escalation is not None
    assert decision.record.escalation.reason is Reason.DEADLINE_EXCEEDED
    assert decide.overdue(policy, decision.record, record.deadline_at + 1) is None


def test_a_provider_pause_escalates_only_when_it_outlasts_the_deadline(
    policy: ProviderPolicy,
) -> None:
    """Issue 9.14: a pause ending before deadline - final_poll_margin is too-early; one
    ending after it is deadline_exceeded now."""
    record = opened(policy).evolve(next_poll_at=NOW)
    room = record.deadline_at - policy.polling.final_poll_margin - NOW
    short = decide.paused(policy, record, NOW, room)
    assert short.problem == "too-early" and short.retry_after == room and not short.changed
    long = decide.paused(policy, record, NOW, room + 0.01)
    assert long.problem == "operation-escalated"
    assert long.record.escalation is not None
    assert long.record.escalation.reason is Reason.DEADLINE_EXCEEDED


def test_escalations_record_the_fingerprints_in_force(policy: ProviderPolicy) -> None:
    """Issue 9.2: resume compares with what the escalation saw, not with the submit."""
    record = opened(policy).evolve(credential_fingerprint="old", policy_fingerprint="old")
    escalated = decide.escalate(policy, record, Reason.AUTHORIZATION_DENIED, NOW, "401")
    escalation = escalated.record.escalation
    assert escalation is not None
    assert escalation.credential_fingerprint == policy.credential_fingerprint
    assert escalation.policy_fingerprint == policy.fingerprint
    restored = OperationRecord.from_dict(escalated.record.to_dict())
    assert restored == escalated.record


def test_which_early_calls_are_held(policy: ProviderPolicy) -> None:
    """``holds_early``: under hold, a too-early call within max_hold; under replay, only
    while nothing was polled yet (nothing to replay); never past max_hold or under refuse."""
    record = opened(policy)
    early = decide.admit(policy, record, NOW)
    assert early.problem == "too-early" and early.retry_after == 1.0

    def with_mode(mode: str, max_hold: str = "60s") -> ProviderPolicy:
        polling = policy.polling.model_copy(update={"early_calls": mode})
        polling = polling.model_copy(update={"max_hold": float(max_hold.rstrip("s"))})
        return policy.model_copy(update={"polling": polling})

    assert decide.holds_early(with_mode("hold"), early)
    assert decide.holds_early(with_mode("replay"), early)
    assert not decide.holds_early(with_mode("refuse"), early)
    assert not decide.holds_early(with_mode("hold", "0.5s"), early)
    polled = early.evolve(record=record.evolve(status_requests_used=1))
    assert decide.holds_early(with_mode("hold"), polled)
    assert not decide.holds_early(with_mode("replay"), polled)  # after a failed poll: 429


def test_an_agents_cancel_goes_once(policy: ProviderPolicy) -> None:
    """``cancel_call``: forwarded while pending with no cancel accepted; afterwards answered
    from the record (202, or the last answer replayed), final answers and escalations as
    for a status call."""
    record = opened(policy)
    assert decide.cancel_call(record, NOW).forward
    asked = record.evolve(cancel_requested_at=NOW, next_poll_at=NOW + 3)
    accepted = decide.cancel_call(asked, NOW + 1)
    assert not accepted.forward and accepted.reply is Reply.CANCEL_ACCEPTED
    assert accepted.retry_after == 2.0
    kept = asked.evolve(last_answer=LastAnswer(200, "application/json", b"{}", NOW))
    assert decide.cancel_call(kept, NOW + 1).reply is Reply.REPLAY
    assert decide.cancel_call(asked.evolve(outcome=Outcome.CANCELLED), NOW).reply is Reply.FINAL
    escalated = decide.escalate(policy, asked, Reason.DEADLINE_EXCEEDED, NOW, "late").record
    assert decide.cancel_call(escalated, NOW).problem == "operation-escalated"
