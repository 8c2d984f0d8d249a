"""The rule book of SPEC section 4: what to do with a status call and with a provider answer.

Pure: (policy, record, now, event) -> Decision. No I/O, no clock, no randomness (a uniform draw
``u`` is passed in), no logging, no asyncio. The HTTP shell carries decisions out: it sends
when ``forward`` is set, persists ``record`` when ``changed`` is set, and answers with
``problem`` or with the provider's (or the stored final) body.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.core import a2a, arns, completion
from gateway.core.models import (
    DelaySource,
    Escalation,
    Event,
    Failure,
    FinalResponse,
    LastAnswer,
    OperationRecord,
    Outcome,
    ProviderAnswer,
    Reason,
    evolver,
)
from gateway.core.schedule import AnswerKind, Guidance, Plan, guidance, parse_instant, plan
from gateway.core.values import bounded, lookup, parse_json
from gateway.settings.policy import ProviderPolicy, RequiredField, placeholders


class Reply(enum.Enum):
    PROVIDER = "provider"  # the provider's answer, passed through
    FINAL = "final"  # the stored final provider answer, no provider call
    PROBLEM = "problem"  # a problem+json answer named by ``problem``
    REPLAY = "replay"  # the last recorded provider answer, no provider call (SPEC 20)
    CANCEL_ACCEPTED = "cancel_accepted"  # a cancel accepted already: 202 from the record


@dataclass(frozen=True, slots=True)
class Decision:
    record: OperationRecord
    reply: Reply
    changed: bool = False
    forward: bool = False
    problem: str | None = None
    retry_after: float | None = None  # seconds the agent should wait, when it should
    event: Event | None = None  # the audit line this decision writes
    plan: Plan | None = None
    detail: str | None = None  # why, for the agent, when the record does not say it
    cut_at: float | None = None  # an earlier request reserved then, its answer never recorded
    shown: bytes | None = None  # the body agents get instead of the provider's (still pending)

    def evolve(self, **changes: Any) -> Decision:
        """``dataclasses.replace`` at about a quarter of its cost (a poll makes several)."""
        return _DECISION_EVOLVE(self, changes)


_DECISION_EVOLVE: Callable[[Decision, dict[str, Any]], Decision] = evolver(
    Decision, tuple(f.name for f in dataclasses.fields(Decision))
)


def as_write(decision: Decision | None) -> tuple[OperationRecord | None, Decision | None]:
    """A decision as a store mutation (``Store.mutate``): its record is written only when
    it changed; no decision writes nothing."""
    if decision is None:
        return None, None
    return (decision.record if decision.changed else None), decision


def permitted_actions(
    reason: Reason, policy: ProviderPolicy, record: OperationRecord
) -> tuple[str, ...]:
    """The bounded operator options an escalation allows (SPEC sections 5 and 12): only
    actions that can succeed: no extend once max_extension is spent, no second cancel."""
    if reason in (Reason.UNKNOWN_STATE, Reason.INTEGRATION_FAILURE, Reason.AUTHORIZATION_DENIED):
        return ("resume", "abandon")
    extend = ("extend",) if extension_left(policy, record) is not None else ()
    if reason is Reason.RATE_LIMITED:
        return (*extend, "abandon")
    if reason is Reason.INPUT_REQUIRED:  # only the caller can answer; polling changes nothing
        extend = ()
    can_cancel = policy.routes.cancel is not None and record.cancel_requested_at is None
    return (*extend, *(("cancel_at_provider",) if can_cancel else ()), "abandon")


def extension_left(policy: ProviderPolicy, record: OperationRecord) -> tuple[float, int] | None:
    """Time and requests still allowed by ``escalation.max_extension``; None when spent."""
    bound = policy.escalation.max_extension
    seconds = bound.time - record.extended_seconds
    requests = bound.requests - record.extended_requests
    if seconds <= 0 or requests <= 0:
        return None
    return seconds, requests


def escalate(
    policy: ProviderPolicy,
    record: OperationRecord,
    reason: Reason,
    now: float,
    detail: str,
    **changes: Any,
) -> Decision:
    """End waiting: the record becomes escalated and the agent gets operation-escalated.

    The escalation keeps the credential and policy fingerprints in force now: ``resume``
    is permitted once the live ones differ from these."""
    new = record.evolve(**changes)
    escalation = Escalation(
        reason,
        now,
        detail,
        permitted_actions(reason, policy, new),
        credential_fingerprint=policy.credential_fingerprint,
        policy_fingerprint=policy.fingerprint,
    )
    new = new.evolve(outcome=Outcome.ESCALATED, escalation=escalation, ended_at=now)
    return Decision(
        new, Reply.PROBLEM, changed=True, problem="operation-escalated", event=Event.ESCALATED
    )


def admit(policy: ProviderPolicy, record: OperationRecord, now: float) -> Decision:
    """Steps 2-6 of a status call: may a request go to the provider now?"""
    if record.outcome.terminal:
        return Decision(record, Reply.FINAL)
    if record.outcome in (Outcome.ESCALATED, Outcome.ABANDONED):
        return Decision(record, Reply.PROBLEM, problem="operation-escalated")
    if now >= record.deadline_at:
        return escalate(policy, record, Reason.DEADLINE_EXCEEDED, now, "the deadline has passed")
    if a2a.awaits_caller(policy, record):  # SPEC 24: the caller's reply resumes pacing
        return early(policy, record, max(1.0, record.next_poll_at - now))
    if record.status_requests_used >= record.max_status_requests:
        detail = f"all {record.max_status_requests} status requests have been used"
        return escalate(policy, record, Reason.REQUEST_BUDGET_EXHAUSTED, now, detail)
    if now < record.next_poll_at:
        return early(policy, record, record.next_poll_at - now)
    return Decision(record, Reply.PROVIDER, forward=True)


def early(policy: ProviderPolicy, record: OperationRecord, wait: float) -> Decision:
    """Step 6, a call ``wait`` seconds before the next permitted poll: 429 too-early, or
    (``early_calls: replay``, SPEC 20) the last provider answer as a cache would give it.
    Only a pending 2xx answer is ever kept to replay (``last_answer``): after a transport
    failure, a 5xx, a 429 or a 404 there is none, and the agent gets too-early."""
    if policy.polling.early_calls == "replay" and record.last_answer is not None:
        return Decision(record, Reply.REPLAY, retry_after=wait, event=Event.REFUSED)
    return Decision(
        record, Reply.PROBLEM, problem="too-early", retry_after=wait, event=Event.REFUSED
    )


def holds_early(policy: ProviderPolicy, decision: Decision) -> bool:
    """A too-early call that waits for the next permitted poll, and gets that poll's answer,
    instead of 429 when the poll is within ``max_hold``: under ``early_calls: hold`` (SPEC
    12), and under ``replay`` while there is nothing to replay because nothing was polled
    yet (SPEC 20a: the submit answered 202 without a status object), so a replaying loop
    never sees a 429. A replay policy's record after a failed poll keeps its too-early."""
    record, polling = decision.record, policy.polling
    if decision.problem != "too-early" or decision.retry_after is None:
        return False
    if decision.retry_after > polling.max_hold:
        return False
    if polling.early_calls == "hold":
        return True
    fresh = record.last_answer is None and record.status_requests_used == 0
    return polling.early_calls == "replay" and fresh


