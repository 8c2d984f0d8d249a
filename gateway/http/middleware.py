"""The one middleware every request passes (``gate``): request id, duration, metrics and the
log line; the server span (``traced``, only when tracing is on); which listener serves which
paths (``misrouted``); no agent request queued behind too many others (``overloaded``); no
new work while the audit log cannot be written; every error as problem+json, the store
failing closing the gate (``failed``). One middleware, not one per concern: each costs a
coroutine frame and a call on every request. Also what reaches the log from aiohttp's own
HTTP parser (``ParserNoise``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from gateway import AuditUnavailable, StoreError
from gateway.flow.requests import AgentRequest
from gateway.flow.runtime import OUTCOME, PROVIDER, ROUTE, RUNTIME, Runtime
from gateway.http.bodies import BodyTimeout, BodyTooLarge
from gateway.http.problems import SLUG, problem
from gateway.observe import tracing
from gateway.observe.context import CURRENT, RequestContext, request_id_from
from gateway.observe.logs import request_line

log = logging.getLogger("statusgate")
R = TypeVar("R", bound=AgentRequest)  # aiohttp's web.Request, or the lane's LaneRequest
Handler = Callable[[R], Awaitable[web.StreamResponse]]
STORE_RETRY_AFTER = 2.0
OVERLOAD_RETRY_AFTER = 1.0
OVERLOADED = (
    "The gateway has as many requests in hand as it takes at once (limits.max_in_flight); "
    "nothing was read, stored or forwarded. Retry after the Retry-After header."
)


def _route(request: AgentRequest) -> str:
    return str(request.get(ROUTE, "other"))


@web.middleware
async def gate(request: R, handler: Handler[R]) -> web.StreamResponse:
    """The one middleware every request passes (one frame, not one per concern): request id
    (kept or made, echoed), duration of every answer, agent requests by provider, route and
    outcome, and one log line per request (SPEC 13); around ``guarded``, or around the
    server span (``traced``, only when tracing is on) that wraps it."""
    started = time.perf_counter()
    context = RequestContext(request_id_from(request.headers.get("X-Request-Id")))
    token = CURRENT.set(context)
    runtime = request.app[RUNTIME]
    try:
        if runtime.traced:
            response = await traced(request, handler)
        else:
            response = await guarded(request, handler)
    finally:
        CURRENT.reset(token)
    response.headers["X-Request-Id"] = context.request_id
    elapsed = time.perf_counter() - started
    route = _route(request)
    metrics = runtime.effects.metrics
    metrics.histogram("request_duration", route).observe(elapsed)
    provider = request.get(PROVIDER)
    if provider is not None:
        outcome = response.get(SLUG) or request.get(OUTCOME, "forwarded")
        metrics.counter("agent_requests", provider, route, outcome).inc()
    request_line(
        {
            "request_id": context.request_id,
            "method": request.method,
            "path": request.path,
            "status": response.status,
            "duration_ms": round(elapsed * 1000, 3),
            "account": context.account,
            "provider": provider,
            "operation_id": response.headers.get("Statusgate-Operation"),
            "outcome": response.headers.get("Statusgate-Outcome") or response.get(SLUG),
            "provider_status": context.provider_status,
            "provider_ms": context.provider_ms,
        }
    )
    return response


UNTRACED = ("/metrics", "/healthz", "/readyz")
METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}
)
TRACED_TOP = frozenset({"p", "admin", "mcp", "console", "problems"})


async def traced(request: R, handler: Handler[R]) -> web.StreamResponse:
    """A server span per request (SPEC 17), continuing the agent's trace context; provider
    calls made for it (held polls included) become its client spans. Its name and the
    attributes kept from span to span are of bounded variety, whatever an agent sends."""
    path = request.path
    if path.startswith(UNTRACED):
        return await guarded(request, handler)
    method = request.method if request.method in METHODS else "_OTHER"
    top = path.split("/", 2)[1] if path != "/" else ""
    name = f"{method} /{top if top in TRACED_TOP else '*'}"
    with tracing.server_span(name, request.headers) as span:
        if not span.recording:
            return await guarded(request, handler)
        context = CURRENT.get()
        span.update(  # before the answer: a request cut short still says what it was
            {
                "http.request.method": method,
                "http.request.method_original": request.method if method == "_OTHER" else None,
                "url.path": path,  # never the query
                "statusgate.request_id": context.request_id if context else None,
            }
        )
        response = await guarded(request, handler)
        headers = response.headers
        span.update(
            {
                "http.route": _route(request),
                "http.response.status_code": response.status,
                "statusgate.provider": request.get(PROVIDER),
                "statusgate.account": context.account if context else None,
                "statusgate.operation_id": headers.get("Statusgate-Operation"),
                "statusgate.outcome": headers.get("Statusgate-Outcome"),
            }
        )
        if response.status >= 500 and span.error is None:
            span.failed(f"answered {response.status}", str(response.status))
        return response


ADMIN_PATHS = ("/admin", "/console", "/metrics")
AGENT_PATHS = ("/p/", "/mcp", "/hooks/")


async def guarded(request: R, handler: Handler[R]) -> web.StreamResponse:
    """The handler behind the gate's checks, in this order: the listener serving the path
    (``misrouted``); no agent request beyond ``limits.max_in_flight`` (``overloaded``); no
    new work while the audit log cannot be written (``check_audit``); every error leaves as
    problem+json, the store failing closing the gate (``failed``)."""
    runtime = request.app[RUNTIME]
    path = request.path
    if runtime.settings.file.admin_listen is not None:
        refused = misrouted(request, runtime, path)
        if refused is not None:
            return refused
    agent = path.startswith(AGENT_PATHS)
    if agent:
        bound = runtime.max_in_flight
        if bound is not None and runtime.in_flight - runtime.parked >= bound:
            runtime.effects.metrics.overloaded.inc()
            return problem("overloaded", OVERLOADED, retry_after=OVERLOAD_RETRY_AFTER)
        runtime.in_flight += 1
    try:
        if _may_act(request, path):
            runtime.effects.check_audit()
        return await handler(request)
    except Exception as exc:
        return failed(request, exc)
    finally:
        if agent:
            runtime.in_flight -= 1


def misrouted(request: AgentRequest, runtime: Runtime, path: str) -> web.Response | None:
    """With ``admin_listen`` set (SPEC 13), the operator API, the console and the metrics
    answer only on the admin listener, and agents' paths only on the agent listener;
    health checks and problem explanations answer on both."""
    admin = runtime.settings.file.admin_listen
    assert admin is not None
    on_admin = _local_port(request) == (runtime.admin_port or admin.port)
    if path.startswith(ADMIN_PATHS) and not on_admin:
        return problem("route-not-allowed", "This path is served on the admin listener only.")
    if path.startswith(AGENT_PATHS) and on_admin:
        return problem("route-not-allowed", "Agents use the agent listener.")
    return None


def _local_port(request: AgentRequest) -> int | None:
    transport = request.transport
    sockname = transport.get_extra_info("sockname") if transport is not None else None
    return int(sockname[1]) if isinstance(sockname, tuple) and len(sockname) >= 2 else None


def failed(request: AgentRequest, exc: Exception) -> web.Response:
    """What an error raised while answering becomes: problem+json, never a traceback; the
    store (or the audit log) failing closes the gate with 503 and Retry-After. SPEC 8: audit
    lines are written before the agent hears back, so while the audit log cannot be
    written, a request that may submit, poll or change a record is answered 503 before
    anything is forwarded or stored; ``check_audit`` writes the lines the disk refused once
    it can, so service resumes by itself."""
    if isinstance(exc, BodyTimeout):
        response = problem("request-timeout", str(exc))
        response.force_close()  # the rest of a stalled body is not waited for
        return response
    if isinstance(exc, BodyTooLarge):
        return problem("request-too-large", str(exc))
    if isinstance(exc, StoreError):
        tracing.record_exception(exc)
        log.warning("store unavailable: %s", exc)
        request.app[RUNTIME].effects.metrics.store_errors.labels(exc.operation).inc()
        detail = (
            "The gateway cannot write its audit log (a full disk?); nothing was forwarded."
            if isinstance(exc, AuditUnavailable)
            else "The gateway cannot reach its store; nothing was forwarded."
        )
        return problem("store-unavailable", detail, retry_after=STORE_RETRY_AFTER)
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return problem("request-too-large", "The request body is too large.")
    if isinstance(exc, (web.HTTPNotFound, web.HTTPMethodNotAllowed)):
        return problem("route-not-allowed", "Agents use /p/{provider}/... with declared routes.")
    if isinstance(exc, web.HTTPException):
        if exc.status >= 400:
            return problem("invalid-request", exc.reason)
        raise exc
    tracing.record_exception(exc)
    log.exception("unhandled error on %s %s", request.method, request.path, exc_info=exc)
    return problem("internal-error", "The gateway failed to handle this request.")


def _may_act(request: AgentRequest, path: str) -> bool:
    """Whether a request may submit, poll or change a record: agents' provider calls, MCP
    calls and operator decisions."""
    if path.startswith(("/p/", "/hooks/")):
        return True
    return request.method == "POST" and (path == "/mcp" or path.startswith("/admin/operations/"))


class ParserNoise(logging.Filter):
    """For the ``aiohttp.server`` logger: a request aiohttp's HTTP parser rejects (a bad
    request line, oversized headers) costs one short warning line, never a traceback, so
    clients cannot flood the log. The line names the error class only: a rejected request
    line may hold a query string or a token."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            record.msg = "rejected a malformed request from %s: %s (%s)"
            record.args = (_peer(record.args), type(error).__name__, error.code)
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def _peer(args: object) -> object:
    return args[0] if isinstance(args, tuple) and args else "unknown"
