"""A double of Cohere's embed jobs and the datasets around them, written from its published
reference (https://docs.cohere.com/reference/create-embed-job , get-embed-job,
cancel-embed-job, create-dataset, get-dataset; the schemas as the official ``cohere`` SDK,
generated from Cohere's API definition, carries them in ``cohere/types/embed_job.py`` and
``dataset.py``), not from our policy.

- ``POST /v1/datasets?name=N&type=embed-input`` (multipart, the file in ``data``) -> 200
  ``{"id"}``: an input dataset, validated at once here.
- ``POST /v1/embed-jobs`` ``{model, dataset_id, input_type, ...}`` -> 200 ``{"job_id",
  "meta"}``; 400 without ``dataset_id``.
- ``GET /v1/embed-jobs/{id}`` -> the EmbedJob: ``job_id``, ``name``, ``status``
  (``processing``, ``complete``, ``cancelling``, ``cancelled``, ``failed``), ``created_at``,
  ``input_dataset_id``, ``output_dataset_id`` (once complete), ``model``, ``truncate``,
  ``meta``.
- ``POST /v1/embed-jobs/{id}/cancel`` -> 200, empty: the job goes ``cancelling``, then
  ``cancelled``.
- ``GET /v1/datasets/{id}`` -> ``{"dataset": {...}}`` with ``dataset_parts`` whose ``url``
  is a signed URL on another host (Cohere's storage); an embed job's output dataset is of
  type ``embed-result``.
- Every call needs ``Authorization: Bearer <key>`` (else 401); an unknown id is 404.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from typing import Any

from aiohttp import BodyPartReader, web

from gateway.demo.jobs import Family, Job, Jobs
from gateway.demo.pack import Double, Example

STORAGE = "https://storage.googleapis.com/cohere-datasets-demo"  # parts live on another host


def output_dataset(job_id: str) -> str:
    """The id of an embed job's output dataset: one per job."""
    return f"{job_id}-embed-result"


def _embed_job(
    jobs: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
) -> dict[str, Any]:
    """An EmbedJob as ``GET /v1/embed-jobs/{id}`` returns it in ``state``."""
    asked = job.request
    body: dict[str, Any] = {
        "job_id": job.id,
        "name": asked.get("name") or "demo-embed-job",
        "status": state,
        "created_at": jobs.instant(job.created_at - jobs.clock()),
        "input_dataset_id": asked.get("dataset_id", ""),
        "model": asked.get("model", "embed-english-v3.0"),
        "truncate": asked.get("truncate") or "END",
        "meta": {"api_version": {"version": "1"}},
    }
    if state == "complete":
        body["output_dataset_id"] = output_dataset(job.id)
    return body


def _authorised(request: web.Request, key: str) -> bool:
    return request.headers.get("Authorization") == f"Bearer {key}"


FAMILY = Family(
    name="cohere-embed-jobs",
    state_field="status",
    id_prefix="",
    success="complete",
    result_field="output_dataset_id",
    result_value=None,
    error_field="status",
    default_script=(
        {"state": "processing"},
        {"state": "processing"},
        {"state": "complete"},
    ),
    pending="processing",
    body=_embed_job,
    auth=_authorised,
    new_id=lambda request: f"{secrets.token_hex(4)}-{secrets.token_hex(2)}-{secrets.token_hex(6)}",
    cancelled_script=({"state": "cancelling"}, {"state": "cancelled"}),
)


def _dataset(dataset_id: str, name: str, kind: str, when: str) -> dict[str, Any]:
    part = {
        "id": f"{dataset_id}-part-0",
        "name": f"{name}-0.avro",
        "url": f"{STORAGE}/{dataset_id}/part-0.avro?X-Goog-Signature=demo",
        "index": 0,
        "size_bytes": 2048,
        "num_rows": 2,
    }
    dataset = {
        "id": dataset_id,
        "name": name,
        "created_at": when,
        "updated_at": when,
        "dataset_type": kind,
        "validation_status": "validated",
        "dataset_parts": [part],
    }
    return {"dataset": dataset}


def routes(jobs: Jobs) -> Iterable[web.AbstractRouteDef]:
    async def create_dataset(request: web.Request) -> web.Response:
        jobs.record(request, None, "file")
        if not FAMILY.auth or not FAMILY.auth(request, jobs.api_key):
            return jobs.denied()
        content = b""
        if request.content_type == "multipart/form-data":
            async for part in await request.multipart():
                if isinstance(part, BodyPartReader) and part.name == "data":
                    content = await part.read()
        name = request.query.get("name", "dataset")
        dataset_id = f"{name}-{secrets.token_hex(3)}"
        jobs.files[dataset_id] = content
        return web.json_response({"id": dataset_id})

    async def create(request: web.Request) -> web.Response:
        try:
            asked = await request.json()
        except ValueError:
            asked = {}
        if not isinstance(asked, dict) or not asked.get("dataset_id"):
            return web.json_response({"message": "dataset_id is required"}, status=400)
        job, _, refused = await jobs.new_job(request, FAMILY, asked)
        if refused is not None:
            return refused
        return web.json_response({"job_id": job.id, "meta": {"api_version": {"version": "1"}}})

    async def cancel(request: web.Request) -> web.Response:
        job = jobs.find_job(request, "cancel")
        if isinstance(job, web.Response):
            return job
        jobs.cancel_job(job)
        return web.Response(status=200)

    async def get_dataset(request: web.Request) -> web.Response:
        dataset_id = request.match_info["dataset_id"]
        owner = next((j for j in jobs.jobs.values() if output_dataset(j.id) == dataset_id), None)
        jobs.record(request, owner.id if owner else dataset_id, "result")
        if not _authorised(request, jobs.api_key):
            return jobs.denied()
        when = jobs.instant(0)
        if owner is not None:  # its id is only ever given in a complete job's answer
            return web.json_response(_dataset(dataset_id, "embed-result", "embed-result", when))
        if dataset_id in jobs.files:
            return web.json_response(_dataset(dataset_id, dataset_id, "embed-input", when))
        return web.json_response({"message": f"dataset {dataset_id} not found"}, status=404)

    return [
        web.post("/v1/datasets", create_dataset),
        web.get("/v1/datasets/{dataset_id}", get_dataset),
        web.post("/v1/embed-jobs", create),
        web.get("/v1/embed-jobs/{job_id}", jobs.status),
        web.post("/v1/embed-jobs/{job_id}/cancel", cancel),
    ]


DOUBLE = Double(
    provider="cohere-embed-jobs",
    reference="https://docs.cohere.com/reference/create-embed-job",
    family=FAMILY,
    routes=routes,
    example=Example(
        "/v1/embed-jobs",
        {
            "model": "embed-english-v3.0",
            "dataset_id": "demo-input-dataset",
            "input_type": "search_document",
        },
    ),
)
