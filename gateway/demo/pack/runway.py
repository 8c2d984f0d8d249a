"""A double of Runway's task API, written from its published reference
(https://docs.dev.runwayml.com/api/ , "Start generating" and "Task management"; the schemas as
the official ``runwayml`` SDK, generated from Runway's OpenAPI document, carries them in
``runwayml/types/task_retrieve_response.py``), not from our policy.

- ``POST /v1/image_to_video`` (and the other generation endpoints served here,
  ``/v1/text_to_video``, ``/v1/video_to_video``, ``/v1/text_to_image``) -> 200 ``{"id":
  "<uuid>"}``: a task.
- ``GET /v1/tasks/{id}`` -> the task: ``id``, ``status``, ``createdAt`` and, by status,
  ``PENDING`` / ``THROTTLED`` (``estimatedCost``), ``RUNNING`` (``progress`` 0-1),
  ``SUCCEEDED`` (``cost``, ``output``: URLs on Runway's CDN, another host, that expire
  within 24-48 hours), ``FAILED`` (``cost``, ``failure``, ``failureCode``), ``CANCELLED``
  (``cost``: "a cancelled or deleted task").
- ``DELETE /v1/tasks/{id}`` -> 204: cancels a task that has not finished (it then reports
  ``CANCELLED``), deletes one that has.
- Every call needs ``Authorization: Bearer <key>`` (else 401) and ``X-Runway-Version:
  2024-11-06`` (else 400); an unknown task is 404.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from gateway.demo.jobs import Family, Job, Jobs
from gateway.demo.pack import Double, Example

VERSION = "2024-11-06"
CDN = "https://dnznrvs05pmza.cloudfront.net"  # outputs live on another host
CREATE_PATHS = (
    "/v1/image_to_video",
    "/v1/text_to_video",
    "/v1/video_to_video",
    "/v1/text_to_image",
)


def _task(
    jobs: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
) -> dict[str, Any]:
    """A task as ``GET /v1/tasks/{id}`` returns it in ``state``."""
    body: dict[str, Any] = {
        "id": job.id,
        "status": state,
        "createdAt": jobs.instant(job.created_at - jobs.clock()),
    }
    if state in ("PENDING", "THROTTLED", "RUNNING"):
        body["estimatedCost"] = {"credits": 50}
    else:
        body["cost"] = {"credits": 0 if state == "CANCELLED" else 50}
    if state == "RUNNING":
        body["progress"] = float(step.get("progress", 0.5))
    elif state == "SUCCEEDED":
        body["output"] = [f"{CDN}/{job.id}.mp4?_jwt=demo"]
    elif state == "FAILED":
        body["failure"] = "The generation failed (scripted)."
        body["failureCode"] = "INTERNAL.BAD_OUTPUT.CODE01"
    return body


def _authorised(request: web.Request, key: str) -> bool:
    return request.headers.get("Authorization") == f"Bearer {key}"


FAMILY = Family(
    name="runway",
    state_field="status",
    id_prefix="",
    success="SUCCEEDED",
    result_field="output",
    result_value=None,
    error_field="failure",
    default_script=(
        {"state": "PENDING"},
        {"state": "RUNNING", "progress": 0.3},
        {"state": "RUNNING", "progress": 0.8},
        {"state": "SUCCEEDED"},
    ),
    pending="RUNNING",
    body=_task,
    auth=_authorised,
    new_id=lambda request: str(uuid.uuid4()),
    cancelled_script=({"state": "CANCELLED"},),
)


def _wrong_version(request: web.Request) -> web.Response | None:
    version = request.headers.get("X-Runway-Version")
    if version == VERSION:
        return None
    message = "X-Runway-Version header is missing" if version is None else "Invalid API version"
    return web.json_response({"error": message}, status=400)


def routes(jobs: Jobs) -> Iterable[web.AbstractRouteDef]:
    async def create(request: web.Request) -> web.Response:
        refused = _wrong_version(request)
        if refused is not None:
            return refused
        job, _, refused = await jobs.new_job(request, FAMILY)
        if refused is not None:
            return refused
        return web.json_response({"id": job.id})

    async def task(request: web.Request) -> web.StreamResponse:
        refused = _wrong_version(request)
        if refused is not None:
            return refused
        return await jobs.status(request)

    async def delete(request: web.Request) -> web.Response:
        refused = _wrong_version(request)
        if refused is not None:
            return refused
        job = jobs.find_job(request, "cancel")
        if isinstance(job, web.Response):
            return job
        jobs.cancel_job(job)
        return web.Response(status=204)

    return [
        *(web.post(path, create) for path in CREATE_PATHS),
        web.get("/v1/tasks/{job_id}", task),
        web.delete("/v1/tasks/{job_id}", delete),
    ]


DOUBLE = Double(
    provider="runway",
    reference="https://docs.dev.runwayml.com/api/",
    family=FAMILY,
    routes=routes,
    example=Example(
        "/v1/image_to_video",
        {
            "model": "gen4_turbo",
            "promptImage": "https://example.com/first-frame.jpg",
            "promptText": "A slow pan across a misty valley",
            "ratio": "1280:720",
            "duration": 5,
        },
        headers={"X-Runway-Version": VERSION},
    ),
)
