"""A scriptable stand-in for real async job APIs, used by ``make run``, the demo and the tests.

Five route families, each shaped after a public API style (the shipped example policies
point at them; Celery Flower and AWS Transcribe are driven against the real things instead):

- ``jobs``: ``POST /v1/jobs`` -> 202 ``{"id", "state", "status_url"}`` + Location;
  ``GET /v1/jobs/{id}``, ``GET /v1/jobs/{id}/result``, ``POST /v1/jobs/{id}/cancel``.
  Credential ``Authorization: Bearer <key>``.
- ``batches`` (OpenAI Batch): ``POST /v1/batches`` -> 200 batch object (``"status":
  "validating"``, echoing ``endpoint``, ``input_file_id``, ``completion_window``);
  ``GET /v1/batches/{id}``; ``POST /v1/batches/{id}/cancel`` (-> ``cancelling``); around them
  ``POST /v1/files`` (upload, raw or multipart with ``file`` and ``purpose``, -> file object)
  and ``GET /v1/files/{id}/content`` (an uploaded file, or a completed batch's output, a
  file id of its own per batch as real ones are: ``output_file(batch id)``). Credential
  ``Authorization: Bearer <key>``.
- ``azure`` (an Azure-style long-running operation): ``POST /documentintelligence/
  documentModels/prebuilt-read:analyze`` -> 202, empty body, ``Operation-Location`` header;
  ``GET .../analyzeResults/{id}`` -> ``{"status": "Running", ...}``. Credential
  ``Ocp-Apim-Subscription-Key: <key>``.
- ``anthropic`` (Anthropic Message Batches): ``POST /v1/messages/batches`` -> 200
  ``message_batch`` with ``"processing_status": "in_progress"``; ``GET
  /v1/messages/batches/{id}``; once ``ended``, ``results_url`` names ``GET
  /v1/messages/batches/{id}/results`` (JSONL, one line per ``custom_id`` of the request);
  ``POST /v1/messages/batches/{id}/cancel`` (-> ``canceling``, then ``ended`` with the
  requests counted as canceled). Credential ``x-api-key: <key>``.
- ``google`` (Google long-running operations): ``POST /v1/projects/{p}/locations/{l}/jobs``
  -> 200 Operation ``{"name": "projects/p/locations/l/operations/op-...", "metadata"}``
  (``done`` absent, as proto3 JSON leaves out false); ``GET /v1/projects/{p}/locations/{l}/
  operations/{op}``; ``POST .../operations/{op}:cancel``. Step states: ``running`` (``done``
  absent), ``pending`` (``done: false``), ``done`` (``done: true`` with ``response``),
  ``failed`` (``done: true`` with ``error``), ``cancelled`` (``done: true``, error code 1).
  Credential: the API key in the query, ``?key=<key>``.

A job's answers are scripted at submit time with a ``demo_script`` list in the JSON body (SDKs
send it as an extra body field); each status call consumes one step and the last step
repeats. Jobs submitted without one follow ``DemoProvider.default_scripts[family]`` (tests set
it for SDKs that cannot add a field), else the family's own default, which runs through its
pending states to success over a few polls. A step is an object such as
``{"state": "running"}``, with any of:

- ``poll_after_seconds``, ``next_check_in`` (seconds), ``retry_after`` (header value),
  ``expires_in`` (seconds, may be negative): timing guidance and contradictions;
- ``omit`` (fields to leave out, e.g. the result), ``set`` (fields to set, e.g.
  ``{"output_file_id": null}``), ``pad`` (bytes of filler), ``echo_auth``
  (a careless provider that echoes the credential it received);
- ``until`` (seconds since submit during which this step repeats), ``delay`` (seconds before
  answering), ``headers`` (extra answer headers, e.g. RateLimit fields);
- ``http`` (a status code such as 503, 429, 404, 401), or ``body`` + ``content_type``;
- faults: ``stall_body`` (seconds of silence mid-body), ``reset_body`` (cut mid-body),
  ``nested`` (JSON nested that deep), ``gzip_bomb`` (MB of JSON, gzip-compressed).

``demo_submit`` scripts the submit answer the same way (``http``, ``delay``, ``retry_after``,
``omit_id``, ``poll_after_seconds``, ``cancel: ignored`` for a job that finishes as scripted
whatever cancel it accepts). A repeated ``Idempotency-Key`` returns the job it first
created. Every request is logged (``kind`` says ``submit``, ``status``, ``result``,
``cancel`` or ``file``); ``GET /_demo/log[?job=ID]`` returns the log as JSON.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import os
import secrets
import time
import zlib
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import BodyPartReader, web

DEFAULT_KEY = "demo-provider-key"
AZURE_PREFIX = "/documentintelligence/documentModels/prebuilt-read"
ANTHROPIC_PREFIX = "/v1/messages/batches"
GOOGLE_OPERATION = "/v1/projects/{project}/locations/{location}/operations/{op}"
DEFAULT_SCRIPT: list[dict[str, Any]] = [
    {"state": "queued"},
    {"state": "running"},
    {"state": "running"},
    {"state": "succeeded"},
]
BATCH_OUTPUT = b'{"custom_id": "request-1", "response": {"status_code": 200}}\n'


def output_file(batch_id: str) -> str:
    """The id of a batch's output file: one per batch, as the real service has it."""
    return f"file-{batch_id.removeprefix('batch_')}-output"


