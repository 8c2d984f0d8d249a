"""OpenAI fine-tuning jobs (policy ``openai-fine-tuning``), from the OpenAI API reference,
"Fine-tuning" (create, retrieve, cancel, pause, resume; the fine_tuning.job object) and
"Files" (upload, retrieve content):

- ``POST /v1/files`` (multipart ``file``, ``purpose: fine-tune``): the training file.
- ``POST /v1/fine_tuning/jobs``: the job, ``status: validating_files``.
- ``GET /v1/fine_tuning/jobs/{id}``: validating_files, queued, running (pausing,
  paused when paused) until succeeded (``fine_tuned_model``, ``result_files``: one CSV
  of training metrics, ``trained_tokens``, ``finished_at``), failed (``error`` with
  code, message, param) or cancelled.
- ``POST /v1/fine_tuning/jobs/{id}/cancel``: "immediately cancel", the job is answered
  ``cancelled``. ``.../pause`` answers ``pausing`` (then ``paused``), ``.../resume``
  answers ``running`` and the job goes on to succeed.
- ``GET /v1/files/{id}/content``: a file's bytes (the results CSV of a succeeded job).

The key is a bearer token. Ids: ``ftjob-`` and 24 characters, files ``file-``.
"""

from __future__ import annotations

import secrets
from typing import Any

from aiohttp import web

from gateway.demo.jobs import Family, Job, Jobs
from gateway.demo.pack import Double, Example
from gateway.demo.pack.common import bearer, json_body, openai_files

PROVIDER = "openai-fine-tuning"
RESULTS_CSV = b"step,train_loss,train_accuracy,valid_loss,valid_mean_token_accuracy\n1,1.5,0.4,,\n"


def results_file(job: Job) -> str:
    """The id of a job's results file: one of its own per job."""
    return f"file-{job.id.removeprefix('ftjob-')}res"


def job_body(
    jobs: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
) -> dict[str, Any]:
    """The fine_tuning.job object at this state."""
    asked = job.request
    model = asked.get("model", "gpt-4o-mini-2024-07-18")
    ended = state in ("succeeded", "failed", "cancelled")
    hyper = {"batch_size": "auto", "learning_rate_multiplier": "auto", "n_epochs": "auto"}
    body: dict[str, Any] = {
        "id": job.id,
        "object": "fine_tuning.job",
        "created_at": int(job.created_at),
        "error": None,
        "fine_tuned_model": None,
        "finished_at": int(jobs.clock()) if ended else None,
        "hyperparameters": hyper,
        "model": model,
        "organization_id": "org-demo",
        "result_files": [],
        "seed": asked.get("seed", 42),
        "status": state,
        "trained_tokens": None,
        "training_file": asked.get("training_file"),
        "validation_file": asked.get("validation_file"),
        "estimated_finish": int(job.created_at) + 3600 if state == "running" else None,
        "integrations": [],
        "metadata": asked.get("metadata"),
        "method": {"type": "supervised", "supervised": {"hyperparameters": hyper}},
    }
    if state == "succeeded":
        suffix = asked.get("suffix") or "demo"
        body["fine_tuned_model"] = f"ft:{model}:org-demo:{suffix}:{job.id[-8:]}"
        body["result_files"] = [results_file(job)]
        body["trained_tokens"] = 5768
        jobs.files.setdefault(results_file(job), RESULTS_CSV)
    if state == "failed":
        body["error"] = {
            "code": "invalid_training_file",
            "message": "scripted failure: the training file has no valid examples",
            "param": "training_file",
        }
    return body


FAMILY = Family(
    name=PROVIDER,
    state_field="status",
    id_prefix="ftjob-",
    success="succeeded",
    result_field="fine_tuned_model",
    result_value=None,
    error_field="error",
    default_script=(
        {"state": "validating_files"},
        {"state": "queued"},
        {"state": "running"},
        {"state": "succeeded"},
    ),
    pending="running",
    body=job_body,
    auth=bearer,
    new_id=lambda request: f"ftjob-{secrets.token_hex(12)}",
    cancelled_script=({"state": "cancelled"},),
)


def routes(jobs: Jobs) -> list[web.AbstractRouteDef]:
    async def create(request: web.Request) -> web.Response:
        job, submit, refused = await jobs.new_job(request, FAMILY, await json_body(request))
        if refused is not None:
            return refused
        body = jobs.status_body(request, job, {"state": "validating_files"})
        return web.json_response(body, headers=jobs.submit_headers(submit))

    def action(kind: str, state: str, then: list[dict[str, Any]] | None) -> Any:
        """cancel (the family's cancelled script), pause or resume (``then``)."""

        async def act(request: web.Request) -> web.Response:
            job = jobs.find_job(request, kind)
            if isinstance(job, web.Response):
                return job
            if then is None:
                jobs.cancel_job(job)
            else:
                job.script, job.index = list(then), 0
            return web.json_response(jobs.status_body(request, job, {"state": state}))

        return act

    paused = [{"state": "pausing"}, {"state": "paused"}]
    resumed = [{"state": "running"}, {"state": "succeeded"}]
    base = "/v1/fine_tuning/jobs/{job_id}"
    return [
        *openai_files(jobs, FAMILY, "/v1"),
        web.post("/v1/fine_tuning/jobs", create),
        web.get(base, jobs.status),
        web.post(base + "/cancel", action("cancel", "cancelled", None)),
        web.post(base + "/pause", action("pause", "pausing", paused)),
        web.post(base + "/resume", action("resume", "running", resumed)),
    ]


DOUBLE = Double(
    provider=PROVIDER,
    reference="https://platform.openai.com/docs/api-reference/fine-tuning",
    family=FAMILY,
    routes=routes,
    example=Example(
        "/v1/fine_tuning/jobs",
        {"model": "gpt-4o-mini-2024-07-18", "training_file": "file-demo-training"},
    ),
)
