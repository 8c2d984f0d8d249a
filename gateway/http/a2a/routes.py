"""Agents' A2A routes under ``/a2a/{provider}`` (SPEC 24): the agent card, the JSON-RPC
binding (1.0 method names and 0.3's), the HTTP+JSON binding, and the remote agent's push
target. Authenticates, parses, asks calls.py, and says the answer in the caller's binding:
JSON-RPC results or errors (a problem as ``data``), HTTP+JSON the task or the problem."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from gateway.core import a2a
from gateway.core.models import Event
from gateway.core.routing import Match
from gateway.flow.a2a import note_task, poll_now
from gateway.flow.requests import AgentRequest
from gateway.flow.runtime import OUTCOME, PROVIDER, ROUTE, RUNTIME
from gateway.http import auth
from gateway.http.a2a import calls, compat
from gateway.http.a2a.card import gateway_card, remote_card
from gateway.http.answers import Call
from gateway.http.bodies import read_limited
from gateway.http.problems import CONTENT_TYPE, problem
from gateway.http.submit import read_body
from gateway.observe.context import note_account
from gateway.settings.policy import ProviderPolicy

JSON = "application/json"


def add_routes(app: web.Application) -> None:
    app.router.add_get("/a2a/{provider}/.well-known/agent-card.json", card)
    app.router.add_post("/a2a/{provider}", jsonrpc)
    app.router.add_post("/a2a/{provider}/push", push)
    app.router.add_post("/a2a/{provider}/message:send", rest_send)
    app.router.add_route("*", "/a2a/{provider}/tasks/{task}", rest_task)


def _policy(request: AgentRequest) -> ProviderPolicy | None:
    policy = request.app[RUNTIME].settings.policies.get(request.match_info["provider"])
    return policy if policy is not None and policy.protocol == "a2a" else None


async def _call(request: AgentRequest) -> Call | web.Response:
    """The authenticated caller of an A2A provider, or the problem that refuses it."""
    runtime = request.app[RUNTIME]
    name = request.match_info["provider"]
    policy = _policy(request)
    account = await auth.agent_of(runtime, request.headers, policy)
    if account is None:
        return problem("unauthenticated", auth.hint(policy))
    note_account(account.id)
    if policy is None:
        return problem("unknown-provider", f"No A2A agent named {name[:100]!r} is configured.")
    if not account.allows(name):
        return problem("forbidden", f"This account may not use provider {name!r}.")
    request[PROVIDER] = name
    return Call(request, runtime, account, policy, Match("status", None, {}))


async def card(request: AgentRequest) -> web.StreamResponse:
    """The remote agent's card with the gateway's interfaces (open, as cards are)."""
    policy = _policy(request)
    if policy is None:
        name = request.match_info["provider"][:100]
        return problem("unknown-provider", f"No A2A agent named {name!r} is configured.")
    request[PROVIDER], request[ROUTE] = policy.provider, "card"
    runtime = request.app[RUNTIME]
    found = await remote_card(runtime, policy)
    if found is None:
        detail = "The remote agent's card could not be fetched."
        return problem("provider-unavailable", detail, retry_after=5)
    url = f"{runtime.settings.file.public_base_url}/a2a/{policy.provider}"
    return web.json_response(gateway_card(found, url))


# -- JSON-RPC ------------------------------------------------------------------------------


def _rpc(rid: Any, *, result: Any = None, error: dict[str, Any] | None = None) -> web.Response:
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": rid}
    if error is not None:
        body["error"] = error
    else:
        body["result"] = result
    return web.Response(body=orjson.dumps(body), content_type=JSON)


def _error_of(response: web.StreamResponse) -> dict[str, Any]:
    """A problem, or a remote agent's own error answer, as a JSON-RPC error."""
    raw = response.body if isinstance(response, web.Response) else None
    try:
        parsed = orjson.loads(raw) if isinstance(raw, bytes) else None
    except orjson.JSONDecodeError:
        parsed = None
    if response.content_type == CONTENT_TYPE.split(";")[0] and isinstance(parsed, dict):
        if "Retry-After" in response.headers:
            parsed.setdefault("retry_after", response.headers["Retry-After"])
        return a2a.error_of_problem(parsed)
    message = f"the remote agent answered {response.status}"
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        message += f": {error['message'][:300]}"
    return {"code": a2a.INTERNAL, "message": message}


async def jsonrpc(request: AgentRequest) -> web.StreamResponse:
    found = await _call(request)
    if isinstance(found, web.Response):
        return found
    body = await read_body(found)
    try:
        envelope = orjson.loads(body)
    except orjson.JSONDecodeError:
        return _rpc(None, error={"code": a2a.PARSE_ERROR, "message": "not JSON"})
    if not isinstance(envelope, dict) or not isinstance(envelope.get("method"), str):
        return _rpc(None, error={"code": a2a.INVALID_REQUEST, "message": "not a request"})
    rid = envelope.get("id")
    named = a2a.method(envelope["method"])
    if named is None:
        return _rpc(rid, error={"code": a2a.METHOD_NOT_FOUND, "message": "no such method"})
    name, old = named
    params = envelope.get("params")
    if not isinstance(params, dict):
        return _rpc(rid, error={"code": a2a.INVALID_PARAMS, "message": "params must be an object"})
    kind = a2a.METHODS[name].kind
    if kind == a2a.REFUSED:
        message = f"{envelope['method']} is not served: {a2a.METHODS[name].what}"
        return _rpc(rid, error={"code": a2a.UNSUPPORTED_OPERATION, "message": message})
    try:
        if old:
            compat.require()  # a 0.3 answer is converted back: know it can be, first
        answer = await _dispatch(found, kind, params, old)
    except compat.Unconvertible as exc:
        return _rpc(rid, error={"code": a2a.INVALID_PARAMS, "message": str(exc)})
    response = answer.response
    if not 200 <= response.status < 300:
        return _copy_headers(response, _rpc(rid, error=_error_of(response)))
    result = _result(kind, answer, response, old)
    return _copy_headers(response, _rpc(rid, result=result))


