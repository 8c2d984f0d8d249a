"""create_app: the aiohttp application with the outside world injected.

The store, the upstream client, the clock, the random source and the metrics registry are
parameters, so tests run the real handlers against a fake clock and a seeded random source.
Also owns the background sweeper (refusal windows, overdue operations, retention purges)
and what reaches the log from aiohttp's own HTTP parser.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from gateway import mcp
from gateway.core import decide
from gateway.core.models import Clock
from gateway.errors import StoreError
from gateway.flow import polls
from gateway.flow.runtime import OUTCOME, PROVIDER, ROUTE, RUNTIME, Runtime
from gateway.http import proxy
from gateway.http.bodies import BodyTimeout, BodyTooLarge
from gateway.http.problems import SLUG, explain, problem
from gateway.observe import tracing
from gateway.observe.audit import AuditLog, Fsync
from gateway.observe.context import CURRENT, RequestContext, request_id_from
from gateway.observe.effects import Effects
from gateway.observe.logs import request_line
from gateway.observe.metrics import Metrics, exposition
from gateway.operator import admin, console, openapi
from gateway.provider.client import Upstream
from gateway.settings.config import Settings
from gateway.settings.policy import ProviderPolicy
from gateway.store import Store, store_from_url
from gateway.store.base import PURGE_BATCH

log = logging.getLogger("statusgate")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
STORE_RETRY_AFTER = 2.0
SWEEP_SECONDS = 1.0
PURGE_EVERY = 60  # sweeps between retention purges
PURGE_ROUNDS = 20  # full batches one purge may delete per provider before the next sweep
OVERDUE_EVERY = 2  # sweeps between deadline checks: SPEC 16 allows 10 s
OVERDUE_BATCH = 500  # overdue operations escalated per provider per check
OVERDUE_LEASE = 10.0  # seconds: the poll lease held while one is escalated
WORKER_ENV = "STATUSGATE_WORKER"  # set by serve --workers in each worker process
SWEEPER = web.AppKey("sweeper", asyncio.Task[None])


def create_app(
    settings: Settings,
    *,
    store: Store | None = None,
    upstream: Upstream | None = None,
    clock: Clock | None = None,
    rng: random.Random | None = None,
    registry: CollectorRegistry | None = None,
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> web.Application:
    limits = settings.file.limits
    audit_path = settings.audit_path
    audit = None
    if audit_path is not None:
        audit = AuditLog(
            audit_path,
            key=settings.audit_key,
            fsync=Fsync(settings.file.audit.fsync),
            shared=bool(os.environ.get(WORKER_ENV)),
        )
    if store is None:
        store = store_from_url(settings.store_url, cache_bytes=limits.cache_bytes)
    clock = clock if clock is not None else store.clock
    effects = Effects(clock=clock, metrics=Metrics(registry), audit=audit)
    effects.metrics.prime(settings.policies)
    runtime = Runtime(
        settings=settings,
        store=store,
        upstream=upstream
        or Upstream(timeout=limits.upstream_timeout, max_response_body=limits.max_response_body),
        clock=clock,
        rng=rng if rng is not None else random.Random(),
        effects=effects,
        sleep=sleep if sleep is not None else asyncio.sleep,
    )
    # the span middleware only when tracing is on (tracing.setup runs before the app):
    # off, every request would pass through it for nothing
    spans = [traced] if tracing.enabled() else []
    app = web.Application(
        middlewares=[observe, *spans, listeners, errors],
        client_max_size=limits.max_request_body,
    )
    app[RUNTIME] = runtime
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/problems/{slug}", explain)
    app.router.add_get("/openapi.json", openapi.serve)
    admin.routes(app)
    mcp.routes(app)
    console.routes(app)
    app.router.add_route("*", "/p/{provider}", proxy.handle)  # SDKs that post to the root
    app.router.add_route("*", "/p/{provider}/{tail:.*}", proxy.handle)
    app.on_startup.append(_start)
    app.on_shutdown.append(_drain)
    app.on_cleanup.append(_stop)
    return app


async def _start(app: web.Application) -> None:
    runtime = app[RUNTIME]
    await runtime.store.open()
    await runtime.upstream.start()
    effects = runtime.effects
    if effects.audit is not None:
        effects.audit.open()
    await effects.restart_notifier(runtime.settings)
    cut = await polls.recover_cut_polls(runtime)
    if cut:
        log.warning("recorded %d status requests cut short by an earlier crash", cut)
    app[SWEEPER] = asyncio.create_task(_sweep(runtime))


async def _sweep(runtime: Runtime) -> None:
    """Close refusal windows whose poll time has come, so counts reach the audit log and
    the record even when the agent never calls again; every few seconds, escalate what is
    past its deadline; now and then, purge what the policies' retention no longer keeps."""
    sweeps = 0
    while True:
        await asyncio.sleep(SWEEP_SECONDS)
        sweeps += 1
        if sweeps % PURGE_EVERY == 0:
            await _sweep_step("purge", purge_finished(runtime))
        if sweeps % OVERDUE_EVERY == 0:
            await _sweep_step("deadline check", escalate_overdue(runtime))
        ended = runtime.effects.refusals.ended(runtime.clock())
        await _sweep_step("refusal windows", polls.close_refusal_windows(runtime, ended))


