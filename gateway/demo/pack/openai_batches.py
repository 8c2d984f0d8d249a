"""A batch API in the OpenAI Batch dialect, as the providers that speak it document it:
upload a JSONL file (``POST <prefix>/files``, multipart ``file`` and ``purpose``), create a
batch from it (``POST <prefix>/batches`` -> the Batch object, ``status: validating``),
retrieve it (``GET <prefix>/batches/{id}``) through validating, in_progress, finalizing
to completed (``output_file_id``) or failed / expired, cancel it (``POST
<prefix>/batches/{id}/cancel`` -> cancelling, then cancelled), download a file
(``GET <prefix>/files/{id}/content``).

The Batch object's fields are the OpenAI reference's (https://platform.openai.com/docs/
api-reference/batch/object): id, object, endpoint, errors, input_file_id,
completion_window, status, output_file_id, error_file_id, the per-status timestamps and
request_counts. Each provider's module (azure_openai_batch, groq_batch) says where its
API differs: its path prefix, its key header, its id forms, a required query parameter.
Not a double itself: the factory its doubles share.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.demo.jobs import Family, Job, Jobs
from gateway.demo.pack import Double, Example
from gateway.demo.pack.common import Handler, batch_output, error, json_body, openai_files


@dataclass(frozen=True)
class Dialect:
    """Where one provider's batch API differs from the others."""

    provider: str
    reference: str
    prefix: str  # the path before /files and /batches (/openai, /openai/v1)
    auth: Callable[[web.Request, str], bool]
    file_prefix: str  # how its file ids start (file-, file_)
    required_query: str | None = None  # a query parameter every call must carry
    example_query: str = ""


TIMESTAMP = {
    "in_progress": "in_progress_at",
    "finalizing": "finalizing_at",
    "completed": "completed_at",
    "failed": "failed_at",
    "expired": "expired_at",
    "cancelling": "cancelling_at",
    "cancelled": "cancelled_at",
}


def output_id(dialect: Dialect, job: Job) -> str:
    """The id of a batch's output file: one of its own per batch, as the real ones are."""
    return f"{dialect.file_prefix}{job.id.removeprefix('batch_')}out"


def batch_body(dialect: Dialect) -> Callable[..., dict[str, Any]]:
    def body(
        jobs: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
    ) -> dict[str, Any]:
        asked = job.request
        created = int(job.created_at)
        total = max(1, len(asked.get("requests") or []))
        done = total if state in ("finalizing", "completed") else 0
        batch: dict[str, Any] = {
            "id": job.id,
            "object": "batch",
            "endpoint": asked.get("endpoint", "/v1/chat/completions"),
            "errors": None,
            "input_file_id": asked.get("input_file_id"),
            "completion_window": asked.get("completion_window", "24h"),
            "status": state,
            "output_file_id": None,
            "error_file_id": None,
            "created_at": created,
            "expires_at": created + 86400,
            "request_counts": {"total": total, "completed": done, "failed": 0},
            "metadata": asked.get("metadata"),
        }
        batch |= dict.fromkeys(TIMESTAMP.values())
        if state != "validating":
            batch["in_progress_at"] = created + 1
        if state in TIMESTAMP:
            batch[TIMESTAMP[state]] = int(jobs.clock())
        if state == "completed":
            batch["output_file_id"] = output_id(dialect, job)
            jobs.files.setdefault(batch["output_file_id"], batch_output(asked, job_id=job.id))
        if state == "failed":
            failure = {"code": "invalid_request", "message": "scripted failure", "line": 1}
            batch["errors"] = {"object": "list", "data": [failure]}
        return batch

    return body


def family(dialect: Dialect) -> Family:
    return Family(
        name=dialect.provider,
        state_field="status",
        id_prefix="batch_",
        success="completed",
        result_field="output_file_id",
        result_value=None,
        error_field="errors",
        default_script=(
            {"state": "validating"},
            {"state": "in_progress"},
            {"state": "finalizing"},
            {"state": "completed"},
        ),
        pending="in_progress",
        body=batch_body(dialect),
        auth=dialect.auth,
        cancelled_script=({"state": "cancelling"}, {"state": "cancelled"}),
    )


def routes(dialect: Dialect, kind: Family) -> Callable[[Jobs], Iterable[web.AbstractRouteDef]]:
    def make(jobs: Jobs) -> list[web.AbstractRouteDef]:
        def guarded(handler: Handler) -> Handler:
            async def check(request: web.Request) -> web.StreamResponse:
                needed = dialect.required_query
                if needed is not None and needed not in request.query:
                    jobs.record(request, request.match_info.get("job_id"), "refused")
                    return error(404, "Resource not found", "invalid_request_error", "404")
                answer: web.StreamResponse = await handler(request)
                return answer

            return check

        async def create(request: web.Request) -> web.Response:
            job, submit, refused = await jobs.new_job(request, kind, await json_body(request))
            if refused is not None:
                return refused
            body = jobs.status_body(request, job, {"state": "validating"})
            return web.json_response(body, headers=jobs.submit_headers(submit))

        async def cancel(request: web.Request) -> web.Response:
            job = jobs.find_job(request, "cancel")
            if isinstance(job, web.Response):
                return job
            jobs.cancel_job(job)
            return web.json_response(jobs.status_body(request, job, {"state": "cancelling"}))

        prefix = dialect.prefix
        return [
            *openai_files(jobs, kind, prefix, dialect.file_prefix, guarded),
            web.post(f"{prefix}/batches", guarded(create)),
            web.get(f"{prefix}/batches/{{job_id}}", guarded(jobs.status)),
            web.post(f"{prefix}/batches/{{job_id}}/cancel", guarded(cancel)),
        ]

    return make


def double(dialect: Dialect) -> Double:
    kind = family(dialect)
    body = {
        "input_file_id": f"{dialect.file_prefix}demo-input",
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    return Double(
        provider=dialect.provider,
        reference=dialect.reference,
        family=kind,
        routes=routes(dialect, kind),
        example=Example(f"{dialect.prefix}/batches{dialect.example_query}", body),
    )
