"""The operator API under ``/admin`` (SPEC section 6): list, show, extend, cancel, abandon,
resume. Operator tokens or the OIDC issuer's JWTs only; an agent token is ``forbidden``.

- ``GET /admin/operations?outcome=&provider=&account=&limit=&cursor=``: newest first,
  ``{"operations": [...], "next_cursor": "..." | null}``. The cursor is opaque (the last
  listed operation's start time and id), so operations created meanwhile never make a
  later page repeat or skip one; ``limit`` is 1 to 500 (default 100).
- ``GET /admin/escalations?limit=``: the queue of escalated operations waiting on a person,
  oldest escalation first, each with its reason, age (by the gateway's clock), permitted
  actions and message; ``total`` counts them all.
- ``GET /admin/operations/{id}``: the record, the escalation, the message, the audit story
  (every replica's lines on PostgreSQL, each naming its replica, also as ``story_lines``),
  and ``extension_left`` (what ``escalation.max_extension`` still allows, or null).
- ``POST /admin/operations/{id}/{extend|cancel|abandon|resume}``, ``POST /admin/reload``.
- ``GET /admin/me``: who the token names, their role and what it may do.

Reading needs the viewer role, a decision the decider role, a reload the admin role
(access.require; ``403 forbidden-role`` below it).

Each action is a pure function of actions.py applied to the freshest record inside one
compare-and-set, and audited with the operator's id before the answer goes back.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.core import actions, effects
from gateway.core.cursors import cursor_after, position
from gateway.core.decide import extension_left
from gateway.core.effects import iso
from gateway.core.escalation import message, problem_members
from gateway.core.models import (
    Event,
    OperationFilter,
    OperationRecord,
    Outcome,
)
from gateway.core.roles import NEEDS, capabilities
from gateway.core.story import labels, told
from gateway.flow import cancels, polls, reloading
from gateway.flow.runtime import RUNTIME, Runtime
from gateway.http.bodies import read_limited
from gateway.http.problems import problem
from gateway.observe import stories
from gateway.observe.mirror import replica_name
from gateway.operator import access
from gateway.settings.policy import ProviderPolicy
from gateway.settings.units import format_duration, parse_duration, rfc3339

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_LIST = 500


def routes(app: web.Application) -> None:
    app.router.add_get("/admin/me", me)
    app.router.add_get("/admin/operations", list_operations)
    app.router.add_get("/admin/escalations", list_escalations)
    app.router.add_get("/admin/operations/{operation_id}", show_operation)
    app.router.add_post("/admin/operations/{operation_id}/{action}", act)
    app.router.add_post("/admin/reload", reload_config)


async def me(request: web.Request) -> web.StreamResponse:
    """Who the token names and what their role may do (the console shows it)."""
    found = await access.caller(request)
    if isinstance(found, web.Response):
        return found
    expires = rfc3339(found.expires_at) if found.expires_at is not None else None
    body = {
        "id": found.id,
        "role": found.role,
        "via": found.via,
        "may": capabilities(found.role),
        "expires_at": expires,
    }
    return web.json_response(body)


def view(record: OperationRecord) -> dict[str, Any]:
    """A record as operators read it: instants in RFC 3339, the final body as text."""
    data = record.to_dict()
    for name in (
        "started_at",
        "deadline_at",
        "next_poll_at",
        "last_polled_at",
        "ended_at",
        "cancel_requested_at",
        "inflight_at",
    ):
        data[name] = iso(data[name])
    if record.next_copy_at is not None:  # kept results: no copy try before then
        data["next_copy_at"] = iso(record.next_copy_at)
    if record.final_response is not None:
        data["final_response"]["body"] = record.final_response.body.decode("utf-8", "replace")
    if record.last_answer is not None:
        data["last_answer"]["body"] = record.last_answer.body.decode("utf-8", "replace")
        data["last_answer"]["at"] = iso(record.last_answer.at)
    if record.escalation is not None:
        data["escalation"]["at"] = iso(record.escalation.at)
    data["usage"] = dict(record.usage)  # SPEC 23: shown even while empty
    data["announce"] = record.announce
    return data


async def list_operations(request: web.Request) -> web.StreamResponse:
    operator = await access.require(request, NEEDS["read"])
    if isinstance(operator, web.Response):
        return operator
    query = request.query
    try:
        outcome = Outcome(query["outcome"]) if query.get("outcome") else None
        limit = _limit(query.get("limit"))
        before = position(query["cursor"]) if query.get("cursor") else None
    except ValueError as exc:
        return problem("invalid-request", f"Bad query: {exc}.")
    where = OperationFilter(
        outcome=outcome,
        provider=query.get("provider") or None,
        account=query.get("account") or None,
        limit=limit + 1,  # one more than shown: whether there is a next page
        before=before,
    )
    found = await request.app[RUNTIME].records.list(where)
    shown = found[:limit]
    more = len(found) > limit
    next_cursor = cursor_after(shown[-1]) if more and shown else None
    return web.json_response({"operations": [view(r) for r in shown], "next_cursor": next_cursor})


def _limit(text: str | None, default: int = 100) -> int:
    if not text:
        return default
    try:
        limit = int(text)
    except ValueError:
        raise ValueError(f"limit must be a whole number from 1 to {MAX_LIST}") from None
    if not 1 <= limit <= MAX_LIST:
        raise ValueError(f"limit must be a whole number from 1 to {MAX_LIST}")
    return limit


async def list_escalations(request: web.Request) -> web.StreamResponse:
    """The queue: escalated operations, oldest escalation first (the console's front page)."""
    operator = await access.require(request, NEEDS["read"])
    if isinstance(operator, web.Response):
        return operator
    try:
        limit = _limit(request.query.get("limit"))
    except ValueError as exc:
        return problem("invalid-request", f"Bad query: {exc}.")
    runtime = request.app[RUNTIME]
    waiting, total = await runtime.records.escalation_queue(limit)  # an index: reads ``limit``
    now = runtime.clock()
    queue = [_queued(runtime, record, now) for record in waiting]
    return web.json_response({"escalations": queue, "total": total, "now": rfc3339(now)})


def _queued(runtime: Runtime, record: OperationRecord, now: float) -> dict[str, Any]:
    escalation = record.escalation
    at = escalation.at if escalation is not None else record.started_at
    policy = runtime.settings.policies.get(record.provider)
    text = (
        message(record, policy)
        if policy is not None
        else f"No policy is loaded for {record.provider!r}: load it again to decide."
    )
    return {
        "operation_id": record.operation_id,
        "provider": record.provider,
        "account": record.account,
        "provider_job_id": record.provider_job_id,
        "reason": escalation.reason.value if escalation is not None else None,
        "escalated_at": rfc3339(at),
        "age_seconds": max(0.0, now - at),
        "permitted_actions": list(actions.offered(policy, record)) if policy else [],
        "status_requests_used": record.status_requests_used,
        "max_status_requests": record.max_status_requests,
        "message": text,
    }


async def show_operation(request: web.Request) -> web.StreamResponse:
    operator = await access.require(request, NEEDS["read"])
    if isinstance(operator, web.Response):
        return operator
    runtime = request.app[RUNTIME]
    record = await _record(runtime, request.match_info["operation_id"])
    if isinstance(record, web.Response):
        return record
    policy = runtime.settings.policies.get(record.provider)
    body: dict[str, Any] = {"record": view(record), "escalation": None, "message": None}
    if record.escalation is not None and policy is not None:
        body["escalation"] = problem_members(record, policy)
        body["message"] = message(record, policy)
    body["extension_left"] = _extension_left(policy, record)
    body.update(await _story(runtime, record.operation_id))
    return web.json_response(body)


async def _story(runtime: Runtime, operation_id: str) -> dict[str, Any]:
    """The story from this replica's audit file and, on a store that keeps every
    replica's lines (PostgreSQL), from every replica, each line naming its replica;
    ``story_lines`` says the same as data; ``story_note`` why lines may be missing."""
    audit, lines = runtime.effects.audit, runtime.store.audit_lines
    replica = replica_name(runtime.settings.file.audit.replica)
    path = audit.path if audit is not None else None
    entries, note = await stories.gathered(operation_id, path=path, replica=replica, lines=lines)
    named = lines is not None
    names = labels(entries)
    shown = [
        {"at": e.line.get("at"), "replica": names[e.chain], "seq": e.seq}
        | {"event": e.line.get("event")}
        for e in entries
    ]
    return {"story": told(entries, named=named), "story_lines": shown, "story_note": note}


def _extension_left(policy: ProviderPolicy | None, record: OperationRecord) -> Any:
    """What ``escalation.max_extension`` still allows this operation, or None when spent."""
    left = extension_left(policy, record) if policy is not None else None
    if policy is None or left is None:
        return None
    bound = policy.escalation.max_extension
    return {
        "time": format_duration(left[0]),
        "seconds": left[0],
        "requests": left[1],
        "max_time": format_duration(bound.time),
        "max_requests": bound.requests,
    }


async def reload_config(request: web.Request) -> web.StreamResponse:
    """Re-read the config and every policy; 422 config-rejected with the check messages."""
    operator = await access.require(request, NEEDS["reload"])
    if isinstance(operator, web.Response):
        return operator
    runtime = request.app[RUNTIME]
    problems = await reloading.reload(runtime)
    if not problems:
        reloading.reload_all()  # with --workers, the other workers reload too
    if problems:
        detail = f"{len(problems)} problem(s); the running config and policies stay in force."
        return problem("config-rejected", detail, extra={"problems": problems})
    policies = sorted(runtime.settings.policies)
    return web.json_response({"result": "ok", "policies": policies, "actor": operator.id})


async def _record(runtime: Runtime, operation_id: str) -> OperationRecord | web.Response:
    record = await runtime.records.get(operation_id)
    if record is None:
        return problem("unknown-operation", f"No operation {operation_id!r}.")
    return record


async def act(request: web.Request) -> web.StreamResponse:
    operator = await access.require(request, NEEDS["decide"])
    if isinstance(operator, web.Response):
        return operator
    action = request.match_info["action"]
    if action not in ("extend", "cancel", "abandon", "resume"):
        return problem("route-not-allowed", "Actions are extend, cancel, abandon and resume.")
    runtime = request.app[RUNTIME]
    record = await _record(runtime, request.match_info["operation_id"])
    if isinstance(record, web.Response):
        return record
    policy = runtime.settings.policies.get(record.provider)
    if policy is None:
        return problem("action-not-permitted", f"No policy is loaded for {record.provider!r}.")
    try:
        asked = await _action_body(request)
    except ValueError as exc:
        return problem("invalid-request", f"Bad request body: {exc}.")
    now = runtime.clock()
    answer = None
    if action == "cancel":  # sent once, under the operation's lease (flow/cancels.py)
        request_sent = cancels.gateway_request(policy, record)
        sent = await cancels.cancel_at_provider(runtime, policy, record, request_sent, asked.reason)
        if sent.result is None:
            return _not_permitted(sent.record, sent.refusal or "not permitted")
        record, answer, result = sent.record, sent.answer, sent.result
    else:
        change = _change(action, policy, now, asked)
        result = await runtime.records.mutate(record.operation_id, change)
    status = answer.status if answer is not None else None
    if result.record is None:
        if answer is not None:  # the cancel reached the provider: its line all the same
            await _refused_cancel(runtime, record, status, operator.id, result)
        return _not_permitted(record, result.refusal or "not permitted")
    done = effects.of_action(
        policy,
        result.record,
        result.event,
        runtime.clock(),
        actor=operator.id,
        detail=result.detail,
        http_status=status,
    )
    await runtime.effects.carry_out(done)
    if result.event in (Event.EXTENDED, Event.RESUMED):  # waiting resumed: learn the state
        runtime.spawn(polls.after_decision(runtime, policy, result.record.operation_id))
    return web.json_response({"action": action, "record": view(result.record)})


@dataclass(frozen=True, slots=True)
class _Asked:
    """An action's request body: why, and for extend how much more time and requests."""

    reason: str
    seconds: float
    requests: int


async def _action_body(request: web.Request) -> _Asked:
    """The action's body read and checked; ValueError says what is wrong with it."""
    body = await json_body(request)
    reason = body.get("reason", "")
    if not isinstance(reason, str):
        raise ValueError("reason must be a string")
    seconds = parse_duration(body["time"]) if "time" in body else 0.0
    requests = body.get("requests", 0)
    if not isinstance(requests, int) or isinstance(requests, bool):
        raise ValueError("requests must be a whole number")
    return _Asked(reason[:500], seconds, requests)


def _change(
    action: str, policy: ProviderPolicy, now: float, asked: _Asked
) -> Callable[[OperationRecord], tuple[OperationRecord | None, actions.ActionResult]]:
    """The record change of extend, resume or abandon, for ``records.mutate``."""

    def change(current: OperationRecord) -> tuple[OperationRecord | None, actions.ActionResult]:
        if action == "extend":
            done = actions.extend(
                policy,
                current,
                now,
                seconds=asked.seconds,
                requests=asked.requests,
                reason=asked.reason,
            )
        elif action == "resume":
            done = actions.resume(policy, current, now)
        else:
            done = actions.abandon(policy, current, now, asked.reason)
        return done.record, done

    return change


async def _refused_cancel(
    runtime: Runtime,
    record: OperationRecord,
    status: int | None,
    actor: str,
    result: actions.ActionResult,
) -> None:
    """A cancel the provider got but the record refused still has its audit line."""
    line = effects.of_call(
        runtime.clock(),
        provider=record.provider,
        account=record.account,
        event=Event.CANCELLED,
        http_status=status,
        detail=f"refused by {actor}'s request: {result.refusal}",
        operation=record,
    )
    await runtime.effects.carry_out(line)


def _not_permitted(record: OperationRecord, why: str) -> web.Response:
    return problem("action-not-permitted", f"Refused: {why}.", operation_id=record.operation_id)


async def json_body(request: web.Request) -> dict[str, Any]:
    limits = request.app[RUNTIME].settings.file.limits
    raw = await read_limited(request, limits.max_request_body, limits.body_timeout)
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # deeply nested JSON is refused, not a crash
        raise ValueError("not JSON (or nested too deeply)") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data