@dataclass(frozen=True)
class Family:
    name: str
    state_field: str
    id_prefix: str
    success: str
    result_field: str
    result_value: Any
    error_field: str
    default_script: tuple[dict[str, Any], ...]
    pending: str  # the state of a step that names none


FAMILIES = {
    "jobs": Family(
        "jobs", "state", "job_", "succeeded", "result", {"pages": 3}, "error",
        tuple(DEFAULT_SCRIPT), "running",
    ),
    "batches": Family(
        "batches", "status", "batch_", "completed", "output_file_id", "file-demo-output",
        "errors",
        ({"state": "validating"}, {"state": "in_progress"}, {"state": "finalizing"},
         {"state": "completed"}),
        "in_progress",
    ),
    "azure": Family(
        "azure", "status", "", "Succeeded", "analyzeResult", {"content": "demo text"}, "error",
        ({"state": "NotStarted"}, {"state": "Running"}, {"state": "Running"},
         {"state": "Succeeded"}),
        "Running",
    ),
    "anthropic": Family(
        "anthropic", "processing_status", "msgbatch_", "ended", "results_url", None, "error",
        ({"state": "in_progress"}, {"state": "in_progress"}, {"state": "ended"}),
        "in_progress",
    ),
    "google": Family(
        "google", "done", "op-", "done", "response",
        {"@type": "type.googleapis.com/demo.v1.JobResult", "pages": 3}, "error",
        ({"state": "running"}, {"state": "running"}, {"state": "done"}),
        "running",
    ),
}  # fmt: skip
# A cancel the provider accepts: what it answers, and the script the job follows from then on.
CANCELLED_SCRIPT: dict[str, list[dict[str, Any]]] = {
    "jobs": [{"state": "cancelled"}],
    "batches": [{"state": "cancelled"}],
    "anthropic": [{"state": "canceling"}, {"state": "ended", "canceled": True}],
    "google": [{"state": "cancelled"}],
}


@dataclass
class Job:
    id: str
    family: Family
    script: list[dict[str, Any]]
    polls: int = 0
    created_at: float = 0.0
    cancelled: bool = False
    index: int = 0
    cancel_ignored: bool = False  # accepts a cancel request but runs on (a race lost)
    request: dict[str, Any] = field(default_factory=dict)  # the submitted JSON body
    cancelled_at: float | None = None
    canceled_requests: bool = False  # anthropic: the batch ended by a cancel

    def next_step(self, now: float) -> dict[str, Any]:
        """Each step answers once, the last forever; a step with ``until`` answers every
        poll until that many seconds have passed since submit."""
        last = len(self.script) - 1
        while self.index < last:
            until = self.script[self.index].get("until")
            if until is None or now - self.created_at < float(until):
                break
            self.index += 1
        step = self.script[self.index]
        if "until" not in step and self.index < last:
            self.index += 1
        self.polls += 1
        return step


