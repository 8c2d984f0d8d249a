"""The submit route: idempotency, one forwarded submission, and the operation record written
before the agent hears back (SPEC section 4, "Submit"). No submission is ever sent twice by
the gateway on its own."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import secrets
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway import StoreError
from gateway.core import decide, effects, idempotency, keys
from gateway.core.decide import Decision
from gateway.core.effects import Effects
from gateway.core.idempotency import Seen
from gateway.core.keys import QuotaRefusal
from gateway.core.models import (
    Event,
    Failure,
    IdempotencyEntry,
    IdemState,
    OperationRecord,
    Outcome,
    ProviderAnswer,
    StoredResponse,
)
from gateway.core.problems import retry_after_value
from gateway.core.routing import fill, job_id_from_body, kept_values, valid_job
from gateway.flow import quotas as quota_refusals
from gateway.flow.polls import gone, held, record_asker
from gateway.http.answers import (
    Call,
    dialect_headers,
    operation_headers,
    passthrough,
    render,
    rewrite_body,
    upstream_problem,
)
from gateway.http.bodies import read_limited
from gateway.http.prefer import format_wait, prefer_wait
from gateway.http.problems import problem
from gateway.provider.client import UpstreamResponse
from gateway.provider.headers import to_provider
from gateway.provider.send import send_upstream
from gateway.settings.policy import Idempotency, ProviderPolicy

log = logging.getLogger("statusgate")
IN_FLIGHT_MARGIN = 1.0  # an in-flight submission older than the upstream timeout plus this is lost
QUOTA_HOLD = 60.0  # a quota place without a record is free this long after the upstream timeout
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


@dataclass(frozen=True, slots=True)
class Submission:
    """What an agent sent to the submit route, whether over HTTP (``POST /p/...``) or through
    the MCP ``start_job`` tool: the same rules apply to both."""

    method: str
    path_qs: str  # the gateway path and query as sent, part of the request fingerprint
    query: str  # the raw query string, appended to the provider path
    headers: tuple[tuple[str, str], ...]
    body: bytes
    answers_untracked: bool = False  # a 2xx without a job id is an answer, not a job (A2A)


async def submit(call: Call) -> web.StreamResponse:
    request = call.request
    body = await read_body(call)
    sent = Submission(
        request.method,
        request.rel_url.raw_path_qs,
        request.rel_url.raw_query_string,
        tuple(request.headers.items()),
        body,
    )
    return await run(call, sent)


async def run(call: Call, sent: Submission) -> web.StreamResponse:
    """The submission ``sent`` for ``call``'s account, policy and matched submit route.
    Reads nothing of ``call.request``, so a caller without an HTTP submit can run it."""
    runtime, policy = call.runtime, call.policy
    body = sent.body
    rules = policy.routes.submit.idempotency
    key = _idempotency_key(sent, rules)
    if isinstance(key, web.Response):
        return key
    fingerprint = hashlib.sha256(
        f"{sent.method}\n{sent.path_qs}\n{hashlib.sha256(body).hexdigest()}".encode()
    ).hexdigest()
    now = runtime.clock()
    operation_id = new_operation_id(now)
    entry = None
    if key is not None:
        entry = IdempotencyEntry(
            key=f"{call.account.id}\n{policy.provider}\n{key}",
            fingerprint=fingerprint,
            state=IdemState.IN_FLIGHT,
            created_at=now,
            expires_at=now + rules.retention,
            claim=secrets.token_hex(8),  # unique, not the policy's seeded jitter source
        )
    account, provider = call.account.id, policy.provider
    seen = await runtime.records.claim_submission(entry, now, operation_id, account, provider)
    if seen is not None:
        return await _replay(call, seen, fingerprint, now)
    refused = await _within_quotas(call, operation_id, entry)
    if refused is not None:
        return refused
    route = policy.routes.submit
    template = call.match.sent or route.path  # a more_paths form is sent as called
    url = policy.upstream + fill(template, call.match.params, sent.query)
    forwarded = None if key is None else idempotency.forwarded_key(call.account.id, key)
    headers = to_provider(sent.headers, policy, forwarded)
    answer, response = await send_upstream(
        runtime.channel(policy), policy, "submit", route.method, url, headers, body
    )
    if response is None or not 200 <= response.status < 300:
        # no answer: the provider may hold a job, so its quota place stays until the hold
        await _release(call, operation_id, quota=response is not None)
    if response is None:
        await _audit(call, Event.SUBMIT_FAILED, None, f"no answer: {_failure(answer)}")
        return await _submit_failed(call, entry, answer.failure)
    if not 200 <= response.status < 300:
        return await _provider_refused(call, entry, response)
    if sent.answers_untracked and _job_id(call, response, body) is None:
        await _release(call, operation_id, reservation=False)
        return await _untracked(call, entry, response)
    wait = prefer_wait(
        (v for k, v in sent.headers if k.lower() == "prefer"), bare=policy.polling.max_hold
    )
    opened = Opened(operation_id, entry, fingerprint, key)
    return await _open(call, opened, answer, response, body, wait)


def _idempotency_key(sent: Submission, rules: Idempotency) -> str | web.Response | None:
    """The submission's idempotency key (the header, else the policy's body field), None
    when it has none, or the problem to answer: a malformed key, or a required one missing."""
    key = next((v for k, v in sent.headers if k.lower() == "idempotency-key"), None)
    if key is None and rules.from_body is not None:
        key = job_id_from_body(sent.body, rules.from_body)  # e.g. AWS ClientRequestToken
    if key is not None and not idempotency.valid_key(key):
        detail = "Idempotency-Key must be 1 to 255 visible ASCII characters."
        return problem("invalid-request", detail)
    if key is None and rules.required:
        detail = "This provider's submissions must carry an Idempotency-Key header" + (
            f" or a {rules.from_body!r} body field." if rules.from_body else "."
        )
        return problem("idempotency-key-missing", detail)
    return key


async def _provider_refused(
    call: Call, entry: IdempotencyEntry | None, response: UpstreamResponse
) -> web.StreamResponse:
    """A non-2xx answer to the submission: its key forgotten (a retry may submit again),
    the gateway's own credential refused said as such, else the answer passed through."""
    runtime, policy = call.runtime, call.policy
    if entry is not None:
        await runtime.records.drop_idempotency(entry.key)
    if response.status in (401, 403):
        return await _credential_rejected(call, response.status)
    detail = "the provider refused the submission; its answer was passed through"
    await _audit(call, Event.SUBMIT_REJECTED, response.status, detail)
    rewriter = runtime.rewriter(policy)
    passed = web.Response(status=response.status, body=response.body)
    for name, value in rewriter.response_headers(response.headers.items(), policy):
        passed.headers.add(name, value)
    return passed


