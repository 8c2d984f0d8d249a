"""create_app: the aiohttp application with the outside world injected.

The store, the upstream client, the clock, the random source and the metrics registry are
parameters, so tests run the real handlers against a fake clock and a seeded random source.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from . import admin, proxy
from .audit import AuditLog, Fsync
from .config import Settings
from .effects import Effects
from .errors import StoreError
from .metrics import Metrics
from .models import Clock
from .notify import Notifier
from .problems import SLUG, explain, problem
from .runtime import OUTCOME, PROVIDER, ROUTE, RUNTIME, Runtime
from .store import Store, store_from_url
from .upstream import Upstream

log = logging.getLogger("statusgate")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
STORE_RETRY_AFTER = 2.0
SWEEP_SECONDS = 1.0
PURGE_EVERY = 60  # sweeps between retention purges
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
        audit = AuditLog(audit_path, key=settings.audit_key, fsync=Fsync(settings.file.audit.fsync))
    store = store if store is not None else store_from_url(settings.store_url)
    clock = clock if clock is not None else store.clock
    effects = Effects(clock=clock, metrics=Metrics(registry), audit=audit)
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
    app = web.Application(middlewares=[observe, errors], client_max_size=limits.max_request_body)
    app[RUNTIME] = runtime
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/problems/{slug}", explain)
    admin.routes(app)
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
    hook = runtime.settings.file.escalation
    if hook.webhook_url is not None:
        effects.notifier = Notifier(
            hook.webhook_url,
            on_outcome=effects.notified,
            attempts=hook.webhook_attempts,
            timeout=hook.webhook_timeout,
            backoff=hook.webhook_backoff,
        )
        effects.notifier.start()
    app[SWEEPER] = asyncio.create_task(_sweep(runtime))


async def _sweep(runtime: Runtime) -> None:
    """Close refusal windows whose poll time has come, so counts reach the audit log and
    the record even when the agent never calls again; now and then, purge what the
    policies' retention no longer keeps."""
    sweeps = 0
    while True:
        await asyncio.sleep(SWEEP_SECONDS)
        sweeps += 1
        if sweeps % PURGE_EVERY == 0:
            with contextlib.suppress(StoreError):
                await purge_finished(runtime)
        with contextlib.suppress(StoreError):
            await proxy.close_refusal_windows(
                runtime, runtime.effects.refusals.ended(runtime.clock())
            )


async def purge_finished(runtime: Runtime) -> int:
    """Delete records that stopped waiting longer ago than their policy's retention."""
    now = runtime.clock()
    purged = 0
    for name, policy in runtime.settings.policies.items():
        purged += await runtime.store.purge(name, now - policy.retention, now)
    if purged:
        log.info("purged %d finished operations past their retention", purged)
    return purged


async def _drain(app: web.Application) -> None:
    """Shutdown: held calls answer now; refusal counts reach the record and the log."""
    runtime = app[RUNTIME]
    runtime.stopping.set()
    app[SWEEPER].cancel()
    with contextlib.suppress(StoreError):
        await proxy.close_refusal_windows(runtime, runtime.effects.refusals.all())


async def _stop(app: web.Application) -> None:
    runtime = app[RUNTIME]
    effects = runtime.effects
    if effects.notifier is not None:
        await effects.notifier.close()
    if effects.audit is not None:
        await effects.audit.close()
    await runtime.upstream.close()
    await runtime.store.close()


def _route(request: web.Request) -> str:
    return str(request.get(ROUTE, "other"))


@web.middleware
async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Duration of every answer; agent requests by provider, route and outcome."""
    started = time.perf_counter()
    response = await handler(request)
    route = _route(request)
    runtime = request.app[RUNTIME]
    metrics = runtime.effects.metrics
    metrics.request_duration.labels(route).observe(time.perf_counter() - started)
    provider = request.get(PROVIDER)
    if provider is not None:
        outcome = response.get(SLUG) or request.get(OUTCOME, "forwarded")
        metrics.agent_requests.labels(provider, route, outcome).inc()
    return response


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as problem+json; the store failing closes the gate (503)."""
    try:
        return await handler(request)
    except StoreError as exc:
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
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return problem("internal-error", "The gateway failed to handle this request.")


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
        counts = await runtime.store.active_counts()
        registry.set_active(counts, sorted(runtime.settings.policies))
    except StoreError as exc:
        registry.store_errors.labels(exc.operation).inc()
    body = generate_latest(registry.registry)
    response = web.Response(body=body)
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response
