"""create_app: the aiohttp application with the outside world injected.

The store, the upstream client, the clock and the random source are parameters, so tests run
the real handlers against a fake clock and a seeded random source.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from . import proxy
from .config import Settings
from .errors import StoreError
from .problems import explain, problem
from .runtime import RUNTIME, Clock, Runtime
from .store import Store, store_from_url
from .upstream import Upstream

log = logging.getLogger("statusgate")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
STORE_RETRY_AFTER = 2.0


def create_app(
    settings: Settings,
    *,
    store: Store | None = None,
    upstream: Upstream | None = None,
    clock: Clock = time.time,
    rng: random.Random | None = None,
) -> web.Application:
    limits = settings.file.limits
    runtime = Runtime(
        settings=settings,
        store=store if store is not None else store_from_url(settings.store_url),
        upstream=upstream
        or Upstream(timeout=limits.upstream_timeout, max_response_body=limits.max_response_body),
        clock=clock,
        rng=rng if rng is not None else random.Random(),
    )
    app = web.Application(middlewares=[errors], client_max_size=limits.max_request_body)
    app[RUNTIME] = runtime
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/problems/{slug}", explain)
    app.router.add_route("*", "/p/{provider}/{tail:.*}", proxy.handle)
    app.on_startup.append(_start)
    app.on_cleanup.append(_stop)
    return app


async def _start(app: web.Application) -> None:
    await app[RUNTIME].upstream.start()


async def _stop(app: web.Application) -> None:
    runtime = app[RUNTIME]
    await runtime.upstream.close()
    await runtime.store.close()


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as problem+json; the store failing closes the gate (503)."""
    try:
        return await handler(request)
    except StoreError as exc:
        log.warning("store unavailable: %s", exc)
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
    except StoreError:
        return web.json_response({"status": "not ready", "store": "unreachable"}, status=503)
    return web.json_response({"status": "ready", "policies": sorted(runtime.settings.policies)})