@dataclass(frozen=True, slots=True)
class Opened:
    """What a forwarded submission carries to the record it opens."""

    operation_id: str  # reserved before the submission was forwarded
    entry: IdempotencyEntry | None
    fingerprint: str
    key: str | None


async def _release(
    call: Call, operation_id: str, *, reservation: bool = True, quota: bool = True
) -> None:
    """The reservation of a submission that opened no operation, given up (one left
    behind, the store failing, is purged after the retention), and its quota place (one
    left behind is free after the in-flight hold)."""
    with contextlib.suppress(StoreError):
        if reservation:
            await call.runtime.records.release_submission(operation_id)
        if quota and call.account.quotas.limited:
            await call.runtime.store.release_quota(call.account.holder, operation_id)


async def _within_quotas(
    call: Call, operation_id: str, entry: IdempotencyEntry | None
) -> web.Response | None:
    """SPEC 25: the submission counted against its key's (or config account's) quotas,
    or ``429 quota-exceeded`` with Retry-After and the claim given back: nothing is sent.
    The count is the store's, atomic across replicas (store/base.py, claim_quota)."""
    account, runtime = call.account, call.runtime
    quotas = account.quotas
    if not quotas.limited:
        return None
    hold = runtime.settings.file.limits.upstream_timeout + QUOTA_HOLD
    now = runtime.clock()
    try:
        wait = await runtime.store.claim_quota(account.holder, operation_id, quotas, now, hold)
    except StoreError:
        await _unclaim(call, operation_id, entry)
        raise  # 503 store-unavailable: nothing was sent
    if wait <= 0:
        return None
    await _unclaim(call, operation_id, entry)
    quota, limit = keys.reached(quotas, wait)
    after = int(retry_after_value(wait))
    refusal = QuotaRefusal(account.id, account.key_id, call.policy.provider, quota, limit, after)
    await quota_refusals.refused(runtime, refusal)  # audited before the answer (SPEC 8)
    limits = [f"{name} {value}" for name, value in quotas.model_dump().items() if value is not None]
    whose = f"agent key {account.key_id}" if account.key_id else f"account {account.id!r}"
    detail = f"The {whose} has reached a quota ({', '.join(limits)}); nothing was sent."
    return problem("quota-exceeded", detail, retry_after=wait)