def cancel_call(record: OperationRecord, now: float) -> Decision:
    """An agent's call to a cancel route it may use (``by: agent``, SPEC 20a): ``forward``
    while the job is pending and no cancel was accepted yet; else answered from the record
    without a provider call: a finished job its final answer, an escalated or abandoned one
    its 409, and a cancel accepted already the last answer replayed when one is kept, else
    202 with the record's ``cancel_requested_at``. The poll that learns the outcome is the
    agent's next permitted status call."""
    if record.outcome.terminal:
        return Decision(record, Reply.FINAL)
    if record.outcome in (Outcome.ESCALATED, Outcome.ABANDONED):
        return Decision(record, Reply.PROBLEM, problem="operation-escalated")
    if record.cancel_requested_at is None:
        return Decision(record, Reply.PROVIDER, forward=True)
    wait = max(0.0, record.next_poll_at - now)
    if record.last_answer is not None:
        return Decision(record, Reply.REPLAY, retry_after=wait)
    return Decision(record, Reply.CANCEL_ACCEPTED, retry_after=wait)


def overdue(policy: ProviderPolicy, record: OperationRecord, now: float) -> Decision | None:
    """SPEC 16: a pending operation past its deadline is escalated even when nobody asks.

    None while the operation is not pending or its deadline has not come."""
    if record.outcome is not Outcome.PENDING or now < record.deadline_at:
        return None
    detail = "the deadline has passed"
    decision = escalate(policy, record, Reason.DEADLINE_EXCEEDED, now, detail, inflight_at=None)
    return decision.evolve(cut_at=record.inflight_at)


