"""``statusgate serve``: the gateway's listeners, signals and life (SPEC 1 and 13).

One aiohttp runner; the agent listener and, with ``admin_listen``, the admin listener.
SIGTERM and SIGINT stop it gracefully (held calls answer, refusal counts are written);
SIGHUP reloads the config and every policy. A port already taken or a store another
process owns is one line on stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import resource
import signal
import ssl
from collections.abc import Callable

import uvloop
from aiohttp import web

from gateway import StoreError
from gateway.flow import reloading
from gateway.flow.runtime import RUNTIME, Runtime
from gateway.http import middleware, proxy
from gateway.http.lane import LaneSite
from gateway.http.middleware import ParserNoise
from gateway.http.site import ListenerSite
from gateway.observe import logs, tracing
from gateway.run.app import create_app
from gateway.settings.config import Settings
from gateway.settings.keeping import FileTarget

log = logging.getLogger("statusgate")


def serve(settings: Settings, *, reuse_port: bool = False) -> int:
    """Run until SIGTERM or SIGINT; the exit code. ``reuse_port``: one of several workers
    sharing the listeners (SO_REUSEPORT)."""
    logs.configure(settings.file.logging)
    logging.getLogger("aiohttp.server").addFilter(ParserNoise())
    traces = tracing.setup()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())  # measured: ~7% more polls/s
    try:
        return asyncio.run(_run(settings, reuse_port, traces))
    except KeyboardInterrupt:
        return 130
    finally:
        tracing.stop()
        logs.stop()


async def _run(settings: Settings, reuse_port: bool, traces: str) -> int:
    app = create_app(settings)
    limits = settings.file.limits
    runner = web.AppRunner(
        app,
        access_log=None,
        handler_cancellation=True,
        keepalive_timeout=limits.keepalive_timeout,  # aiohttp's connections (at start)
    )
    try:
        await runner.setup()  # opens the store (on_startup): a locked SQLite file fails here
    except StoreError as exc:
        log.error("statusgate serve: %s", exc)
        return 1
    files, before = open_files()
    try:
        bound = await _listen(runner, settings, reuse_port, connection_cap(files))
    except OSError as exc:
        log.error("statusgate serve: %s", exc)
        await runner.cleanup()
        return 1
    runtime = app[RUNTIME]
    runtime.admin_port = bound.get("admin")
    for role, port in bound.items():  # a log line: JSON like every other when logs are
        url = f"{_scheme(settings, role)}://{_host(settings, role)}:{port}"
        log.info("statusgate %s listener on %s", role, url, extra={"listener": role, "url": url})
    log.info(what_serves(settings))
    log_connection_limits(files, before, limits.max_connections)
    log.info(traces)
    gc.freeze()  # what start-up made lives as long as the process: never scanned again
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGHUP, lambda: _reload_soon(runtime))
    await stop.wait()
    log.info("stopping: answering held calls and writing refusal counts")
    await runner.cleanup()
    return 0


def what_serves(settings: Settings) -> str:
    """The start line saying what this process serves: its config, how many policies, the
    store's kind (never its URL, which may hold a password), the audit file, whether an
    escalation webhook is set, where kept results go (a folder or a bucket, no credentials)."""
    webhook = "on" if settings.file.escalation.webhook_url else "off"
    target = settings.results_target
    if isinstance(target, FileTarget):
        kept = f"in {target.folder}"
    elif target is not None:
        kept = f"in s3://{target.bucket}/{target.prefix}"
    else:
        kept = "in a temporary folder"
    count = len(settings.policies)
    config = str(settings.path) if settings.path is not None else "(no file)"
    audit = str(settings.audit_path) if settings.audit_path is not None else "off"
    return (
        f"serving {config}: {count} {'policy' if count == 1 else 'policies'}, "
        f"store {settings.store_url.split(':', 1)[0]}, audit {audit}, "
        f"escalation webhook {webhook}, kept results {kept}"
    )


# Descriptors kept for what is not an agent connection: the admin listener and its clients,
# provider connections (up to 100 per provider origin), the store's, the audit log, traces.
FILES_RESERVE = 1024


def open_files() -> tuple[int, int]:
    """Raise the soft open-files limit to the hard one at start (each connection is a
    descriptor, and soft limits are often 1024): the limit in force, and the one before."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if wanted > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):
            return soft, soft  # log_connection_limits says what is in force
    return max(wanted, soft), soft


