"""Agent-facing handlers under ``/p/{provider}/...``: the thin shell around decide.py.

Each handler loads, asks the pure core, sends at most what the decision allows, asks the core
again about the answer, saves, and answers. No polling rule lives here; if one seems to, it
belongs in decide.py or schedule.py.

The hold (``Prefer: wait``), the shared poll and ``wait_for`` (how MCP waits for an
account's operation) are the poll workflow's, in gateway/flow/polls.py; this module asks it.
"""

from __future__ import annotations

import dataclasses

from aiohttp import web

from gateway.core import arns, decide, effects, results
from gateway.core.decide import Decision, Reply, job_aliases
from gateway.core.models import Event, OperationRecord, ProviderAnswer
from gateway.core.routing import fill, job_id_from_body, valid_job
from gateway.flow import cancels, keeping
from gateway.flow.polls import Asker, StaleCopy, gone, held, may_hold, shared_poll
from gateway.flow.requests import AgentRequest
from gateway.flow.runtime import OUTCOME, PROVIDER, ROUTE, RUNTIME, Runtime
from gateway.http import auth, kept
from gateway.http.answers import (
    Call,
    operation_headers,
    passthrough,
    render,
    unknown_operation,
    upstream_problem,
)
from gateway.http.lane import LaneRequest
from gateway.http.prefer import format_wait, prefer_wait
from gateway.http.problems import problem
from gateway.http.submit import read_body, submit
from gateway.observe.context import note_account
from gateway.provider.headers import agent_query, header_safe, to_provider
from gateway.provider.send import send_upstream
from gateway.settings.policy import ProviderPolicy


async def handle(request: AgentRequest) -> web.StreamResponse:
    """Entry for every ``/p/{provider}/...`` request."""
    runtime = request.app[RUNTIME]
    name = request.match_info["provider"]
    policy = runtime.settings.policies.get(name)
    account = await auth.agent_of(runtime, request.headers, policy)
    if account is None:
        return problem("unauthenticated", auth.hint(policy))
    note_account(account.id)
    if policy is None:
        return problem("unknown-provider", f"No provider named {name!r} is configured.")
    if not account.allows(name):
        return problem("forbidden", f"This account may not use provider {name!r}.")
    if policy.protocol == "a2a":
        detail = f"{name!r} is an A2A agent: it is served at /a2a/{name} (docs/a2a.md)."
        return problem("route-not-allowed", detail)
    request[PROVIDER] = name
    raw_path = request.rel_url.raw_path.removeprefix(f"/p/{name}") or "/"  # the API's root
    match = runtime.routes[name].match(request.method, raw_path, request.headers)
    if match is None:
        detail = f"{request.method} {raw_path} is not a declared route of {name!r}."
        return problem("route-not-allowed", detail)
    if not match.valid:
        return problem("invalid-request", "Path segments must match [A-Za-z0-9._~-]{1,200}.")
    request[ROUTE] = match.kind
    call = Call(request, runtime, account, policy, match)
    source = _body_source(policy, match.kind)
    if source is not None:  # a status call by POST names its job in the body (SPEC 12)
        call = await _with_body_job_id(call, source)
        if call.match.job_id is None or not valid_job(policy, call.match.job_id):
            detail = f"The request body must name the job in {source!r}."
            return problem("invalid-request", detail)
    if match.kind == "submit":
        return await submit(call)
    if match.kind == "status":
        return await status(call)
    if match.kind == "result":
        return await result(call)
    if match.kind == "passthrough":
        return await passthrough_call(call)
    return await cancel(call)


def _body_source(policy: ProviderPolicy, kind: str) -> str | None:
    """The request body path that names the job on this kind of route, if any (a cancel
    route's only when agents may use it)."""
    route = getattr(policy.routes, kind, None) if kind in ("status", "result", "cancel") else None
    if kind == "cancel" and (route is None or route.by != "agent"):
        return None
    source = route.job_id if route is not None else None
    return source.path if source is not None else None


async def _with_body_job_id(call: Call, path: str) -> Call:
    body = await read_body(call)
    match = dataclasses.replace(call.match, job_id=job_id_from_body(body, path))
    return dataclasses.replace(call, match=match, body=body)


# -- status -------------------------------------------------------------------------------


def _asker(call: Call) -> Asker:
    request = call.request
    route = call.policy.routes.status
    return Asker(
        call.runtime,
        call.policy,
        call.job_id,
        to_provider(request.headers.items(), call.policy),
        agent_query(request.rel_url.raw_query_string, route.query_params),
        call.body,
        gone=lambda: gone(request),
        request=request,
        # the lane defers the cancel of a gone client's handler while it polls: the poll
        # runs in the handler's task (aiohttp's own server cancels at once: a task then)
        uncancelled=request.uncancelled if isinstance(request, LaneRequest) else None,
    )


