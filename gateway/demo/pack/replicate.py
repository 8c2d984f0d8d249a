"""A double of Replicate's predictions API, written from its published reference
(https://replicate.com/docs/reference/http#predictions.create , predictions.get,
predictions.cancel; statuses from https://replicate.com/docs/topics/predictions/lifecycle),
not from our policy.

- ``POST /v1/predictions`` ``{version, input, webhook?, stream?}`` -> 201, the prediction
  with ``status: starting``. ``Prefer: wait[=N]`` asks Replicate to hold the answer until the
  prediction ends or N seconds pass; this double answers at once, as Replicate does when the
  wait runs out first (the prediction still ``starting``). 422 without ``version``.
- ``GET /v1/predictions/{id}`` -> the prediction: ``id``, ``model``, ``version``, ``input``,
  ``logs``, ``output`` (once ``succeeded``: file URLs on replicate.delivery, another host),
  ``data_removed``, ``error`` (once ``failed``), ``status`` (``starting``, ``processing``,
  ``succeeded``, ``failed``, ``canceled``; ``aborted``: the prediction's deadline passed
  before it started), ``created_at``, ``started_at``, ``completed_at``, ``metrics``, and
  ``urls``: ``get`` and ``cancel`` on the API itself, ``stream`` on stream.replicate.com,
  ``web`` on replicate.com.
- ``POST /v1/predictions/{id}/cancel`` -> 200, the prediction, ``canceled``.
- Every call needs ``Authorization: Bearer <token>`` (401 ``Unauthenticated`` otherwise);
  an unknown prediction is 404.
"""

from __future__ import annotations

import secrets
import string
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from gateway.demo.jobs import Family, Job, Jobs
from gateway.demo.pack import Double, Example

DELIVERY = "https://replicate.delivery/xezq"  # outputs live on another host
STREAM = "https://stream.replicate.com/v1/files"
ENDED = ("succeeded", "failed", "canceled", "aborted")
ALPHABET = string.ascii_lowercase + string.digits


def _prediction(
    jobs: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
) -> dict[str, Any]:
    """A prediction as ``GET /v1/predictions/{id}`` returns it in ``state``."""
    api = f"{jobs.base(request)}/v1/predictions/{job.id}"
    now = jobs.instant(0)
    asked = job.request
    body: dict[str, Any] = {
        "id": job.id,
        "model": "demo/flux-schnell",
        "version": asked.get("version", ""),
        "input": asked.get("input", {}),
        "logs": "" if state == "starting" else "Running predict()...\n",
        "output": None,
        "data_removed": False,
        "error": None,
        "status": state,
        "created_at": jobs.instant(job.created_at - jobs.clock()),
        "started_at": None if state in ("starting", "aborted") else now,
        "completed_at": now if state in ENDED else None,
        "urls": {
            "web": f"https://replicate.com/p/{job.id}",
            "get": api,
            "cancel": f"{api}/cancel",
            "stream": f"{STREAM}/{job.id}-stream",
        },
        "metrics": {"predict_time": 4.2} if state in ("succeeded", "failed") else {},
    }
    if state == "succeeded":
        body["output"] = [f"{DELIVERY}/{job.id}/out-0.webp"]
    elif state == "failed":
        body["error"] = "CUDA out of memory (scripted)"
    return body


def _authorised(request: web.Request, key: str) -> bool:
    return request.headers.get("Authorization") == f"Bearer {key}"


FAMILY = Family(
    name="replicate",
    state_field="status",
    id_prefix="",
    success="succeeded",
    result_field="output",
    result_value=None,
    error_field="error",
    default_script=(
        {"state": "starting"},
        {"state": "processing"},
        {"state": "processing"},
        {"state": "succeeded"},
    ),
    pending="processing",
    body=_prediction,
    auth=_authorised,
    new_id=lambda request: "".join(secrets.choice(ALPHABET) for _ in range(26)),
    cancelled_script=({"state": "canceled"},),
)


def _problem(status: int, title: str, detail: str) -> web.Response:
    return web.json_response({"title": title, "detail": detail, "status": status}, status=status)


def routes(jobs: Jobs) -> Iterable[web.AbstractRouteDef]:
    async def create(request: web.Request) -> web.Response:
        try:
            asked = await request.json()
        except ValueError:
            asked = {}
        if not isinstance(asked, dict) or not asked.get("version"):
            return _problem(422, "Input validation failed", "version is required")
        job, _, refused = await jobs.new_job(request, FAMILY, asked)
        if refused is not None:
            if refused.status == 401:
                return _problem(401, "Unauthenticated", "You did not pass a valid token")
            return refused
        body = jobs.status_body(request, job, {"state": "starting"})
        return web.json_response(body, status=201)

    async def get(request: web.Request) -> web.StreamResponse:
        return await jobs.status(request)

    async def cancel(request: web.Request) -> web.Response:
        job = jobs.find_job(request, "cancel")
        if isinstance(job, web.Response):
            return job
        jobs.cancel_job(job)
        return web.json_response(jobs.status_body(request, job, {"state": "canceled"}))

    async def version(request: web.Request) -> web.Response:
        """``GET /v1/models/{owner}/{name}/versions/{id}`` (models.versions.get): the
        version's id, created_at, cog_version and openapi_schema."""
        if not _authorised(request, jobs.api_key):
            return _problem(401, "Unauthenticated", "You did not pass a valid token")
        output = {"type": "array", "items": {"type": "string", "format": "uri"}}
        schema = {"components": {"schemas": {"Output": output}}}
        body = {
            "id": request.match_info["version_id"],
            "created_at": jobs.instant(0),
            "cog_version": "0.9.4",
            "openapi_schema": schema,
        }
        return web.json_response(body)

    return [
        web.get("/v1/models/{owner}/{name}/versions/{version_id}", version),
        web.post("/v1/predictions", create),
        web.get("/v1/predictions/{job_id}", get),
        web.post("/v1/predictions/{job_id}/cancel", cancel),
    ]


DOUBLE = Double(
    provider="replicate",
    reference="https://replicate.com/docs/reference/http#predictions.create",
    family=FAMILY,
    routes=routes,
    example=Example(
        "/v1/predictions",
        {
            "version": "5599ed30703defd1d160a25a63321b4dec97101d98b4674bcc56e41f62f35637",
            "input": {"prompt": "an astronaut riding a horse"},
        },
    ),
)
