"""Starting a job and fetching its result over MCP: the start_job and get_result tools run
the provider's submit and result routes for the caller's account exactly as ``POST /p/...``
and the result route do (http.submit.run, http.proxy.fetch_result), then read their answers;
a result kept by the gateway (SPEC 23) is read from its copy, as the result route serves it.

Owns turning a tool's arguments into what an agent would have sent, and an HTTP answer of
those routes into an operation and a view of the provider's answer, or a Refused naming the
problem. Never sends anything to a provider itself, never skips idempotency, the credential,
the record written before the answer, the result gate, its budget or its audit line.
"""

from __future__ import annotations

import base64
import contextlib
import json
from typing import Any

from aiohttp import web

from gateway.core import results
from gateway.core.models import OperationRecord
from gateway.core.routing import Match, job_id_from_body
from gateway.flow import keeping
from gateway.http import kept
from gateway.http.answers import Call
from gateway.http.mcp.caller import Caller, Refused, owned, policy_of
from gateway.http.problems import CONTENT_TYPE
from gateway.http.proxy import fetch_result
from gateway.http.submit import Submission, run
from gateway.provider.headers import to_provider
from gateway.settings.policy import ProviderPolicy, placeholders

MAX_ROUTE = 2000  # characters of a route worth matching


class ProviderRefused(Exception):
    """The provider answered the submission or the result fetch with an error of its own
    (passed through, no operation created or nothing fetched)."""

    def __init__(self, view: dict[str, Any]) -> None:
        super().__init__(f"the provider answered {view['status']}")
        self.view = view


def _policy(caller: Caller, provider: str) -> ProviderPolicy:
    policy = caller.runtime.settings.policies.get(provider)
    if policy is None:
        raise Refused("unknown-provider", f"No provider named {provider[:100]!r} is configured.")
    if not caller.account.allows(provider):
        raise Refused("forbidden", f"This account may not use provider {provider[:100]!r}.")
    return policy


def _route(policy: ProviderPolicy, route: str | None) -> tuple[str, str]:
    """The provider path and query string of the submission: ``route`` as an agent would
    write it after ``/p/{provider}``, or the submit route's own path when it has no
    placeholder to fill."""
    if route is None:
        path = policy.routes.submit.path
        if placeholders(path):
            detail = f"route is required: the submit route {path!r} has segments to fill."
            raise Refused("invalid-request", detail)
        return path.partition("?")[0], ""
    if len(route) > MAX_ROUTE or not route.startswith("/") or "#" in route:
        raise Refused("invalid-request", "route must be a path starting with /.")
    path, _, query = route.partition("?")
    return path, query


def _key_required(policy: ProviderPolicy, key: str | None, body: bytes) -> None:
    """The tool error naming idempotency_key when the policy requires a key and none came
    (neither the argument nor the body field the policy reads it from)."""
    rules = policy.routes.submit.idempotency
    if key is not None or not rules.required:
        return
    if rules.from_body is not None and job_id_from_body(body, rules.from_body) is not None:
        return
    also = f" (or the body field {rules.from_body!r})" if rules.from_body else ""
    detail = (
        f"idempotency_key is required: provider {policy.provider!r} takes submissions only "
        f"with an idempotency key{also}, so a retry can never start a second job."
    )
    raise Refused("idempotency-key-missing", detail)


async def start(
    caller: Caller, provider: str, route: str | None, body: bytes, key: str | None
) -> tuple[OperationRecord, dict[str, Any]]:
    """Submit for the caller's account: the operation and the view of the submit answer."""
    policy = _policy(caller, provider)
    path, query = _route(policy, route)
    submit = policy.routes.submit
    fixed = dict(submit.match.headers) if submit.match is not None else {}
    match = caller.runtime.routes[provider].match(submit.method, path, fixed)
    if match is None or match.kind != "submit":
        detail = f"{submit.method} {path[:200]} is not {provider!r}'s submit route."
        raise Refused("route-not-allowed", detail)
    if not match.valid:
        raise Refused("invalid-request", "Path segments must match [A-Za-z0-9._~-]{1,200}.")
    _key_required(policy, key, body)
    headers = [("Content-Type", "application/json"), *fixed.items()]
    if key is not None:
        headers.append(("Idempotency-Key", key))
    gateway_path = f"/p/{provider}{path}" + (f"?{query}" if query else "")
    sent = Submission(submit.method, gateway_path, query, tuple(headers), body)
    answer = await run(_call(caller, policy, match), sent)
    view = _view(answer)
    operation_id = answer.headers.get("Statusgate-Operation")
    if operation_id is None or not 200 <= answer.status < 300:
        raise _refusal(answer, view)
    record = await owned(caller, operation_id)
    if record is None:  # purged between the answer and this read: say what is known
        detail = "The job was submitted but its operation is no longer kept."
        raise Refused("unknown-operation", detail, operation_id)
    return record, view


