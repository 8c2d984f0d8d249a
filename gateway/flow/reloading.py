"""Live reload of the config and every policy (SPEC 13): on SIGHUP and POST /admin/reload.

A valid set replaces the running one at once (calls in flight keep the policy they started
with); an invalid set is refused whole with the same messages as ``statusgate check``, and
the running set stays. Settings bound to sockets, files or the store cannot change live and
are refused by name; a listener's TLS files are not among them (they are re-read at every
reload, and the connections accepted after it are served with them), but turning TLS on
or off is.
"""

from __future__ import annotations

import logging
import os
import signal

from gateway import ConfigError
from gateway.flow.pausing import bound_pauses
from gateway.flow.runtime import Runtime
from gateway.observe import logs
from gateway.settings.config import GatewayFile, Listen, Settings, load_settings

log = logging.getLogger("statusgate")
FIXED = ("store", "audit", "results_store")  # need a restart (the result store is opened once)
LISTENERS = ("listen", "admin_listen")  # their sockets need a restart, their TLS files not


def fixed_changes(running: GatewayFile, loaded: GatewayFile, shown: str) -> list[str]:
    """One message per setting that differs but cannot change while running."""
    changed = [
        name
        for name in LISTENERS
        if _socket(getattr(running, name)) != _socket(getattr(loaded, name))
    ]
    changed += [name for name in FIXED if getattr(running, name) != getattr(loaded, name)]
    if running.limits.cache_bytes != loaded.limits.cache_bytes:
        changed.append("limits.cache_bytes")  # the store's cache is sized at start
    return [
        f"{shown}: {name}: cannot change while the gateway runs; restart it to apply"
        for name in changed
    ]


def _socket(listen: Listen | None) -> tuple[str, int, bool] | None:
    """What of a listener a reload cannot change: its address and whether it speaks TLS."""
    return None if listen is None else (listen.host, listen.port, listen.tls is not None)


async def reload(runtime: Runtime) -> list[str]:
    """Re-read and apply the config; the problems that refused it, or [] when applied."""
    metrics = runtime.effects.metrics
    settings, problems = _load(runtime.settings)
    if settings is None:
        metrics.config_reloads.labels("error").inc()
        metrics.last_reload_ok.set(0)
        log.error("config reload refused: %d problem(s); the running set stays", len(problems))
        for line in problems:
            log.error("config reload: %s", line)
        return problems
    webhook_changed = (
        settings.file.escalation != runtime.settings.file.escalation
        or settings.webhook_secret != runtime.settings.webhook_secret
    )
    logging_changed = settings.file.logging != runtime.settings.file.logging
    runtime.apply(settings)
    await bound_pauses(runtime)
    metrics.prime(settings.policies)
    if logging_changed:
        logs.configure(settings.file.logging)
    if webhook_changed:
        await runtime.effects.restart_notifier(settings)
    metrics.config_reloads.labels("ok").inc()
    metrics.last_reload_ok.set(1)
    names = ", ".join(sorted(settings.policies)) or "none"
    log.info("config reloaded: %d policies (%s)", len(settings.policies), names)
    if settings.tls:
        log.info(
            "TLS files re-read (%s): new connections get the certificates now in them",
            ", ".join(f"{key}.tls" for key in sorted(settings.tls)),
        )
    return []


def _load(running: Settings) -> tuple[Settings | None, list[str]]:
    """The new settings and no problems, or None and why not."""
    if running.path is None:
        return None, ["the gateway was not started from a config file; nothing to reload"]
    try:
        loaded = load_settings(running.path)
    except ConfigError as exc:
        return None, exc.problems
    problems = fixed_changes(running.file, loaded.file, str(running.path))
    return (None, problems) if problems else (loaded, [])


def reload_all() -> None:
    """In a worker: have the supervisor pass SIGHUP to every worker, so a reload asked of
    one (POST /admin/reload) reaches them all."""
    if os.environ.get("STATUSGATE_WORKER"):
        os.kill(os.getppid(), signal.SIGHUP)
