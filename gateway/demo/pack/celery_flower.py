"""Celery tasks run through Flower's HTTP API (the double of ``celery-flower``; its
real-server tests run a Celery worker and Flower).

Written from Flower's API reference (https://flower.readthedocs.io/en/latest/api.html) and
Celery's task states (https://docs.celeryq.dev/en/stable/reference/celery.states.html):

- ``POST /api/task/async-apply/{taskname}`` with ``{"args": [...], "kwargs": {...}}``
  answers 200 ``{"task-id": ..., "state": "PENDING"}`` (404 for an unknown task name);
- ``GET /api/task/result/{taskid}`` answers ``{"task-id", "state"}``, and once the task is
  ready (``SUCCESS``, ``FAILURE``, ``REVOKED``) its ``result`` too (``null`` for a task
  that returned None), with the ``traceback`` of a failure;
- ``GET /api/task/info/{taskid}`` answers the task as Flower's event monitor saw it
  (``uuid``, ``name``, ``state``, ``args``, ``kwargs``, ``received``, ``started``,
  ``succeeded``, ``result``, ``worker`` ...), 404 for a task it never saw;
- ``POST /api/task/revoke/{taskid}?terminate=true`` answers ``{"message": "Revoked '<id>'"}``.

States: ``PENDING`` (also any id Celery never saw), ``RECEIVED``, ``STARTED``, ``RETRY``,
``SUCCESS``, ``FAILURE``, ``REVOKED``. Flower's ``--basic_auth`` makes every call carry
``Authorization: Basic <base64 of user:password>``: the double holds that base64 string as
its key.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from gateway.demo.jobs import Family, Job, Jobs
from gateway.demo.pack import Double, Example

TASKS = ("tasks.add", "tasks.transcribe", "tasks.report")  # what the double's worker runs
READY = ("SUCCESS", "FAILURE", "REVOKED")


def _result(
    jobs: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
) -> dict[str, Any]:
    """``GET /api/task/result/{taskid}``: the state, and the result once ready."""
    body: dict[str, Any] = {"task-id": job.id, "state": state}
    if state == "SUCCESS":
        args = job.request.get("args") or []
        numbers = [a for a in args if isinstance(a, int | float) and not isinstance(a, bool)]
        body["result"] = sum(numbers) if numbers else None
    elif state == "FAILURE":
        body["result"] = "ValueError('scripted failure')"
        body["traceback"] = "Traceback (most recent call last):\nValueError: scripted failure\n"
    elif state == "REVOKED":
        body["result"] = "TaskRevokedError('terminated')"
    return body


def _authorised(request: web.Request, key: str) -> bool:
    return request.headers.get("Authorization") == f"Basic {key}"


FAMILY = Family(
    name="celery-flower",
    state_field="state",
    id_prefix="",
    success="SUCCESS",
    result_field="result",
    result_value=None,
    error_field="result",
    default_script=(
        {"state": "PENDING"},
        {"state": "RECEIVED"},
        {"state": "STARTED"},
        {"state": "SUCCESS"},
    ),
    pending="STARTED",
    body=_result,
    auth=_authorised,
    new_id=lambda request: str(uuid.uuid4()),
    cancelled_script=({"state": "REVOKED"},),
)


def _unauthorised() -> web.Response:
    return web.Response(
        status=401, text="Unauthorized", headers={"WWW-Authenticate": 'Basic realm="flower"'}
    )


def routes(jobs: Jobs) -> Iterable[web.AbstractRouteDef]:
    names: dict[str, str] = {}  # task id -> task name

    async def async_apply(request: web.Request) -> web.Response:
        name = request.match_info["taskname"]
        if not _authorised(request, jobs.api_key):
            jobs.record(request, None, "submit")
            return _unauthorised()
        if name not in TASKS:
            jobs.record(request, None, "submit")
            return web.Response(status=404, text=f"Unknown task '{name}'")
        job, _, refused = await jobs.new_job(request, FAMILY)
        if refused is not None:
            return refused
        names[job.id] = name
        return web.json_response({"task-id": job.id, "state": "PENDING"})

    async def result(request: web.Request) -> web.StreamResponse:
        if not _authorised(request, jobs.api_key):
            jobs.record(request, request.match_info["job_id"], "status")
            return _unauthorised()
        if request.match_info["job_id"] not in jobs.jobs:  # Celery never saw it: PENDING
            jobs.record(request, request.match_info["job_id"], "status")
            return web.json_response({"task-id": request.match_info["job_id"], "state": "PENDING"})
        return await jobs.status(request)

    async def info(request: web.Request) -> web.Response:
        job = jobs.find_job(request, "info")
        if isinstance(job, web.Response):
            if job.status != 404:
                return _unauthorised()
            return web.Response(status=404, text=f"Unknown task '{request.match_info['job_id']}'")
        step = job.script[min(job.index, len(job.script) - 1)]
        state = str(step.get("state", FAMILY.pending))
        return web.json_response(_info(job, names.get(job.id, TASKS[0]), state))

    async def revoke(request: web.Request) -> web.Response:
        job = jobs.find_job(request, "cancel")
        if isinstance(job, web.Response):
            return _unauthorised() if job.status == 401 else job
        jobs.cancel_job(job)
        return web.json_response({"message": f"Revoked '{job.id}'"})

    return [
        web.post("/api/task/async-apply/{taskname}", async_apply),
        web.get("/api/task/result/{job_id}", result),
        web.get("/api/task/info/{job_id}", info),
        web.post("/api/task/revoke/{job_id}", revoke),
    ]


def _info(job: Job, name: str, state: str) -> dict[str, Any]:
    """What Flower's event monitor knows of a task (``GET /api/task/info/{taskid}``)."""
    started = job.created_at + 0.01
    return {
        "uuid": job.id,
        "task-id": job.id,
        "name": name,
        "state": state,
        "args": repr(job.request.get("args") or []),
        "kwargs": repr(job.request.get("kwargs") or {}),
        "received": job.created_at,
        "started": started if state in ("STARTED", "RETRY", *READY) else None,
        "succeeded": started + 1 if state == "SUCCESS" else None,
        "failed": started + 1 if state == "FAILURE" else None,
        "revoked": started + 1 if state == "REVOKED" else None,
        "result": None,
        "exception": None,
        "traceback": None,
        "retries": 0,
        "worker": "celery@demo-worker",
    }


DOUBLE = Double(
    provider="celery-flower",
    reference="https://flower.readthedocs.io/en/latest/api.html",
    family=FAMILY,
    routes=routes,
    example=Example("/api/task/async-apply/tasks.add", {"args": [2, 3]}),
)
