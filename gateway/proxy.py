"""Agent-facing handlers under ``/p/{provider}/...``: the thin shell around decide.py.

Each handler loads, asks the pure core, sends at most what the decision allows, asks the core
again about the answer, saves, and answers. No polling rule lives here; if one seems to, it
belongs in decide.py or schedule.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from . import decide
from .config import Account
from .decide import Decision, Failure, ProviderAnswer, Reply
from .errors import NotAdmissible, UpstreamBodyTooLarge, UpstreamTimeout, UpstreamUnavailable
from .escalation import problem_members, rfc3339
from .headers import format_wait, prefer_wait, to_provider, valid_job_id
from .metrics import status_class
from .models import IdempotencyEntry, IdemState, OperationRecord, Outcome, StoredResponse
from .policy import ProviderPolicy
from .problems import problem, retry_after_value
from .routing import Match, fill
from .runtime import OUTCOME, PROVIDER, ROUTE, RUNTIME, PollTask, Runtime
from .schedule import provider_limit
from .upstream import UpstreamResponse

LEASE_MARGIN = 1.0  # a lease outlives the upstream timeout by this much
MIN_HOLD_STEP = 0.005  # a held call never wakes more often than this
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


@dataclass(frozen=True, slots=True)
class Call:
    """One authenticated agent request matched to a declared route."""

    request: web.Request
    runtime: Runtime
    account: Account
    policy: ProviderPolicy
    match: Match

    @property
    def job_id(self) -> str:
        assert self.match.job_id is not None
        return self.match.job_id


async def handle(request: web.Request) -> web.StreamResponse:
    """Entry for every ``/p/{provider}/...`` request."""
    runtime = request.app[RUNTIME]
    account = runtime.agent(request.headers.get("Authorization"))
    if account is None:
        return problem("unauthenticated", "Send 'Authorization: Bearer <agent token>'.")
    name = request.match_info["provider"]
    policy = runtime.settings.policies.get(name)
    if policy is None:
        return problem("unknown-provider", f"No provider named {name!r} is configured.")
    if not account.allows(name):
        return problem("forbidden", f"This account may not use provider {name!r}.")
    request[PROVIDER] = name
    raw_path = request.rel_url.raw_path.removeprefix(f"/p/{name}")
    match = runtime.routes[name].match(request.method, raw_path)
    if match is None:
        detail = f"{request.method} {raw_path} is not a declared route of {name!r}."
        return problem("route-not-allowed", detail)
    if match.job_id is not None and not valid_job_id(match.job_id):
        return problem("invalid-request", "The job id must match [A-Za-z0-9._~-]{1,200}.")
    request[ROUTE] = match.kind
    call = Call(request, runtime, account, policy, match)
    if match.kind == "submit":
        return await submit(call)
    if match.kind == "status":
        return await status(call)
    if match.kind == "result":
        return await result(call)
    return problem(
        "approval-required",
        "Cancelling a job is an operator decision: ask an operator to use "
        "POST /admin/operations/{id}/cancel.",
    )


# -- status -------------------------------------------------------------------------------


async def status(call: Call) -> web.StreamResponse:
    runtime, policy = call.runtime, call.policy
    record = await runtime.store.find(call.account.id, policy.provider, call.job_id)
    if record is None:
        return _unknown_operation()
    wait = prefer_wait(call.request.headers.getall("Prefer", []))
    if wait is not None:
        return await _hold(call, record, min(wait, policy.polling.max_hold))
    now = runtime.clock()
    decision = decide.admit(policy, record, now)
    if not decision.forward and not decision.changed:  # answered without any write
        return _refusal(call, decision, now)
    decision, response = await _shared_poll(call, record.operation_id, pace=decision.forward)
    return render(call, decision, response, runtime.clock())


async def _hold(call: Call, record: OperationRecord, wait: float) -> web.StreamResponse:
    """``Prefer: wait=N``: wait for the next permitted poll, poll for the agent, and keep
    waiting through pending answers until the job ends, waiting must end, N seconds pass,
    the deadline comes or the gateway stops. A held call costs only timers."""
    runtime = call.runtime
    end = min(runtime.clock() + wait, record.deadline_at)
    runtime.holding += 1
    try:
        decision, response = await _step(call, record)
        while decision.record.outcome is Outcome.PENDING and decision.retry_after is not None:
            now = runtime.clock()
            wake = now + max(decision.retry_after, MIN_HOLD_STEP)
            if wake > end or _gone(call.request) or not await runtime.pause(wake - now):
                break
            current = await runtime.store.get(record.operation_id)
            assert current is not None
            decision, response = await _step(call, current)
    finally:
        runtime.holding -= 1
    answer = render(call, decision, response, runtime.clock())
    answer.headers["Preference-Applied"] = f"wait={format_wait(wait)}"
    return answer


async def _step(call: Call, record: OperationRecord) -> tuple[Decision, UpstreamResponse | None]:
    """One look at the operation: the answer from the record, or one shared poll."""
    decision = decide.admit(call.policy, record, call.runtime.clock())
    if not decision.forward and not decision.changed:
        return decision, None
    return await _shared_poll(call, record.operation_id, pace=decision.forward)


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


async def _shared_poll(
    call: Call, operation_id: str, *, pace: bool
) -> tuple[Decision, UpstreamResponse | None]:
    """Step 7: one poll per operation in this process at a time; every caller gets its
    answer. The poll is a task of its own, so a caller that goes away never cuts it short."""
    runtime = call.runtime
    task = runtime.inflight.get(operation_id)
    if task is None:
        task = asyncio.create_task(_poll(call, operation_id, pace=pace))
        runtime.inflight[operation_id] = task
        task.add_done_callback(lambda done: _forget(runtime, operation_id, done))
    else:
        call.request[OUTCOME] = "cached"
    return await asyncio.shield(task)


def _forget(runtime: Runtime, operation_id: str, task: PollTask) -> None:
    if runtime.inflight.get(operation_id) is task:
        del runtime.inflight[operation_id]
    if not task.cancelled():
        task.exception()  # retrieved here, raised to every caller still waiting


def _persisting(decision: Decision) -> tuple[OperationRecord | None, Decision]:
    """A decision as a store mutation: write its record only if it changed."""
    return (decision.record if decision.changed else None), decision


async def _poll(
    call: Call, operation_id: str, *, pace: bool
) -> tuple[Decision, UpstreamResponse | None]:
    """Steps 8 and 9: lease, re-check and reserve (or escalate), send exactly one request,
    classify, save. Every write to the record happens under the lease."""
    runtime, policy = call.runtime, call.policy
    lease = f"poll:{operation_id}"
    token = secrets.token_hex(16)
    ttl = runtime.settings.file.limits.upstream_timeout + LEASE_MARGIN
    if not await runtime.store.acquire_lease(lease, token, runtime.clock(), ttl):
        record = await runtime.store.get(operation_id)
        assert record is not None
        detail = "A status request for this operation is already in flight."
        busy = Decision(record, Reply.PROBLEM, problem="too-early", retry_after=1.0, detail=detail)
        return busy, None
    try:
        now = runtime.clock()
        if pace:
            wait = await runtime.store.pace(policy.provider, policy.polling.provider_rate, now)
            if wait > 0:
                return await _deferred(runtime, operation_id, wait), None
        effects = runtime.effects
        window = effects.refusals.close(operation_id)
        refusals = window.count if window is not None else 0
        try:
            decision = await runtime.store.mutate(
                operation_id,
                lambda current: _persisting(decide.take(policy, current, now, refusals)),
            )
        except NotAdmissible as exc:
            record = await runtime.store.get(operation_id)
            assert record is not None
            refused = Decision(
                record, Reply.PROBLEM, problem="too-early", retry_after=1.0, detail=str(exc)
            )
            return refused, None
        if window is not None:
            await effects.refused(decision.record, window)
        if not decision.forward:
            await effects.decided(policy, decision)
            return decision, None
        url = policy.upstream + fill(policy.routes.status.path, call.job_id)
        if call.request.rel_url.raw_query_string:
            url += "?" + call.request.rel_url.raw_query_string
        headers = to_provider(call.request.headers.items(), policy)
        method = policy.routes.status.method
        answer, response = await send_upstream(runtime, policy, "status", method, url, headers)
        done = runtime.clock()
        limit = provider_limit(answer.status, response.headers if response else {}, done)
        if limit is not None:
            await runtime.store.tighten(policy.provider, *limit)
        u = runtime.rng.random()
        reserved = decision.record
        decided = await runtime.store.mutate(
            operation_id,
            lambda current: _persisting(
                decide.classify(policy, current, answer, done, u)
                if decide.still_ours(reserved, current)
                else decide.superseded(current, done)
            ),
        )
        await effects.decided(
            policy, decided, http_status=answer.status, detail=_answer_detail(answer, decided)
        )
        return decided, response
    finally:
        await runtime.store.release_lease(lease, token)


async def _deferred(runtime: Runtime, operation_id: str, wait: float) -> Decision:
    record = await runtime.store.get(operation_id)
    assert record is not None
    detail = "The provider's ceiling on status calls is reached; this poll waits its turn."
    return Decision(record, Reply.PROBLEM, problem="too-early", retry_after=wait, detail=detail)


async def send_upstream(
    runtime: Runtime,
    policy: ProviderPolicy,
    route: str,
    method: str,
    url: str,
    headers: dict[str, str],
    body: bytes | None = None,
) -> tuple[ProviderAnswer, UpstreamResponse | None]:
    """One upstream request as the core sees it (plus the raw answer when there is one),
    counted and timed. ``headers`` come from headers.to_provider (credential included)."""
    metrics = runtime.effects.metrics
    started = time.perf_counter()
    failure: Failure | None = None
    response: UpstreamResponse | None = None
    try:
        response = await runtime.upstream.send(method, url, headers, body, secrets=policy.secrets)
    except UpstreamTimeout:
        failure = Failure.TIMEOUT
    except UpstreamBodyTooLarge:
        failure = Failure.TOO_LARGE
    except UpstreamUnavailable as exc:
        failure = Failure.CONNECTION if exc.sent else Failure.UNREACHABLE
    metrics.upstream_duration.labels(policy.provider, route).observe(time.perf_counter() - started)
    status = response.status if response is not None else None
    label = status_class(status, failure.value if failure is not None else None)
    metrics.upstream_requests.labels(policy.provider, route, label).inc()
    if response is None:
        return ProviderAnswer(None, failure=failure), None
    answer = ProviderAnswer(
        status=response.status,
        body=response.body,
        content_type=response.content_type,
        retry_after=response.headers.get("Retry-After"),
    )
    return answer, response


def _answer_detail(answer: ProviderAnswer, decision: Decision) -> str | None:
    """What the audit line says about the answer besides its status: for the story."""
    parts = []
    if answer.failure is not None:
        parts.append(answer.failure.value)
    if answer.retry_after is not None:
        parts.append(f"Retry-After {_header_safe(answer.retry_after[:40])}")
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


# -- answers ------------------------------------------------------------------------------


def operation_headers(record: OperationRecord, now: float) -> dict[str, str]:
    headers = {
        "Statusgate-Operation": record.operation_id,
        "Statusgate-Outcome": record.outcome.value,
        "Statusgate-Requests-Remaining": str(
            max(0, record.max_status_requests - record.status_requests_used)
        ),
        "Statusgate-Deadline": rfc3339(record.deadline_at),
    }
    if record.last_known_state is not None:
        headers["Statusgate-Provider-State"] = _header_safe(record.last_known_state)
    if record.outcome is Outcome.PENDING:
        headers["Retry-After"] = retry_after_value(record.next_poll_at - now)
        headers["Statusgate-Next-Poll-At"] = rfc3339(record.next_poll_at, millis=True)
    return headers


def _header_safe(text: str) -> str:
    cleaned = "".join(c if 0x20 <= ord(c) < 0x7F else "?" for c in text[:200])
    return cleaned


def render(
    call: Call, decision: Decision, upstream: UpstreamResponse | None, now: float
) -> web.StreamResponse:
    record = decision.record
    headers = operation_headers(record, now)
    if decision.reply is Reply.FINAL and record.final_response is not None:
        final = record.final_response
        return _raw(200, headers, final.body, final.content_type)
    if decision.reply is Reply.PROVIDER and upstream is not None:
        return _passthrough(call, upstream, headers)
    slug = decision.problem or "operation-escalated"
    extra = problem_members(record, call.policy) if slug == "operation-escalated" else None
    return problem(
        slug,
        _detail(slug, decision, upstream),
        operation_id=record.operation_id,
        retry_after=decision.retry_after,
        headers=headers,
        extra=extra,
    )


def _detail(slug: str, decision: Decision, upstream: UpstreamResponse | None) -> str:
    record = decision.record
    if decision.detail is not None:
        return decision.detail
    if slug == "too-early":
        return f"The next status request is permitted at {rfc3339(record.next_poll_at, True)}."
    if slug == "operation-escalated":
        escalation = record.escalation
        if escalation is None:
            return f"The operation was {record.outcome.value} by an operator."
        return escalation.detail
    if slug in ("provider-unavailable", "provider-timeout"):
        if upstream is not None:
            return f"The provider answered {upstream.status}."
        return "The provider could not be reached or did not answer in time."
    if slug == "provider-rate-limited":
        return "The provider answered 429 Too Many Requests."
    if slug == "job-not-visible-yet":
        return "The provider does not show the job yet; this is normal right after submission."
    return slug


def _passthrough(
    call: Call, upstream: UpstreamResponse, headers: dict[str, str]
) -> web.StreamResponse:
    rewriter = call.runtime.rewriters[call.policy.provider]
    kept = rewriter.response_headers(upstream.headers.items(), call.policy)
    body = _rewrite_body(call, upstream.body, upstream.content_type)
    response = web.Response(status=upstream.status, body=body)
    for name, value in kept:
        response.headers.add(name, value)
    response.headers.update(headers)
    return response


def _rewrite_body(call: Call, body: bytes, content_type: str) -> bytes:
    fields = call.policy.routes.submit.status_url_fields
    if not fields or "json" not in content_type.lower():
        return body
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return body
    if not call.runtime.rewriters[call.policy.provider].body_fields(data, fields):
        return body
    return json.dumps(data).encode()


def _raw(status: int, headers: dict[str, str], body: bytes, content_type: str) -> web.Response:
    response = web.Response(status=status, body=body, headers=headers)
    if content_type:
        response.headers["Content-Type"] = content_type
    return response


def _unknown_operation() -> web.Response:
    return problem("unknown-operation", "This account has no operation for that job id.")


# -- result -------------------------------------------------------------------------------


async def result(call: Call) -> web.StreamResponse:
    runtime, policy = call.runtime, call.policy
    record = await runtime.store.find(call.account.id, policy.provider, call.job_id)
    if record is None:
        return _unknown_operation()
    now = runtime.clock()
    headers = operation_headers(record, now)
    if record.outcome is not Outcome.SUCCEEDED:
        detail = f"The operation is {record.outcome.value}; the result is served after success."
        return problem("not-ready", detail, operation_id=record.operation_id, headers=headers)
    route = policy.routes.result
    assert route is not None
    url = policy.upstream + fill(route.path, call.job_id)
    sent = to_provider(call.request.headers.items(), policy)
    answer, response = await send_upstream(runtime, policy, "result", route.method, url, sent)
    if response is None:
        return _upstream_problem(answer, record.operation_id, headers)
    return _passthrough(call, response, headers)


def _upstream_problem(
    answer: ProviderAnswer, operation_id: str | None, headers: dict[str, str] | None = None
) -> web.Response:
    if answer.failure is Failure.TIMEOUT:
        detail = "The provider did not answer in time."
        return problem("provider-timeout", detail, operation_id=operation_id, retry_after=1)
    if answer.failure is Failure.TOO_LARGE:
        detail = "The provider's answer is larger than limits.max_response_body."
        return problem("integration-failure", detail, operation_id=operation_id)
    detail = "The provider could not be reached."
    return problem(
        "provider-unavailable", detail, operation_id=operation_id, retry_after=1, headers=headers
    )


# -- submit -------------------------------------------------------------------------------


async def submit(call: Call) -> web.StreamResponse:
    runtime, policy, request = call.runtime, call.policy, call.request
    body = await read_body(request, runtime.settings.file.limits.max_request_body)
    if isinstance(body, web.Response):
        return body
    rules = policy.routes.submit.idempotency
    key = request.headers.get("Idempotency-Key")
    if key is not None and (not key.strip() or len(key) > 255):
        return problem("invalid-request", "Idempotency-Key must be 1 to 255 characters.")
    if key is None and rules.required:
        detail = "This provider's submissions must carry an Idempotency-Key header."
        return problem("idempotency-key-missing", detail)
    path = request.rel_url.raw_path_qs
    fingerprint = hashlib.sha256(
        f"{request.method}\n{path}\n{hashlib.sha256(body).hexdigest()}".encode()
    ).hexdigest()
    now = runtime.clock()
    entry = None
    if key is not None:
        entry = IdempotencyEntry(
            key=f"{call.account.id}\n{policy.provider}\n{key}",
            fingerprint=fingerprint,
            state=IdemState.IN_FLIGHT,
            created_at=now,
            expires_at=now + rules.retention,
        )
        seen = await runtime.store.claim_idempotency(entry, now)
        if seen is not None:
            return await _replay(call, seen, fingerprint, now)
    route = policy.routes.submit
    url = policy.upstream + route.path
    if request.rel_url.raw_query_string:
        url += "?" + request.rel_url.raw_query_string
    headers = to_provider(request.headers.items(), policy, key)
    answer, response = await send_upstream(
        runtime, policy, "submit", route.method, url, headers, body
    )
    if response is None:
        return await _submit_failed(call, entry, answer.failure)
    if not 200 <= response.status < 300:
        if entry is not None:
            await runtime.store.drop_idempotency(entry.key)
        rewriter = runtime.rewriters[policy.provider]
        passed = web.Response(status=response.status, body=response.body)
        for name, value in rewriter.response_headers(response.headers.items(), policy):
            passed.headers.add(name, value)
        return passed
    return await _open(call, entry, fingerprint, key, answer, response)


async def _open(
    call: Call,
    entry: IdempotencyEntry | None,
    fingerprint: str,
    key: str | None,
    answer: ProviderAnswer,
    response: UpstreamResponse,
) -> web.StreamResponse:
    runtime, policy = call.runtime, call.policy
    job_id = _job_id(call, response)
    if job_id is None:
        if entry is not None:  # the job may exist: never let a retry submit it again
            await runtime.store.put_idempotency(_replace(entry, state=IdemState.UNKNOWN))
        detail = "The provider accepted the submission but gave no valid job id to track."
        return problem("integration-failure", detail)
    now = runtime.clock()
    decision = decide.open_operation(
        policy,
        operation_id=new_operation_id(now),
        account=call.account.id,
        job_id=job_id,
        fingerprint=fingerprint,
        idempotency_key=key,
        answer=answer,
        now=now,
        u=runtime.rng.random(),
    )
    rewriter = runtime.rewriters[policy.provider]
    kept = tuple(rewriter.response_headers(response.headers.items(), policy))
    status_url = f"{runtime.settings.file.public_base_url}/p/{policy.provider}" + fill(
        policy.routes.status.path, job_id
    )
    if not any(name.lower() == "location" for name, _ in kept):
        kept = (*kept, ("Location", status_url))
    stored = StoredResponse(
        response.status, kept, _rewrite_body(call, response.body, response.content_type)
    )
    completed = None
    if entry is not None:
        completed = _replace(
            entry,
            state=IdemState.COMPLETED,
            operation_id=decision.record.operation_id,
            response=stored,
        )
    record = await runtime.store.create(decision.record, completed)
    if record.operation_id == decision.record.operation_id:  # new, not a known job
        opened = dataclasses.replace(decision, event="submitted")
        await runtime.effects.decided(policy, opened, http_status=response.status)
        if record.outcome is Outcome.ESCALATED:
            await runtime.effects.decided(policy, decision)
    return _stored_answer(stored, record, runtime.clock())


def _job_id(call: Call, response: UpstreamResponse) -> str | None:
    source = call.policy.routes.submit.job_id
    if source.source == "body":
        try:
            value = decide.lookup(json.loads(response.body), source.path)
        except (ValueError, RecursionError):
            return None
        job_id = (
            str(value) if isinstance(value, str | int) and not isinstance(value, bool) else None
        )
    else:
        job_id = _job_id_from_location(call, response)
    return job_id if job_id is not None and valid_job_id(job_id) else None


def _job_id_from_location(call: Call, response: UpstreamResponse) -> str | None:
    """The status route's {job_id} in Location, else in a declared status URL header."""
    policy = call.policy
    prefix = f"{call.runtime.settings.file.public_base_url}/p/{policy.provider}"
    rewriter = call.runtime.rewriters[policy.provider]
    for header in ("Location", *policy.routes.submit.status_url_headers):
        value = response.headers.get(header)
        gateway_url = rewriter.url(value) if value is not None else None
        if gateway_url is None:
            continue
        path = gateway_url.removeprefix(prefix).split("?", 1)[0]
        match = call.runtime.routes[policy.provider].match(policy.routes.status.method, path)
        if match is not None and match.kind == "status":
            return match.job_id
    return None