def paused(policy: ProviderPolicy, record: OperationRecord, now: float, wait: float) -> Decision:
    """A poll that is due but must wait ``wait`` seconds because the provider is paused or
    at its ceiling (SPEC 16): too-early, or escalate ``deadline_exceeded`` when the pause
    ends after the last moment the operation may still poll."""
    decision = admit(policy, record, now)
    if not decision.forward:
        return decision
    if now + wait > record.deadline_at - policy.polling.final_poll_margin:
        detail = "the provider paused status calls until after the operation's deadline"
        return escalate(policy, record, Reason.DEADLINE_EXCEEDED, now, detail)
    detail = "The provider's ceiling on status calls is reached; this poll waits."
    return Decision(record, Reply.PROBLEM, problem="too-early", retry_after=wait, detail=detail)


def take(
    policy: ProviderPolicy, record: OperationRecord, now: float, refusals: int = 0
) -> Decision:
    """Steps 2-6 again under the lease, then step 8's reservation: the record to store next.

    Refusals counted in memory since the last write are folded into whatever is written.
    Under the lease, a reservation whose answer was never recorded (``inflight_at``) is a
    request cut short by a crash: it is cleared here and reported as ``cut_at``.
    """
    cut = record.inflight_at
    if cut is not None:
        record = record.evolve(inflight_at=None)
    decision = admit(policy, record, now)
    if decision.forward:
        decision = decision.evolve(record=reserve(record, now, refusals), changed=True)
    elif decision.changed and refusals:
        folded = decision.record.evolve(early_refusals=decision.record.early_refusals + refusals)
        decision = decision.evolve(record=folded)
    elif cut is not None:
        decision = decision.evolve(changed=True)
    return decision if cut is None else decision.evolve(cut_at=cut)


def recover(record: OperationRecord) -> Decision | None:
    """At start: a reservation whose answer was never recorded, when no poll holds the
    lease, is a request cut short by a crash. None when there is none."""
    if record.inflight_at is None:
        return None
    cleared = record.evolve(inflight_at=None)
    return Decision(cleared, Reply.PROBLEM, changed=True, cut_at=record.inflight_at)


def reserve(record: OperationRecord, now: float, refusals: int = 0) -> OperationRecord:
    """Spend one status request before it is sent; folds in refusals counted meanwhile.

    ``inflight_at`` marks the request as sent-but-unanswered until its answer is recorded."""
    return record.evolve(
        status_requests_used=record.status_requests_used + 1,
        early_refusals=record.early_refusals + refusals,
        last_polled_at=now,
        inflight_at=now,
    )


def still_ours(reserved: OperationRecord, current: OperationRecord) -> bool:
    """Fencing: a poll's answer applies only while no later poll has been reserved.

    A replica paused past its lease finds another reservation on the record when it wakes;
    its answer is then stale and is dropped rather than written over a newer record.
    """
    return (
        current.status_requests_used == reserved.status_requests_used
        and current.last_polled_at == reserved.last_polled_at
    )


def come_back(record: OperationRecord, wait: float, detail: str) -> Decision:
    """A poll that cannot go now for a reason of the moment (another poll holds the lease,
    the store's clock refused): too-early in ``wait`` seconds, nothing written."""
    return Decision(record, Reply.PROBLEM, problem="too-early", retry_after=wait, detail=detail)


def superseded(record: OperationRecord, now: float) -> Decision:
    """The answer to give when this poll's answer was dropped: the record as it stands."""
    if record.outcome.terminal:
        return Decision(record, Reply.FINAL)
    if record.outcome is not Outcome.PENDING:
        return Decision(record, Reply.PROBLEM, problem="operation-escalated")
    wait = max(1.0, record.next_poll_at - now)
    detail = "A later status request superseded this one; its answer was not recorded."
    return Decision(record, Reply.PROBLEM, problem="too-early", retry_after=wait, detail=detail)


