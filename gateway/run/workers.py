"""``statusgate serve --workers N``: N gateway processes sharing the listeners (SPEC 10).

Only on a shared store (``Store.shared``: Redis, PostgreSQL), where every worker shares
records, leases, pacing and the clock; a SQLite file is owned by one process and
``memory://`` is one process's memory, so both are refused with a clear message. The parent
forks the workers before any event loop or thread exists, forwards SIGTERM, SIGINT and SIGHUP
to them, restarts a worker that dies (at most once a second), and exits when they have all
stopped. Metrics from every worker are merged at scrape time through prometheus_client's
multiprocess files.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from types import FrameType

from gateway import ConfigError
from gateway.observe import logs
from gateway.settings.config import Settings, load_settings
from gateway.store import store_kind

RESTART_GAP = 1.0  # a worker that dies is restarted, at most once a second
START_WINDOW = 5.0  # a worker exiting with 1 this soon after its start could not start


def _reloaded(settings: Settings) -> Settings:
    """The config as it is on disk now, or the running one if it does not load."""
    if settings.path is None:
        return settings
    try:
        return load_settings(settings.path)
    except ConfigError:
        return settings  # the workers refuse it too, and say why


def refusal(settings: Settings, workers: int) -> str | None:
    """Why ``workers`` processes cannot serve these settings, or None."""
    if workers < 1:
        return "--workers must be 1 or more"
    if workers == 1:
        return None
    scheme = settings.store_url.split(":", 1)[0]
    if not store_kind(settings.store_url).shared:
        return (
            f"--workers {workers} needs a shared store (store: redis://... or postgresql://...);"
            f" the {scheme} store is owned by one process"
        )
    ports = [settings.file.listen.port]
    if settings.file.admin_listen is not None:
        ports.append(settings.file.admin_listen.port)
    if 0 in ports:
        return f"--workers {workers} needs fixed ports: every worker binds the same one"
    return None


def prepare_metrics_dir() -> Path:
    """A fresh folder for the workers' metric files; set before prometheus_client loads."""
    folder = Path(tempfile.mkdtemp(prefix="statusgate-metrics-"))
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    return folder


def run(settings: Settings, workers: int, metrics_dir: Path | None = None) -> int:
    """Fork ``workers`` workers and supervise them; the exit code. ``metrics_dir`` is
    removed once every worker has stopped."""
    try:
        return _supervise(settings, workers)
    finally:
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def _supervise(settings: Settings, workers: int) -> int:
    from gateway.run.server import serve

    children: dict[int, tuple[int, float]] = {}  # pid -> (worker number, started)
    current = [settings]  # what a worker started now runs: the last set that loaded
    stopping = False

    def start(number: int) -> None:
        pid = os.fork()
        if pid == 0:  # the worker
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            os.environ["STATUSGATE_WORKER"] = str(number)  # the audit chain is shared
            os._exit(serve(current[0], reuse_port=True))
        children[pid] = (number, time.monotonic())

    def forward(number: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        if number in (signal.SIGTERM, signal.SIGINT):
            stopping = True
        if number == signal.SIGHUP:  # a worker restarted later starts from the new set
            current[0] = _reloaded(current[0])
        for pid in list(children):
            with contextlib.suppress(ProcessLookupError):  # reaped a moment ago
                os.kill(pid, signal.SIGTERM if number == signal.SIGINT else number)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    for index in range(workers):
        start(index)
    logs.say(settings.file.logging, logging.INFO, f"statusgate: {workers} workers started")
    failed = False
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid not in children:
            continue
        worker, started = children.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        if stopping:
            continue
        if code == 1 and time.monotonic() - started < START_WINDOW:
            # it could not start (a taken port, an unreachable store): neither will the rest
            failed = True
            forward(signal.SIGTERM, None)
            continue
        logs.say(
            current[0].file.logging,
            logging.WARNING,
            f"statusgate: worker {worker} exited with {code}; restarting it",
        )
        time.sleep(max(0.0, RESTART_GAP - (time.monotonic() - started)))
        start(worker)
    return 1 if failed else 0
