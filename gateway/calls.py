"""What every agent-route handler shares: the matched call, one counted and timed upstream
request, and the answers built from decisions (operation headers, problems, provider bodies
passed through with URLs rewritten)."""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web

from . import tracing
from .config import Account
from .context import CURRENT, note_provider_call
from .credentials import Outgoing
from .decide import Decision, Reply
from .errors import UpstreamBodyTooLarge, UpstreamTimeout, UpstreamUnavailable
from .escalation import problem_members
from .metrics import status_class
from .models import Failure, OperationRecord, Outcome, ProviderAnswer
from .policy import ProviderPolicy
from .problems import problem, retry_after_value
from .routing import Match
from .runtime import Runtime
from .units import rfc3339
from .upstream import UpstreamResponse


@dataclass(frozen=True, slots=True)
class Call:
    """One authenticated agent request matched to a declared route."""

    request: web.Request
    runtime: Runtime
    account: Account
    policy: ProviderPolicy
    match: Match
    body: bytes | None = None  # read already (a status call naming its job in the body)

    @property
    def job_id(self) -> str:
        assert self.match.job_id is not None
        return self.match.job_id


async def send_upstream(
    runtime: Runtime,
    policy: ProviderPolicy,
    route: str,
    method: str,
    url: str,
    headers: dict[str, str],
    body: bytes | None = None,
    *,
    operation_id: str | None = None,
) -> tuple[ProviderAnswer, UpstreamResponse | None]:
    """One upstream request as the core sees it (plus the raw answer when there is one),
    counted, timed and traced. ``headers`` come from headers.to_provider; the policy's
    credential is put on here."""
    metrics = runtime.effects.metrics
    started = time.perf_counter()
    headers = dict(headers)
    with tracing.client_span(f"{method} {route}", headers) as span:
        if span.recording:
            host, port, path = _server(url, policy.upstream)
            context = CURRENT.get()
            span.update(
                {
                    "http.request.method": method,
                    "server.address": host,
                    "server.port": port,
                    "url.path": path,  # never the query: it may hold a key
                    "statusgate.provider": policy.provider,
                    "statusgate.route": route,
                    "statusgate.operation_id": operation_id,  # none yet at submit
                    "statusgate.account": context.account if context else None,
                }
            )
        response, failure = await _exchange(
            runtime, policy, route, Outgoing(method, url, headers, body)
        )
        if response is not None:
            span.update({"http.response.status_code": response.status})
            if response.status >= 400:  # an error for a client span (semantic conventions)
                span.failed(f"answered {response.status}", str(response.status))
        else:
            span.update({"error.type": failure.value if failure is not None else "error"})
            span.failed("no usable answer from the provider")
    elapsed = time.perf_counter() - started
    metrics.upstream_duration.labels(policy.provider, route).observe(elapsed)
    status = response.status if response is not None else None
    label = status_class(status, failure.value if failure is not None else None)
    metrics.upstream_requests.labels(policy.provider, route, label).inc()
    note_provider_call(status, elapsed)
    if response is None or failure is Failure.CREDENTIAL_RENEWED:
        return ProviderAnswer(None, failure=failure), None
    answer = ProviderAnswer(
        status=response.status,
        body=response.body,
        content_type=response.content_type,
        retry_after=response.headers.get("Retry-After"),
    )
    return answer, response


async def _exchange(
    runtime: Runtime, policy: ProviderPolicy, route: str, request: Outgoing
) -> tuple[UpstreamResponse | None, Failure | None]:
    """Send with the credential on. A 401 to an OAuth2 token renews it: any other call is
    sent once more with the new token (it was refused, nothing happened at the provider);
    a status call is not, since every status request sent counts against the budget: it
    reports ``CREDENTIAL_RENEWED`` (a transport failure) and the next permitted poll uses
    the new token."""
    credential = runtime.applier(policy)
    attempts = 1 if route == "status" else 2
    response: UpstreamResponse | None = None
    try:
        for _ in range(attempts):
            response = None
            out = await credential.apply(request)
            response = await runtime.upstream.send(
                out.method, out.url, out.headers, out.body, secrets=credential.secrets()
            )
            if response.status != 401 or not credential.renew():
                return response, None
        renewed = route == "status"
        return response, Failure.CREDENTIAL_RENEWED if renewed else None
    except UpstreamTimeout:
        return None, Failure.TIMEOUT
    except UpstreamBodyTooLarge:
        return None, Failure.TOO_LARGE
    except UpstreamUnavailable as exc:
        return None, Failure.CONNECTION if exc.sent else Failure.UNREACHABLE


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
        headers["Statusgate-Provider-State"] = header_safe(record.last_known_state)
    if record.outcome is Outcome.PENDING:
        headers["Retry-After"] = retry_after_value(record.next_poll_at - now)
        headers["Statusgate-Next-Poll-At"] = rfc3339(record.next_poll_at, millis=True)
    return headers


def _server(url: str, upstream: str) -> tuple[str | None, int, str]:
    """Host, port and path (without the query) of a provider call: the provider's part
    parsed once, the rest cut from ``url``."""
    if not url.startswith(upstream):
        return _origin(url.split("?", 1)[0])
    host, port, base = _origin(upstream)
    return host, port, base + url[len(upstream) :].split("?", 1)[0]


@functools.lru_cache(maxsize=64)
def _origin(url: str) -> tuple[str | None, int, str]:
    parts = urlsplit(url)
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), parts.path


@functools.lru_cache(maxsize=1024)
def header_safe(text: str) -> str:
    cleaned = "".join(c if 0x20 <= ord(c) < 0x7F else "?" for c in text[:200])
    return cleaned


def render(
    call: Call, decision: Decision, upstream: UpstreamResponse | None, now: float
) -> web.StreamResponse:
    record = decision.record
    headers = operation_headers(record, now)
    if decision.reply is Reply.FINAL and record.final_response is not None:
        final = record.final_response  # stored as the provider sent it: rewrite it again
        body = rewrite_body(call, final.body, final.content_type)
        return _raw(200, headers, body, final.content_type)
    if decision.reply is Reply.PROVIDER and upstream is not None:
        return passthrough(call, upstream, headers)
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
        return (
            f"The next status request is permitted at {rfc3339(record.next_poll_at, millis=True)}."
        )
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
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return body
    if not call.runtime.rewriter(call.policy).body_fields(data, fields):
        return body
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
