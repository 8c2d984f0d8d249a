"""MCP tasks for wait_for_operation: the task id is the operation id (SPEC 15).

Two wire formats, chosen per request by what the client negotiated:

- the tasks utility of revision 2025-11-25 (``tools/call`` with a ``task`` param answered by
  ``CreateTaskResult {task}``; ``tasks/get``, blocking ``tasks/result``, ``tasks/list``;
  ``ttl`` and ``pollInterval`` in milliseconds);
- the ``io.modelcontextprotocol/tasks`` extension, when the client declares it (at
  initialize or in the request's ``_meta`` client capabilities; the only tasks of
  2026-07-28): ``resultType: "task"``, ``ttlMs``, ``pollIntervalMs``, the final result
  inline in ``tasks/get``, ack-only ``tasks/update``, ``tasks/cancel`` refused as
  approval-required unless the policy lets agents cancel, no ``tasks/list`` or ``tasks/result``.

Statuses: pending -> working; escalated -> working, its statusMessage naming the reason (an
operator may still resume it); succeeded -> completed; failed, expired, abandoned -> failed;
cancelled -> cancelled. A ``tasks/get`` before the next permitted poll is answered from the
record and counted as a refused (too-early) status call; one when a poll is due makes at
most that poll (caller.look). Never cancels or changes an operation, except a
``tasks/cancel`` where the policy lets agents cancel (``routes.cancel.by: agent``): then
the provider's cancel route, sent once (flow/cancels.py).
"""

from __future__ import annotations

import math
from typing import Any

from gateway.core import effects
from gateway.core.cursors import cursor_after, position
from gateway.core.models import OperationFilter, OperationRecord, Outcome
from gateway.flow import cancels
from gateway.http.mcp import tools
from gateway.http.mcp.caller import Caller, Refused, look, owned, policy_of, wait
from gateway.http.mcp.jsonrpc import (
    APPROVAL_REQUIRED,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    OPERATION_ENDED,
    RpcError,
)
from gateway.settings.policy import ProviderPolicy
from gateway.settings.units import rfc3339

STATUS = {
    Outcome.PENDING: "working",
    Outcome.ESCALATED: "working",
    Outcome.SUCCEEDED: "completed",
    Outcome.FAILED: "failed",
    Outcome.EXPIRED: "failed",
    Outcome.ABANDONED: "failed",
    Outcome.CANCELLED: "cancelled",
}
MIN_POLL_MS = 250  # a poll already due is suggested this soon, never as a tight loop
ESCALATED_POLL_MS = 60_000  # an escalation waits on a person: look again in a minute
RESULT_RECHECK = 5.0  # seconds between looks at an escalated task while tasks/result blocks
LIST_PAGE = 100
RELATED = "io.modelcontextprotocol/related-task"
IMMEDIATE = "io.modelcontextprotocol/model-immediate-response"


def status(record: OperationRecord) -> str:
    return STATUS[record.outcome]


def done(record: OperationRecord) -> bool:
    return status(record) != "working"


def message(record: OperationRecord) -> str:
    state = f" (provider state {record.last_known_state})" if record.last_known_state else ""
    if record.outcome is Outcome.PENDING:
        due = rfc3339(record.next_poll_at, millis=True)
        return f"pending{state}; the next status request is permitted at {due}"
    if record.outcome is Outcome.ESCALATED and record.escalation is not None:
        actions = ", ".join(record.escalation.permitted_actions) or "none"
        reason = record.escalation.reason.value
        return f"escalated: {reason}; waiting for an operator (permitted actions: {actions})"
    if record.outcome is Outcome.ABANDONED:
        return "abandoned by an operator"
    return f"{record.outcome.value} at the provider{state}"


def poll_ms(record: OperationRecord, now: float) -> int | None:
    """Milliseconds to the next permitted poll (SPEC 21); MIN_POLL_MS when one is due now
    (the look that makes it is in flight), a minute while an operator decides, none once
    done."""
    if record.outcome is Outcome.ESCALATED:
        return ESCALATED_POLL_MS
    if record.outcome is not Outcome.PENDING:
        return None
    due = math.ceil((record.next_poll_at - now) * 1000)
    return due if due > 0 else MIN_POLL_MS


def ttl_ms(record: OperationRecord, policy: ProviderPolicy | None) -> int | None:
    """How long the record is kept from its start: until its retention after it ended (or
    after its deadline while it waits); None (unlimited) when no policy would purge it."""
    if policy is None:
        return None
    end = record.ended_at if record.ended_at is not None else record.deadline_at
    return max(0, math.ceil((end + policy.retention - record.started_at) * 1000))