async def result(caller: Caller, operation_id: str) -> tuple[OperationRecord, dict[str, Any]]:
    """The operation's result through its result route: the record (its fetch counted)
    and the view of the provider's answer."""
    record = await owned(caller, operation_id)
    if record is None:
        raise Refused("unknown-operation", "This account has no operation with that id.")
    policy = policy_of(caller, record)
    if policy is None:
        detail = f"No policy is loaded for {record.provider!r}; its result cannot be fetched."
        raise Refused("unknown-provider", detail, record.operation_id)
    _policy(caller, record.provider)
    route = policy.routes.result
    if route is None:
        detail = f"Provider {record.provider!r} declares no result route."
        raise Refused("route-not-allowed", detail, record.operation_id)
    if policy.results.keep:  # SPEC 23: from the kept copy, as the result route answers
        record = await keeping.settled(caller.runtime, policy, record)
        view = await _kept(caller, record)
        if view is not None:
            return record, view
    fixed = route.match.headers.items() if route.match is not None else []
    match = Match("result", record.provider_job_id, {"job_id": record.provider_job_id})
    answer = await fetch_result(_call(caller, policy, match), record, to_provider(fixed, policy))
    view = _view(answer)
    if not 200 <= answer.status < 300:
        raise _refusal(answer, view)
    fresh = await owned(caller, record.operation_id)
    return fresh or record, view


def _call(caller: Caller, policy: ProviderPolicy, match: Match) -> Call:
    """The matched call the HTTP handlers share; their code reads none of the request's
    own path, headers or body (that is what Submission and fetch_result take)."""
    return Call(caller.request, caller.runtime, caller.account, policy, match)


async def _kept(caller: Caller, record: OperationRecord) -> dict[str, Any] | None:
    """The view of the operation's kept result (no provider call, no fetch counted), or
    None when there is none to serve or it cannot be read (then it is fetched as before)."""
    runtime = caller.runtime
    copy = results.served_copy(record, runtime.clock())
    body = await kept.read_copy(runtime, record, copy) if copy is not None else None
    if copy is None or body is None:
        return None
    view = _view_of(200, copy.content_type or "application/octet-stream", body)
    view["kept"] = True
    return view


def _view(answer: web.StreamResponse) -> dict[str, Any]:
    """A provider answer as MCP results show it."""
    raw = answer.body if isinstance(answer, web.Response) else None
    body = raw if isinstance(raw, bytes) else b""
    return _view_of(answer.status, answer.headers.get("Content-Type", ""), body)


def _view_of(status: int, content_type: str, body: bytes) -> dict[str, Any]:
    """An answer as MCP results show it: status, content type, the body as text (base64
    when it is not UTF-8) and, when it is JSON, parsed."""
    view: dict[str, Any] = {"status": status, "content_type": content_type}
    try:
        view["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        view["body"] = ""
        view["body_base64"] = base64.b64encode(body).decode("ascii")
        return view
    if "json" in content_type.lower():
        with contextlib.suppress(ValueError, RecursionError):
            view["json"] = json.loads(body)
    return view


def _refusal(answer: web.StreamResponse, view: dict[str, Any]) -> Exception:
    """A problem of the gateway as a Refused naming its slug; a provider's own error as
    ProviderRefused."""
    if answer.headers.get("Content-Type", "").startswith(CONTENT_TYPE):
        problem = view.get("json")
        if isinstance(problem, dict) and isinstance(problem.get("type"), str):
            slug = problem["type"].rsplit("/", 1)[-1]
            detail = str(problem.get("detail", slug))
            operation_id = problem.get("operation_id")
            return Refused(slug, detail, operation_id if isinstance(operation_id, str) else None)
    return ProviderRefused(view)
