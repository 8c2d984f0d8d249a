"""The middlewares every request passes: request id, duration, metrics and the log line
(``observe``); the server span (``traced``, only when tracing is on); which listener serves
which paths (``listeners``); no agent request queued behind too many others (``bounded``);
every error as problem+json, the store failing closing the gate (``errors``); no new work
while the audit log cannot be written (``audit_gate``). Also what reaches the log from
aiohttp's own HTTP parser (``ParserNoise``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from gateway.errors import AuditUnavailable, StoreError
from gateway.flow.runtime import OUTCOME, PROVIDER, ROUTE, RUNTIME
from gateway.http.bodies import BodyTimeout, BodyTooLarge
from gateway.http.problems import SLUG, problem
from gateway.observe import tracing
from gateway.observe.context import CURRENT, RequestContext, request_id_from
from gateway.observe.logs import request_line

log = logging.getLogger("statusgate")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
STORE_RETRY_AFTER = 2.0
OVERLOAD_RETRY_AFTER = 1.0
OVERLOADED = (
    "The gateway has as many requests in hand as it takes at once (limits.max_in_flight); "
    "nothing was read, stored or forwarded. Retry after the Retry-After header."
)


def _route(request: web.Request) -> str:
    return str(request.get(ROUTE, "other"))


@web.middleware
async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Request id (kept or made, echoed), duration of every answer, agent requests by
    provider, route and outcome, and one log line per request (SPEC 13)."""
    started = time.perf_counter()
    context = RequestContext(request_id_from(request.headers.get("X-Request-Id")))
    token = CURRENT.set(context)
    try:
        response = await handler(request)
    finally:
        CURRENT.reset(token)
    response.headers["X-Request-Id"] = context.request_id
    elapsed = time.perf_counter() - started
    route = _route(request)
    metrics = request.app[RUNTIME].effects.metrics
    metrics.child("request_duration", route).observe(elapsed)
    provider = request.get(PROVIDER)
    if provider is not None:
        outcome = response.get(SLUG) or request.get(OUTCOME, "forwarded")
        metrics.child("agent_requests", provider, route, outcome).inc()
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


@web.middleware
async def traced(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A server span per request (SPEC 17), continuing the agent's trace context; provider
    calls made for it (held polls included) become its client spans. Its name and the
    attributes kept from span to span are of bounded variety, whatever an agent sends."""
    path = request.path
    if path.startswith(UNTRACED):
        return await handler(request)
    method = request.method if request.method in METHODS else "_OTHER"
    top = path.split("/", 2)[1] if path != "/" else ""
    name = f"{method} /{top if top in TRACED_TOP else '*'}"
    with tracing.server_span(name, request.headers) as span:
        if not span.recording:
            return await handler(request)
        context = CURRENT.get()
        span.update(  # before the answer: a request cut short still says what it was
            {
                "http.request.method": method,
                "http.request.method_original": request.method if method == "_OTHER" else None,
                "url.path": path,  # never the query
                "statusgate.request_id": context.request_id if context else None,
            }
        )
        response = await handler(request)
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
AGENT_PATHS = ("/p/", "/mcp")


@web.middleware
async def listeners(request: web.Request, handler: Handler) -> web.StreamResponse:
    """With ``admin_listen`` set (SPEC 13), the operator API, the console and the metrics
    answer only on the admin listener, and agents' paths only on the agent listener;
    health checks and problem explanations answer on both."""
    runtime = request.app[RUNTIME]
    admin = runtime.settings.file.admin_listen
    if admin is None:
        return await handler(request)
    on_admin = _local_port(request) == (runtime.admin_port or admin.port)
    path = request.path
    if path.startswith(ADMIN_PATHS) and not on_admin:
        return problem("route-not-allowed", "This path is served on the admin listener only.")
    if path.startswith(AGENT_PATHS) and on_admin:
        return problem("route-not-allowed", "Agents use the agent listener.")
    return await handler(request)


@web.middleware
async def bounded(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Issue 23: with ``limits.max_in_flight`` agent requests in hand in this process (held
    calls parked between looks not counted), a new one is answered 503 ``overloaded`` with
    ``Retry-After: 1`` at once, before its token is read or anything reaches the store or a
    provider: a caller told to come back beats one queued for seconds. Hot path: a prefix
    test and an integer compare. Operator, console, health, metrics and problem paths are
    never bounded (a health check answers under overload)."""
    if not request.path.startswith(AGENT_PATHS):
        return await handler(request)
    runtime = request.app[RUNTIME]
    bound = runtime.max_in_flight
    if bound is not None and runtime.in_flight - runtime.parked >= bound:
        runtime.effects.metrics.overloaded.inc()
        return problem("overloaded", OVERLOADED, retry_after=OVERLOAD_RETRY_AFTER)
    runtime.in_flight += 1
    try:
        return await handler(request)
    finally:
        runtime.in_flight -= 1


def _local_port(request: web.Request) -> int | None:
    transport = request.transport
    sockname = transport.get_extra_info("sockname") if transport is not None else None
    return int(sockname[1]) if isinstance(sockname, tuple) and len(sockname) >= 2 else None


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as problem+json; the store failing closes the gate (503)."""
    try:
        return await handler(request)
    except BodyTimeout as exc:
        response = problem("request-timeout", str(exc))
        response.force_close()  # the rest of a stalled body is not waited for
        return response
    except BodyTooLarge as exc:
        return problem("request-too-large", str(exc))
    except StoreError as exc:
        tracing.record_exception(exc)
        log.warning("store unavailable: %s", exc)
        request.app[RUNTIME].effects.metrics.store_errors.labels(exc.operation).inc()
        detail = (
            "The gateway cannot write its audit log (a full disk?); nothing was forwarded."
            if isinstance(exc, AuditUnavailable)
            else "The gateway cannot reach its store; nothing was forwarded."
        )
        return problem("store-unavailable", detail, retry_after=STORE_RETRY_AFTER)
    except web.HTTPRequestEntityTooLarge:
        return problem("request-too-large", "The request body is too large.")
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed):
        return problem("route-not-allowed", "Agents use /p/{provider}/... with declared routes.")
    except web.HTTPException as exc:
        if exc.status >= 400:
            return problem("invalid-request", exc.reason)
        raise
    except Exception as exc:
        tracing.record_exception(exc)
        log.exception("unhandled error on %s %s", request.method, request.path)
        return problem("internal-error", "The gateway failed to handle this request.")


@web.middleware
async def audit_gate(request: web.Request, handler: Handler) -> web.StreamResponse:
    """SPEC 8: audit lines are written before the agent hears back. While the audit log
    cannot be written, a request that may submit, poll or change a record is answered 503
    (by ``errors``) before anything is forwarded or stored; the check writes the lines the
    disk refused once it can, so service resumes by itself."""
    if _may_act(request):
        request.app[RUNTIME].effects.check_audit()
    return await handler(request)


def _may_act(request: web.Request) -> bool:
    path = request.path
    if path.startswith("/p/"):
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