async def _sweep_step(name: str, step: Awaitable[object]) -> None:
    """One step of the sweeper: a failure is logged and the sweeper goes on (it must never
    die: deadlines would then go unseen)."""
    try:
        await step
    except StoreError:
        pass  # counted where it happened; tried again at the next sweep
    except Exception:
        log.exception("sweeper: %s failed; trying again at the next sweep", name)


async def escalate_overdue(runtime: Runtime) -> int:
    """SPEC 16: pending operations past their deadline are escalated whether or not an
    agent asks (audit line, metrics, webhook as usual); how many this call escalated.

    Providers no longer in the policies are left alone; one that cannot be escalated now (a
    poll holds its lease, or the store failed on it) is tried again at the next check."""
    escalated = 0
    for policy in list(runtime.settings.policies.values()):
        late = await runtime.store.overdue(policy.provider, runtime.clock(), OVERDUE_BATCH)
        for operation_id in late:
            with contextlib.suppress(StoreError):
                escalated += await _escalate(runtime, policy, operation_id)
    return escalated


async def _escalate(runtime: Runtime, policy: ProviderPolicy, operation_id: str) -> bool:
    """Under the poll lease, as a poll would: no status request is in flight meanwhile.

    With several replicas the store's compare-and-set lets one write win; only the
    replica whose write won gets a decision back, so effects happen once."""
    store, lease, token = runtime.store, f"poll:{operation_id}", secrets.token_hex(16)
    if not await store.acquire_lease(lease, token, runtime.clock(), OVERDUE_LEASE):
        return False
    try:
        now = runtime.clock()
        decision = await store.mutate(
            operation_id, lambda current: decide.as_write(decide.overdue(policy, current, now))
        )
        if decision is None:
            return False
        if decision.cut_at is not None:  # a poll cut short by a crash gets its line too
            await runtime.effects.interrupted(decision.record, decision.cut_at)
        await runtime.effects.decided(policy, decision)
        return True
    finally:
        await store.release_lease(lease, token)


async def purge_finished(runtime: Runtime) -> int:
    """Delete records that stopped waiting longer ago than their policy's retention, in
    full batches while there are more (up to PURGE_ROUNDS per provider)."""
    now = runtime.clock()
    purged = 0
    for name, policy in list(runtime.settings.policies.items()):
        for _ in range(PURGE_ROUNDS):
            batch = await runtime.store.purge(name, now - policy.retention, now)
            purged += batch
            if batch < PURGE_BATCH:
                break
    if purged:
        log.info("purged %d finished operations past their retention", purged)
    return purged


async def _drain(app: web.Application) -> None:
    """Shutdown: held calls answer now; refusal counts reach the record and the log."""
    runtime = app[RUNTIME]
    runtime.stopping.set()
    app[SWEEPER].cancel()
    with contextlib.suppress(StoreError):
        await polls.close_refusal_windows(runtime, runtime.effects.refusals.all())


async def _stop(app: web.Application) -> None:
    runtime = app[RUNTIME]
    effects = runtime.effects
    await effects.close_notifier(runtime.settings.file.escalation.webhook_timeout)
    if effects.audit is not None:
        await effects.audit.close()
    await runtime.upstream.close()
    await runtime.store.close()


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
    metrics.request_duration.labels(route).observe(elapsed)
    provider = request.get(PROVIDER)
    if provider is not None:
        outcome = response.get(SLUG) or request.get(OUTCOME, "forwarded")
        metrics.agent_requests.labels(provider, route, outcome).inc()
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
        return problem(
            "store-unavailable",
            "The gateway cannot reach its store; nothing was forwarded.",
            retry_after=STORE_RETRY_AFTER,
        )
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


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    try:
        await runtime.store.ping()
    except StoreError as exc:
        runtime.effects.metrics.store_errors.labels(exc.operation).inc()
        return web.json_response({"status": "not ready", "store": "unreachable"}, status=503)
    return web.json_response({"status": "ready", "policies": sorted(runtime.settings.policies)})


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text format; the active-operations gauge is read from the store."""
    runtime = request.app[RUNTIME]
    registry = runtime.effects.metrics
    try:
        providers = sorted(runtime.settings.policies)
        registry.set_active(await runtime.store.active_counts(), providers)
        registry.set_open(await runtime.store.open_escalations(), providers)
    except StoreError as exc:
        registry.store_errors.labels(exc.operation).inc()
    response = web.Response(body=exposition(registry.registry))
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response