def open_operation(
    policy: ProviderPolicy,
    *,
    operation_id: str,
    account: str,
    job_id: str,
    fingerprint: str,
    idempotency_key: str | None,
    answer: ProviderAnswer,
    now: float,
    u: float,
    route_values: tuple[tuple[str, str], ...] = (),
) -> Decision:
    """The record written before the submit answer goes back; first poll per SPEC 4.4.
    ``route_values``: the submit path's named segments the job's routes name too."""
    polling = policy.polling
    record = OperationRecord(
        operation_id=operation_id,
        provider=policy.provider,
        account=account,
        provider_job_id=job_id,
        request_fingerprint=fingerprint,
        idempotency_key=idempotency_key,
        started_at=now,
        deadline_at=now + polling.deadline,
        max_status_requests=polling.max_status_requests,
        max_transport_failures=polling.max_transport_failures,
        max_rate_limited=polling.max_rate_limited,
        next_poll_at=now,
        delay_source=DelaySource.LOCAL_BACKOFF,
        credential_fingerprint=policy.credential_fingerprint,
        policy_fingerprint=policy.fingerprint,
        last_http_status=answer.status,
        result_values=job_aliases(policy, job_id),
        route_values=route_values,
    )
    body = _json(answer.body)
    hint = _hint(policy, answer, body if isinstance(body, dict) else None, now)
    state = lookup(body, policy.states.field) if isinstance(body, dict) else None
    known = state_text(state) if isinstance(state, str | bool | int | float) else None
    record = record.evolve(last_known_state=known)
    if (
        policy.polling.early_calls == "replay"
        and answer.status == 200
        and isinstance(body, dict)
        and policy.state_class(state) == "pending"
    ):
        record = record.evolve(last_answer=_kept(answer, now))  # a status object already
    return _schedule(policy, record, answer, now, u, AnswerKind.PENDING, hint)


def with_first_task(
    policy: ProviderPolicy, opened: Decision, answer: ProviderAnswer, now: float, u: float
) -> Decision:
    """SPEC 24: an A2A submit's answer (``{"task": {...}}``) is the task's first status
    answer. The new record takes the task's state and the schedule it means, as a status
    answer with that task would give it, so the operation's one ``submitted`` line says
    them (the send is one line in its story), and no status request is spent. A task that
    ends or escalates at once is not applied here: the record opens pending and the A2A
    SendMessage (flow/a2a.note_task) records the end with its own line. Other policies'
    submit answers are not status answers: ``opened`` as it is."""
    if policy.protocol != "a2a":
        return opened
    body = _json(answer.body)
    task = body.get("task") if isinstance(body, dict) else None
    if not isinstance(task, dict):
        return opened
    sent = json.dumps(task, separators=(",", ":"), ensure_ascii=False).encode()
    first = classify(policy, opened.record, ProviderAnswer(200, sent, "application/json"), now, u)
    return first if first.record.outcome is Outcome.PENDING else opened


def classify(
    policy: ProviderPolicy,
    record: OperationRecord,
    answer: ProviderAnswer,
    now: float,
    u: float,
    *,
    announce: bool = False,
) -> Decision:
    """Step 9: what one provider answer to a status request means (SPEC table).

    Recording the answer clears the reservation's ``inflight_at`` whatever it says. An
    answer that ends the operation records its usage numbers and, with ``announce`` (a
    webhook is configured), owes the ``operation.completed`` event in the same write."""
    if record.outcome is not Outcome.PENDING:  # decided meanwhile: the answer changes nothing
        decision = superseded(record, now)
    else:
        decision = _classify(policy, record, answer, now, u)
        if decision.record.outcome.terminal:
            ended = completion.completed(
                record, decision.record, policy.usage, answer.body, announce=announce
            )
            decision = decision.evolve(record=ended)
        if decision.shown is not None:  # replays show the still-pending answer too
            answer = dataclasses.replace(answer, body=decision.shown)
        decision = _remember(decision, answer, now, keep=policy.polling.early_calls == "replay")
    if decision.record.inflight_at is None:
        return decision
    cleared = decision.record.evolve(inflight_at=None)
    return decision.evolve(record=cleared, changed=True)


