"""What a step causes besides its answer, as data: audit lines, metric changes and webhook
notices (STYLE habit 2: side effects are returned, not performed).

A poll, a submission, an operator action or a provider call outside the polling loop ends
with a tuple of effects built here; gateway/observe/effects.py carries a tuple out, in
order, in one place. Pure: no I/O and no clock (every instant is passed in). A new audit
event is a new builder here (or a new ``event`` given to one) and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.core.decide import Decision, Reply
from gateway.core.escalation import message, problem_members
from gateway.core.keys import AgentKey, QuotaRefusal
from gateway.core.models import DelaySource, Event, OperationRecord, Outcome
from gateway.core.schedule import Plan
from gateway.settings.policy import ProviderPolicy
from gateway.settings.units import rfc3339


@dataclass(frozen=True, slots=True)
class Line:
    """One audit line (``seq``, ``prev`` and ``hash`` are added by the audit log)."""

    fields: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Count:
    """One metric change: ``metric`` names a collector of observe/metrics.py."""

    metric: str
    labels: tuple[str, ...]
    value: float = 1.0
    observe: bool = False  # a histogram observation rather than a counter increment


@dataclass(frozen=True, slots=True)
class Notice:
    """One webhook notice (sent only when a webhook is configured)."""

    kind: str  # operation.escalated | operation.decided | operation.updated
    record: OperationRecord
    policy: ProviderPolicy
    extra: Mapping[str, Any] = field(default_factory=dict)


Effect = Line | Count | Notice
Effects = tuple[Effect, ...]
NONE: Effects = ()

# Operator actions by audit event, as named in operation.decided webhooks.
OPERATOR_EVENTS = {
    Event.EXTENDED: "extend",
    Event.RESUMED: "resume",
    Event.ABANDONED: "abandon",
    Event.CANCELLED: "cancel",
}


def iso(instant: float | None) -> str | None:
    """RFC 3339 UTC with milliseconds, as audit lines carry instants."""
    return None if instant is None else rfc3339(instant, millis=True)


def line_fields(
    record: OperationRecord,
    *,
    event: str,
    at: float,
    decision: str,
    http_status: int | None = None,
    detail: str | None = None,
    actor: str = "gateway",
    count: int | None = None,
) -> dict[str, Any]:
    """The fields of one audit line about ``record`` (seq, prev and hash come from seal)."""
    pending = record.outcome is Outcome.PENDING
    fields: dict[str, Any] = {
        "at": iso(at),
        "operation_id": record.operation_id,
        "provider": record.provider,
        "account": record.account,
        "event": event,
        "provider_state": record.last_known_state,
        "http_status": http_status,
        "decision": decision,
        "next_poll_at": iso(record.next_poll_at) if pending else None,
        "delay_source": record.delay_source.value if pending else None,
        "requests_used": record.status_requests_used,
        "max_requests": record.max_status_requests,
        "deadline_at": iso(record.deadline_at),
        "reason": record.escalation.reason.value if record.escalation else None,
        "detail": detail,
        "actor": actor,
    }
    if count is not None:
        fields["count"] = count
    return fields


def of_decision(
    policy: ProviderPolicy,
    decision: Decision,
    now: float,
    *,
    event: Event | None = None,
    http_status: int | None = None,
    detail: str | None = None,
) -> Effects:
    """A persisted decision of the gateway's own: its line, counts and escalation notice
    (none when it has no event)."""
    event = event or decision.event
    if event is None:
        return NONE
    word = _decision_word(decision)
    return _of_event(
        policy, decision.record, event, now, word, decision.plan, http_status, detail, "gateway"
    )


def of_action(
    policy: ProviderPolicy,
    record: OperationRecord,
    event: Event,
    now: float,
    *,
    actor: str,
    detail: str | None,
    http_status: int | None,
) -> Effects:
    """An operator's action written to ``record``: its line, counts and the
    ``operation.decided`` notice."""
    word = record.outcome.value
    return _of_event(policy, record, event, now, word, None, http_status, detail, actor)


def _of_event(
    policy: ProviderPolicy,
    record: OperationRecord,
    event: Event,
    now: float,
    word: str,
    plan: Plan | None,
    http_status: int | None,
    detail: str | None,
    actor: str,
) -> Effects:
    if event is Event.ESCALATED and record.escalation is not None and detail is None:
        detail = record.escalation.detail
    line = line_fields(
        record,
        event=event,
        at=now,
        decision=word,
        http_status=http_status,
        detail=detail,
        actor=actor,
    )
    found: list[Effect] = [Line(line), *_counts(record, event, plan)]
    if event is Event.ESCALATED:
        found.append(Notice("operation.escalated", record, policy))
    elif event in OPERATOR_EVENTS and actor != "gateway":
        extra = {"action": OPERATOR_EVENTS[event], "actor": actor, "detail": detail}
        found.append(Notice("operation.decided", record, policy, extra))
    return tuple(found)


def of_agent_cancel(
    policy: ProviderPolicy,
    record: OperationRecord,
    account: str,
    now: float,
    *,
    http_status: int | None,
    accepted: str | None,
    refusal: str | None,
) -> Effects:
    """An agent's own cancel sent to the provider (``routes.cancel.by: agent``, SPEC 20a):
    one ``cancel_requested`` line naming the account as its actor, saying ``accepted`` (the
    record's change) or why it was not (``refusal``); no webhook notice, no count."""
    detail = accepted if accepted is not None else f"not accepted: {refusal}"
    actor = f"account:{account}"
    return of_action(
        policy,
        record,
        Event.CANCEL_REQUESTED,
        now,
        actor=actor,
        detail=detail,
        http_status=http_status,
    )


def of_update(policy: ProviderPolicy, record: OperationRecord, detail: str) -> Effects:
    """An ``operation.updated`` notice: the state a poll the gateway made on its own found
    (after an operator's extend or resume), for webhook-driven agents and operators."""
    extra = {"provider_state": record.last_known_state, "detail": detail}
    return (Notice("operation.updated", record, policy, extra),)


def of_refusals(
    record: OperationRecord, count: int, first_at: float, ends_at: float, now: float
) -> Effects:
    """One line for a closed window of too-early refusals, with their count."""
    line = line_fields(
        record.evolve(next_poll_at=ends_at),
        event=Event.REFUSED,
        at=now,
        decision="too-early",
        detail=f"first at {iso(first_at)}",
        count=count,
    )
    return (Line(line),)


def of_interruption(record: OperationRecord, sent_at: float, now: float) -> Effects:
    """SPEC 16: the line a status request cut short by a crash could not write itself,
    written when the cut is found (the next poll under the lease, or at start)."""
    detail = f"request sent at {iso(sent_at)} was cut short; no answer was recorded"
    line = line_fields(record, event=Event.POLLED, at=now, decision="interrupted", detail=detail)
    return (Line(line),)


def of_call(
    now: float,
    *,
    provider: str,
    account: str,
    event: Event,
    http_status: int | None,
    detail: str,
    operation: OperationRecord | None = None,
) -> Effects:
    """One line for a provider call outside the polling loop (a rejected submit, a
    passthrough call, a result fetch, a refused cancel)."""
    if operation is not None:
        fields = line_fields(
            operation,
            event=event,
            at=now,
            decision="forwarded",
            http_status=http_status,
            detail=detail,
        )
    else:
        fields = {
            "at": iso(now),
            "operation_id": None,
            "provider": provider,
            "account": account,
            "event": event,
            "http_status": http_status,
            "decision": "forwarded",
            "detail": detail,
            "actor": "gateway",
        }
    return (Line(fields),)


def of_push(
    provider: str,
    result: str,
    now: float,
    *,
    record: OperationRecord | None = None,
    detail: str | None = None,
) -> Effects:
    """A provider's push (SPEC 23): counted by ``result`` and audited ``pushed``, with
    the operation it touched when there is one."""
    count = Count("pushes", (provider, result))
    if record is not None:
        fields = line_fields(record, event=Event.PUSHED, at=now, decision=result, detail=detail)
    else:
        fields = {
            "at": iso(now),
            "operation_id": None,
            "provider": provider,
            "account": None,
            "event": Event.PUSHED.value,
            "decision": result,
            "detail": detail,
            "actor": "provider",
        }
    return (count, Line(fields))


def of_key(event: Event, key: AgentKey, now: float, *, actor: str, detail: str) -> Effects:
    """An agent key made or revoked through the operator API (SPEC 25): one line naming
    the key by id and account, never its token (nor the token's digest)."""
    line = {
        "at": iso(now),
        "operation_id": None,
        "provider": None,
        "account": key.account,
        "event": event.value,
        "decision": "created" if event is Event.KEY_CREATED else "revoked",
        "detail": detail,
        "actor": actor,
        "key_id": key.id,
    }
    return (Count("keys_changed", (event.value,)), Line(line))


def of_quota_refusal(
    refused: QuotaRefusal, now: float, *, count: int = 1, since: float | None = None
) -> Effects:
    """Submissions refused ``429 quota-exceeded``, nothing forwarded (SPEC 25): one
    ``quota_exceeded`` line, about no operation (none was opened), for the first refusal
    of a window (``count`` 1), or for the ``count`` refused after it, ``since`` the
    first, when the window closes (flow/quotas.py). Names the key by id, never its token."""
    said = f"{refused.quota} {refused.limit} reached; nothing was sent"
    if since is not None:
        said = f"{count} more refused since {iso(since)}: {said}"
    line = {
        "at": iso(now),
        "operation_id": None,
        "provider": refused.provider,
        "account": refused.account,
        "event": Event.QUOTA_EXCEEDED.value,
        "http_status": 429,
        "decision": "quota-exceeded",
        "detail": said,
        "actor": "gateway",
        "key_id": refused.key_id,
        "quota": refused.quota,
        "limit": refused.limit,
        "retry_after": refused.retry_after,
        "count": count,
    }
    return (Line(line),)


def of_hold_declined(provider: str, bound: str) -> Effects:
    """A call that asked to be held, answered at once instead: ``bound`` (``account`` or
    ``total``) of ``limits.max_held_per_account`` / ``max_held`` was reached."""
    return (Count("holds_declined", (provider, bound)),)


def of_delivery(notice: Mapping[str, Any], outcome: str, now: float) -> Effects:
    """A webhook delivery's outcome: counted, and a line of its own."""
    result = next((word for word in ("delivered", "dropped") if outcome.startswith(word)), "failed")
    line = {
        "at": iso(now),
        "operation_id": notice["operation_id"],
        "provider": notice["provider"],
        "account": notice["account"],
        "event": Event.NOTIFIED.value,
        "decision": "webhook",
        "reason": notice["reason"],
        "detail": outcome,
        "actor": "gateway",
    }
    return (Count("webhook_deliveries", (result,)), Line(line))


def of_completion(record: OperationRecord, outcome: str, now: float) -> Effects:
    """An ``operation.completed`` post (SPEC 23): counted by result, and a ``notified``
    line saying what came of it."""
    result = "delivered" if outcome == "delivered" else "failed"
    if outcome.startswith("given up"):
        result = "given_up"  # owed past the sender's bound: marked sent unposted
    elif outcome.startswith("dropped"):
        result = "dropped"  # no webhook configured any more: marked sent unposted
    line = line_fields(
        record, event=Event.NOTIFIED.value, at=now, decision="operation.completed", detail=outcome
    )
    return (Count("completion_deliveries", (result,)), Line(line))


def notice_body(notice: Notice, message_id: str, now: float) -> dict[str, Any]:
    """A webhook body: ``type`` (Standard Webhooks event type), a message ``id`` kept
    across retries, and what an operator needs to decide."""
    record, policy = notice.record, notice.policy
    members = problem_members(record, policy)
    body: dict[str, Any] = {
        "type": notice.kind,
        "id": message_id,
        "timestamp": iso(now),
        "outcome": record.outcome.value,
        "operation_id": record.operation_id,
        "provider": record.provider,
        "account": record.account,
        "provider_job_id": record.provider_job_id,
        "reason": members["reason"],
        "escalated_at": members.get("escalated_at"),
        "permitted_actions": members["permitted_actions"],
        "message": message(record, policy),
    }
    body.update(notice.extra)
    return body


def _counts(record: OperationRecord, event: Event, plan: Plan | None) -> list[Count]:
    provider = record.provider
    found = []
    if event is Event.SUBMITTED:
        found.append(Count("operations_started", (provider,)))
    if event is Event.ESCALATED and record.escalation is not None:
        found.append(Count("escalations", (provider, record.escalation.reason.value)))
    if event in (Event.FINISHED, Event.ABANDONED):  # the operation ended
        found.append(Count("operations_finished", (provider, record.outcome.value)))
        used = float(record.status_requests_used)
        found.append(Count("requests_per_operation", (provider,), used, observe=True))
        for kind, number in record.usage if event is Event.FINISHED else ():
            if number > 0:  # a counter only goes up
                found.append(Count("usage", (provider, record.account, kind), float(number)))
    if plan is not None:
        if plan.source in (DelaySource.PROVIDER_RETRY_AFTER, DelaySource.PROVIDER_POLL_HINT):
            found.append(Count("provider_guidance", (provider, plan.source.value)))
        if plan.hint_rejected:
            found.append(Count("provider_guidance", (provider, "hint_rejected")))
    return found


def _decision_word(decision: Decision) -> str:
    if decision.problem is not None:
        return decision.problem
    if decision.reply is Reply.FINAL:
        return "answer-from-record"
    if decision.reply is Reply.REPLAY:
        return "replayed"
    return decision.record.outcome.value
