"""Operator decisions on an operation (SPEC section 6), as pure functions.

Each takes the freshest record and returns either the record to store next or a refusal
that names the rule or the limit. Only the actions an escalation reason permits are ever
allowed, and extensions stay within the policy's ``escalation.max_extension`` in total.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.models import DelaySource, Event, OperationRecord, Outcome, ProviderAnswer, Reason
from gateway.settings.policy import ProviderPolicy
from gateway.settings.units import format_duration


@dataclass(frozen=True, slots=True)
class ActionResult:
    """What an action does: a new record and its audit event, or a refusal."""

    record: OperationRecord | None
    event: Event
    refusal: str | None = None
    detail: str | None = None


def _refuse(event: Event, why: str) -> ActionResult:
    return ActionResult(None, event, refusal=why)


def _permits(policy: ProviderPolicy, record: OperationRecord, action: str) -> str | None:
    """None if ``action`` is permitted now, else why not. The refusal names the actions
    the escalation answer offers (``offered``), not every one its reason permits: resume
    before the policy changed is not one of them. ``offered`` asks this function only
    about permitted actions, which never reach the refusal, so the two do not loop."""
    if record.outcome is Outcome.PENDING and action in ("abandon", "cancel_at_provider"):
        return None
    escalation = record.escalation
    if record.outcome is not Outcome.ESCALATED or escalation is None:
        return f"the operation is {record.outcome.value}, not escalated"
    if action not in escalation.permitted_actions:
        allowed = ", ".join(offered(policy, record)) or "none"
        return f"{action} is not permitted for {escalation.reason.value} (permitted now: {allowed})"
    return None


def extend(
    policy: ProviderPolicy,
    record: OperationRecord,
    now: float,
    *,
    seconds: float,
    requests: int,
    reason: str,
) -> ActionResult:
    """More time and requests, within max_extension in total; waiting resumes at once."""
    why = _permits(policy, record, "extend")
    if why is not None:
        return _refuse(Event.EXTENDED, why)
    bound = policy.escalation.max_extension
    if seconds < 0 or requests < 0 or (seconds == 0 and requests == 0):
        return _refuse(Event.EXTENDED, "an extension needs a positive time or number of requests")
    time_left = bound.time - record.extended_seconds
    requests_left = bound.requests - record.extended_requests
    if seconds > time_left or requests > requests_left:
        return _refuse(
            Event.EXTENDED,
            f"over the policy's escalation.max_extension of {format_duration(bound.time)} and "
            f"{bound.requests} requests in total ({_left(time_left)} and "
            f"{max(0, requests_left)} requests left)",
        )
    deadline = max(record.deadline_at, now) + seconds
    budget = max(record.max_status_requests, record.status_requests_used) + requests
    if deadline <= now:
        return _refuse(Event.EXTENDED, "the deadline has passed: extend by a positive time")
    if budget <= record.status_requests_used:
        return _refuse(Event.EXTENDED, "the request budget is spent: add requests")
    polling = policy.polling
    new = record.evolve(
        outcome=Outcome.PENDING,
        escalation=None,
        ended_at=None,
        deadline_at=deadline,
        max_status_requests=budget,
        max_transport_failures=record.transport_failures_used + polling.max_transport_failures,
        max_rate_limited=record.rate_limited_used + polling.max_rate_limited,
        next_poll_at=now,
        delay_source=DelaySource.MANUAL_EXTENSION,
        extended_seconds=record.extended_seconds + seconds,
        extended_requests=record.extended_requests + requests,
    )
    detail = f"+{format_duration(seconds) if seconds else '0s'}, +{requests} requests"
    return ActionResult(new, Event.EXTENDED, detail=f"{detail}: {reason}" if reason else detail)


def _left(seconds: float) -> str:
    return format_duration(seconds) if seconds > 0 else "0s"


def resume(policy: ProviderPolicy, record: OperationRecord, now: float) -> ActionResult:
    """Waiting resumes only after what caused the escalation changed: the live credential
    or policy is compared with the one in force when the escalation happened (SPEC 12)."""
    why = _permits(policy, record, "resume")
    if why is not None:
        return _refuse(Event.RESUMED, why)
    unchanged = _unchanged(policy, record)
    if unchanged is not None:
        return _refuse(Event.RESUMED, unchanged)
    new = record.evolve(
        outcome=Outcome.PENDING,
        escalation=None,
        ended_at=None,
        policy_fingerprint=policy.fingerprint,
        credential_fingerprint=policy.credential_fingerprint,
        next_poll_at=now,
        delay_source=DelaySource.LOCAL_BACKOFF,
    )
    return ActionResult(new, Event.RESUMED)


def _unchanged(policy: ProviderPolicy, record: OperationRecord) -> str | None:
    """Why resuming would meet the same cause again (None when what caused the escalation
    changed): the credential for authorization_denied, the policy otherwise."""
    escalation = record.escalation
    assert escalation is not None
    if escalation.reason is Reason.AUTHORIZATION_DENIED:
        then = escalation.credential_fingerprint or record.credential_fingerprint
        if policy.credential_fingerprint == then:
            return "the provider credential has not changed since"
    elif policy.fingerprint == (escalation.policy_fingerprint or record.policy_fingerprint):
        return "the provider's policy has not changed since"
    return None


def offered(policy: ProviderPolicy, record: OperationRecord) -> tuple[str, ...]:
    """The actions worth offering now (SPEC 13, 20): those the escalation permits that can
    succeed under the live policy. ``resume`` waits until the credential or the policy
    changed; ``extend`` needs max_extension left; ``cancel_at_provider`` a cancel route and
    no cancel accepted yet."""
    escalation = record.escalation
    if record.outcome is not Outcome.ESCALATED or escalation is None:
        return ()
    possible = {
        "resume": lambda: _unchanged(policy, record) is None,
        "extend": lambda: _extension_room(policy, record),
        "cancel_at_provider": lambda: may_cancel(policy, record) is None,
    }
    return tuple(a for a in escalation.permitted_actions if possible.get(a, lambda: True)())


def _extension_room(policy: ProviderPolicy, record: OperationRecord) -> bool:
    bound = policy.escalation.max_extension
    return bound.time > record.extended_seconds and bound.requests > record.extended_requests


def abandon(
    policy: ProviderPolicy, record: OperationRecord, now: float, reason: str
) -> ActionResult:
    """Stop waiting for good; status calls answer operation-escalated from now on."""
    why = _permits(policy, record, "abandon")
    if why is not None:
        return _refuse(Event.ABANDONED, why)
    abandoned = record.evolve(outcome=Outcome.ABANDONED, ended_at=now)
    return ActionResult(abandoned, Event.ABANDONED, detail=reason or None)


def may_cancel(policy: ProviderPolicy, record: OperationRecord) -> str | None:
    """None if an operator may ask the provider to cancel now, else why not."""
    if policy.routes.cancel is None:
        return "the policy declares no cancel route for this provider"
    if record.cancel_requested_at is not None:
        return "the provider already accepted a cancel request for this job"
    return _permits(policy, record, "cancel_at_provider")


def cancelled(
    policy: ProviderPolicy,
    record: OperationRecord,
    answer: ProviderAnswer,
    reason: str,
    now: float,
) -> ActionResult:
    """The provider accepting a cancel request is not the job's outcome (SPEC 12): the
    operation keeps waiting, on a small fresh budget of ``escalation.cancel_checks`` status
    requests, until the provider reports a terminal state, which becomes the outcome."""
    why = may_cancel(policy, record)
    if why is not None:
        return _refuse(Event.CANCELLED, why)
    status = answer.status
    if status is None or not 200 <= status < 300:
        shown = "no answer" if status is None else f"HTTP {status}"
        return _refuse(Event.CANCELLED, f"the provider did not accept the cancel request ({shown})")
    polling, checks = policy.polling, policy.escalation.cancel_checks
    new = record.evolve(
        outcome=Outcome.PENDING,
        escalation=None,
        ended_at=None,
        cancel_requested_at=now,
        deadline_at=max(record.deadline_at, now + checks * polling.max_delay),
        max_status_requests=record.status_requests_used + checks,
        max_transport_failures=record.transport_failures_used + polling.max_transport_failures,
        max_rate_limited=record.rate_limited_used + polling.max_rate_limited,
        next_poll_at=now,
        delay_source=DelaySource.LOCAL_BACKOFF,
    )
    detail = f"the provider accepted the cancel request (HTTP {status}); waiting for its outcome"
    return ActionResult(new, Event.CANCELLED, detail=f"{detail}: {reason}" if reason else detail)
