"""Agent-facing handlers under ``/p/{provider}/...``: the thin shell around decide.py.

Each handler loads, asks the pure core, sends at most what the decision allows, asks the core
again about the answer, saves, and answers. No polling rule lives here; if one seems to, it
belongs in decide.py or schedule.py.

Also owns the hold (``Prefer: wait``) and the shared poll for callers without an HTTP status
call: ``wait_for`` is how the MCP server waits for an account's operation, through the same
schedule, budgets and coalescing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aiohttp import web

from . import decide, results
from .calls import (
    Call,
    header_safe,
    operation_headers,
    passthrough,
    render,
    send_upstream,
    unknown_operation,
    upstream_problem,
)
from .config import Account
from .context import note_account
from .decide import Decision, Reply
from .errors import NotAdmissible
from .headers import agent_query, format_wait, prefer_wait, to_provider
from .models import Event, OperationFilter, OperationRecord, Outcome, ProviderAnswer
from .pacing import GUARD
from .policy import ProviderPolicy
from .problems import problem
from .routing import body_with_job_id, fill, job_id_from_body, valid_job
from .runtime import OUTCOME, PROVIDER, ROUTE, RUNTIME, PollTask, Runtime
from .schedule import provider_limit
from .submit import read_body, submit
from .upstream import UpstreamResponse

LEASE_MARGIN = 1.0  # a poll lease outlives the longest poll by this much
MIN_HOLD_STEP = 0.005  # a held call never wakes more often than this


async def handle(request: web.Request) -> web.StreamResponse:
    """Entry for every ``/p/{provider}/...`` request."""
    runtime = request.app[RUNTIME]
    account = runtime.agent(request.headers)
    if account is None:
        return problem("unauthenticated", "Send 'Authorization: Bearer <agent token>'.")
    note_account(account.id)
    name = request.match_info["provider"]
    policy = runtime.settings.policies.get(name)
    if policy is None:
        return problem("unknown-provider", f"No provider named {name!r} is configured.")
    if not account.allows(name):
        return problem("forbidden", f"This account may not use provider {name!r}.")
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
    return problem(
        "approval-required",
        "Cancelling a job is an operator decision: ask an operator to use "
        "POST /admin/operations/{id}/cancel.",
    )


def _body_source(policy: ProviderPolicy, kind: str) -> str | None:
    """The request body path that names the job on this kind of route, if any."""
    route = getattr(policy.routes, kind, None) if kind in ("status", "result") else None
    source = route.job_id if route is not None else None
    return source.path if source is not None else None


async def _with_body_job_id(call: Call, path: str) -> Call:
    body = await read_body(call)
    match = dataclasses.replace(call.match, job_id=job_id_from_body(body, path))
    return dataclasses.replace(call, match=match, body=body)


# -- status -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Asker:
    """Whom a poll is made for: the provider job, what of the asker's own request goes to
    the provider with it, and how to tell that the asker went away. An agent's status call
    forwards its headers, allowed query parameters and body; a wait the gateway makes for
    an account (MCP) forwards nothing of an agent's."""

    runtime: Runtime
    policy: ProviderPolicy
    job_id: str
    headers: Mapping[str, str]  # ready for the provider (headers.to_provider)
    query: str = ""  # the agent's query parameters the status route lets through
    body: bytes | None = None
    gone: Callable[[], bool] = lambda: False
    request: web.Request | None = None  # an agent's HTTP call, told when it joins a poll


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
    )


def record_asker(
    runtime: Runtime,
    policy: ProviderPolicy,
    record: OperationRecord,
    gone: Callable[[], bool] | None = None,
) -> Asker:
    """A poll the gateway makes for the record's account with nothing of an agent's request:
    the status route's match headers, and the job id in a JSON body where the route reads it
    there (as an operator's cancel is sent)."""
    route = policy.routes.status
    headers = to_provider(route.match.headers.items() if route.match else [], policy)
    body = None
    if route.job_id is not None and route.job_id.path is not None:
        body = body_with_job_id(route.job_id.path, record.provider_job_id)
        headers.setdefault("Content-Type", "application/json")
    return Asker(runtime, policy, record.provider_job_id, headers, body=body, gone=gone or _never)


def _never() -> bool:
    return False


