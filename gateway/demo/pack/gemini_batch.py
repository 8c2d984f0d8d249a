"""The Gemini API's Batch API (the double of ``gemini-batch``).

Written from the Gemini API reference, "Batch API" (https://ai.google.dev/api/batch-api:
``models.batchGenerateContent``, ``batches.get``, ``batches.cancel``, ``batches.delete``,
``GenerateContentBatch``, ``BatchState``, ``GenerateContentBatchOutput``), the Batch API
guide (https://ai.google.dev/gemini-api/docs/batch-api) and "Files"
(https://ai.google.dev/api/files), and from how google-genai reads the answers
(``google/genai/batches.py``: the state and output are read from the Operation's
``metadata``):

- ``POST /v1beta/models/{model}:batchGenerateContent`` with ``{"batch": {"displayName",
  "inputConfig": {"requests": {"requests": [{"request": ..., "metadata": ...}]}} or
  {"fileName": "files/..."}}}`` answers a long-running Operation named ``batches/<id>``
  whose ``metadata`` is the ``GenerateContentBatch`` (``@type``, ``model``,
  ``displayName``, ``state``, ``batchStats``, ``createTime``...).
- ``GET /v1beta/batches/{id}`` answers that Operation again; ``metadata.state`` is one of
  ``BATCH_STATE_PENDING``, ``BATCH_STATE_RUNNING``, ``BATCH_STATE_SUCCEEDED``,
  ``BATCH_STATE_FAILED``, ``BATCH_STATE_CANCELLED``, ``BATCH_STATE_EXPIRED`` (a batch
  pending or running for 48 hours expires); once it has ended ``done`` is true, and a
  succeeded batch carries ``metadata.output`` (and ``response``): ``inlinedResponses`` for
  inlined requests, ``responsesFile`` (``files/<id>``) for a file of requests. The step
  ``{"output": false}`` answers SUCCEEDED before the output is there, as the real service
  has been seen to.
- ``POST /v1beta/batches/{id}:cancel`` answers ``{}``; ``DELETE /v1beta/batches/{id}`` too.
- ``GET /v1beta/files/{id}:download?alt=media`` answers a responses file (JSONL, one
  ``GenerateContentResponse`` per line, with the request's ``key``).

The key is read from ``x-goog-api-key`` or ``?key=``; a wrong one is 400 API_KEY_INVALID.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from gateway.demo.jobs import Family, Job, Jobs
from gateway.demo.pack import Double, Example
from gateway.demo.pack.google import api_key, error, key_rejected, not_found

TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main."
ENDED = (
    "BATCH_STATE_SUCCEEDED",
    "BATCH_STATE_FAILED",
    "BATCH_STATE_CANCELLED",
    "BATCH_STATE_EXPIRED",
)
ENDING_ERRORS = {
    "BATCH_STATE_FAILED": (13, "The batch failed (scripted failure)."),
    "BATCH_STATE_CANCELLED": (1, "The batch was cancelled."),
    "BATCH_STATE_EXPIRED": (4, "The batch expired after 48 hours."),
}


def _requests(job: Job) -> list[dict[str, Any]]:
    config = (job.request.get("batch") or {}).get("inputConfig") or {}
    found = (config.get("requests") or {}).get("requests") or []
    return [r for r in found if isinstance(r, dict)]


def _answer(text: str) -> dict[str, Any]:
    """A GenerateContentResponse with one candidate."""
    return {
        "candidates": [
            {"content": {"parts": [{"text": text}], "role": "model"}, "finishReason": "STOP"}
        ],
        "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 3, "totalTokenCount": 7},
        "modelVersion": "gemini-2.5-flash",
    }


def output(job: Job) -> dict[str, Any]:
    """A succeeded batch's GenerateContentBatchOutput: inlined responses, or a file."""
    inlined = _requests(job)
    if inlined:
        responses = [
            {"response": _answer(f"demo answer {n + 1}"), "metadata": item.get("metadata", {})}
            for n, item in enumerate(inlined)
        ]
        return {"inlinedResponses": {"inlinedResponses": responses}}
    return {"responsesFile": f"files/batch-{job.id.removeprefix('batches/')}"}


def _operation(
    jobs: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
) -> dict[str, Any]:
    """The Operation ``batches.get`` answers, the batch in ``state``."""
    batch = job.request.get("batch") or {}
    count = max(1, len(_requests(job)))
    done = state == "BATCH_STATE_SUCCEEDED"
    stats = {"requestCount": str(count), "pendingRequestCount": str(0 if done else count)}
    if done:
        stats["successfulRequestCount"] = str(count)
    metadata: dict[str, Any] = {
        "@type": TYPE + "GenerateContentBatch",
        "name": job.id,
        "model": job.request.get("demo_model", "models/gemini-2.5-flash"),
        "displayName": batch.get("displayName", ""),
        "createTime": jobs.instant(job.created_at - jobs.clock()),
        "updateTime": jobs.instant(0),
        "batchStats": stats,
        "state": state,
    }
    body: dict[str, Any] = {"name": job.id, "metadata": metadata}
    if state in ENDED:
        metadata["endTime"] = jobs.instant(0)
        body["done"] = True
    if done and step.get("output", True):
        metadata["output"] = output(job)
        body["response"] = {"@type": TYPE + "GenerateContentBatchOutput", **output(job)}
    if state in ENDING_ERRORS:
        code, message = ENDING_ERRORS[state]
        body["error"] = {"code": code, "message": message}
    return body