async def status(call: Call) -> web.StreamResponse:
    runtime, policy = call.runtime, call.policy
    held = call.request.headers.get("Prefer")
    copy = None if held else runtime.records.known(call.account.id, policy.provider, call.job_id)
    record: OperationRecord | None = None
    if copy is not None and decide.admit(policy, copy, runtime.clock()).forward:
        # due by this process's copy: the reservation's compare-and-set proves it current,
        # saving a read; a stale copy sends us the stored record to start from
        try:
            decision, response = await shared_poll(_asker(call), copy, pace=True, from_copy=True)
            return render(call, decision, response, runtime.clock())
        except StaleCopy as stale:
            record = stale.record
    if record is None:
        record = await find_job(runtime, call.account.id, policy, call.job_id)
    if record is None:
        return unknown_operation()
    if record.provider_job_id != call.job_id:  # named by its alias: poll it by its own id
        call = dataclasses.replace(
            call, match=dataclasses.replace(call.match, job_id=record.provider_job_id)
        )
    wait = prefer_wait(call.request.headers.getall("Prefer", []), bare=policy.polling.max_hold)
    # RFC 7240: wait=0 asks for no wait at all; past limits.max_held, as without Prefer
    if wait and await may_hold(runtime, call.account.id, policy):
        return await _hold(call, record, min(wait, policy.polling.max_hold))
    now = runtime.clock()
    decision = decide.admit(policy, record, now)
    if not decision.forward and not decision.changed:  # answered without any write
        if decide.holds_early(policy, decision) and await may_hold(
            runtime, call.account.id, policy
        ):
            return await _hold(call, record, 0.0, early=True)
        return _refusal(call, decision, runtime.clock())
    decision, response = await shared_poll(_asker(call), record, pace=decision.forward)
    return render(call, decision, response, runtime.clock())


async def find_job(
    runtime: Runtime, account: str, policy: ProviderPolicy, job_id: str
) -> OperationRecord | None:
    """The account's operation of this provider job; under ``routes.job_ids: aws-arn`` also
    the one whose ARN job id ends in ``job_id`` (its alias, SPEC 22)."""
    record = await runtime.records.find(account, policy.provider, job_id)
    if record is None and policy.routes.job_ids == "aws-arn" and arns.plain(job_id):
        found = await runtime.records.find_result(account, policy.provider, job_id)
        if found is not None and job_id in job_aliases(policy, found.provider_job_id):
            record = found
    return record


async def _hold(
    call: Call, record: OperationRecord, wait: float, *, early: bool = False
) -> web.StreamResponse:
    """``Prefer: wait=N`` on a status call, or (``early``) an early call held for the next
    permitted poll (``decide.holds_early``): the hold below, answered as a status call."""
    decision, response = await held(_asker(call), record, wait, early=early)
    answer = render(call, decision, response, call.runtime.clock())
    if not early:
        answer.headers["Preference-Applied"] = f"wait={format_wait(wait)}"
    return answer


def _refusal(call: Call, decision: Decision, now: float) -> web.StreamResponse:
    """An answer from the record: too-early and replayed calls count as refused polls (the
    audit log's aggregated ``refused`` lines); replayed and final answers are ``cached``."""
    if decision.problem == "too-early" or decision.reply is Reply.REPLAY:
        call.runtime.refusals.note(decision.record, now)
    if decision.reply in (Reply.FINAL, Reply.REPLAY):
        call.request[OUTCOME] = "cached"
    return render(call, decision, None, now)


# -- cancel ------------------------------------------------------------------------------


async def cancel(call: Call) -> web.StreamResponse:
    """The cancel route: an operator's decision (403 approval-required) unless the policy
    says ``routes.cancel.by: agent`` (SPEC 20a). Then an agent cancels its own account's
    job: sent once (flow/cancels.py), the provider's answer passed through and audited
    ``cancel_requested`` naming the account; a second call, or one on a job that ended, is
    answered from the record (``decide.cancel_call``)."""
    runtime, policy, request = call.runtime, call.policy, call.request
    route = policy.routes.cancel
    if route is None or route.by != "agent":
        detail = "Cancelling a job is an operator decision: ask an operator to use "
        return problem("approval-required", detail + "POST /admin/operations/{id}/cancel.")
    record = await find_job(runtime, call.account.id, policy, call.job_id)
    if record is None:
        return unknown_operation()
    decision = decide.cancel_call(record, runtime.clock())
    if decision.forward:
        body = call.body if call.body is not None else await read_body(call)
        query = agent_query(request.rel_url.raw_query_string, route.query_params)
        asked = cancels.Request(to_provider(request.headers.items(), policy), body or None, query)
        sent = await cancels.cancel_at_provider(runtime, policy, record, asked)
        if sent.answer is not None:
            return await _cancel_sent(call, sent, sent.answer)
        if sent.busy:
            detail = f"Refused: {cancels.BUSY}."
            operation_id, headers = sent.record.operation_id, _headers(call, sent.record)
            return problem(
                "too-early", detail, operation_id=operation_id, retry_after=1.0, headers=headers
            )
        decision = decide.cancel_call(sent.record, runtime.clock())  # decided meanwhile
    if decision.reply is not Reply.PROBLEM:
        request[OUTCOME] = "cached"
    return render(call, decision, None, runtime.clock())