async def _unclaim(call: Call, operation_id: str, entry: IdempotencyEntry | None) -> None:
    """What ``claim_submission`` wrote for a submission that will not be sent, given back,
    so a retry with its key is not told the key is in use."""
    with contextlib.suppress(StoreError):
        if entry is not None:
            await call.runtime.records.drop_idempotency(entry.key)
        await call.runtime.records.release_submission(operation_id)


async def _untracked(
    call: Call, entry: IdempotencyEntry | None, response: UpstreamResponse
) -> web.StreamResponse:
    """A 2xx that names no job where the protocol allows it (an A2A agent's Message reply
    instead of a Task): the provider's answer itself, no operation opened; a retry with the
    key asks again (nothing to track was started)."""
    if entry is not None:
        await call.runtime.records.drop_idempotency(entry.key)
    await _audit(call, Event.PASSTHROUGH, response.status, "answered without a job to track")
    return passthrough(call, response, {})


async def _credential_rejected(call: Call, status: int) -> web.Response:
    """SPEC 12: the provider refused the gateway's own credential. The agent's token was
    fine, so it must not see a 401 as if it were not; the operator is told."""
    policy = call.policy
    log.error(
        "provider %s answered %d to the gateway's credential on submit; check the policy's "
        "credential",
        policy.provider,
        status,
    )
    detail = "the provider refused the gateway's credential; no operation was created"
    await _audit(call, Event.SUBMIT_REJECTED, status, detail)
    detail = (
        f"The provider answered {status} to the gateway's own credential for "
        f"{policy.provider!r}; no job was created. An operator must fix the credential."
    )
    return problem("provider-credential-rejected", detail)


async def _open(
    call: Call,
    opened: Opened,
    answer: ProviderAnswer,
    response: UpstreamResponse,
    sent: bytes,
    wait: float | None = None,
) -> web.StreamResponse:
    runtime, policy = call.runtime, call.policy
    entry, fingerprint, key = opened.entry, opened.fingerprint, opened.key
    job_id = _job_id(call, response, sent)
    if job_id is None:
        await _release(call, opened.operation_id)
        if entry is not None:  # the job may exist: never let a retry submit it again
            await runtime.records.put_idempotency(_replace(entry, state=IdemState.UNKNOWN))
        await _audit(call, Event.SUBMIT_UNTRACKED, response.status, "no valid job id")
        detail = "The provider accepted the submission but gave no valid job id to track."
        return problem("integration-failure", detail)
    now = runtime.clock()
    decision = decide.open_operation(
        policy,
        operation_id=opened.operation_id,
        account=call.account.id,
        job_id=job_id,
        fingerprint=fingerprint,
        idempotency_key=key,
        answer=answer,
        now=now,
        u=runtime.rng.random(),
        route_values=kept_values(call.match.params),
    )
    if policy.protocol == "a2a":  # its answer is the task's first state (one draw only then)
        decision = decide.with_first_task(policy, decision, answer, now, runtime.rng.random())
    kept = _answer_headers(call, response, job_id)
    stored = StoredResponse(
        response.status, kept, rewrite_body(call, response.body, response.content_type)
    )
    completed = None
    if entry is not None:
        completed = _replace(
            entry,
            state=IdemState.COMPLETED,
            operation_id=decision.record.operation_id,
            response=stored,
        )
    try:
        record = await runtime.records.create(decision.record, completed)
    except StoreError as exc:  # the job exists at the provider: say so, never "nothing forwarded"
        return await _unrecorded(call, entry, response, job_id, exc)
    if record.operation_id == decision.record.operation_id:  # new, not a known job
        await runtime.effects.carry_out(_opened(policy, decision, response.status, now))
    if wait:
        return await held_submit(call, record, stored, wait)
    return _stored_answer(stored, record, runtime.clock(), policy)


