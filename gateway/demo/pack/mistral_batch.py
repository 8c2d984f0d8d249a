"""Mistral batch jobs (policy ``mistral-batch``), from Mistral's batch guide
(https://docs.mistral.ai/capabilities/batch) and API reference ("Batch", "Files"), which
the official ``mistralai`` SDK follows:

- ``POST /v1/files`` (multipart ``file``, ``purpose: batch``): the file object (id,
  object, bytes, created_at, filename, purpose, sample_type, source, num_lines, ...).
- ``POST /v1/batch/jobs`` (input_files or requests, endpoint, model, metadata,
  timeout_hours): the job, ``status: QUEUED``.
- ``GET /v1/batch/jobs/{id}``: the job (id, object "batch", input_files, endpoint, model,
  errors, status, created_at, total / completed / succeeded / failed_requests,
  output_file, error_file, started_at, completed_at), QUEUED and RUNNING until SUCCESS,
  FAILED, TIMEOUT_EXCEEDED or, after a cancel, CANCELLATION_REQUESTED then CANCELLED.
- ``POST /v1/batch/jobs/{id}/cancel``: the job, CANCELLATION_REQUESTED.
- ``GET /v1/files/{id}/content``: the file's bytes (application/octet-stream).

The key is a bearer token. Ids are UUIDs. The SDK cannot add a field to a request body:
a job follows ``default_scripts["mistral-batch"]`` or the default below.
"""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web

from gateway.demo.jobs import Family, Job, Jobs
from gateway.demo.pack import Double, Example
from gateway.demo.pack.common import batch_output, bearer, file_content, json_body, take_upload

PROVIDER = "mistral-batch"
ENDED = ("SUCCESS", "FAILED", "TIMEOUT_EXCEEDED", "CANCELLED")


def output_file(job: Job) -> str:
    """The id of a job's output file: one of its own per job."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, job.id))


def not_found(what: str) -> web.Response:
    body = {"object": "error", "message": f"{what} not found", "type": "invalid_request_error"}
    return web.json_response(body | {"param": None, "code": None}, status=404)


def job_body(
    jobs: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
) -> dict[str, Any]:
    """The Mistral batch job object at this state."""
    asked = job.request
    total = len(asked.get("requests") or []) or 1
    ended = state in ENDED
    succeeded = total if state == "SUCCESS" else 0
    body: dict[str, Any] = {
        "id": job.id,
        "object": "batch",
        "input_files": asked.get("input_files") or [],
        "metadata": asked.get("metadata"),
        "endpoint": asked.get("endpoint", "/v1/chat/completions"),
        "model": asked.get("model"),
        "agent_id": asked.get("agent_id"),
        "output_file": None,
        "error_file": None,
        "errors": [],
        "status": state,
        "created_at": int(job.created_at),
        "total_requests": total,
        "completed_requests": total if ended else 0,
        "succeeded_requests": succeeded,
        "failed_requests": total if state == "FAILED" else 0,
        "started_at": None if state == "QUEUED" else int(job.created_at) + 1,
        "completed_at": int(jobs.clock()) if ended else None,
    }
    if state == "SUCCESS":
        body["output_file"] = output_file(job)
        jobs.files.setdefault(output_file(job), batch_output(asked, job_id=job.id))
    if state == "FAILED":
        body["errors"] = [{"message": "scripted failure: no valid request", "count": total}]
    return body


FAMILY = Family(
    name=PROVIDER,
    state_field="status",
    id_prefix="",
    success="SUCCESS",
    result_field="output_file",
    result_value=None,
    error_field="errors",
    default_script=({"state": "QUEUED"}, {"state": "RUNNING"}, {"state": "SUCCESS"}),
    pending="RUNNING",
    body=job_body,
    auth=bearer,
    new_id=lambda request: str(uuid.uuid4()),
    cancelled_script=({"state": "CANCELLATION_REQUESTED"}, {"state": "CANCELLED"}),
)


def routes(jobs: Jobs) -> list[web.AbstractRouteDef]:
    async def upload(request: web.Request) -> web.Response:
        jobs.record(request, None, "file")
        if not jobs.authorised(request, FAMILY):
            return jobs.denied()
        got = await take_upload(jobs, request, file_id=str(uuid.uuid4()))
        body = {
            "id": got.file_id,
            "object": "file",
            "bytes": len(got.content),
            "created_at": int(jobs.clock()),
            "filename": got.filename,
            "purpose": got.purpose,
            "sample_type": "batch_request",
            "source": "upload",
            "num_lines": got.content.count(b"\n"),
            "mimetype": "application/jsonl",
        }
        return web.json_response(body)

    async def content(request: web.Request) -> web.Response:
        file_id = request.match_info["file_id"]
        jobs.record(request, file_id, "result")
        if not jobs.authorised(request, FAMILY):
            return jobs.denied()
        found = file_content(jobs, file_id, "application/octet-stream")
        return not_found("File") if found is None else found

    async def create(request: web.Request) -> web.Response:
        job, submit, refused = await jobs.new_job(request, FAMILY, await json_body(request))
        if refused is not None:
            return refused
        body = jobs.status_body(request, job, {"state": "QUEUED"})
        return web.json_response(body, headers=jobs.submit_headers(submit))

    async def cancel(request: web.Request) -> web.Response:
        job = jobs.find_job(request, "cancel")
        if isinstance(job, web.Response):
            return job
        jobs.cancel_job(job)
        state = {"state": "CANCELLATION_REQUESTED"}
        return web.json_response(jobs.status_body(request, job, state))

    return [
        web.post("/v1/files", upload),
        web.get("/v1/files/{file_id}/content", content),
        web.post("/v1/batch/jobs", create),
        web.get("/v1/batch/jobs/{job_id}", jobs.status),
        web.post("/v1/batch/jobs/{job_id}/cancel", cancel),
    ]


DOUBLE = Double(
    provider=PROVIDER,
    reference="https://docs.mistral.ai/api/#tag/batch",
    family=FAMILY,
    routes=routes,
    example=Example(
        "/v1/batch/jobs",
        {
            "input_files": ["6f3b5a6e-0d8c-4a63-9c55-3b7d0f0f2a11"],
            "endpoint": "/v1/chat/completions",
            "model": "mistral-small-latest",
        },
    ),
)
