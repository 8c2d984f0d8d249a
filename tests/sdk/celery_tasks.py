"""A tiny Celery app for tests/sdk/test_provider_celery.py, loaded by a real worker and a real
Flower (``celery -A celery_tasks ...`` with tests/ on PYTHONPATH). The broker and result
backend URL and a key prefix that keeps the test's keys apart on a shared Redis come from
the environment the test sets."""

from __future__ import annotations

import os
import time

from celery import Celery

REDIS = os.environ.get("STATUSGATE_CELERY_REDIS", "redis://127.0.0.1:6379/0")
PREFIX = os.environ.get("STATUSGATE_CELERY_PREFIX", "")

app = Celery("celery_tasks", broker=REDIS, backend=REDIS)
app.conf.update(
    task_track_started=True,  # STARTED while running, not PENDING
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
)
if PREFIX:
    app.conf.broker_transport_options = {"global_keyprefix": PREFIX}
    app.conf.result_backend_transport_options = {"global_keyprefix": PREFIX}


@app.task
def add(x: int, y: int) -> int:
    return x + y


@app.task
def returns_none() -> None:
    return None


@app.task
def slow(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@app.task
def fails() -> None:
    raise ValueError("scripted failure")
