"""A task the gateway learned of without polling (SPEC 24): the Task a remote agent answered
to a SendMessage (the first one, or a caller's follow-up) or pushed, recorded on the
operation as a status answer with that task would be.

Owns the write: the state table classifies the task (``decide.classify``, the same rule as
a poll's answer), no status request is spent, a poll in flight meanwhile is superseded by
it (its fencing sees the record moved), and the effects (the line naming how the task came,
and an end or an escalation it brought) are carried out before anyone is answered. Never
answers HTTP.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.core import decide, effects
from gateway.core.decide import Decision
from gateway.core.models import Event, OperationRecord, Outcome, ProviderAnswer
from gateway.flow.polls import record_asker, shared_poll
from gateway.flow.runtime import Runtime
from gateway.settings.policy import ProviderPolicy


async def note_task(
    runtime: Runtime,
    policy: ProviderPolicy,
    record: OperationRecord,
    task: dict[str, Any],
    event: Event | None,
    detail: str,
) -> OperationRecord:
    """Record ``task`` on ``record``'s operation while it is pending; the record after it
    (as it stands when the operation had ended or escalated already). ``event`` names the
    line saying how the task came; None when another line says that already (a new task's
    ``submitted``), so only an end or an escalation it brought has lines."""
    answer = ProviderAnswer(200, orjson.dumps(task), "application/json")
    now, u = runtime.clock(), runtime.rng.random()

    def change(current: OperationRecord) -> tuple[OperationRecord | None, Decision | None]:
        if current.outcome is not Outcome.PENDING:
            return None, None
        ended = decide.classify(policy, current, answer, now, u, announce=runtime.announces)
        return decide.as_write(ended)

    decision = await runtime.records.mutate(record.operation_id, change, known=record)
    if decision is None:
        current = await runtime.records.get(record.operation_id)
        return current or record
    found = effects.NONE
    if event is not None:
        found += effects.of_decision(
            policy, decision, now, event=event, http_status=200, detail=detail
        )
    if decision.event in (Event.FINISHED, Event.ESCALATED):
        found += effects.of_decision(policy, decision, now)
    await runtime.effects.carry_out(found)
    return decision.record


async def poll_now(
    runtime: Runtime, policy: ProviderPolicy, record: OperationRecord, state: str
) -> None:
    """A thin push (a status update naming a state the record does not have yet): the
    operation is made due now and polled, within its budget (SPEC 23), so the record gets
    the whole task (its artifacts) from the remote agent. A poll in flight meanwhile may
    have been sent before the push's state: then one more."""
    for _ in range(2):
        await _poll_once(runtime, policy, record)
        current = await runtime.records.get(record.operation_id)
        if current is None or current.outcome is not Outcome.PENDING:
            return
        if current.last_known_state == state:
            return
        record = current


async def _poll_once(runtime: Runtime, policy: ProviderPolicy, record: OperationRecord) -> None:
    now = runtime.clock()

    def due(current: OperationRecord) -> tuple[OperationRecord | None, OperationRecord]:
        if current.outcome is not Outcome.PENDING or current.next_poll_at <= now:
            return None, current
        moved = current.evolve(next_poll_at=now)
        return moved, moved

    current = await runtime.records.mutate(record.operation_id, due, known=record)
    if decide.admit(policy, current, now).forward:
        await shared_poll(record_asker(runtime, policy, current), current, pace=True)
