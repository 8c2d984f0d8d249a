"""Vertex AI batch prediction jobs (the double of ``vertex-batch-prediction``).

Written from the Vertex AI REST reference:
https://cloud.google.com/vertex-ai/docs/reference/rest/v1/projects.locations.batchPredictionJobs
(``create``, ``get``, ``cancel``), the ``BatchPredictionJob`` resource and ``JobState``
(https://cloud.google.com/vertex-ai/docs/reference/rest/v1/JobState), and "Batch
prediction for Gemini" (https://cloud.google.com/vertex-ai/generative-ai/docs/multimodal/batch-prediction-gemini):

- ``POST /v1/projects/{project}/locations/{location}/batchPredictionJobs`` with a
  ``BatchPredictionJob`` (``displayName``, ``model``, ``inputConfig`` {``instancesFormat``,
  ``gcsSource`` or ``bigquerySource``}, ``outputConfig`` {``predictionsFormat``,
  ``gcsDestination`` or ``bigqueryDestination``}) answers the job, named
  ``projects/<project number>/locations/<location>/batchPredictionJobs/<numeric id>``
  (resource names carry the project number, whichever of id or number the request used).
- ``GET .../batchPredictionJobs/{id}`` answers the job: ``state`` one of
  ``JOB_STATE_QUEUED``, ``JOB_STATE_PENDING``, ``JOB_STATE_RUNNING``,
  ``JOB_STATE_SUCCEEDED``, ``JOB_STATE_FAILED``, ``JOB_STATE_CANCELLING``,
  ``JOB_STATE_CANCELLED``, ``JOB_STATE_PAUSED``, ``JOB_STATE_EXPIRED``,
  ``JOB_STATE_UPDATING``, ``JOB_STATE_PARTIALLY_SUCCEEDED``; a finished job carries
  ``outputInfo`` (``gcsOutputDirectory`` or ``bigqueryOutputTable``) and
  ``completionStats``, a failed one its ``error``. The step ``{"output_info": false}``
  answers a success without it.
- ``POST .../batchPredictionJobs/{id}:cancel`` answers ``{}``; the job goes
  ``JOB_STATE_CANCELLING``, then ``JOB_STATE_CANCELLED`` with ``error`` code 1.

Every call carries ``Authorization: Bearer <OAuth 2.0 access token>``; a wrong one is 401.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from gateway.demo.jobs import Family, Job, Jobs
from gateway.demo.pack import Double, Example
from gateway.demo.pack.google import bearer, error, not_found, token_rejected

PROJECT_NUMBER = "123456789012"  # the number of every project the double is asked about
JOBS = "/v1/projects/{project}/locations/{location}/batchPredictionJobs"
ENDED_ERRORS = {
    "JOB_STATE_FAILED": (3, "Failed to read the input: gs://... is not valid JSONL (scripted)."),
    "JOB_STATE_CANCELLED": (1, "CANCELLED"),
    "JOB_STATE_EXPIRED": (4, "The job was queued for too long and expired."),
}
SUCCEEDED = ("JOB_STATE_SUCCEEDED", "JOB_STATE_PARTIALLY_SUCCEEDED")


def _number(project: str) -> str:
    return project if project.isdigit() else PROJECT_NUMBER


def _name(request: web.Request, job_id: str | None = None) -> str:
    """A job's resource name from the path, the project as its number."""
    info = request.match_info
    project, location = _number(info["project"]), info["location"]
    job = job_id if job_id is not None else info["job"]
    return f"projects/{project}/locations/{location}/batchPredictionJobs/{job}"