async def _unrecorded(
    call: Call,
    entry: IdempotencyEntry | None,
    response: UpstreamResponse,
    job_id: str,
    exc: StoreError,
) -> web.Response:
    """The provider accepted the submission but the store could not record it: the key
    kept as unknown (a retry must not submit again either), the outcome said as unknown."""
    log.error("store failed after provider %s accepted a submission: %s", call.policy.provider, exc)
    if entry is not None:
        with contextlib.suppress(StoreError):
            await call.runtime.records.put_idempotency(_replace(entry, state=IdemState.UNKNOWN))
    await _audit(call, Event.SUBMIT_UNTRACKED, response.status, "the store failed")
    detail = (
        f"The provider accepted the submission (job {job_id}) but the gateway could not "
        "record it. Do not resubmit: an operator must look at the provider."
    )
    return problem("submission-outcome-unknown", detail)


async def held_submit(
    call: Call, record: OperationRecord, stored: StoredResponse, wait: float
) -> web.StreamResponse:
    """A submit that asked ``Prefer: wait=N`` (Replicate's SDK does, on create): the
    submission was forwarded without it (the provider never holds the gateway's
    connection), and the agent is now held as a status call would be (SPEC 4), up to N
    capped at ``max_hold``, polling only as the schedule permits. A job that ends in that
    time is answered with its final answer; otherwise the submit's own answer, with the
    operation's current headers (an answer from a later poll would tell Replicate's SDK
    the job is done: it takes any state but ``starting`` as the end of a wait)."""
    runtime, policy = call.runtime, call.policy
    limit = min(wait, policy.polling.max_hold)
    request = call.request
    asker = record_asker(runtime, policy, record, gone=lambda: gone(request))
    decision, response = await held(asker, record, limit, early=False)
    now = runtime.clock()
    if decision.record.outcome.terminal:
        answer = render(call, decision, response, now)
    else:
        answer = _stored_answer(stored, decision.record, now, policy)
    answer.headers["Preference-Applied"] = f"wait={format_wait(limit)}"
    return answer


def _answer_headers(
    call: Call, response: UpstreamResponse, job_id: str
) -> tuple[tuple[str, str], ...]:
    """The provider's answer headers an agent may see, with a Location of the job's status
    URL at the gateway when the provider gave none and the status route has one."""
    runtime, policy = call.runtime, call.policy
    rewriter = runtime.rewriter(policy)
    kept = tuple(rewriter.response_headers(response.headers.items(), policy))
    status = policy.routes.status
    has_location = any(name.lower() == "location" for name, _ in kept)
    if status.job_id is None and not has_location:  # a status URL exists to point at
        base = f"{runtime.settings.file.public_base_url}/p/{policy.provider}"
        values = {**call.match.params, "job_id": job_id}
        kept = (*kept, ("Location", base + fill(status.path, values)))
    return kept


def _opened(policy: ProviderPolicy, decision: Decision, status: int, now: float) -> Effects:
    """The effects of a new operation: its ``submitted`` line and count, and, when the
    submit answer itself ended the waiting, the escalation too."""
    found = effects.of_decision(policy, decision, now, event=Event.SUBMITTED, http_status=status)
    if decision.record.outcome is Outcome.ESCALATED:
        found += effects.of_decision(policy, decision, now)
    return found


def _job_id(call: Call, response: UpstreamResponse, sent: bytes) -> str | None:
    """The provider's id for the new job, from wherever the policy says (SPEC 12)."""
    source = call.policy.routes.submit.job_id
    job_id: str | None
    if source.source == "body":
        assert source.path is not None
        job_id = job_id_from_body(response.body, source.path)
    elif source.source == "request":
        assert source.path is not None
        job_id = job_id_from_body(sent, source.path)
    elif source.source == "header":
        assert source.name is not None
        job_id = response.headers.get(source.name)
    else:
        job_id = _job_id_from_location(call, response)
    return job_id if job_id is not None and valid_job(call.policy, job_id) else None