def _stored_answer(stored: StoredResponse, record: OperationRecord, now: float) -> web.Response:
    response = web.Response(status=stored.status, body=stored.body)
    for name, value in stored.headers:
        response.headers.add(name, value)
    response.headers.update(operation_headers(record, now))
    return response


async def _replay(
    call: Call, seen: IdempotencyEntry, fingerprint: str, now: float
) -> web.StreamResponse:
    runtime = call.runtime
    if seen.fingerprint != fingerprint:
        detail = "This Idempotency-Key was used for a different request."
        return problem("idempotency-key-conflict", detail)
    stale = now - seen.created_at > runtime.settings.file.limits.upstream_timeout + LEASE_MARGIN
    if seen.state is IdemState.IN_FLIGHT and not stale:
        detail = "The original request with this key is still in flight."
        return problem("idempotency-key-in-use", detail, retry_after=1)
    if seen.state is IdemState.COMPLETED and seen.response is not None and seen.operation_id:
        record = await runtime.store.get(seen.operation_id)
        if record is not None:
            return _stored_answer(seen.response, record, now)
    detail = (
        "The original submission may have reached the provider, but its answer was lost. "
        "The gateway does not resubmit; check at the provider whether the job exists."
    )
    return problem("submission-outcome-unknown", detail)