async def status(call: Call) -> web.StreamResponse:
    runtime, policy = call.runtime, call.policy
    record = await runtime.store.find(call.account.id, policy.provider, call.job_id)
    if record is None:
        return unknown_operation()
    wait = prefer_wait(call.request.headers.getall("Prefer", []))
    if wait:  # RFC 7240: wait=0 asks for no wait at all
        return await _hold(call, record, min(wait, policy.polling.max_hold))
    now = runtime.clock()
    decision = decide.admit(policy, record, now)
    if not decision.forward and not decision.changed:  # answered without any write
        if _holds_early(policy, decision):
            return await _hold(call, record, 0.0, early=True)
        return _refusal(call, decision, now)
    decision, response = await _shared_poll(_asker(call), record, pace=decision.forward)
    return render(call, decision, response, runtime.clock())


def _holds_early(policy: ProviderPolicy, decision: Decision) -> bool:
    """``polling.early_calls: hold`` (SPEC 12): a too-early call whose next permitted poll
    is within ``max_hold`` waits for it instead of getting 429."""
    return (
        policy.polling.early_calls == "hold"
        and decision.problem == "too-early"
        and decision.retry_after is not None
        and decision.retry_after <= policy.polling.max_hold
    )


async def _hold(
    call: Call, record: OperationRecord, wait: float, *, early: bool = False
) -> web.StreamResponse:
    """``Prefer: wait=N`` on a status call, or (``early``) an early call held for the next
    permitted poll (``early_calls: hold``): the hold below, answered as a status call."""
    decision, response = await _held(_asker(call), record, wait, early=early)
    answer = render(call, decision, response, call.runtime.clock())
    if not early:
        answer.headers["Preference-Applied"] = f"wait={format_wait(wait)}"
    return answer


async def wait_for(
    runtime: Runtime,
    account: Account,
    policy: ProviderPolicy,
    record: OperationRecord,
    seconds: float,
    *,
    gone: Callable[[], bool] | None = None,
) -> tuple[Decision, UpstreamResponse | None]:
    """``Prefer: wait`` without an HTTP status call (MCP): hold for ``account``'s operation
    up to ``seconds`` (capped at the policy's ``max_hold``, never past the deadline), polling
    only as the schedule permits. ``seconds`` 0 is one look: the answer from the record, or
    the one poll that is due. Forwards nothing of an agent's request."""
    if record.account != account.id or record.provider != policy.provider:
        raise ValueError("an operation is waited for by its own account, under its own policy")
    limit = min(max(0.0, seconds), policy.polling.max_hold)
    asker = record_asker(runtime, policy, record, gone)
    return await _held(asker, record, limit, early=False)


async def _held(
    asker: Asker, record: OperationRecord, wait: float, *, early: bool
) -> tuple[Decision, UpstreamResponse | None]:
    """Wait for the next permitted poll, poll for the asker, and keep waiting through
    pending answers until the job ends, waiting must end, ``wait`` seconds pass, the
    deadline comes, the asker goes away or the gateway stops. Costs only timers.

    ``early``: wait for the next permitted poll only (up to ``max_hold``) and answer that
    poll, pending or not."""
    runtime = asker.runtime
    limit = asker.policy.polling.max_hold if early else wait
    end = min(runtime.clock() + limit, record.deadline_at)
    runtime.holding += 1
    try:
        decision, response = await _step(asker, record)
        while decision.record.outcome is Outcome.PENDING and decision.retry_after is not None:
            if early and response is not None:
                break  # the one poll an early call waited for
            now = runtime.clock()
            wake = now + max(decision.retry_after, MIN_HOLD_STEP)
            if wake > end or asker.gone() or not await runtime.pause(wake - now):
                break
            current = await runtime.store.get(record.operation_id)
            assert current is not None
            decision, response = await _step(asker, current)
            if early:
                break
    finally:
        runtime.holding -= 1
    return decision, response


async def _step(asker: Asker, record: OperationRecord) -> tuple[Decision, UpstreamResponse | None]:
    """One look at the operation: the answer from the record, or one shared poll."""
    decision = decide.admit(asker.policy, record, asker.runtime.clock())
    if not decision.forward and not decision.changed:
        return decision, None
    return await _shared_poll(asker, record, pace=decision.forward)


def gone(request: web.Request) -> bool:
    """The client of ``request`` went away (a held call stops waiting for it)."""
    transport = request.transport
    return transport is None or transport.is_closing()