@dataclass
class DemoProvider:
    api_key: str = DEFAULT_KEY
    clock: Callable[[], float] = time.time
    jobs: dict[str, Job] = field(default_factory=dict)
    log: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=20000))
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _keys: dict[str, str] = field(default_factory=dict)  # Idempotency-Key -> job id
    files: dict[str, bytes] = field(default_factory=dict)  # uploaded files by id
    in_flight: dict[str, int] = field(default_factory=dict)  # status calls being answered
    most_in_flight: dict[str, int] = field(default_factory=dict)  # the most at once, per job
    # called with the job id just before a status answer is sent (tests use it to act at
    # the instant the provider has answered)
    before_answer: Callable[[str], Awaitable[None]] | None = None
    # per family, the script of jobs submitted without a demo_script (tests set it when the
    # agent is an SDK that cannot add a field to the submit body)
    default_scripts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/jobs", self._submit_jobs)
        app.router.add_get("/v1/jobs/{job_id}", self._status)
        app.router.add_get("/v1/jobs/{job_id}/result", self._result)
        app.router.add_post("/v1/jobs/{job_id}/cancel", self._cancel)
        app.router.add_post("/v1/batches", self._submit_batches)
        app.router.add_get("/v1/batches/{job_id}", self._status)
        app.router.add_post("/v1/batches/{job_id}/cancel", self._cancel)
        app.router.add_post("/v1/files", self._upload)
        app.router.add_get("/v1/files/{file_id}/content", self._file_content)
        app.router.add_post(AZURE_PREFIX + ":analyze", self._submit_azure)
        app.router.add_get(AZURE_PREFIX + "/analyzeResults/{job_id}", self._status)
        app.router.add_post(ANTHROPIC_PREFIX, self._submit_anthropic)
        app.router.add_get(ANTHROPIC_PREFIX + "/{job_id}", self._status)
        app.router.add_get(ANTHROPIC_PREFIX + "/{job_id}/results", self._anthropic_results)
        app.router.add_post(ANTHROPIC_PREFIX + "/{job_id}/cancel", self._cancel)
        app.router.add_post("/v1/projects/{project}/locations/{location}/jobs", self._submit_google)
        app.router.add_get(GOOGLE_OPERATION, self._status)
        app.router.add_post(GOOGLE_OPERATION + ":cancel", self._cancel)
        app.router.add_get("/_demo/log", self._log)
        return app

    # -- helpers ------------------------------------------------------------------------
    def _record(self, request: web.Request, job_id: str | None, kind: str) -> None:
        self.log.append(
            {
                "at": self.clock(),
                "method": request.method,
                "path": request.path_qs,
                "job_id": job_id,
                "kind": kind,
                "headers": dict(request.headers),
            }
        )

    def _authorised(self, request: web.Request, family: Family) -> bool:
        if family.name == "azure":
            return request.headers.get("Ocp-Apim-Subscription-Key") == self.api_key
        if family.name == "anthropic":
            return request.headers.get("x-api-key") == self.api_key
        if family.name == "google":
            return request.query.get("key") == self.api_key
        return request.headers.get("Authorization") == f"Bearer {self.api_key}"

    def _denied(self) -> web.Response:
        return web.json_response({"error": {"code": "unauthorized"}}, status=401)

    def _instant(self, seconds_from_now: float) -> str:
        moment = datetime.fromtimestamp(self.clock() + seconds_from_now, tz=UTC)
        return moment.isoformat().replace("+00:00", "Z")

    def _new_id(self, request: web.Request, family: Family) -> str:
        # unique across restarts, so a gateway store that outlives the provider never sees
        # a job id come back
        if family.name == "azure":
            return f"{next(self._ids):08d}-demo-{secrets.token_hex(6)}"
        if family.name == "google":
            info = request.match_info
            return (
                f"projects/{info['project']}/locations/{info['location']}/operations/"
                f"{family.id_prefix}{secrets.token_hex(6)}"
            )
        return f"{family.id_prefix}{secrets.token_hex(6)}"

    async def _new_job(
        self, request: web.Request, family: Family
    ) -> tuple[Job, dict[str, Any], web.Response | None]:
        try:
            payload = await request.json()
        except ValueError:
            payload = {}
        if not isinstance(payload, dict):
            payload = {}
        key = request.headers.get("Idempotency-Key")
        if key is not None and key in self._keys:  # the provider dedups retried submissions
            job = self.jobs[self._keys[key]]
            self._record(request, job.id, "submit")
            return job, {}, None
        job_id = self._new_id(request, family)
        script = (
            payload.get("demo_script")
            or self.default_scripts.get(family.name)
            or list(family.default_script)
        )
        submit = payload.get("demo_submit") or {}
        for step in script:
            if isinstance(step, dict) and isinstance(step.get("gzip_bomb"), int | float):
                _bomb(float(step["gzip_bomb"]))  # made now, not while a poll waits
        job = Job(job_id, family, list(script), created_at=self.clock(), request=payload)
        job.cancel_ignored = submit.get("cancel") == "ignored"
        self._record(request, job_id, "submit")
        if not self._authorised(request, family):
            return job, submit, self._denied()
        if submit.get("http"):
            if submit.get("delay"):
                await asyncio.sleep(float(submit["delay"]))
            body = {"error": {"code": "scripted", "status": submit["http"]}}
            return job, submit, web.json_response(body, status=int(submit["http"]))
        self.jobs[job_id] = job
        if key is not None:
            self._keys[key] = job_id
        if submit.get("delay"):  # the job exists even if the caller gives up waiting
            await asyncio.sleep(float(submit["delay"]))
        return job, submit, None

    def _base(self, request: web.Request) -> str:
        return f"{request.scheme}://{request.host}"

    @staticmethod
    def _submit_headers(submit: dict[str, Any]) -> dict[str, str]:
        return {"Retry-After": str(submit["retry_after"])} if "retry_after" in submit else {}

    # -- submit -------------------------------------------------------------------------
    async def _submit_jobs(self, request: web.Request) -> web.Response:
        job, submit, refused = await self._new_job(request, FAMILIES["jobs"])
        if refused is not None:
            return refused
        url = f"{self._base(request)}/v1/jobs/{job.id}"
        body: dict[str, Any] = {"id": job.id, "state": "queued", "status_url": url}
        if submit.get("omit_id"):
            del body["id"]
        headers = self._submit_headers(submit)
        if not submit.get("omit_id"):
            headers["Location"] = url
        if "poll_after_seconds" in submit:
            body["poll_after_seconds"] = submit["poll_after_seconds"]
        return web.json_response(body, status=202, headers=headers)

    async def _submit_batches(self, request: web.Request) -> web.Response:
        return await self._submit_with_body(request, FAMILIES["batches"], "validating")

    async def _submit_anthropic(self, request: web.Request) -> web.Response:
        return await self._submit_with_body(request, FAMILIES["anthropic"], "in_progress")

    async def _submit_google(self, request: web.Request) -> web.Response:
        return await self._submit_with_body(request, FAMILIES["google"], "running")

    async def _submit_with_body(
        self, request: web.Request, family: Family, state: str
    ) -> web.Response:
        """The families whose submit answers 200 with the new job's status object."""
        job, submit, refused = await self._new_job(request, family)
        if refused is not None:
            return refused
        body = self._status_body(request, job, {"state": state})
        if submit.get("omit_id"):
            body.pop("name" if family.name == "google" else "id", None)
        return web.json_response(body, status=200, headers=self._submit_headers(submit))

    async def _submit_azure(self, request: web.Request) -> web.Response:
        job, submit, refused = await self._new_job(request, FAMILIES["azure"])
        if refused is not None:
            return refused
        headers = self._submit_headers(submit)
        if not submit.get("omit_id"):
            query = request.query_string or "api-version=2024-11-30"
            url = f"{self._base(request)}{AZURE_PREFIX}/analyzeResults/{job.id}?{query}"
            headers["Operation-Location"] = url
        return web.Response(status=202, headers=headers)

    # -- status -------------------------------------------------------------------------
    def _job(self, request: web.Request, kind: str) -> Job | web.Response:
        """The job a request names (logged), or the 404/401 answer to give instead."""
        info = request.match_info
        job_id = info.get("job_id")
        if job_id is None:  # a Google operation: its id is its resource name
            job_id = (
                f"projects/{info['project']}/locations/{info['location']}/operations/{info['op']}"
            )
        self._record(request, job_id, kind)
        job = self.jobs.get(job_id)
        if job is None:
            return web.json_response({"error": {"code": "not_found"}}, status=404)
        if not self._authorised(request, job.family):
            return self._denied()
        return job

    async def _status(self, request: web.Request) -> web.StreamResponse:
        job = self._job(request, "status")
        if isinstance(job, web.Response):
            return job
        job_id = job.id
        step = job.next_step(self.clock())
        self.in_flight[job_id] = self.in_flight.get(job_id, 0) + 1
        self.most_in_flight[job_id] = max(
            self.most_in_flight.get(job_id, 0), self.in_flight[job_id]
        )
        try:
            answer = await self._answer(request, job, step)
            if self.before_answer is not None:
                await self.before_answer(job_id)
            return answer
        finally:
            self.in_flight[job_id] -= 1

    async def _answer(
        self, request: web.Request, job: Job, step: dict[str, Any]
    ) -> web.StreamResponse:
        if step.get("delay"):
            await asyncio.sleep(float(step["delay"]))
        fault = _FAULTS.get(next((name for name in _FAULTS if name in step), ""))
        if fault is not None:
            return await fault(request, step)
        headers = {"Retry-After": str(step["retry_after"])} if "retry_after" in step else {}
        headers.update({str(k): str(v) for k, v in step.get("headers", {}).items()})
        if "body" in step:
            content_type = step.get("content_type", "application/json")
            raw = step["body"] if isinstance(step["body"], str) else json.dumps(step["body"])
            return web.Response(
                status=int(step.get("http", 200)),
                text=raw,
                headers={**headers, "Content-Type": content_type},
            )
        http = int(step.get("http", 200))
        if http != 200:
            body = {"error": {"code": "scripted", "status": http}}
            return web.json_response(body, status=http, headers=headers)
        body = self._status_body(request, job, step)
        if step.get("echo_auth"):
            received = request.headers.get("Authorization", "")
            body["debug"] = {"authorization": received}
            headers["X-Debug-Auth"] = received
        return web.json_response(body, headers=headers)

    def _status_body(self, request: web.Request, job: Job, step: dict[str, Any]) -> dict[str, Any]:
        family = job.family
        state = step.get("state", family.pending)
        shape = _SHAPES.get(family.name)
        if shape is not None:
            body = shape(self, request, job, state, step)
        else:
            body = {"id": job.id, family.state_field: state}
            if state == family.success:
                body[family.result_field] = family.result_value
            if state in ("failed", "Failed"):
                body[family.error_field] = {"code": "demo_failure", "message": "scripted failure"}
        if "poll_after_seconds" in step:
            body["poll_after_seconds"] = step["poll_after_seconds"]
        if "next_check_in" in step:
            body["next_check_at"] = self._instant(float(step["next_check_in"]))
        if "expires_in" in step:
            body["expires_at"] = self._instant(float(step["expires_in"]))
        if "pad" in step:
            body["pad"] = "x" * int(step["pad"])
        for name in step.get("omit", []):
            body.pop(name, None)
        body.update(step.get("set", {}))
        return body

    def _batch_body(
        self, request: web.Request, job: Job, state: str, step: dict[str, Any]
    ) -> dict[str, Any]:
        """An OpenAI Batch object."""
        asked = job.request
        body: dict[str, Any] = {
            "id": job.id,
            "object": "batch",
            "endpoint": asked.get("endpoint", "/v1/chat/completions"),
            "input_file_id": asked.get("input_file_id"),
            "completion_window": asked.get("completion_window", "24h"),
            "status": state,
            "created_at": int(job.created_at),
        }
        if state == "completed":
            body["output_file_id"] = output_file(job.id)
            body["request_counts"] = {"total": 1, "completed": 1, "failed": 0}
        if state == "failed":
            body["errors"] = {
                "object": "list",
                "data": [{"code": "demo_failure", "message": "scripted failure"}],
            }
        return body

    def _azure_body(
        self, request: web.Request, job: Job, state: str, step: dict[str, Any]
    ) -> dict[str, Any]:
        """An Azure AI Document Intelligence analyze result."""
        body: dict[str, Any] = {
            "status": state,
            "createdDateTime": self._instant(job.created_at - self.clock()),
            "lastUpdatedDateTime": self._instant(0),
        }
        if state == "Succeeded":
            body["analyzeResult"] = job.family.result_value
        if state in ("failed", "Failed"):
            body["error"] = {"code": "demo_failure", "message": "scripted failure"}
        return body

    def _anthropic_body(
        self, request: web.Request, job: Job, state: str, step: dict[str, Any]
    ) -> dict[str, Any]:
        """An Anthropic ``message_batch``: ``results_url`` once it has ended."""
        count = max(1, len(job.request.get("requests") or []))
        ended = state == "ended"
        canceled = ended and bool(step.get("canceled") or job.canceled_requests)
        if canceled:
            job.canceled_requests = True
        counts = {"processing": 0 if ended else count, "succeeded": 0, "errored": 0}
        counts |= {"canceled": count if canceled else 0, "expired": 0}
        if ended and not canceled:
            counts["succeeded"] = count
        cancelled_at = job.cancelled_at
        return {
            "id": job.id,
            "type": "message_batch",
            "processing_status": state,
            "request_counts": counts,
            "created_at": self._instant(job.created_at - self.clock()),
            "expires_at": self._instant(job.created_at + 86400 - self.clock()),
            "ended_at": self._instant(0) if ended else None,
            "cancel_initiated_at": (
                None if cancelled_at is None else self._instant(cancelled_at - self.clock())
            ),
            "archived_at": None,
            "results_url": (
                f"{self._base(request)}{ANTHROPIC_PREFIX}/{job.id}/results" if ended else None
            ),
        }

    def _google_body(
        self, request: web.Request, job: Job, state: str, step: dict[str, Any]
    ) -> dict[str, Any]:
        """A google.longrunning.Operation."""
        body: dict[str, Any] = {
            "name": job.id,
            "metadata": {
                "@type": "type.googleapis.com/demo.v1.JobMetadata",
                "createTime": self._instant(job.created_at - self.clock()),
                "state": state.upper(),
            },
        }
        if state == "pending":
            body["done"] = False
        elif state == "done":
            body["done"] = True
            body["response"] = job.family.result_value
        elif state == "failed":
            body["done"] = True
            body["error"] = {"code": 3, "message": "scripted failure"}
        elif state == "cancelled":
            body["done"] = True
            body["error"] = {"code": 1, "message": "CANCELLED"}
        return body

    async def _result(self, request: web.Request) -> web.Response:
        job = self._job(request, "result")
        if isinstance(job, web.Response):
            return job
        return web.json_response({"id": job.id, "data": job.family.result_value})

    async def _anthropic_results(self, request: web.Request) -> web.Response:
        job = self._job(request, "result")
        if isinstance(job, web.Response):
            return job
        requests = job.request.get("requests") or [{"custom_id": "request-1"}]
        lines = []
        for item in requests:
            custom_id = item.get("custom_id") if isinstance(item, dict) else None
            if job.canceled_requests:
                result: dict[str, Any] = {"type": "canceled"}
            else:
                message = {
                    "id": f"msg_{secrets.token_hex(6)}",
                    "type": "message",
                    "role": "assistant",
                    "model": "demo-model",
                    "content": [{"type": "text", "text": "demo answer"}],
                    "stop_reason": "end_turn",
                    "stop_sequence": None,
                    "usage": {"input_tokens": 3, "output_tokens": 2},
                }
                result = {"type": "succeeded", "message": message}
            lines.append(json.dumps({"custom_id": custom_id, "result": result}))
        return web.Response(
            body=("\n".join(lines) + "\n").encode(), content_type="application/x-jsonl"
        )

    async def _cancel(self, request: web.Request) -> web.Response:
        job = self._job(request, "cancel")
        if isinstance(job, web.Response):
            return job
        job.cancelled = True
        job.cancelled_at = self.clock()
        family = job.family.name
        if not job.cancel_ignored:
            job.script = list(CANCELLED_SCRIPT.get(family, [{"state": "cancelled"}]))
            job.index = 0
        if family == "google":
            return web.json_response({})
        if family in ("batches", "anthropic"):
            state = "cancelling" if family == "batches" else "canceling"
            return web.json_response(self._status_body(request, job, {"state": state}))
        return web.json_response({"id": job.id, job.family.state_field: "cancelled"})

    # -- files around batches -----------------------------------------------------------
    async def _upload(self, request: web.Request) -> web.Response:
        self._record(request, None, "file")
        if not self._authorised(request, FAMILIES["batches"]):
            return self._denied()
        filename, purpose = "upload", "batch"
        if request.content_type == "multipart/form-data":
            content = b""
            async for part in await request.multipart():
                if not isinstance(part, BodyPartReader):
                    continue
                if part.name == "file":
                    filename = part.filename or filename
                    content = await part.read()
                elif part.name == "purpose":
                    purpose = await part.text()
        else:
            content = await request.read()
        file_id = f"file-{secrets.token_hex(6)}"
        self.files[file_id] = content
        body = {
            "id": file_id,
            "object": "file",
            "bytes": len(content),
            "created_at": int(self.clock()),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
        }
        return web.json_response(body)

    async def _file_content(self, request: web.Request) -> web.Response:
        file_id = request.match_info["file_id"]
        self._record(request, file_id, "file")
        if not self._authorised(request, FAMILIES["batches"]):
            return self._denied()
        content = self.files.get(file_id)
        if content is None and any(output_file(job) == file_id for job in self.jobs):
            content = BATCH_OUTPUT
        if content is None:
            return web.json_response({"error": {"code": "not_found"}}, status=404)
        return web.Response(body=content, content_type="application/jsonl")

    async def _log(self, request: web.Request) -> web.Response:
        wanted = request.query.get("job")
        entries = [e for e in self.log if wanted is None or e["job_id"] == wanted]
        return web.json_response(entries)