def _fields(record: OperationRecord) -> dict[str, Any]:
    instants = [
        record.started_at,
        record.last_polled_at,
        record.ended_at,
        record.cancel_requested_at,
        record.escalation.at if record.escalation is not None else None,
    ]
    return {
        "taskId": record.operation_id,
        "status": status(record),
        "statusMessage": message(record),
        "createdAt": rfc3339(record.started_at, millis=True),
        "lastUpdatedAt": rfc3339(max(t for t in instants if t is not None), millis=True),
    }


def legacy(record: OperationRecord, policy: ProviderPolicy | None, now: float) -> dict[str, Any]:
    """A 2025-11-25 Task."""
    task = {**_fields(record), "ttl": ttl_ms(record, policy)}
    interval = poll_ms(record, now)
    if interval is not None:
        task["pollInterval"] = interval
    return task


def extension(record: OperationRecord, policy: ProviderPolicy | None, now: float) -> dict[str, Any]:
    """An io.modelcontextprotocol/tasks Task."""
    task = {**_fields(record), "ttlMs": ttl_ms(record, policy)}
    interval = poll_ms(record, now)
    if interval is not None:
        task["pollIntervalMs"] = interval
    return task


# -- methods ---------------------------------------------------------------------------------


def create(caller: Caller, record: OperationRecord, *, legacy_shape: bool) -> dict[str, Any]:
    """The answer to a task-augmented wait_for_operation: the task as the record has it (no
    provider call: the operation is already durable, so tasks/get resolves at once)."""
    now, policy = caller.runtime.clock(), policy_of(caller, record)
    if not legacy_shape:
        return {"resultType": "task", **extension(record, policy, now)}
    hint = (
        f"Waiting for operation {record.operation_id} as task {record.operation_id}: "
        f"poll tasks/get, then tasks/result."
    )
    return {"task": legacy(record, policy, now), "_meta": {IMMEDIATE: hint}}


async def _task(caller: Caller, params: dict[str, Any]) -> OperationRecord:
    task_id = params.get("taskId")
    if not isinstance(task_id, str):
        raise RpcError(INVALID_PARAMS, "Invalid params: taskId must be a string.")
    record = await owned(caller, task_id)
    if record is None:
        raise RpcError(INVALID_PARAMS, "Failed to retrieve task: Task not found")
    return record


def early(record: OperationRecord, now: float) -> bool:
    """A look before the next permitted poll: the record is the answer (SPEC 21)."""
    return record.outcome is Outcome.PENDING and now < record.next_poll_at


def _refused(caller: Caller, record: OperationRecord, now: float) -> None:
    """An early tasks/get counted as an agent's too-early status call is: the metric, and
    the operation's refusal window (one audit line when it closes)."""
    metrics = caller.runtime.effects.metrics
    metrics.agent_requests.labels(record.provider, "status", "too-early").inc()
    caller.runtime.refusals.note(record, now)


async def get(caller: Caller, params: dict[str, Any], *, legacy_shape: bool) -> dict[str, Any]:
    record = await _task(caller, params)
    if early(record, caller.runtime.clock()):
        _refused(caller, record, caller.runtime.clock())
    else:
        record = await look(caller, record)
    now, policy = caller.runtime.clock(), policy_of(caller, record)
    if legacy_shape:
        return legacy(record, policy, now)
    answer = {"resultType": "complete", **extension(record, policy, now)}
    if status(record) == "completed":
        answer["result"] = tools.waited(caller, record, 0.0, 0.0)
    elif status(record) == "failed":
        data = tools.waited(caller, record, 0.0, 0.0)["structuredContent"]
        answer["error"] = {"code": OPERATION_ENDED, "message": message(record), "data": data}
    return answer