async def _shared_poll(
    asker: Asker, record: OperationRecord, *, pace: bool
) -> tuple[Decision, UpstreamResponse | None]:
    """Step 7: one poll per operation in this process at a time; every caller gets its
    answer. The poll is a task of its own, so a caller that goes away never cuts it short."""
    runtime, operation_id = asker.runtime, record.operation_id
    task = runtime.inflight.get(operation_id)
    if task is None:
        task = asyncio.create_task(_poll(asker, record, pace=pace))
        runtime.inflight[operation_id] = task
        task.add_done_callback(lambda done: _forget(runtime, operation_id, done))
    elif asker.request is not None:
        asker.request[OUTCOME] = "cached"
    return await asyncio.shield(task)


def _forget(runtime: Runtime, operation_id: str, task: PollTask) -> None:
    if runtime.inflight.get(operation_id) is task:
        del runtime.inflight[operation_id]
    if not task.cancelled():
        task.exception()  # retrieved here, raised to every caller still waiting


def _persisting(decision: Decision) -> tuple[OperationRecord | None, Decision]:
    """``decide.as_write`` for a decision that is never None."""
    record, _ = decide.as_write(decision)
    return record, decision


def lease_ttl(runtime: Runtime, policy: ProviderPolicy) -> float:
    """How long a poll may hold its lease: an OAuth2 token fetch and the request itself
    (each bounded by upstream_timeout), the pacing space before the send, and a margin, so
    a live poll never loses its lease to another replica."""
    spacing = GUARD / policy.polling.provider_rate if policy.polling.provider_rate else 0.0
    return 2 * runtime.settings.file.limits.upstream_timeout + spacing + LEASE_MARGIN


async def _poll(
    asker: Asker, record: OperationRecord, *, pace: bool
) -> tuple[Decision, UpstreamResponse | None]:
    """Steps 8 and 9: lease, re-check and reserve (or escalate), send exactly one request,
    classify, save. Every write to the record happens under the lease."""
    runtime, policy, operation_id = asker.runtime, asker.policy, record.operation_id
    lease = f"poll:{operation_id}"
    token = secrets.token_hex(16)
    ttl = lease_ttl(runtime, policy)
    rate = policy.polling.provider_rate if pace else None
    wait = await runtime.store.start_poll(lease, token, runtime.clock(), ttl, policy.provider, rate)
    if wait is None:
        detail = "A status request for this operation is already in flight."
        return await _come_back(runtime, operation_id, 1.0, detail), None
    released = False
    try:
        now = runtime.clock()
        effects = runtime.effects
        if pace and wait > 0:
            return await _paused(asker, record, now, wait), None
        window = effects.refusals.close(operation_id)
        refusals = window.count if window is not None else 0
        try:
            decision = await runtime.store.mutate(
                operation_id,
                lambda current: _persisting(decide.take(policy, current, now, refusals)),
                known=record,
            )
        except NotAdmissible as exc:
            return await _come_back(runtime, operation_id, 1.0, str(exc)), None
        if window is not None:
            await effects.refused(decision.record, window)
        if decision.cut_at is not None:
            await effects.interrupted(decision.record, decision.cut_at)
        if not decision.forward:
            await effects.decided(policy, decision)
            return decision, None
        route = policy.routes.status
        url = policy.upstream + fill(route.path, {"job_id": asker.job_id}, asker.query)
        if policy.polling.provider_rate is not None:
            await runtime.space_sends(policy.provider, policy.polling.provider_rate)
        answer, response = await send_upstream(
            runtime, policy, "status", route.method, url, dict(asker.headers), asker.body
        )
        done = runtime.clock()
        limit = provider_limit(answer.status, response.headers if response else {}, done)
        if limit is not None:
            await runtime.store.tighten(policy.provider, *limit)
        u = runtime.rng.random()
        reserved = decision.record
        released = True  # finish_poll releases the lease with the write
        decided = await runtime.store.finish_poll(
            operation_id,
            lambda current: _persisting(
                decide.classify(policy, current, answer, done, u)
                if decide.still_ours(reserved, current)
                else decide.superseded(current, done)
            ),
            known=reserved.evolve(version=reserved.version + 1),
            lease=lease,
            token=token,
        )
        await effects.decided(
            policy, decided, http_status=answer.status, detail=_answer_detail(answer, decided)
        )
        return decided, response
    finally:
        if not released:
            await runtime.store.release_lease(lease, token)


async def _paused(asker: Asker, record: OperationRecord, now: float, wait: float) -> Decision:
    """The provider is paused or at its ceiling: too-early, or (SPEC 16) escalated when the
    pause outlasts the operation's deadline. Runs under the lease."""
    policy, runtime = asker.policy, asker.runtime
    decision = await runtime.store.mutate(
        record.operation_id,
        lambda current: _persisting(decide.paused(policy, current, now, wait)),
        known=record,
    )
    await runtime.effects.decided(policy, decision)
    return decision