def connection_cap(files: int) -> int:
    """Agent connections an open-files limit leaves room for: FILES_RESERVE kept (or half
    of a small limit)."""
    return max(files - FILES_RESERVE, files // 2)


def log_connection_limits(files: int, before: int, configured: int | None) -> None:
    """One line with the open-files limit in force, and a warning when it leaves room
    for fewer agent connections than ``limits.max_connections`` asks for."""
    log.info(
        "open-files limit %d (%s)",
        files,
        f"raised from {before}" if files > before else "the hard limit",
        extra={"open_files": files},
    )
    cap = connection_cap(files)
    if configured is None or configured > cap:
        log.warning(
            "limits.max_connections is %s but the open-files limit (%d) leaves room for %d:"
            " the agent listener keeps at most %d connections",
            configured if configured is not None else "null (no bound)",
            files,
            cap,
            cap,
        )


# Connections the kernel queues before the gateway accepts them. aiohttp's default (128)
# overflowed in a burst (the overload bench: hundreds of clients waited a second or more for
# SYN retries before a 503 could even be sent); the kernel caps it at net.core.somaxconn.
BACKLOG = 4096


async def _listen(
    runner: web.AppRunner, settings: Settings, reuse_port: bool, cap: int | None = None
) -> dict[str, int]:
    """Bind every listener; the port each one got (``agent``, and ``admin`` when set)."""
    wanted = {"agent": settings.file.listen}
    if settings.file.admin_listen is not None:
        wanted["admin"] = settings.file.admin_listen
    bound: dict[str, int] = {}
    for role, listen in wanted.items():
        site: web.BaseSite
        if role == "agent":
            site = agent_site(
                runner, listen.host, listen.port, reuse_port=reuse_port, connection_cap=cap
            )
        else:
            site = ListenerSite(
                runner,
                listen.host,
                listen.port,
                reuse_port=reuse_port,
                backlog=BACKLOG,
                tls=tls_in_force(runner, "admin_listen") if listen.tls is not None else None,
            )
        try:
            await site.start()
        except OSError as exc:
            why = exc.strerror or str(exc)
            raise OSError(f"cannot listen on {listen.host}:{listen.port} ({role}): {why}") from None
        address = runner.addresses[-1]  # the site just started
        bound[role] = int(address[1]) if isinstance(address, tuple) else listen.port
    return bound


def agent_site(
    runner: web.AppRunner,
    host: str,
    port: int,
    *,
    reuse_port: bool = False,
    connection_cap: int | None = None,
) -> LaneSite:
    """The agent listener: agents' ``/p/`` calls on the lane (gateway/http/lane/), every
    other path on aiohttp's own server, under one runner; its limits the running set's (a
    reload applies to connections opened after it), a connection refused past
    ``limits.max_connections`` counted as an overloaded request."""
    runtime = runner.app[RUNTIME]
    tls = runtime.settings.file.listen.tls is not None
    return LaneSite(
        runner,
        host,
        port,
        middleware=middleware.gate,
        handler=proxy.handle,
        reuse_port=reuse_port or None,
        backlog=BACKLOG,
        limits=lambda: runtime.settings.file.limits,
        connection_cap=connection_cap,
        on_refused=lambda: runtime.effects.metrics.overloaded.inc(),
        tls=tls_in_force(runner, "listen") if tls else None,
    )


def tls_in_force(runner: web.AppRunner, key: str) -> Callable[[], ssl.SSLContext | None]:
    """The listener's TLS context of the running set (``listen`` or ``admin_listen``),
    asked as each connection is accepted: a reload's re-read files serve the next ones."""
    runtime = runner.app[RUNTIME]
    if key not in runtime.settings.tls:  # Settings not made by load_settings: never plain
        raise OSError(f"{key}.tls: the TLS files were not read (load the config to serve)")
    return lambda: runtime.settings.tls.get(key)


def _scheme(settings: Settings, role: str) -> str:
    listen = settings.file.admin_listen if role == "admin" else settings.file.listen
    return "https" if listen is not None and listen.tls is not None else "http"


def _host(settings: Settings, role: str) -> str:
    listen = settings.file.admin_listen if role == "admin" else settings.file.listen
    assert listen is not None
    return listen.host


def _reload_soon(runtime: Runtime) -> None:
    """SIGHUP: reload in a task of the runtime's own (kept until done)."""
    runtime.spawn(_reload(runtime))


async def _reload(runtime: Runtime) -> None:
    await reloading.reload(runtime)  # it logs what it found wrong