def _job(
    jobs: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
) -> dict[str, Any]:
    """The BatchPredictionJob in ``state``."""
    asked = job.request
    body: dict[str, Any] = {
        "name": job.id,
        "displayName": asked.get("displayName", ""),
        "model": asked.get("model"),
        "inputConfig": asked.get("inputConfig"),
        "outputConfig": asked.get("outputConfig"),
        "state": state,
        "createTime": jobs.instant(job.created_at - jobs.clock()),
        "updateTime": jobs.instant(0),
    }
    if state not in ("JOB_STATE_QUEUED", "JOB_STATE_PENDING"):
        body["startTime"] = jobs.instant(job.created_at + 60 - jobs.clock())
    if state in (*SUCCEEDED, *ENDED_ERRORS):
        body["endTime"] = jobs.instant(0)
    if state in SUCCEEDED and step.get("output_info", True):
        prefix = ((asked.get("outputConfig") or {}).get("gcsDestination") or {}).get(
            "outputUriPrefix", "gs://demo-out"
        )
        body["outputInfo"] = {"gcsOutputDirectory": f"{prefix}/prediction-model-demo"}
        failed = 1 if state == "JOB_STATE_PARTIALLY_SUCCEEDED" else 0
        body["completionStats"] = {"successfulCount": str(2 - failed), "failedCount": str(failed)}
    if state in ENDED_ERRORS:
        code, message = ENDED_ERRORS[state]
        body["error"] = {"code": code, "message": message}
    return body


FAMILY = Family(
    name="vertex-batch-prediction",
    state_field="state",
    id_prefix="",
    success="JOB_STATE_SUCCEEDED",
    result_field="outputInfo",
    result_value=None,
    error_field="error",
    default_script=(
        {"state": "JOB_STATE_QUEUED"},
        {"state": "JOB_STATE_PENDING"},
        {"state": "JOB_STATE_RUNNING"},
        {"state": "JOB_STATE_RUNNING"},
        {"state": "JOB_STATE_SUCCEEDED"},
    ),
    pending="JOB_STATE_RUNNING",
    body=_job,
    auth=bearer,
    new_id=lambda request: _name(request, str(10**18 + secrets.randbelow(9 * 10**18))),
    cancelled_script=({"state": "JOB_STATE_CANCELLING"}, {"state": "JOB_STATE_CANCELLED"}),
)


def routes(jobs: Jobs) -> Iterable[web.AbstractRouteDef]:
    async def create(request: web.Request) -> web.Response:
        if not bearer(request, jobs.api_key):
            jobs.record(request, None, "submit")
            return token_rejected()
        try:
            payload = await request.json()
        except ValueError:
            payload = None
        needed = ("displayName", "model", "inputConfig", "outputConfig")
        if not isinstance(payload, dict) or any(not payload.get(k) for k in needed):
            jobs.record(request, None, "submit")
            return error(400, f"{', '.join(needed)} are required.")
        job, _, refused = await jobs.new_job(request, FAMILY, payload)
        if refused is not None:
            return refused
        return web.json_response(jobs.status_body(request, job, {"state": "JOB_STATE_PENDING"}))

    async def get(request: web.Request) -> web.StreamResponse:
        name = _name(request)
        if not bearer(request, jobs.api_key):
            jobs.record(request, name, "status")
            return token_rejected()
        if name not in jobs.jobs:
            return not_found(jobs, request, name, "status")
        return await jobs.status(request, name)

    async def cancel(request: web.Request) -> web.Response:
        job = jobs.find_job(request, "cancel", _name(request))
        if isinstance(job, web.Response):
            return token_rejected() if job.status == 401 else error(404, "Job not found.")
        jobs.cancel_job(job)
        return web.json_response({})

    return [
        web.post(JOBS, create),
        web.get(JOBS + "/{job}", get),
        web.post(JOBS + "/{job}:cancel", cancel),
    ]


DOUBLE = Double(
    provider="vertex-batch-prediction",
    reference="https://cloud.google.com/vertex-ai/docs/reference/rest/v1/projects.locations.batchPredictionJobs",
    family=FAMILY,
    routes=routes,
    example=Example(
        "/v1/projects/demo-project/locations/us-central1/batchPredictionJobs",
        {
            "displayName": "demo-batch",
            "model": "publishers/google/models/gemini-2.5-flash",
            "inputConfig": {
                "instancesFormat": "jsonl",
                "gcsSource": {"uris": ["gs://demo-in/requests.jsonl"]},
            },
            "outputConfig": {
                "predictionsFormat": "jsonl",
                "gcsDestination": {"outputUriPrefix": "gs://demo-out/batch"},
            },
        },
    ),
)
