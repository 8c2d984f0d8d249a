"""The three A2A calls the gateway serves, on the provider machinery (SPEC 24): SendMessage
is a submit (``http.submit.run``) or, for a task of the caller's, a follow-up; GetTask a
status call (decide.admit, the shared poll, the hold); CancelTask the cancel route under
``routes.cancel.by``. Each returns the answer the /p/ machinery would give (the provider's
JSON or a problem+json) and the task as it stands; wire.py says it in the caller's binding.

Talks A2A 1.0 over HTTP+JSON to the remote agent whatever the caller spoke (the gateway
converts 0.3 calls), with ``A2A-Version: 1.0`` on every call. Never decides a rule itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from gateway.core import a2a, decide, effects
from gateway.core.decide import Decision, Reply
from gateway.core.models import Event, OperationRecord, Outcome
from gateway.core.routing import Match
from gateway.flow import cancels
from gateway.flow.a2a import note_task
from gateway.flow.polls import gone, held, may_hold, record_asker, shared_poll
from gateway.flow.runtime import OUTCOME, ROUTE
from gateway.http.answers import Call, operation_headers, passthrough, render, upstream_problem
from gateway.http.lane import LaneRequest
from gateway.http.problems import problem
from gateway.http.proxy import find_job
from gateway.http.submit import Submission, run
from gateway.provider.headers import to_provider
from gateway.provider.send import send_upstream
from gateway.settings.a2a import VERSION

PUSH_PATH = "/a2a/{provider}/push"  # the gateway's push target for a provider's tasks


@dataclass(frozen=True, slots=True)
class Answer:
    """What a call came to: the /p/-style answer and, when there is one, the task."""

    response: web.StreamResponse
    task: dict[str, Any] | None = None


def _headers() -> list[tuple[str, str]]:
    return [("Content-Type", "application/json"), ("A2A-Version", VERSION)]


def _json(response: web.StreamResponse) -> Any:
    body = response.body if isinstance(response, web.Response) else None
    if not isinstance(body, bytes) or not 200 <= response.status < 300:
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _task_of(value: Any) -> dict[str, Any] | None:
    """The Task in a SendMessage answer (``{"task": ...}``) or a bare Task."""
    if isinstance(value, dict) and isinstance(value.get("task"), dict):
        value = value["task"]
    if isinstance(value, dict) and isinstance(value.get("status"), dict) and "id" in value:
        task: dict[str, Any] = value
        return task
    return None


def standing(record: OperationRecord, fallback: dict[str, Any] | None) -> dict[str, Any] | None:
    """The task as the record has it: its final answer, else the last one recorded."""
    stored = record.final_response or record.last_answer
    if stored is not None:
        try:
            task = _task_of(orjson.loads(stored.body))
        except orjson.JSONDecodeError:
            task = None
        if task is not None:
            return task
    return fallback


# -- SendMessage -----------------------------------------------------------------------


async def send(call: Call, params: dict[str, Any]) -> Answer:
    """A new task (a submit: idempotent on the message id, the task an operation of the
    caller's account) or a follow-up message for one of the account's tasks. A blocking
    send is forwarded non-blocking and the caller held as ``Prefer: wait`` holds."""
    message = params.get("message")
    if not isinstance(message, dict):
        return Answer(problem("invalid-request", "SendMessage needs a message object."))
    config = params.get("configuration")
    config = dict(config) if isinstance(config, dict) else {}
    blocking = config.get("returnImmediately") is not True
    config["returnImmediately"] = True
    # a caller never names the task's push target: the remote agent would push, under the
    # gateway's credential, wherever it said (docs/a2a.md: push config methods refused)
    config.pop("taskPushNotificationConfig", None)
    config.pop("pushNotificationConfig", None)  # the 0.3 name
    task_id = message.get("taskId")
    if isinstance(task_id, str) and task_id:
        return await _follow_up(call, task_id, {**params, "configuration": config}, blocking)
    runtime, policy = call.runtime, call.policy
    if a2a.settings(policy).push and await _pushes(call):
        base = runtime.settings.file.public_base_url
        token = a2a.push_token(a2a.push_key(policy), policy.provider, call.account.id)
        url = base + PUSH_PATH.format(provider=policy.provider)
        config["taskPushNotificationConfig"] = {"url": url, "token": token}
    body = orjson.dumps({**params, "configuration": config}, option=orjson.OPT_SORT_KEYS)
    headers = _headers()
    message_id = message.get("messageId")
    if isinstance(message_id, str) and message_id:
        headers.append(("Idempotency-Key", message_id))
    submit = policy.routes.submit
    match = Match("submit", None, {})
    path = f"/a2a/{policy.provider}{submit.path}"
    sent = Submission("POST", path, "", tuple(headers), body, answers_untracked=True)
    call.request[ROUTE] = "submit"
    response = await run(dataclasses.replace(call, match=match), sent)
    operation_id = response.headers.get("Statusgate-Operation")
    answered = _task_of(_json(response))
    if operation_id is None or answered is None:
        return Answer(response, answered)
    record = await runtime.records.get(operation_id)
    if record is None:
        return Answer(response, answered)
    if record.last_polled_at is None:  # opened pending, but the task ended or escalated at once
        record = await note_task(runtime, policy, record, answered, None, "submitted")
    return await _answer(call, record, response, answered, blocking)


async def _pushes(call: Call) -> bool:
    """The remote agent's card says it sends push notifications."""
    from gateway.http.a2a.card import remote_card

    card = await remote_card(call.runtime, call.policy)
    capabilities = card.get("capabilities") if isinstance(card, dict) else None
    return isinstance(capabilities, dict) and capabilities.get("pushNotifications") is True


async def _follow_up(call: Call, task_id: str, params: dict[str, Any], blocking: bool) -> Answer:
    """A message for a task of the caller's account (the reply to INPUT_REQUIRED, say):
    forwarded, its task recorded, pacing resumed. Another account's task, or none, is
    unknown; an ended one is answered from the record, nothing forwarded."""
    runtime, policy = call.runtime, call.policy
    call.request[ROUTE] = "submit"
    record = await find_job(runtime, call.account.id, policy, task_id)
    if record is None:
        return Answer(problem("unknown-operation", "This account has no task with that id."))
    if record.outcome is not Outcome.PENDING:
        decision = decide.admit(policy, record, runtime.clock())
        call.request[OUTCOME] = "cached"
        response = render(call, decision, None, runtime.clock())
        return Answer(response, standing(record, None))
    url = policy.upstream + policy.routes.submit.path
    body = orjson.dumps(params)
    answer, upstream = await send_upstream(
        runtime.channel(policy),
        policy,
        "submit",
        "POST",
        url,
        to_provider(_headers(), policy),
        body,
        operation_id=record.operation_id,
    )
    headers = operation_headers(record, runtime.clock())
    if upstream is None:
        return Answer(upstream_problem(answer, record.operation_id, headers))
    response = passthrough(call, upstream, headers)
    answered = _task_of(_json(response))
    if answered is None or answered.get("id") != task_id:
        line = effects.of_call(
            runtime.clock(),
            provider=policy.provider,
            account=call.account.id,
            event=Event.MESSAGE_SENT,
            http_status=upstream.status,
            detail="follow-up message, answered without its task",
            operation=record,
        )
        await runtime.effects.carry_out(line)
        return Answer(response, answered)
    record = await note_task(runtime, policy, record, answered, Event.MESSAGE_SENT, "follow-up")
    return await _answer(call, record, response, answered, blocking)


async def _answer(
    call: Call,
    record: OperationRecord,
    response: web.StreamResponse,
    answered: dict[str, Any],
    blocking: bool,
) -> Answer:
    """A send's answer: after the hold a blocking send asked for, the task as it stands."""
    runtime, policy = call.runtime, call.policy
    if blocking and record.outcome is Outcome.PENDING and not a2a.awaits_caller(policy, record):
        limit = policy.polling.max_hold
        if await may_hold(runtime, call.account.id, policy):
            asker = _asker(call, record)
            decision, _ = await held(asker, record, limit, early=False)
            record = decision.record
    task = standing(record, answered)
    for name, value in operation_headers(record, runtime.clock()).items():
        response.headers[name] = value
    return Answer(response, task)


# -- GetTask ---------------------------------------------------------------------------


def _asker(call: Call, record: OperationRecord) -> Any:
    request = call.request
    asker = record_asker(call.runtime, call.policy, record, gone=lambda: gone(request))
    uncancelled = request.uncancelled if isinstance(request, LaneRequest) else None
    return dataclasses.replace(asker, request=request, uncancelled=uncancelled)


async def get(call: Call, task_id: str) -> Answer:
    """A status call: paced by the policy; an early one answered with the last task
    recorded, an ended one from the record, one past budget or deadline escalated."""
    runtime, policy = call.runtime, call.policy
    call.request[ROUTE] = "status"
    record = await find_job(runtime, call.account.id, policy, task_id)
    if record is None:
        return Answer(problem("unknown-operation", "This account has no task with that id."))
    now = runtime.clock()
    decision = decide.admit(policy, record, now)
    if not decision.forward and not decision.changed:
        if decide.holds_early(policy, decision) and await may_hold(
            runtime, call.account.id, policy
        ):
            decision, upstream = await held(_asker(call, record), record, 0.0, early=True)
            return _status_answer(call, decision, render(call, decision, upstream, now))
        if decision.problem == "too-early" or decision.reply is Reply.REPLAY:
            runtime.refusals.note(decision.record, now)
        if decision.reply in (Reply.FINAL, Reply.REPLAY):
            call.request[OUTCOME] = "cached"
        return _status_answer(call, decision, render(call, decision, None, now))
    decision, upstream = await shared_poll(_asker(call, record), record, pace=decision.forward)
    return _status_answer(call, decision, render(call, decision, upstream, runtime.clock()))


def _status_answer(call: Call, decision: Decision, response: web.StreamResponse) -> Answer:
    return Answer(response, _task_of(_json(response)))


# -- CancelTask ------------------------------------------------------------------------


async def cancel(call: Call, task_id: str) -> Answer:
    """``routes.cancel.by: agent``: the caller's own task's cancel sent once, audited
    ``cancel_requested``; the task keeps being polled until the agent reports it. Otherwise
    an operator's decision: refused."""
    runtime, policy = call.runtime, call.policy
    call.request[ROUTE] = "cancel"
    route = policy.routes.cancel
    record = await find_job(runtime, call.account.id, policy, task_id)
    if record is None:
        return Answer(problem("unknown-operation", "This account has no task with that id."))
    if route is None or route.by != "agent":
        detail = "Cancelling a task is an operator decision: ask an operator to use "
        detail += "POST /admin/operations/{id}/cancel."
        return Answer(problem("approval-required", detail, operation_id=record.operation_id))
    decision = decide.cancel_call(record, runtime.clock())
    if decision.forward:
        sent = await cancels.cancel_at_provider(
            runtime, policy, record, cancels.gateway_request(policy, record)
        )
        if sent.answer is not None:
            assert sent.result is not None
            line = effects.of_agent_cancel(
                policy,
                sent.record,
                call.account.id,
                runtime.clock(),
                http_status=sent.answer.status,
                accepted=sent.result.detail if sent.result.record is not None else None,
                refusal=sent.result.refusal,
            )
            await runtime.effects.carry_out(line)
            headers = operation_headers(sent.record, runtime.clock())
            if sent.response is None:
                return Answer(upstream_problem(sent.answer, record.operation_id, headers))
            response = passthrough(call, sent.response, headers)
            return Answer(response, _task_of(_json(response)) or standing(sent.record, None))
        if sent.busy:
            detail = f"Refused: {cancels.BUSY}."
            return Answer(
                problem("too-early", detail, operation_id=record.operation_id, retry_after=1.0)
            )
        decision = decide.cancel_call(sent.record, runtime.clock())
    if decision.reply is not Reply.PROBLEM:
        call.request[OUTCOME] = "cached"
    response = render(call, decision, None, runtime.clock())
    return Answer(response, _task_of(_json(response)) or standing(decision.record, None))