async def _come_back(runtime: Runtime, operation_id: str, wait: float, detail: str) -> Decision:
    """too-early with ``Retry-After: wait``, on the record as it stands now."""
    record = await runtime.store.get(operation_id)
    assert record is not None
    return Decision(record, Reply.PROBLEM, problem="too-early", retry_after=wait, detail=detail)


def _answer_detail(answer: ProviderAnswer, decision: Decision) -> str | None:
    """What the audit line says about the answer besides its status: for the story."""
    parts = []
    if answer.failure is not None:
        parts.append(answer.failure.value)
    if answer.retry_after is not None:
        parts.append(f"Retry-After {header_safe(answer.retry_after[:40])}")
    if decision.plan is not None and decision.plan.hint_rejected:
        parts.append("hint rejected")
    return ", ".join(parts) or None


def _refusal(call: Call, decision: Decision, now: float) -> web.StreamResponse:
    if decision.problem == "too-early":
        call.runtime.effects.refusals.note(decision.record, now)
    elif decision.reply is Reply.FINAL:
        call.request[OUTCOME] = "cached"
    return render(call, decision, None, now)


async def close_refusal_windows(runtime: Runtime, operation_ids: list[str]) -> None:
    """Fold the refusals counted in memory into their records and the audit log."""
    effects = runtime.effects
    for operation_id in operation_ids:
        window = effects.refusals.close(operation_id)
        if window is None:
            continue

        def fold(
            current: OperationRecord, count: int = window.count
        ) -> tuple[OperationRecord | None, OperationRecord]:
            folded = current.evolve(early_refusals=current.early_refusals + count)
            return folded, folded

        record = await runtime.store.mutate(operation_id, fold)
        await effects.refused(record, window)


async def recover_cut_polls(runtime: Runtime, limit: int = 10_000) -> int:
    """At start (SPEC 16): every status request cut short by a crash gets its audit line.

    A pending record whose reservation has no recorded answer, and whose poll lease nobody
    holds, was being polled by a process that died. How many were found."""
    found = 0
    where = OperationFilter(outcome=Outcome.PENDING, limit=limit)
    for record in await runtime.store.list(where):
        if record.inflight_at is None:
            continue
        lease, token = f"poll:{record.operation_id}", secrets.token_hex(16)
        ttl = runtime.settings.file.limits.upstream_timeout + LEASE_MARGIN  # one write
        if not await runtime.store.acquire_lease(lease, token, runtime.clock(), ttl):
            continue  # a live process is polling it now
        try:
            decision = await runtime.store.mutate(
                record.operation_id, lambda current: decide.as_write(decide.recover(current))
            )
        finally:
            await runtime.store.release_lease(lease, token)
        if decision is not None and decision.cut_at is not None:
            await runtime.effects.interrupted(decision.record, decision.cut_at)
            found += 1
    return found


# -- result and passthrough --------------------------------------------------------------


async def result(call: Call) -> web.StreamResponse:
    """The result route: only after success, at most ``max_result_fetches`` times, each
    fetch counted on the record before it is sent and audited as ``result_fetched``."""
    runtime, policy = call.runtime, call.policy
    record = await runtime.store.find(call.account.id, policy.provider, call.job_id)
    if record is None:
        return unknown_operation()
    route = policy.routes.result
    assert route is not None
    values = results.provider_values(route.path, record)
    if isinstance(values, results.Refusal):
        return _refused(call, record, values)
    fetched = await runtime.store.mutate(
        record.operation_id,
        lambda current: results.fetch(policy, current),
        known=record,
    )
    if isinstance(fetched, results.Refusal):
        return _refused(call, record, fetched)
    query = agent_query(call.request.rel_url.raw_query_string, route.query_params)
    url = policy.upstream + fill(route.path, values, query)
    sent = to_provider(call.request.headers.items(), policy)
    answer, response = await send_upstream(runtime, policy, "result", route.method, url, sent)
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
    await call.runtime.effects.call(
        provider=call.policy.provider,
        account=call.account.id,
        event=event,
        http_status=answer.status,
        detail=detail + failure,
        operation=operation,
    )


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
        runtime, policy, "passthrough", request.method, url, headers, body or None
    )
    detail = f"{request.method} {header_safe(raw_path)}"
    await _audit_call(call, Event.PASSTHROUGH, answer, detail)
    if response is None:
        return upstream_problem(answer, None)
    return passthrough(call, response, {})