async def result(caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
    """2025-11-25 tasks/result: blocks until the task is done (holding and polling as the
    schedule permits), then exactly what wait_for_operation answers for it. The block is
    capped like a wait, at the policy's ``max_hold``: an operation still pending or
    escalated by then is answered as wait_for_operation answers it (its outcome says so),
    so a call on an escalated operation cannot hang for as long as no operator decides."""
    runtime = caller.runtime
    record = await _task(caller, params)
    started = runtime.clock()
    policy = policy_of(caller, record)
    cap = policy.polling.max_hold if policy is not None else RESULT_RECHECK
    while not done(record) and runtime.clock() - started < cap:
        if caller.gone():
            raise RpcError(INTERNAL_ERROR, "The client went away.")
        fresh = await _progress(caller, record, cap - (runtime.clock() - started))
        if fresh is None:
            raise RpcError(INTERNAL_ERROR, "The gateway is stopping; ask for the result again.")
        record = fresh
    answer = tools.waited(caller, record, runtime.clock() - started, 0.0)
    answer["_meta"] = {RELATED: {"taskId": record.operation_id}}
    return answer


async def _progress(caller: Caller, record: OperationRecord, left: float) -> OperationRecord | None:
    """One round of waiting, at most ``left`` seconds, for a task that is not done; None
    when the gateway stops."""
    runtime = caller.runtime
    began, hold = runtime.clock(), max(0.0, left)
    if record.outcome is Outcome.PENDING:
        try:
            record = await wait(caller, record, hold)
        except Refused as refused:
            raise RpcError(INTERNAL_ERROR, refused.detail, refused.problem()) from None
        if done(record):
            return record
        hold = max(0.0, left - (runtime.clock() - began))
    pause = min(hold, RESULT_RECHECK)
    if record.outcome is Outcome.PENDING:
        pause = min(hold, max(0.005, record.next_poll_at - runtime.clock()))
    if pause <= 0:
        return record
    if not await runtime.park(pause):
        return None
    fresh = await owned(caller, record.operation_id)
    if fresh is None:
        raise RpcError(INVALID_PARAMS, "Failed to retrieve task: Task has expired")
    return fresh


async def listing(caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
    """2025-11-25 tasks/list: every operation of the account (each is a task), newest
    first, in pages with an opaque nextCursor."""
    before = _position(params.get("cursor"))
    where = OperationFilter(account=caller.account.id, limit=LIST_PAGE + 1, before=before)
    found = await caller.runtime.records.list(where)
    page, now = found[:LIST_PAGE], caller.runtime.clock()
    answer: dict[str, Any] = {"tasks": [legacy(r, policy_of(caller, r), now) for r in page]}
    if len(found) > LIST_PAGE and page:
        answer["nextCursor"] = cursor_after(page[-1])
    return answer


def _position(cursor: Any) -> tuple[float, str] | None:
    if cursor is None:
        return None
    try:
        return position(cursor)
    except ValueError:
        raise RpcError(
            INVALID_PARAMS, "Invalid params: the cursor is not one this server gave."
        ) from None


async def acknowledge(caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
    """Extension tasks/update: an ack for a task of the account. Nothing changes: these
    tasks never ask for input."""
    await _task(caller, params)
    return {"resultType": "complete"}


async def cancel(caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
    """Extension tasks/cancel. A task already done has nothing to cancel: acknowledged.
    Where the policy lets agents cancel (``routes.cancel.by: agent``, SPEC 20a) a pending
    operation's cancel route is sent once for the account, as the HTTP cancel route does
    (a second tasks/cancel is acknowledged from the record), and the task keeps working
    until the provider reports the outcome. Otherwise refused as ``approval-required``, as
    an agent's call to an operator-only cancel route is: an operator's decision."""
    record = await _task(caller, params)
    if done(record):
        return {"resultType": "complete"}
    policy = policy_of(caller, record)
    route = policy.routes.cancel if policy is not None else None
    by_agent = route is not None and route.by == "agent" and caller.account.allows(record.provider)
    if policy is not None and by_agent and record.outcome is Outcome.PENDING:
        return await _cancel_by_agent(caller, policy, record)
    detail = (
        "Cancelling a provider job is an operator decision: ask an operator to use "
        f"POST /admin/operations/{record.operation_id}/cancel (or abandon it)."
    )
    problem = Refused("approval-required", detail, record.operation_id).problem()
    raise RpcError(APPROVAL_REQUIRED, f"approval-required: {detail}", problem)


async def _cancel_by_agent(
    caller: Caller, policy: ProviderPolicy, record: OperationRecord
) -> dict[str, Any]:
    """The provider's cancel route sent once for the caller's pending operation (flow/
    cancels.py), audited ``cancel_requested`` with the account; acknowledged once a cancel
    is accepted (now or before), an error naming why when the provider did not accept."""
    runtime = caller.runtime
    if record.cancel_requested_at is None:
        request = cancels.gateway_request(policy, record)
        sent = await cancels.cancel_at_provider(runtime, policy, record, request)
        if sent.answer is not None and sent.result is not None:
            line = effects.of_agent_cancel(
                policy,
                sent.record,
                caller.account.id,
                runtime.clock(),
                http_status=sent.answer.status,
                accepted=sent.result.detail if sent.result.record is not None else None,
                refusal=sent.result.refusal,
            )
            await runtime.effects.carry_out(line)
        record = sent.record
        if record.cancel_requested_at is None and not done(record):
            slug = "too-early" if sent.busy else "action-not-permitted"
            detail = f"The cancel was not accepted: {sent.refusal}; try again later."
            problem = Refused(slug, detail, record.operation_id).problem()
            raise RpcError(INTERNAL_ERROR, f"{slug}: {detail}", problem)
    return {"resultType": "complete"}