async def _cancel_sent(
    call: Call, sent: cancels.Sent, answer: ProviderAnswer
) -> web.StreamResponse:
    """The provider's answer to an agent's cancel: the audit line (accepted, or not and
    why), then that answer with the operation's headers."""
    assert sent.result is not None
    result, now = sent.result, call.runtime.clock()
    line = effects.of_agent_cancel(
        call.policy,
        sent.record,
        call.account.id,
        now,
        http_status=answer.status,
        accepted=result.detail if result.record is not None else None,
        refusal=result.refusal,
    )
    await call.runtime.effects.carry_out(line)
    headers = _headers(call, sent.record)
    if sent.response is None:
        return upstream_problem(answer, sent.record.operation_id, headers)
    return passthrough(call, sent.response, headers)


# -- result and passthrough --------------------------------------------------------------


async def result(call: Call) -> web.StreamResponse:
    """The result route: only after success, at most ``max_result_fetches`` times, each
    fetch counted on the record before it is sent and audited as ``result_fetched``. A
    route whose provider path takes a field of the final answer is addressed by the job id
    or (SPEC 20) by that field's value, among the account's own operations only."""
    runtime, policy = call.runtime, call.policy
    route = policy.routes.result
    assert route is not None
    account = call.account.id
    record = await find_job(runtime, account, policy, call.job_id)
    if record is None and "{final." in route.path:
        record = await runtime.records.find_result(account, policy.provider, call.job_id)
    if record is None:
        return unknown_operation()
    if policy.results.keep:  # SPEC 23: answered from the kept copy, made first if owed
        record = await keeping.settled(runtime, policy, record)
        copy = results.served_copy(record, runtime.clock())
        answer = await kept.from_copy(call, record, copy) if copy is not None else None
        if answer is not None:
            return answer
    query = agent_query(call.request.rel_url.raw_query_string, route.query_params)
    sent = to_provider(call.request.headers.items(), policy)
    return await fetch_result(call, record, sent, query)


async def fetch_result(
    call: Call, record: OperationRecord, sent: dict[str, str], query: str = ""
) -> web.StreamResponse:
    """The result of ``record`` through the result route, with ``sent`` headers (ready for
    the provider) and ``query``: gated, counted and audited. Reads nothing of
    ``call.request``, so the MCP ``get_result`` tool runs it too."""
    runtime, policy = call.runtime, call.policy
    route = policy.routes.result
    assert route is not None
    values = results.provider_values(policy, record, call.match.params)
    if isinstance(values, results.Refusal):
        return _refused(call, record, values)
    fetched = await runtime.records.mutate(
        record.operation_id,
        lambda current: results.fetch(policy, current),
        known=record,
    )
    if isinstance(fetched, results.Refusal):
        return _refused(call, record, fetched)
    query = "&".join(q for q in (values.query, query) if q)
    url = policy.upstream + fill(route.path, values.values, query)
    answer, response = await send_upstream(
        runtime.channel(policy),
        policy,
        "result",
        route.method,
        url,
        sent,
        operation_id=record.operation_id,
    )
    limit = policy.polling.max_result_fetches
    detail = f"result fetch {fetched.result_fetches} of {limit}"
    await _audit_call(call, Event.RESULT_FETCHED, answer, detail, fetched)
    headers = _headers(call, fetched)
    if response is None:
        return upstream_problem(answer, record.operation_id, headers)
    return passthrough(call, response, headers)


async def _audit_call(
    call: Call,
    event: Event,
    answer: ProviderAnswer,
    detail: str,
    operation: OperationRecord | None = None,
) -> None:
    """The audit line of a provider call outside the polling loop, naming a failure."""
    failure = f", {answer.failure.value}" if answer.failure is not None else ""
    line = effects.of_call(
        call.runtime.clock(),
        provider=call.policy.provider,
        account=call.account.id,
        event=event,
        http_status=answer.status,
        detail=detail + failure,
        operation=operation,
    )
    await call.runtime.effects.carry_out(line)


def _headers(call: Call, record: OperationRecord) -> dict[str, str]:
    return operation_headers(record, call.runtime.clock())


def _refused(call: Call, record: OperationRecord, refusal: results.Refusal) -> web.Response:
    headers = _headers(call, record)
    return problem(refusal.slug, refusal.detail, operation_id=record.operation_id, headers=headers)


async def passthrough_call(call: Call) -> web.StreamResponse:
    """A declared provider call around a job (SPEC 12): forwarded with the credential,
    scrubbed and rewritten like any answer, audited as ``passthrough``; not tracked."""
    runtime, policy, request = call.runtime, call.policy, call.request
    body = await read_body(call)
    raw_path = request.rel_url.raw_path.removeprefix(f"/p/{policy.provider}")
    url = policy.upstream + raw_path
    if request.rel_url.raw_query_string:
        url += "?" + request.rel_url.raw_query_string
    headers = to_provider(request.headers.items(), policy)
    answer, response = await send_upstream(
        runtime.channel(policy), policy, "passthrough", request.method, url, headers, body or None
    )
    detail = f"{request.method} {header_safe(raw_path)}"
    await _audit_call(call, Event.PASSTHROUGH, answer, detail)
    if response is None:
        return upstream_problem(answer, None)
    return passthrough(call, response, {})
