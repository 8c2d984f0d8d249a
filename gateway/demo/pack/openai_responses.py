"""OpenAI Responses in background mode (policy ``openai-responses``), from the OpenAI API
reference, "Responses" (create, retrieve, cancel; the Response object) and the
"Background mode" guide (https://platform.openai.com/docs/guides/background):

- ``POST /v1/responses`` with ``background: true`` answers at once with a Response whose
  status is ``queued``; without it the response is generated before the answer
  (``completed``). ``stream: true`` is not spoken by this double (400).
- ``GET /v1/responses/{id}``: the Response, ``queued`` / ``in_progress`` until it ends
  ``completed`` (``output``: a message with ``output_text``; ``usage``), ``failed``
  (``error``), ``incomplete`` (``incomplete_details.reason``) or ``cancelled``.
- ``POST /v1/responses/{id}/cancel``: a background response becomes ``cancelled`` (the
  Response is answered); one created without background is refused (400).

The key is a bearer token. Ids are ``resp_`` and 32 hex digits, messages ``msg_``.
"""

from __future__ import annotations

import secrets
from typing import Any

from aiohttp import web

from gateway.demo.jobs import Family, Job, Jobs
from gateway.demo.pack import Double, Example
from gateway.demo.pack.common import bearer, error, json_body

PROVIDER = "openai-responses"


def _output(job: Job, state: str) -> list[dict[str, Any]]:
    if state not in ("completed", "incomplete"):
        return []
    text = "demo answer" if state == "completed" else "demo ans"
    message = {
        "type": "message",
        "id": f"msg_{job.id.removeprefix('resp_')}",
        "status": state,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    return [message]


def response_body(
    jobs: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
) -> dict[str, Any]:
    """The Response object at this state."""
    asked = job.request
    ended = state in ("completed", "failed", "incomplete", "cancelled")
    body: dict[str, Any] = {
        "id": job.id,
        "object": "response",
        "created_at": int(job.created_at),
        "status": state,
        "background": bool(asked.get("background")),
        "completed_at": int(jobs.clock()) if state == "completed" else None,
        "error": None,
        "incomplete_details": None,
        "instructions": asked.get("instructions"),
        "max_output_tokens": asked.get("max_output_tokens"),
        "model": asked.get("model", "gpt-5"),
        "output": _output(job, state),
        "parallel_tool_calls": True,
        "previous_response_id": asked.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": True,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": None,
        "metadata": asked.get("metadata") or {},
    }
    if ended and state != "cancelled":
        body["usage"] = {
            "input_tokens": 12,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 2,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 14,
        }
    if state == "failed":
        body["error"] = {"code": "server_error", "message": "scripted failure"}
    if state == "incomplete":
        body["incomplete_details"] = {"reason": "max_output_tokens"}
    return body


FAMILY = Family(
    name=PROVIDER,
    state_field="status",
    id_prefix="resp_",
    success="completed",
    result_field="output",
    result_value=None,
    error_field="error",
    default_script=({"state": "queued"}, {"state": "in_progress"}, {"state": "completed"}),
    pending="in_progress",
    body=response_body,
    auth=bearer,
    new_id=lambda request: f"resp_{secrets.token_hex(16)}",
    cancelled_script=({"state": "cancelled"},),
)


def routes(jobs: Jobs) -> list[web.AbstractRouteDef]:
    async def create(request: web.Request) -> web.Response:
        payload = await json_body(request)
        if payload.get("stream"):
            jobs.record(request, None, "refused")
            return error(400, "This demo does not stream responses.", "invalid_request_error")
        job, submit, refused = await jobs.new_job(request, FAMILY, payload)
        if refused is not None:
            return refused
        if not payload.get("background"):  # generated before the answer
            job.script = [{"state": "completed"}]
            return web.json_response(jobs.status_body(request, job, {"state": "completed"}))
        body = jobs.status_body(request, job, {"state": "queued"})
        return web.json_response(body, headers=jobs.submit_headers(submit))

    async def cancel(request: web.Request) -> web.Response:
        job = jobs.find_job(request, "cancel")
        if isinstance(job, web.Response):
            return job
        if not job.request.get("background"):
            detail = "Only responses created with background=true can be cancelled."
            return error(400, detail, "invalid_request_error")
        jobs.cancel_job(job)
        return web.json_response(jobs.status_body(request, job, {"state": "cancelled"}))

    return [
        web.post("/v1/responses", create),
        web.get("/v1/responses/{job_id}", jobs.status),
        web.post("/v1/responses/{job_id}/cancel", cancel),
    ]


DOUBLE = Double(
    provider=PROVIDER,
    reference="https://platform.openai.com/docs/api-reference/responses",
    family=FAMILY,
    routes=routes,
    example=Example(
        "/v1/responses",
        {"model": "gpt-5", "input": "Write a haiku about queues.", "background": True},
    ),
)