def _remember(decision: Decision, answer: ProviderAnswer, now: float, *, keep: bool) -> Decision:
    """Keep the answer to replay to early calls when it left the job pending with a 2xx;
    any other answer clears what was kept (SPEC 20: no replay after a failure or a 5xx).
    Only policies that replay (``keep``) keep answers; one kept before a reload that
    stopped replaying is cleared here."""
    record = decision.record
    pending = record.outcome is Outcome.PENDING
    ok = answer.failure is None and answer.status is not None and 200 <= answer.status < 300
    last = _kept(answer, now) if keep and pending and ok else None
    if last == record.last_answer:
        return decision
    return decision.evolve(record=record.evolve(last_answer=last), changed=True)


def _kept(answer: ProviderAnswer, now: float) -> LastAnswer:
    assert answer.status is not None
    return LastAnswer(answer.status, answer.content_type, answer.body, now)


def _classify(
    policy: ProviderPolicy,
    record: OperationRecord,
    answer: ProviderAnswer,
    now: float,
    u: float,
) -> Decision:
    # what every answer records, the reservation's inflight_at cleared with it: applied in
    # the one copy the answer's decision makes (a copy is most of a decision's cost)
    seen = {"last_http_status": answer.status, "last_polled_at": now, "inflight_at": None}
    status = answer.status
    if answer.failure is Failure.TOO_LARGE:
        detail = "the status answer is larger than limits.max_response_body"
        return escalate(policy, record, Reason.INTEGRATION_FAILURE, now, detail, **seen)
    if answer.failure is not None or (status is not None and status >= 500):
        return _transport_failure(policy, record, answer, now, u)
    assert status is not None
    if status in (401, 403):
        detail = f"the provider answered {status} to the gateway's credential"
        return escalate(policy, record, Reason.AUTHORIZATION_DENIED, now, detail, **seen)
    if status == 404:
        if now - record.started_at <= policy.polling.not_found_grace:
            kind = AnswerKind.NOT_VISIBLE
            return _schedule(policy, record, answer, now, u, kind, Guidance(), seen)
        detail = "the provider no longer knows the job (404 after the not-found grace period)"
        return escalate(policy, record, Reason.INTEGRATION_FAILURE, now, detail, **seen)
    if status == 429:
        return _rate_limited(policy, record, answer, now, u)
    if not 200 <= status < 300:
        detail = f"unexpected HTTP status {status} from the status route"
        return escalate(policy, record, Reason.INTEGRATION_FAILURE, now, detail, **seen)
    return _classify_body(policy, record, answer, now, u, seen)


def _transport_failure(
    policy: ProviderPolicy, record: OperationRecord, answer: ProviderAnswer, now: float, u: float
) -> Decision:
    used = record.transport_failures_used + 1
    new = record.evolve(
        transport_failures_used=used, last_http_status=answer.status, last_polled_at=now
    )
    if used > record.max_transport_failures:
        detail = f"{used} transport failures, more than the {record.max_transport_failures} allowed"
        return escalate(policy, new, Reason.PROVIDER_FAILURE, now, detail)
    retry_after = answer.retry_after if answer.status == 503 else None
    hint = guidance(retry_after, None, None, now, retry_after_only=True)
    return _schedule(policy, new, answer, now, u, AnswerKind.UNAVAILABLE, hint)


def _rate_limited(
    policy: ProviderPolicy, record: OperationRecord, answer: ProviderAnswer, now: float, u: float
) -> Decision:
    used = record.rate_limited_used + 1
    new = record.evolve(rate_limited_used=used, last_http_status=429, last_polled_at=now)
    if used > record.max_rate_limited:
        detail = f"{used} rate-limited answers, more than the {record.max_rate_limited} allowed"
        return escalate(policy, new, Reason.RATE_LIMITED, now, detail)
    hint = guidance(answer.retry_after, None, None, now, retry_after_only=True)
    return _schedule(policy, new, answer, now, u, AnswerKind.THROTTLED, hint)