Shape = Callable[[DemoProvider, web.Request, Job, str, dict[str, Any]], dict[str, Any]]
_SHAPES: dict[str, Shape] = {
    "batches": DemoProvider._batch_body,
    "azure": DemoProvider._azure_body,
    "anthropic": DemoProvider._anthropic_body,
    "google": DemoProvider._google_body,
}


async def _stall_body(request: web.Request, step: dict[str, Any]) -> web.StreamResponse:
    """Headers and half a body, then silence for ``stall_body`` seconds."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = 64
    await response.prepare(request)
    await response.write(b'{"state": "running", "pad": "')
    await asyncio.sleep(float(step["stall_body"]))
    return response


async def _reset_body(request: web.Request, step: dict[str, Any]) -> web.StreamResponse:
    """Headers and half a body, then the connection is cut."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = 64
    await response.prepare(request)
    await response.write(b'{"state": "running", "pad": "')
    assert request.transport is not None
    request.transport.abort()
    return response


async def _nested(request: web.Request, step: dict[str, Any]) -> web.StreamResponse:
    depth = int(step["nested"])
    return web.Response(text="[" * depth + "]" * depth, content_type="application/json")


async def _gzip_bomb(request: web.Request, step: dict[str, Any]) -> web.StreamResponse:
    """``gzip_bomb`` MB of spaces inside a JSON string, gzip-compressed (about 1000:1)."""
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    return web.Response(body=_bomb(float(step["gzip_bomb"])), headers=headers)


