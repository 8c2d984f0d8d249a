"""What a verified provider push means for an operation (SPEC 23). Pure: no I/O, no clock
(instants are passed in), no signature checks (provider/pushes.py verifies before anything
here runs).

A push is read into a ``Reading`` (the job it names, the state it reports, the status object
it carries); ``step`` then says what to do with the operation: end it from the push as a
status answer with that state would (``APPLIED``), poll once at once (``POLL``: a thin push,
which names the job but not a usable state, or a success without what ``success_requires``
needs), or nothing (``PENDING``: the job is still running; ``IGNORED``: the operation stopped
waiting already).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from gateway.core import decide
from gateway.core.decide import Decision
from gateway.core.models import OperationRecord, Outcome, ProviderAnswer
from gateway.core.values import lookup, parse_json
from gateway.settings.policy import ProviderPolicy
from gateway.settings.push import Push


class Step(enum.StrEnum):
    APPLIED = "applied"  # the push ended the operation (or changed it) as a status answer
    POLL = "polled"  # a thin push: one poll at once
    PENDING = "pending"  # the push says the job is still running: nothing to do
    IGNORED = "ignored"  # the operation stopped waiting already


@dataclass(frozen=True, slots=True)
class Reading:
    """A push body as the policy reads it."""

    job_id: str | None
    state: Any  # a JSON scalar, or None when the push reports none
    status_object: dict[str, Any] | None  # the job object as the status route answers it


def read(push: Push, body: bytes) -> Reading | None:
    """The push's job id, state and status object; None when the body is not a JSON
    object."""
    data = parse_json(body)
    if not isinstance(data, dict):
        return None
    raw_id = lookup(data, push.job_id.path)
    job_id = str(raw_id) if isinstance(raw_id, str | int) and not isinstance(raw_id, bool) else None
    state: Any = None
    if push.state.path is not None:
        found = lookup(data, push.state.path)
        state = found if isinstance(found, str | int | float | bool) else None
    elif push.state.events:
        event = lookup(data, push.state.event_path)
        state = push.state.events.get(event) if isinstance(event, str) else None
    where = push.object
    obj = None if where is None else data if where == "." else lookup(data, where)
    return Reading(job_id, state, obj if isinstance(obj, dict) else None)


@dataclass(frozen=True, slots=True)
class Action:
    step: Step
    decision: Decision | None = None  # APPLIED: the write; POLL: the record made due now


def step(
    policy: ProviderPolicy,
    record: OperationRecord,
    reading: Reading,
    now: float,
    u: float,
    *,
    announce: bool = False,
) -> Action:
    """What a verified push for ``record`` does. A push whose state the state table
    classifies is applied when its status object holds that same state (and, on success,
    what ``success_requires`` needs): the record is updated exactly as a status answer
    carrying that object would update it. A push with no usable state, or whose object does
    not back it, makes the operation due now for one poll."""
    if record.outcome is not Outcome.PENDING:
        return Action(Step.IGNORED)
    kind = policy.state_class(reading.state) if reading.state is not None else None
    if kind == "pending":
        return Action(Step.PENDING)
    obj = reading.status_object
    if kind is not None and obj is not None and _backs(policy, obj, kind):
        answer = ProviderAnswer(200, json.dumps(obj).encode(), "application/json")
        decision = decide.classify(policy, record, answer, now, u, announce=announce)
        if decision.record.outcome is not Outcome.ESCALATED:
            return Action(Step.APPLIED, decision)
    return Action(Step.POLL, _due_now(record, now))


def _backs(policy: ProviderPolicy, obj: dict[str, Any], kind: str) -> bool:
    """The status object holds a state of the same class (and, on success, every required
    field): it can stand for a status answer."""
    own = lookup(obj, policy.states.field)
    if own is None or isinstance(own, dict | list) or policy.state_class(own) != kind:
        return False
    if kind == "success":
        return all(decide.present(obj, field) for field in policy.states.required())
    return True


def _due_now(record: OperationRecord, now: float) -> Decision:
    """The record with its next poll moved to ``now`` (never later than it was)."""
    due = record.evolve(next_poll_at=min(record.next_poll_at, now))
    return Decision(due, decide.Reply.PROBLEM, changed=due != record)