def _classify_body(
    policy: ProviderPolicy,
    record: OperationRecord,
    answer: ProviderAnswer,
    now: float,
    u: float,
    seen: dict[str, Any],
) -> Decision:
    """A 2xx answer's body through the state table; ``seen``: the changes every answer
    records, made in the decision's one copy of ``record``."""
    body = _json(answer.body)
    if not isinstance(body, dict):
        detail = "the status answer is not a JSON object"
        return escalate(policy, record, Reason.INTEGRATION_FAILURE, now, detail, **seen)
    states = policy.states
    state = lookup(body, states.field)
    if isinstance(state, dict | list):
        detail = f"the state field {states.field!r} is not a JSON scalar"
        return escalate(policy, record, Reason.UNKNOWN_STATE, now, detail, **seen)
    if state is not None:
        seen = {**seen, "last_known_state": state_text(state)}
    kind = policy.state_class(state)
    if kind is None and state is None:
        detail = f"the state field {states.field!r} is missing"
        return escalate(policy, record, Reason.UNKNOWN_STATE, now, detail, **seen)
    if kind is None:
        detail = f"state {_short(state_text(state))} is not in the policy's state table"
        return escalate(policy, record, Reason.UNKNOWN_STATE, now, detail, **seen)
    if kind == "success" and any(lookup(body, p) is not None for p in states.failure_if_present):
        kind = "failure"  # Google's done: true with an error
    if kind == "pending" and a2a.escalates_input(policy, state):
        detail = a2a.input_detail(state_text(state), body)
        return escalate(policy, record, Reason.INPUT_REQUIRED, now, detail, **seen)
    if kind == "pending":
        expires = (
            parse_instant(lookup(body, states.expires_at_field))
            if states.expires_at_field
            else None
        )
        if expires is not None and now > expires:
            shown = _short(state_text(state))
            detail = f"the job is still {shown} after its own {states.expires_at_field}"
            return escalate(policy, record, Reason.INTEGRATION_FAILURE, now, detail, **seen)
        hint = _hint(policy, answer, body, now)
        return _schedule(policy, record, answer, now, u, AnswerKind.PENDING, hint, seen)
    if kind == "success" and not all(present(body, f) for f in states.required()):
        # not done yet: Gemini says SUCCEEDED before its output file exists. Polling goes
        # on under the same budget and deadline until the answer carries it, and agents
        # (and replays) are shown the answer with a pending state: an SDK that read the
        # success would stop without its result
        masked = _as_pending(policy, body)
        hint = _hint(policy, answer, body, now)
        decision = _schedule(policy, record, answer, now, u, AnswerKind.PENDING, hint, seen)
        return decision.evolve(shown=masked)
    values = result_values(policy, body) if kind == "success" else ()
    return _finish(record, answer, _OUTCOMES[kind], now, values, seen)


def _as_pending(policy: ProviderPolicy, body: dict[str, Any]) -> bytes:
    """The answer with its state field set to the policy's first pending value."""
    shown = json.loads(json.dumps(body))
    node, *path = [shown, *policy.states.field.split(".")]
    for part in path[:-1]:
        node = node.setdefault(part, {}) if isinstance(node, dict) else {}
    pending = policy.states.pending[0] if policy.states.pending else None
    if isinstance(node, dict):
        node[path[-1]] = pending
    return json.dumps(shown).encode()


_OUTCOMES = {
    "success": Outcome.SUCCEEDED,
    "failure": Outcome.FAILED,
    "cancelled": Outcome.CANCELLED,
    "expired": Outcome.EXPIRED,
}


def _finish(
    record: OperationRecord,
    answer: ProviderAnswer,
    outcome: Outcome,
    now: float,
    values: tuple[str, ...] = (),
    seen: dict[str, Any] | None = None,
) -> Decision:
    """The operation ends with this answer; a success's result values are indexed with it,
    after the values it was indexed by already (a job id's alias)."""
    final = FinalResponse(answer.status or 200, answer.content_type, answer.body)
    kept = (*record.result_values, *(v for v in values if v not in record.result_values))
    new = record.evolve(
        **(seen or {}), outcome=outcome, final_response=final, ended_at=now, result_values=kept
    )
    return Decision(new, Reply.PROVIDER, changed=True, event=Event.FINISHED)


SEGMENT = re.compile(r"[A-Za-z0-9._~-]{1,200}")


