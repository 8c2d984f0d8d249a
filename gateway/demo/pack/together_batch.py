"""Together AI batches (policy ``together-batch``), from Together's "Manage batch jobs"
guide (https://docs.together.ai/docs/inference/batch/manage) and API reference
("Batches", "Files"), which the official ``together`` SDK 2.x follows:

- ``POST /v1/batches`` (endpoint, input_file_id, completion_window, model_id, priority)
  answers ``{"job": <batch>, "warning": null}``: create wraps the batch, retrieve does
  not.
- ``GET /v1/batches/{id}``: the batch (id, user_id, input_file_id, file_size_bytes,
  status, job_deadline, created_at, endpoint, progress 0-100, model_id, output_file_id,
  error_file_id, error, completed_at; times as RFC 3339), status VALIDATING,
  IN_PROGRESS, COMPLETED, FAILED, EXPIRED or CANCELLED.
- ``POST /v1/batches/{id}/cancel`` (while VALIDATING or IN_PROGRESS): the batch, from
  then on CANCELLED.
- ``GET /v1/files/{id}/content``: the output JSONL of a completed batch.

The key is a bearer token. Ids are UUIDs (files ``file-<uuid>``).
"""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web

from gateway.demo.jobs import Family, Job, Jobs
from gateway.demo.pack import Double, Example
from gateway.demo.pack.common import batch_output, bearer, error, file_content, json_body

PROVIDER = "together-batch"
ENDED = ("COMPLETED", "FAILED", "EXPIRED", "CANCELLED")


def output_file(job: Job) -> str:
    """The id of a batch's output file: one of its own per batch."""
    return f"file-{uuid.uuid5(uuid.NAMESPACE_URL, job.id)}"


def batch_body(
    jobs: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
) -> dict[str, Any]:
    """The Together batch object at this state."""
    asked = job.request
    done = state in ENDED
    progress = {"VALIDATING": 0.0, "IN_PROGRESS": 40.0, "CANCELING": 40.0}.get(state, 100.0)
    body: dict[str, Any] = {
        "id": job.id,
        "user_id": "demo-user",
        "input_file_id": asked.get("input_file_id"),
        "file_size_bytes": 1024,
        "status": state,
        "job_deadline": jobs.instant(job.created_at + 86400 - jobs.clock()),
        "created_at": jobs.instant(job.created_at - jobs.clock()),
        "endpoint": asked.get("endpoint", "/v1/chat/completions"),
        "progress": progress if state != "FAILED" else 0.0,
        "model_id": asked.get("model_id"),
        "output_file_id": None,
        "error_file_id": None,
        "error": None,
        "completed_at": jobs.instant(0) if done else None,
    }
    if state == "COMPLETED":
        body["output_file_id"] = output_file(job)
        jobs.files.setdefault(output_file(job), batch_output(asked, job_id=job.id))
    if state == "FAILED":
        body["error"] = "scripted failure: the input file is not valid JSONL"
    return body


FAMILY = Family(
    name=PROVIDER,
    state_field="status",
    id_prefix="",
    success="COMPLETED",
    result_field="output_file_id",
    result_value=None,
    error_field="error",
    default_script=({"state": "VALIDATING"}, {"state": "IN_PROGRESS"}, {"state": "COMPLETED"}),
    pending="IN_PROGRESS",
    body=batch_body,
    auth=bearer,
    new_id=lambda request: str(uuid.uuid4()),
    cancelled_script=({"state": "CANCELLED"},),
)


def routes(jobs: Jobs) -> list[web.AbstractRouteDef]:
    async def create(request: web.Request) -> web.Response:
        job, submit, refused = await jobs.new_job(request, FAMILY, await json_body(request))
        if refused is not None:
            return refused
        body = {"job": jobs.status_body(request, job, {"state": "VALIDATING"}), "warning": None}
        return web.json_response(body, headers=jobs.submit_headers(submit))

    async def cancel(request: web.Request) -> web.Response:
        job = jobs.find_job(request, "cancel")
        if isinstance(job, web.Response):
            return job
        jobs.cancel_job(job)
        return web.json_response(jobs.status_body(request, job, {"state": "CANCELLED"}))

    async def content(request: web.Request) -> web.Response:
        file_id = request.match_info["file_id"]
        jobs.record(request, file_id, "result")
        if not jobs.authorised(request, FAMILY):
            return jobs.denied()
        found = file_content(jobs, file_id, "application/octet-stream")
        if found is None:
            return error(404, f"File {file_id} not found", "invalid_request_error")
        return found

    return [
        web.post("/v1/batches", create),
        web.get("/v1/batches/{job_id}", jobs.status),
        web.post("/v1/batches/{job_id}/cancel", cancel),
        web.get("/v1/files/{file_id}/content", content),
    ]


DOUBLE = Double(
    provider=PROVIDER,
    reference="https://docs.together.ai/docs/inference/batch/manage",
    family=FAMILY,
    routes=routes,
    example=Example(
        "/v1/batches",
        {"endpoint": "/v1/chat/completions", "input_file_id": "file-demo-input"},
    ),
)