async def _dispatch(call: Call, kind: str, params: dict[str, Any], old: bool) -> calls.Answer:
    if kind == a2a.SEND:
        return await calls.send(call, compat.send_params(params) if old else params)
    task_id = params.get("id")
    if not isinstance(task_id, str) or not task_id:
        return calls.Answer(problem("invalid-request", "params.id must name the task."))
    if kind == a2a.GET:
        return await calls.get(call, task_id)
    return await calls.cancel(call, task_id)


def _result(kind: str, answer: calls.Answer, response: web.StreamResponse, old: bool) -> Any:
    """The JSON-RPC result: 1.0 SendMessage a SendMessageResponse, the others the Task;
    0.3 the Task (or Message) in 0.3's shape."""
    raw = response.body if isinstance(response, web.Response) else b""
    value = orjson.loads(raw) if isinstance(raw, bytes) and raw else None
    if answer.task is None:  # a Message reply
        message = value.get("message") if isinstance(value, dict) else None
        if old and isinstance(message, dict):
            return compat.old_message(message)
        return value
    if old:
        return compat.old_task(answer.task)
    return {"task": answer.task} if kind == a2a.SEND else answer.task


def _copy_headers(inner: web.StreamResponse, outer: web.Response) -> web.Response:
    for name, value in inner.headers.items():
        if name.startswith(("Statusgate-", "Retry-After")) or name in ("Age", "X-Should-Retry"):
            outer.headers[name] = value
    return outer


# -- HTTP+JSON -----------------------------------------------------------------------------


async def rest_send(request: AgentRequest) -> web.StreamResponse:
    found = await _call(request)
    if isinstance(found, web.Response):
        return found
    try:
        params = orjson.loads(await read_body(found))
    except orjson.JSONDecodeError:
        return problem("invalid-request", "The body must be a JSON SendMessageRequest.")
    if not isinstance(params, dict):
        return problem("invalid-request", "The body must be a JSON SendMessageRequest.")
    return _rest(await calls.send(found, params), a2a.SEND)


async def rest_task(request: AgentRequest) -> web.StreamResponse:
    found = await _call(request)
    if isinstance(found, web.Response):
        return found
    task_id, _, verb = request.match_info["task"].partition(":")
    if request.method == "GET" and not verb:
        return _rest(await calls.get(found, task_id), a2a.GET)
    if request.method == "POST" and verb == "cancel":
        return _rest(await calls.cancel(found, task_id), a2a.CANCEL)
    detail = f"{request.method} {request.rel_url.path[:200]} is not served (docs/a2a.md)."
    return problem("route-not-allowed", detail)


def _rest(answer: calls.Answer, kind: str) -> web.StreamResponse:
    response = answer.response
    if not 200 <= response.status < 300 or answer.task is None:
        return response
    body = {"task": answer.task} if kind == a2a.SEND else answer.task
    out = web.Response(body=orjson.dumps(body), content_type=JSON)
    return _copy_headers(response, out)


# -- the remote agent's pushes -------------------------------------------------------------


async def push(request: AgentRequest) -> web.StreamResponse:
    """A push from the remote agent (A2A 1.0 StreamResponse, ``X-A2A-Notification-Token``
    the token the gateway gave with the task): a full task is recorded as a status answer
    would be; anything else is acknowledged and left to the schedule."""
    runtime = request.app[RUNTIME]
    policy = _policy(request)
    if policy is None:
        return problem("unknown-provider", "No such A2A agent is configured.")
    request[PROVIDER], request[ROUTE] = policy.provider, "push"
    token = request.headers.get("X-A2A-Notification-Token", "")
    account = a2a.push_account(a2a.push_key(policy), policy.provider, token)
    if account is None:
        return problem("unauthenticated", "The push token is not one the gateway gave.")
    limits = runtime.settings.file.limits

    raw = await read_limited(request, limits.max_request_body, limits.body_timeout)
    try:
        event = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return problem("invalid-request", "A push must be JSON.")
    task = event.get("task") if isinstance(event, dict) else None
    update = event.get("statusUpdate") if isinstance(event, dict) else None
    task_id = (task or {}).get("id") if isinstance(task, dict) else None
    if task_id is None and isinstance(update, dict):
        task_id = update.get("taskId")
    record = None
    if isinstance(task_id, str):
        record = await runtime.records.find(account, policy.provider, task_id)
    if record is None:
        request[OUTCOME] = "ignored"
        return web.Response(status=202)
    if isinstance(task, dict):
        await note_task(runtime, policy, record, task, Event.PUSHED, "push")
        return web.Response(status=200)
    status = update.get("status") if isinstance(update, dict) else None
    state = status.get("state") if isinstance(status, dict) else None
    if isinstance(state, str) and state != record.last_known_state:
        await poll_now(runtime, policy, record, state)  # thin: the task itself comes from a poll
    return web.Response(status=200)