@functools.lru_cache(maxsize=4)
def _bomb(megabytes: float) -> bytes:
    """Made once per size, at submit, and without compressing it all: each MiB of spaces
    after a full flush deflates to the same bytes, so one MiB is compressed and its block
    repeated (compressing 50 MB took 0.26 s here, which ate a 0.3 s upstream timeout on
    a busy machine); only the gzip trailer's CRC reads the whole."""
    size = int(megabytes * 1024 * 1024)
    chunk = b" " * (1024 * 1024)
    head, tail = b'{"state": "running", "pad": "', b'"}'
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate: the gzip frame is ours
    first = deflate.compress(head) + deflate.flush(zlib.Z_FULL_FLUSH)
    block = deflate.compress(chunk) + deflate.flush(zlib.Z_FULL_FLUSH)
    count = size // len(chunk)
    crc = zlib.crc32(head)
    for _ in range(count):
        crc = zlib.crc32(chunk, crc)
    crc = zlib.crc32(tail, crc)
    length = len(head) + count * len(chunk) + len(tail)
    last = deflate.compress(tail) + deflate.flush()
    frame = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"  # gzip, deflate, no name, no time
    trailer = crc.to_bytes(4, "little") + (length & 0xFFFFFFFF).to_bytes(4, "little")
    return frame + first + block * count + last + trailer


_FAULTS = {
    "stall_body": _stall_body,
    "reset_body": _reset_body,
    "nested": _nested,
    "gzip_bomb": _gzip_bomb,
}


def run(host: str, port: int) -> None:
    provider = DemoProvider(api_key=os.environ.get("DEMO_API_KEY", DEFAULT_KEY))
    print(f"demo provider listening on http://{host}:{port}", flush=True)
    web.run_app(provider.app(), host=host, port=port, print=None, access_log=None)