FAMILY = Family(
    name="gemini-batch",
    state_field="metadata.state",
    id_prefix="batches/",
    success="BATCH_STATE_SUCCEEDED",
    result_field="metadata.output",
    result_value=None,
    error_field="error",
    default_script=(
        {"state": "BATCH_STATE_PENDING"},
        {"state": "BATCH_STATE_RUNNING"},
        {"state": "BATCH_STATE_RUNNING"},
        {"state": "BATCH_STATE_SUCCEEDED"},
    ),
    pending="BATCH_STATE_RUNNING",
    body=_operation,
    auth=api_key,
    new_id=lambda request: f"batches/{secrets.token_hex(10)}",
    cancelled_script=({"state": "BATCH_STATE_CANCELLED"},),
)


async def _create(jobs: Jobs, request: web.Request) -> web.Response:
    """A batch made from inline requests or an uploaded file (batches.create)."""
    if not api_key(request, jobs.api_key):
        jobs.record(request, None, "submit")
        return key_rejected()
    try:
        payload = await request.json()
    except ValueError:
        payload = None
    batch = payload.get("batch") if isinstance(payload, dict) else None
    config = batch.get("inputConfig") if isinstance(batch, dict) else None
    if not isinstance(config, dict) or not ({"requests", "fileName"} & set(config)):
        jobs.record(request, None, "submit")
        return error(400, "batch.inputConfig must hold requests or a fileName.")
    assert isinstance(payload, dict)
    payload["demo_model"] = f"models/{request.match_info['model']}"
    job, _, refused = await jobs.new_job(request, FAMILY, payload)
    if refused is not None:
        return refused
    return web.json_response(jobs.status_body(request, job, {"state": "BATCH_STATE_PENDING"}))


async def _download(jobs: Jobs, request: web.Request) -> web.Response:
    """A finished batch's results file, one JSON line per request (alt=media)."""
    name = f"files/{request.match_info['file']}"
    jobs.record(request, name, "result")
    if not api_key(request, jobs.api_key):
        return key_rejected()
    job = jobs.jobs.get(f"batches/{name.removeprefix('files/batch-')}")
    if job is None or request.query.get("alt") != "media":
        return error(404, f"{name} not found.")
    count = max(1, len(_requests(job)))
    lines = [
        json.dumps({"key": f"request-{n + 1}", "response": _answer(f"demo answer {n + 1}")})
        for n in range(count)
    ]
    return web.Response(text="\n".join(lines) + "\n", content_type="application/jsonl")


def routes(jobs: Jobs) -> Iterable[web.AbstractRouteDef]:
    async def create(request: web.Request) -> web.Response:
        return await _create(jobs, request)

    async def get(request: web.Request) -> web.StreamResponse:
        name = f"batches/{request.match_info['batch']}"
        if not api_key(request, jobs.api_key):
            jobs.record(request, name, "status")
            return key_rejected()
        if name not in jobs.jobs:
            return not_found(jobs, request, name, "status")
        return await jobs.status(request, name)

    async def cancel(request: web.Request) -> web.Response:
        name = f"batches/{request.match_info['batch']}"
        job = jobs.find_job(request, "cancel", name)
        if isinstance(job, web.Response):
            return key_rejected() if job.status == 401 else error(404, f"{name} not found.")
        jobs.cancel_job(job)
        return web.json_response({})

    async def delete(request: web.Request) -> web.Response:
        name = f"batches/{request.match_info['batch']}"
        job = jobs.find_job(request, "delete", name)
        if isinstance(job, web.Response):
            return key_rejected() if job.status == 401 else error(404, f"{name} not found.")
        del jobs.jobs[name]
        return web.json_response({})

    async def download(request: web.Request) -> web.Response:
        return await _download(jobs, request)

    return [
        web.post("/v1beta/models/{model}:batchGenerateContent", create),
        web.get("/v1beta/batches/{batch}", get),
        web.post("/v1beta/batches/{batch}:cancel", cancel),
        web.delete("/v1beta/batches/{batch}", delete),
        web.get("/v1beta/files/{file}:download", download),
    ]


DOUBLE = Double(
    provider="gemini-batch",
    reference="https://ai.google.dev/api/batch-api",
    family=FAMILY,
    routes=routes,
    example=Example(
        "/v1beta/models/gemini-2.5-flash:batchGenerateContent",
        {
            "batch": {
                "displayName": "demo-batch",
                "inputConfig": {
                    "requests": {
                        "requests": [
                            {
                                "request": {"contents": [{"parts": [{"text": "Hello"}]}]},
                                "metadata": {"key": "request-1"},
                            }
                        ]
                    }
                },
            }
        },
    ),
)