def _job_id_from_location(call: Call, response: UpstreamResponse) -> str | None:
    """The status route's {job_id} in Location, else in a declared status URL header."""
    policy = call.policy
    prefix = f"{call.runtime.settings.file.public_base_url}/p/{policy.provider}"
    rewriter = call.runtime.rewriter(policy)
    for header in ("Location", *policy.routes.submit.status_url_headers):
        value = response.headers.get(header)
        gateway_url = rewriter.url(value) if value is not None else None
        if gateway_url is None:
            continue
        path = gateway_url.removeprefix(prefix).split("?", 1)[0]
        match = call.runtime.route_table(policy).match(policy.routes.status.method, path)
        if match is not None and match.kind == "status":
            return match.job_id
    return None


def _stored_answer(
    stored: StoredResponse, record: OperationRecord, now: float, policy: ProviderPolicy
) -> web.Response:
    response = web.Response(status=stored.status, body=stored.body)
    for name, value in stored.headers:
        response.headers.add(name, value)
    response.headers.update(operation_headers(record, now))
    response.headers.update(dialect_headers(policy, record, now))
    return response


async def _replay(
    call: Call, seen: IdempotencyEntry, fingerprint: str, now: float
) -> web.StreamResponse:
    runtime = call.runtime
    limit = runtime.settings.file.limits.upstream_timeout + IN_FLIGHT_MARGIN
    verdict = idempotency.judge(seen, fingerprint, now, limit)
    if verdict is Seen.CONFLICT:
        detail = "This Idempotency-Key was used for a different request."
        return problem("idempotency-key-conflict", detail)
    if verdict is Seen.IN_USE:
        detail = "The original request with this key is still in flight."
        return problem("idempotency-key-in-use", detail, retry_after=1)
    if verdict is Seen.REPLAY:
        assert seen.response is not None and seen.operation_id is not None
        record = await runtime.records.get(seen.operation_id)
        if record is not None:
            return _stored_answer(seen.response, record, now, call.policy)
    detail = (
        "The original submission may have reached the provider, but its answer was lost. "
        "The gateway does not resubmit; check at the provider whether the job exists."
    )
    return problem("submission-outcome-unknown", detail)


async def _submit_failed(
    call: Call, entry: IdempotencyEntry | None, failure: Failure | None
) -> web.StreamResponse:
    store = call.runtime.records
    provider_dedups = call.policy.routes.submit.idempotency.forward_header is not None
    if entry is not None:
        if idempotency.retry_is_safe(failure, provider_dedups):
            await store.drop_idempotency(entry.key)
        else:  # it may have reached the provider: never let a retry submit it again
            await store.put_idempotency(_replace(entry, state=IdemState.UNKNOWN))
    if failure is Failure.TOO_LARGE:
        detail = "The provider's submit answer is larger than limits.max_response_body."
        return problem("integration-failure", detail)
    return upstream_problem(ProviderAnswer(None, failure=failure), None)


async def _audit(call: Call, event: Event, status: int | None, detail: str) -> None:
    """The audit line of a submission that opened no operation (SPEC 16: every provider
    call has one)."""
    line = effects.of_call(
        call.runtime.clock(),
        provider=call.policy.provider,
        account=call.account.id,
        event=event,
        http_status=status,
        detail=detail,
    )
    await call.runtime.effects.carry_out(line)


def _failure(answer: ProviderAnswer) -> str:
    return answer.failure.value if answer.failure is not None else "error"


def _replace(entry: IdempotencyEntry, **changes: Any) -> IdempotencyEntry:
    return dataclasses.replace(entry, **changes)


async def read_body(call: Call) -> bytes:
    """The agent's body within limits.max_request_body and limits.body_timeout (raises
    BodyTooLarge or BodyTimeout, answered 413 and 408 by the errors middleware)."""
    limits = call.runtime.settings.file.limits
    return await read_limited(call.request, limits.max_request_body, limits.body_timeout)


def new_operation_id(now: float) -> str:
    """``op_`` and a ULID: 48 bits of milliseconds then 80 random bits, Crockford base32."""
    value = (int(now * 1000) << 80) | secrets.randbits(80)
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "op_" + "".join(reversed(chars))
