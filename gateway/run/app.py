"""create_app: the aiohttp application with the outside world injected, and its start,
drain and stop.

The store, the upstream client, the clock, the random source and the metrics registry are
parameters, so tests run the real handlers against a fake clock and a seeded random source.
Wiring only: the middlewares are in gateway/http/middleware.py, the sweeper in
gateway/flow/sweep.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from gateway import StoreError
from gateway.core.models import Clock
from gateway.flow import completions, keeping, pausing, polls, quotas, sweep
from gateway.flow.runtime import RUNTIME, Runtime
from gateway.http import hooks, mcp, middleware, proxy
from gateway.http.a2a import routes as a2a_routes
from gateway.http.problems import explain
from gateway.observe import tracing
from gateway.observe.audit import AuditLog, Fsync
from gateway.observe.effects import Effects
from gateway.observe.metrics import FLUSH_SECONDS, MULTIPROCESS, Metrics, exposition
from gateway.observe.mirror import AuditMirror, replica_name
from gateway.operator import admin, console, keys, openapi, sso
from gateway.provider.client import Upstream
from gateway.settings.config import Settings
from gateway.store import Store, store_from_url

log = logging.getLogger("statusgate")
CHORES_GRACE = 2.0  # seconds cancelled background work gets to end before the store closes
RECOVER_RETRY = 2.0  # seconds between start-up recovery attempts while the store is down
WORKER_ENV = "STATUSGATE_WORKER"  # set by serve --workers in each worker process
SWEEPER = web.AppKey("sweeper", asyncio.Task[None])
SENDER = web.AppKey("completion sender", asyncio.Task[None])  # SPEC 23


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
    runtime.traced = tracing.enabled()  # tracing.setup runs before the app
    app = web.Application(middlewares=[middleware.gate], client_max_size=limits.max_request_body)
    app[RUNTIME] = runtime
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/problems/{slug}", explain)
    app.router.add_get("/openapi.json", openapi.serve)
    admin.routes(app)
    keys.routes(app)
    mcp.routes(app)
    sso.routes(app)
    console.routes(app)
    a2a_routes.add_routes(app)
    hooks.routes(app)
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
        _start_mirror(runtime)
    await effects.restart_notifier(runtime.settings)
    try:
        await _recover(runtime)
    except StoreError as exc:  # not ready until the store answers; never a crash loop
        log.warning("store unreachable at start (%s); recovery runs once it answers", exc)
        runtime.spawn(_recover_when_up(runtime))
    app[SWEEPER] = asyncio.create_task(sweep.run(runtime))
    app[SENDER] = asyncio.create_task(completions.run(runtime))  # posts only with a webhook
    if MULTIPROCESS:  # the other workers' scrapes read this worker's counts from files
        runtime.spawn(_flush_metrics(effects.metrics))


def _start_mirror(runtime: Runtime) -> None:
    """On a store that keeps every replica's audit lines, ship this file's lines to it in
    the background (observe/mirror.py). With ``--workers`` the workers share one file and
    one chain: worker 0 alone ships it."""
    lines, audit = runtime.store.audit_lines, runtime.effects.audit
    if lines is None or audit is None or os.environ.get(WORKER_ENV, "0") != "0":
        return
    mirror = AuditMirror(audit.path, lines, replica_name(runtime.settings.file.audit.replica))
    audit.on_written = mirror.nudge
    mirror.start()
    runtime.effects.mirror = mirror


async def _flush_metrics(metrics: Metrics) -> None:
    while True:
        await asyncio.sleep(FLUSH_SECONDS)
        metrics.flush()


async def _recover(runtime: Runtime) -> None:
    """What a start owes the store: pauses bounded by today's policies, and an audit line
    for every status request an earlier crash cut short (SPEC 16)."""
    await pausing.bound_pauses(runtime)
    cut = await polls.recover_cut_polls(runtime)
    if cut:
        log.warning("recorded %d status requests cut short by an earlier crash", cut)
    owed = await keeping.keep_owed(runtime)
    if owed:
        log.info("fetching %d results owed a kept copy", owed)


async def _recover_when_up(runtime: Runtime) -> None:
    while await runtime.pause(RECOVER_RETRY):
        try:
            await _recover(runtime)
        except StoreError:
            continue
        log.info("store reachable: start-up recovery done")
        return


async def _drain(app: web.Application) -> None:
    """Shutdown: held calls answer now; refusal counts reach the record and the log."""
    runtime = app[RUNTIME]
    runtime.stopping.set()
    sweeper = app.get(SWEEPER)
    if sweeper is not None:
        sweeper.cancel()
    with contextlib.suppress(StoreError):
        await polls.close_refusal_windows(runtime, runtime.refusals.all())
    await quotas.close_windows(runtime, every=True)


async def _stop(app: web.Application) -> None:
    """Everything that may still touch the store ends before it closes: polls in flight get
    up to the upstream timeout to record their answers; background work is cancelled."""
    runtime = app[RUNTIME]
    polling = list(runtime.inflight.values())
    if polling:
        await asyncio.wait(polling, timeout=runtime.settings.file.limits.upstream_timeout)
    loops = [task for task in (app.get(SWEEPER), app.get(SENDER)) if task is not None]
    chores = [*loops, *runtime.background, *runtime.releases.loops]
    for task in chores:
        task.cancel()
    if chores:  # bounded: a driver may swallow a cancellation (redis-py has)
        await asyncio.wait(chores, timeout=CHORES_GRACE)
    effects = runtime.effects
    await effects.close_notifier(runtime.settings.file.escalation.webhook_timeout)
    effects.metrics.flush()  # a worker's last counts reach the files the others read
    if effects.audit is not None:
        await effects.audit.close()
    if effects.mirror is not None:  # after the file's last lines, before the store closes
        await effects.mirror.close()
    await runtime.upstream.close()
    await runtime.keeper.close()
    await runtime.store.close()


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    try:
        await runtime.store.ping()
    except StoreError as exc:
        runtime.effects.metrics.store_errors.labels(exc.operation).inc()
        said = {"status": "not ready", "store": "unavailable", "reason": str(exc)}
        return web.json_response(said, status=503)
    audit = runtime.effects.audit
    if audit is not None and not audit.writable():  # a full disk: no new work is taken
        body = {"status": "not ready", "audit": "unwritable", "audit_lines_waiting": audit.waiting}
        return web.json_response(body, status=503)
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
    response = web.Response(body=exposition(registry))
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response
