"""Fireworks batch inference jobs (policy ``fireworks-batch``), from the Fireworks batch
inference guide (https://docs.fireworks.ai/guides/batch-inference) and API reference
("Create Batch Inference Job", "Get Batch Inference Job", "Delete Batch Inference Job"),
which the official ``fireworks-ai`` SDK follows:

- ``POST /v1/accounts/{account}/batchInferenceJobs[?batchInferenceJobId=ID]`` (model,
  inputDatasetId, outputDatasetId, inferenceParameters, displayName, precision): the
  job, whose ``name`` is its resource name ``accounts/{account}/batchInferenceJobs/{ID}``
  (ID generated when not given), its output dataset ``accounts/{account}/datasets/...``
  (generated when not given), ``state: JOB_STATE_VALIDATING``.
- ``GET /v1/accounts/{account}/batchInferenceJobs/{ID}``: the job (name, displayName,
  createTime, createdBy, state, status {code, message}, model, inputDatasetId,
  outputDatasetId, inferenceParameters, updateTime, precision, jobProgress,
  continuedFromJobName), its ``state`` one of the reference's JobState values
  (JOB_STATE_VALIDATING, _PENDING, _RUNNING, _WRITING_RESULTS ... _COMPLETED, _FAILED,
  _EXPIRED, _PAUSED, _DELETING ...), times as RFC 3339.
- ``DELETE`` of the same path: ``{}``; the job is then JOB_STATE_DELETING.

The key is a bearer token. The reference has no cancel for batch inference jobs.
"""

from __future__ import annotations

import secrets
from typing import Any

from aiohttp import web

from gateway.demo.jobs import Family, Job, Jobs
from gateway.demo.pack import Double, Example
from gateway.demo.pack.common import bearer, json_body

PROVIDER = "fireworks-batch"
JOBS = "/v1/accounts/{account}/batchInferenceJobs"


def job_name(request: web.Request) -> str:
    """The resource name of the job a create asks for (its id, or a new one)."""
    given = request.query.get("batchInferenceJobId") or f"bij-{secrets.token_hex(6)}"
    return f"accounts/{request.match_info['account']}/batchInferenceJobs/{given}"


def job_body(
    jobs: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
) -> dict[str, Any]:
    """The BatchInferenceJob at this state."""
    asked = job.request
    account = job.id.split("/")[1]
    output = asked.get("outputDatasetId") or f"accounts/{account}/datasets/{job.id[-16:]}-out"
    asked.setdefault("outputDatasetId", output)  # generated once, kept for every answer
    done = state in ("JOB_STATE_COMPLETED", "JOB_STATE_EXPIRED", "JOB_STATE_FAILED")
    total = 2
    processed = total if done else (0 if state == "JOB_STATE_VALIDATING" else 1)
    body: dict[str, Any] = {
        "name": job.id,
        "displayName": asked.get("displayName", ""),
        "createTime": jobs.instant(job.created_at - jobs.clock()),
        "expireTime": jobs.instant(job.created_at + 86400 - jobs.clock()),
        "createdBy": "demo@example.com",
        "state": state,
        "status": {"code": "OK", "message": ""},
        "model": asked.get("model", "accounts/fireworks/models/llama-v3p1-8b-instruct"),
        "inputDatasetId": asked.get("inputDatasetId"),
        "outputDatasetId": output,
        "inferenceParameters": asked.get("inferenceParameters") or {},
        "updateTime": jobs.instant(0),
        "precision": asked.get("precision", "PRECISION_UNSPECIFIED"),
        "jobProgress": {
            "percent": 100 * processed // total,
            "totalInputRequests": total,
            "totalProcessedRequests": processed,
            "successfullyProcessedRequests": processed,
            "failedRequests": 0,
        },
        "continuedFromJobName": asked.get("continuedFromJobName", ""),
    }
    if state == "JOB_STATE_FAILED":
        body["status"] = {"code": "INVALID_ARGUMENT", "message": "scripted failure"}
    return body


FAMILY = Family(
    name=PROVIDER,
    state_field="state",
    id_prefix="",
    success="JOB_STATE_COMPLETED",
    result_field="outputDatasetId",
    result_value=None,
    error_field="status",
    default_script=(
        {"state": "JOB_STATE_VALIDATING"},
        {"state": "JOB_STATE_PENDING"},
        {"state": "JOB_STATE_RUNNING"},
        {"state": "JOB_STATE_WRITING_RESULTS"},
        {"state": "JOB_STATE_COMPLETED"},
    ),
    pending="JOB_STATE_RUNNING",
    body=job_body,
    auth=bearer,
    new_id=job_name,
    cancelled_script=({"state": "JOB_STATE_DELETING"},),
)


def routes(jobs: Jobs) -> list[web.AbstractRouteDef]:
    def named(request: web.Request) -> str:
        info = request.match_info
        return f"accounts/{info['account']}/batchInferenceJobs/{info['job']}"

    async def create(request: web.Request) -> web.Response:
        job, submit, refused = await jobs.new_job(request, FAMILY, await json_body(request))
        if refused is not None:
            return refused
        body = jobs.status_body(request, job, {"state": "JOB_STATE_VALIDATING"})
        return web.json_response(body, headers=jobs.submit_headers(submit))

    async def get(request: web.Request) -> web.StreamResponse:
        return await jobs.status(request, named(request))

    async def delete(request: web.Request) -> web.Response:
        job = jobs.find_job(request, "cancel", named(request))
        if isinstance(job, web.Response):
            return job
        jobs.cancel_job(job)
        return web.json_response({})

    return [
        web.post(JOBS, create),
        web.get(JOBS + "/{job}", get),
        web.delete(JOBS + "/{job}", delete),
    ]


DOUBLE = Double(
    provider=PROVIDER,
    reference="https://docs.fireworks.ai/api-reference/get-batch-inference-job",
    family=FAMILY,
    routes=routes,
    example=Example(
        "/v1/accounts/demo-account/batchInferenceJobs",
        {
            "model": "accounts/fireworks/models/llama-v3p1-8b-instruct",
            "inputDatasetId": "accounts/demo-account/datasets/batch-input",
        },
    ),
)