def addressable(value: Any) -> str | None:
    """A value of the final answer as an agent can put it in one path segment, or None:
    a string or whole number of at most 200 characters from ``[A-Za-z0-9._~-]`` (so never
    ``/``, ``?`` or ``#``) and without ``..``. Only these are indexed (SPEC 20)."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    text = str(value)
    if SEGMENT.fullmatch(text) is None or ".." in text or text == ".":
        return None
    return text


def job_aliases(policy: ProviderPolicy, job_id: str) -> tuple[str, ...]:
    """Other names of the job an operation is found by (``Records.find_result``): an ARN
    job id's trailing id, under ``routes.job_ids: aws-arn`` (SPEC 22)."""
    if policy.routes.job_ids != "aws-arn":
        return ()
    tail = arns.alias(job_id)
    return () if tail is None else (tail,)


def result_values(policy: ProviderPolicy, body: Any) -> tuple[str, ...]:
    """The values of the result route's ``{final.<field>}`` placeholders in a final answer
    that can address the result (``addressable``), in order, without repeats."""
    route = policy.routes.result
    if route is None:
        return ()
    found: list[str] = []
    for name in placeholders(route.path):
        if name.startswith("final."):
            value = addressable(lookup(body, name.removeprefix("final.")))
            if value is not None and value not in found:
                found.append(value)
    return tuple(found)


_PROBLEM_FOR = {
    AnswerKind.PENDING: None,
    AnswerKind.THROTTLED: "provider-rate-limited",
    AnswerKind.NOT_VISIBLE: "job-not-visible-yet",
}


def _schedule(
    policy: ProviderPolicy,
    record: OperationRecord,
    answer: ProviderAnswer,
    now: float,
    u: float,
    kind: AnswerKind,
    hint: Guidance,
    seen: dict[str, Any] | None = None,
) -> Decision:
    """Set next_poll_at (or escalate when the provider asks to wait past the deadline);
    ``seen``: further changes to make in the same copy of ``record``."""
    the_plan = plan(
        policy.polling,
        now=now,
        deadline_at=record.deadline_at,
        attempt=record.status_requests_used,
        u=u,
        kind=kind,
        hint=hint,
    )
    if the_plan.beyond_deadline:
        detail = "the provider asked to wait past the operation's deadline"
        decision = escalate(policy, record, Reason.DEADLINE_EXCEEDED, now, detail, **(seen or {}))
        return decision.evolve(plan=the_plan)
    next_poll_at = the_plan.next_poll_at
    if kind is AnswerKind.PENDING and policy.pushes is not None:  # SPEC 23: fallback_delay
        latest = record.deadline_at - policy.polling.final_poll_margin
        next_poll_at = max(next_poll_at, min(now + policy.pushes.fallback_delay, latest))
        the_plan = dataclasses.replace(the_plan, next_poll_at=next_poll_at)
    new = record.evolve(**(seen or {}), next_poll_at=next_poll_at, delay_source=the_plan.source)
    if kind is AnswerKind.UNAVAILABLE:
        problem: str | None = (
            "provider-timeout" if answer.failure is Failure.TIMEOUT else "provider-unavailable"
        )
    else:
        problem = _PROBLEM_FOR[kind]
    return Decision(
        new,
        Reply.PROBLEM if problem else Reply.PROVIDER,
        changed=True,
        problem=problem,
        retry_after=max(0.0, the_plan.next_poll_at - now),
        event=Event.POLLED,
        plan=the_plan,
    )


def _hint(
    policy: ProviderPolicy, answer: ProviderAnswer, body: Mapping[str, Any] | None, now: float
) -> Guidance:
    hints = policy.hints
    poll_after = (
        lookup(body, hints.poll_after_seconds) if body and hints.poll_after_seconds else None
    )
    next_check = lookup(body, hints.next_check_at) if body and hints.next_check_at else None
    return guidance(answer.retry_after, poll_after, next_check, now)


def present(body: Any, field: RequiredField) -> bool:
    """A required field is present (and not null, unless the policy allows null)."""
    if field.allow_null:
        parent, _, leaf = field.path.rpartition(".")
        node = lookup(body, parent) if parent else body
        return isinstance(node, dict) and leaf in node
    return lookup(body, field.path) is not None


def _json(body: bytes) -> Any:
    return parse_json(body)


def state_text(state: Any) -> str:
    """A state as recorded and shown: strings as they are, other JSON scalars as JSON,
    bounded (core/values.py: a provider's value can be of any size)."""
    return bounded(state if isinstance(state, str) else json.dumps(state))


def _short(state: str) -> str:
    return json.dumps(state[:80])
