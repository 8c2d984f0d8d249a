"""Answers to agents built from decisions: operation headers, problems, provider bodies
passed through with URLs rewritten, and the matched call every agent-route handler shares."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import orjson
from aiohttp import web

from gateway.core.decide import Decision, Reply
from gateway.core.escalation import problem_members
from gateway.core.models import Failure, OperationRecord, Outcome, ProviderAnswer
from gateway.core.problems import retry_after_ms, retry_after_value
from gateway.core.routing import Match
from gateway.core.values import parse_json
from gateway.flow.requests import AgentRequest
from gateway.flow.runtime import Runtime
from gateway.http.problems import problem
from gateway.provider.client import UpstreamResponse
from gateway.provider.headers import header_safe
from gateway.settings.config import Account
from gateway.settings.policy import ProviderPolicy
from gateway.settings.units import rfc3339


@dataclass(frozen=True, slots=True)
class Call:
    """One authenticated agent request matched to a declared route."""

    request: AgentRequest
    runtime: Runtime
    account: Account
    policy: ProviderPolicy
    match: Match
    body: bytes | None = None  # read already (a status call naming its job in the body)

    @property
    def job_id(self) -> str:
        assert self.match.job_id is not None
        return self.match.job_id


def operation_headers(record: OperationRecord, now: float) -> dict[str, str]:
    """The Statusgate-* headers of an answer about ``record`` (and Retry-After while it
    is pending). All but Retry-After depend on the record alone, so they are made once per
    record version: an operation refused many times between two writes reuses them."""
    key = (record.operation_id, record.version)
    fixed = _FIXED.get(key)
    if fixed is None or fixed[0] is not record:
        fixed = (record, _fixed_headers(record))
        if len(_FIXED) >= FIXED_HEADERS:
            _FIXED.clear()
        _FIXED[key] = fixed
    headers = dict(fixed[1])
    if record.outcome is Outcome.PENDING:
        headers["Retry-After"] = retry_after_value(record.next_poll_at - now)
    return headers


def dialect_headers(
    policy: ProviderPolicy, record: OperationRecord, now: float, retry_after: float | None = None
) -> dict[str, str]:
    """A client's own pacing header on a pending answer (SPEC 22): ``answers.
    poll_after_ms_header`` (openai-poll-after-ms) with the whole milliseconds until the next
    permitted poll, or until the ``retry_after`` this answer gives when it has one."""
    name = policy.answers.poll_after_ms_header
    if name is None or record.outcome is not Outcome.PENDING:
        return {}
    wait = record.next_poll_at - now if retry_after is None else retry_after
    return {name: retry_after_ms(wait)}


def _fixed_headers(record: OperationRecord) -> dict[str, str]:
    headers = {
        "Statusgate-Operation": record.operation_id,
        "Statusgate-Outcome": record.outcome.value,
        "Statusgate-Requests-Remaining": str(
            max(0, record.max_status_requests - record.status_requests_used)
        ),
        "Statusgate-Deadline": rfc3339(record.deadline_at),
    }
    if record.last_known_state is not None:
        headers["Statusgate-Provider-State"] = header_safe(record.last_known_state)
    if record.outcome is Outcome.PENDING:
        headers["Statusgate-Next-Poll-At"] = rfc3339(record.next_poll_at, millis=True)
    return headers


# (operation id, version) -> (the record, its fixed headers); the record is kept to tell a
# version written again after a rollback from the one cached. Cleared when full.
_FIXED: dict[tuple[str, int], tuple[OperationRecord, dict[str, str]]] = {}
FIXED_HEADERS = 4096


def render(
    call: Call, decision: Decision, upstream: UpstreamResponse | None, now: float
) -> web.StreamResponse:
    record = decision.record
    headers = operation_headers(record, now)
    headers.update(dialect_headers(call.policy, record, now, decision.retry_after))
    if decision.reply is Reply.FINAL and record.final_response is not None:
        final = record.final_response  # stored as the provider sent it: rewrite it again
        body = rewrite_body(call, final.body, final.content_type)
        return _raw(200, headers, body, final.content_type)
    if decision.reply is Reply.PROVIDER and upstream is not None:
        if decision.shown is not None:  # a success still pending (success_requires)
            upstream = dataclasses.replace(upstream, body=decision.shown)
        return passthrough(call, upstream, headers)
    if decision.reply is Reply.REPLAY and record.last_answer is not None:
        return replay(call, decision, now, headers)
    if decision.reply is Reply.CANCEL_ACCEPTED and record.cancel_requested_at is not None:
        accepted = {
            "operation_id": record.operation_id,
            "outcome": record.outcome.value,
            "cancel_requested_at": rfc3339(record.cancel_requested_at, millis=True),
        }
        return web.json_response(accepted, status=202, headers=headers)
    slug = decision.problem or "operation-escalated"
    extra = problem_members(record, call.policy) if slug == "operation-escalated" else None
    return problem(
        slug,
        _detail(slug, decision, upstream, headers),
        operation_id=record.operation_id,
        retry_after=decision.retry_after,
        headers=headers,
        extra=extra,
    )


def replay(call: Call, decision: Decision, now: float, headers: dict[str, str]) -> web.Response:
    """``early_calls: replay`` (SPEC 20): the last provider answer, rewritten again as it is
    stored as the provider sent it, with its ``Age`` and when to come back."""
    last = decision.record.last_answer
    assert last is not None
    body = rewrite_body(call, last.body, last.content_type)
    response = _raw(last.status, headers, body, last.content_type)
    response.headers["Age"] = str(max(0, int(now - last.at)))
    if decision.retry_after is not None:
        response.headers["Retry-After-Ms"] = retry_after_ms(decision.retry_after)
    return response


def _detail(
    slug: str, decision: Decision, upstream: UpstreamResponse | None, headers: dict[str, str]
) -> str:
    record = decision.record
    if decision.detail is not None:
        return decision.detail
    if slug == "too-early":  # the instant as its header has it, formatted once a version
        when = headers.get("Statusgate-Next-Poll-At") or rfc3339(record.next_poll_at, millis=True)
        return f"The next status request is permitted at {when}."
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


def passthrough(
    call: Call, upstream: UpstreamResponse, headers: dict[str, str]
) -> web.StreamResponse:
    rewriter = call.runtime.rewriter(call.policy)
    kept = rewriter.response_headers(upstream.headers.items(), call.policy)
    body = rewrite_body(call, upstream.body, upstream.content_type)
    response = web.Response(status=upstream.status, body=body)
    for name, value in kept:
        response.headers.add(name, value)
    response.headers.update(headers)
    return response


def rewrite_body(call: Call, body: bytes, content_type: str) -> bytes:
    fields = call.policy.routes.submit.status_url_fields
    if not fields or "json" not in content_type.lower():
        return body
    data = parse_json(body)
    if data is None or not call.runtime.rewriter(call.policy).body_fields(data, fields):
        return body
    try:
        return orjson.dumps(data)
    except orjson.JSONEncodeError:  # an integer past 64 bits, which json writes
        return json.dumps(data).encode()


def _raw(status: int, headers: dict[str, str], body: bytes, content_type: str) -> web.Response:
    response = web.Response(status=status, body=body, headers=headers)
    if content_type:
        response.headers["Content-Type"] = content_type
    return response


def unknown_operation() -> web.Response:
    return problem("unknown-operation", "This account has no operation for that job id.")


def upstream_problem(
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
