"""A double of fal's queue API, written from its published reference
(https://fal.ai/docs/model-endpoints/queue , https://fal.ai/docs/inference-api/queue/status ,
.../queue/cancel; the client side as the official ``fal-client`` reads it,
``fal_client/client.py``: ``_BaseRequestHandle._parse_status``, ``SyncRequestHandle``), not
from our policy.

- ``POST /{owner}/{app}[/{path}]`` (the model's input as JSON) -> 200 ``{"request_id",
  "status": "IN_QUEUE", "queue_position", "status_url", "response_url", "cancel_url"}``; the
  three URLs name ``/{owner}/{app}/requests/{request_id}`` on the queue host, without the
  endpoint's sub-path.
- ``GET /{owner}/{app}/requests/{id}/status[?logs=1]`` -> ``{"status": "IN_QUEUE",
  "queue_position"}``, ``{"status": "IN_PROGRESS", "logs"}`` or ``{"status": "COMPLETED",
  "logs", "metrics"}``; a request that failed is ``COMPLETED`` with ``error`` and
  ``error_type``. Every answer carries ``response_url``. (The reference does not say what a
  cancelled request reports; this double reports ``COMPLETED`` with ``error_type:
  request_cancelled``.)
- ``GET /{owner}/{app}/requests/{id}`` -> the model's output (``images`` on fal's CDN, another
  host) once COMPLETED; 400 while it is not; 422 with the error once it failed.
- ``PUT /{owner}/{app}/requests/{id}/cancel`` -> 202 ``{"status":
  "CANCELLATION_REQUESTED"}``, or 400 ``{"status": "ALREADY_COMPLETED"}``.
- Every call needs ``Authorization: Key <key>`` (401 otherwise); an unknown request is 404.

"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from gateway.demo.jobs import Family, Job, Jobs
from gateway.demo.pack import Double, Example

CDN = "https://v3.fal.media/files"  # outputs live on another host
CANCELLED = {"error": "Request was cancelled", "error_type": "request_cancelled"}


def _app_url(jobs: Jobs, request: web.Request, job_id: str) -> str:
    info = request.match_info
    return f"{jobs.base(request)}/{info['owner']}/{info['app']}/requests/{job_id}"


def _status(
    jobs: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
) -> dict[str, Any]:
    """A request's status as ``GET .../requests/{id}/status`` returns it in ``state``."""
    body: dict[str, Any] = {"status": state, "request_id": job.id}
    body["response_url"] = _app_url(jobs, request, job.id)
    logs = [{"message": "step 1/4", "level": "INFO", "timestamp": jobs.instant(0)}]
    with_logs = request.query.get("logs") in ("1", "true", "True")
    if state == "IN_QUEUE":
        body["queue_position"] = int(step.get("position", 0))
    else:
        body["logs"] = logs if with_logs else None
    if state == "COMPLETED":
        body["metrics"] = {"inference_time": 1.8}
        if job.cancelled:
            body.update(CANCELLED)
        elif step.get("error"):
            body["error"] = str(step["error"])
            body["error_type"] = "runner_error"
    return body


def _authorised(request: web.Request, key: str) -> bool:
    return request.headers.get("Authorization") == f"Key {key}"


FAMILY = Family(
    name="fal-queue",
    state_field="status",
    id_prefix="",
    success="COMPLETED",
    result_field="response_url",
    result_value=None,
    error_field="error",
    default_script=(
        {"state": "IN_QUEUE", "position": 2},
        {"state": "IN_QUEUE", "position": 0},
        {"state": "IN_PROGRESS"},
        {"state": "COMPLETED"},
    ),
    pending="IN_PROGRESS",
    body=_status,
    auth=_authorised,
    new_id=lambda request: str(uuid.uuid4()),
    cancelled_script=({"state": "COMPLETED"},),
)


def _detail(status: int, detail: Any) -> web.Response:
    return web.json_response({"detail": detail}, status=status)


def routes(jobs: Jobs) -> Iterable[web.AbstractRouteDef]:
    async def submit(request: web.Request) -> web.Response:
        job, _, refused = await jobs.new_job(request, FAMILY)
        if refused is not None:
            return _detail(401, "Unauthorized") if refused.status == 401 else refused
        url = _app_url(jobs, request, job.id)
        body = {
            "request_id": job.id,
            "status": "IN_QUEUE",
            "queue_position": 0,
            "status_url": f"{url}/status",
            "response_url": url,
            "cancel_url": f"{url}/cancel",
        }
        return web.json_response(body)

    answered: dict[str, str] = {}  # the state each request last reported

    async def status(request: web.Request) -> web.StreamResponse:
        answer = await jobs.status(request)
        if answer.status in (401, 404):
            return _detail(answer.status, "Unauthorized" if answer.status == 401 else "Not found")
        if isinstance(answer, web.Response) and isinstance(answer.body, bytes):
            with contextlib.suppress(ValueError, AttributeError):
                answered[request.match_info["job_id"]] = json.loads(answer.body)["status"]
        return answer

    async def result(request: web.Request) -> web.Response:
        job = jobs.find_job(request, "result")
        if isinstance(job, web.Response):
            return _detail(job.status, "Not found")
        if answered.get(job.id) != "COMPLETED":
            return _detail(400, "Request is still in progress")
        failed = next((s.get("error") for s in job.script if s.get("error")), None)
        if job.cancelled or failed:
            error = CANCELLED["error"] if job.cancelled else str(failed)
            return _detail(422, [{"msg": error, "type": "runner_error"}])
        image = {"url": f"{CDN}/{job.id}/image.png", "width": 1024, "height": 768}
        return web.json_response({"images": [image], "seed": 42, "prompt": job.request})

    async def cancel(request: web.Request) -> web.Response:
        job = jobs.find_job(request, "cancel")
        if isinstance(job, web.Response):
            return web.json_response({"status": "NOT_FOUND"}, status=job.status)
        if answered.get(job.id) == "COMPLETED":
            return web.json_response({"status": "ALREADY_COMPLETED"}, status=400)
        jobs.cancel_job(job)
        return web.json_response({"status": "CANCELLATION_REQUESTED"}, status=202)

    base = "/{owner}/{app}"
    return [
        web.get(base + "/requests/{job_id}/status", status),
        web.get(base + "/requests/{job_id}", result),
        web.put(base + "/requests/{job_id}/cancel", cancel),
        web.post(base, submit),
        web.post(base + "/{path:.+}", submit),
    ]


DOUBLE = Double(
    provider="fal-queue",
    reference="https://fal.ai/docs/model-endpoints/queue",
    family=FAMILY,
    routes=routes,
    example=Example("/fal-ai/flux/dev", {"prompt": "a lighthouse at dusk"}),
)