async def _submit_failed(
    call: Call, entry: IdempotencyEntry | None, failure: Failure | None
) -> web.StreamResponse:
    store = call.runtime.store
    provider_dedups = call.policy.routes.submit.idempotency.forward_header is not None
    if entry is not None:
        if failure is Failure.UNREACHABLE or provider_dedups:
            await store.drop_idempotency(entry.key)
        else:  # it may have reached the provider: never let a retry submit it again
            await store.put_idempotency(_replace(entry, state=IdemState.UNKNOWN))
    if failure is Failure.TOO_LARGE:
        detail = "The provider's submit answer is larger than limits.max_response_body."
        return problem("integration-failure", detail)
    return _upstream_problem(ProviderAnswer(None, failure=failure), None)


def _replace(entry: IdempotencyEntry, **changes: Any) -> IdempotencyEntry:
    return dataclasses.replace(entry, **changes)


async def read_body(request: web.Request, cap: int) -> bytes | web.Response:
    if request.content_length is not None and request.content_length > cap:
        return problem("request-too-large", f"The body is larger than {cap} bytes.")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > cap:
            return problem("request-too-large", f"The body is larger than {cap} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)


def new_operation_id(now: float) -> str:
    """``op_`` and a ULID: 48 bits of milliseconds then 80 random bits, Crockford base32."""
    value = (int(now * 1000) << 80) | secrets.randbits(80)
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "op_" + "".join(reversed(chars))
