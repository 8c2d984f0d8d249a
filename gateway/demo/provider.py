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
  Credential: the API key in the query, ``?key=<key>``. Under ``/google-operations`` the
  family is joined by Veo's long-running operations on the Gemini API
  (``gateway/demo/pack/veo.py``).

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
import json
import os
import secrets
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import BodyPartReader, web

from gateway.demo.jobs import DEFAULT_KEY, DEFAULT_SCRIPT, PREFIX, Body, Family, Job, Jobs
from gateway.demo.pack import doubles, veo

AZURE_PREFIX = "/documentintelligence/documentModels/prebuilt-read"
ANTHROPIC_PREFIX = "/v1/messages/batches"
GOOGLE_OPERATION = "/v1/projects/{project}/locations/{location}/operations/{op}"
BATCH_OUTPUT = b'{"custom_id": "request-1", "response": {"status_code": 200}}\n'


# The shipped policies the five families speak for, each also served under /<provider>.
LEGACY = (
    "demo-jobs",
    "batch-api",
    "openai-batch",
    "anthropic-batches",
    "azure-read",
    "google-operations",
)


def output_file(batch_id: str) -> str:
    """The id of a batch's output file: one per batch, as the real service has it."""
    return f"file-{batch_id.removeprefix('batch_')}-output"


FAMILIES = {
    "jobs": Family(
        "jobs", "state", "job_", "succeeded", "result", {"pages": 3}, "error",
        tuple(DEFAULT_SCRIPT), "running",
        usage={"input_tokens": 1200, "output_tokens": 350},
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
class DemoProvider(Jobs):
    """The five families of the demo at the root and under the shipped policies they speak
    for, and the provider pack's doubles under theirs (``gateway/demo/pack``)."""

    def app(self) -> web.Application:
        """The five families at the root (as tests and ``make run`` have always used them),
        and every shipped policy's API under ``/<provider>``: the families again under the
        names of the policies they speak for, and each double of the provider pack."""
        app = web.Application()
        app.add_routes(self._family_routes())
        app.router.add_get("/_demo/log", self.show_log)
        for provider in LEGACY:
            served = self._family_routes()
            if provider == "google-operations":  # Google's LROs include Veo's (pack/veo.py)
                served += veo.routes(self)
            app.add_subapp(f"/{provider}", self._mounted(provider, served))
        for double in doubles().values():
            routes = double.routes(self)
            app.add_subapp(f"/{double.provider}", self._mounted(double.provider, routes))
        return app

    def _mounted(self, provider: str, routes: Iterable[web.AbstractRouteDef]) -> web.Application:
        sub = web.Application()
        sub[PREFIX] = f"/{provider}"
        sub.add_routes(routes)
        return sub

    def _family_routes(self) -> list[web.AbstractRouteDef]:
        return [
            web.post("/v1/jobs", self._submit_jobs),
            web.get("/v1/jobs/{job_id}", self.status),
            web.get("/v1/jobs/{job_id}/result", self._result),
            web.post("/v1/jobs/{job_id}/cancel", self._cancel),
            web.post("/v1/batches", self._submit_batches),
            web.get("/v1/batches/{job_id}", self.status),
            web.post("/v1/batches/{job_id}/cancel", self._cancel),
            web.post("/v1/files", self._upload),
            web.get("/v1/files/{file_id}/content", self._file_content),
            web.post(AZURE_PREFIX + ":analyze", self._submit_azure),
            web.get(AZURE_PREFIX + "/analyzeResults/{job_id}", self.status),
            web.post(ANTHROPIC_PREFIX, self._submit_anthropic),
            web.get(ANTHROPIC_PREFIX + "/{job_id}", self.status),
            web.get(ANTHROPIC_PREFIX + "/{job_id}/results", self._anthropic_results),
            web.post(ANTHROPIC_PREFIX + "/{job_id}/cancel", self._cancel),
            web.post("/v1/projects/{project}/locations/{location}/jobs", self._submit_google),
            web.get(GOOGLE_OPERATION, self.status),
            web.post(GOOGLE_OPERATION + ":cancel", self._cancel),
        ]

    # -- helpers ------------------------------------------------------------------------
    def authorised(self, request: web.Request, family: Family) -> bool:
        if family.auth is not None:
            return family.auth(request, self.api_key)
        if family.name == "azure":
            return request.headers.get("Ocp-Apim-Subscription-Key") == self.api_key
        if family.name == "anthropic":
            return request.headers.get("x-api-key") == self.api_key
        if family.name == "google":
            return request.query.get("key") == self.api_key
        return super().authorised(request, family)

    def new_id(self, request: web.Request, family: Family) -> str:
        if family.name == "azure":
            return f"{next(self._ids):08d}-demo-{secrets.token_hex(6)}"
        if family.name == "google":
            info = request.match_info
            return (
                f"projects/{info['project']}/locations/{info['location']}/operations/"
                f"{family.id_prefix}{secrets.token_hex(6)}"
            )
        return super().new_id(request, family)

    def shape(self, family: Family) -> Body | None:
        return family.body or _SHAPES.get(family.name)

    # -- submit -------------------------------------------------------------------------
    async def _submit_jobs(self, request: web.Request) -> web.Response:
        job, submit, refused = await self.new_job(request, FAMILIES["jobs"])
        if refused is not None:
            return refused
        url = f"{self.base(request)}/v1/jobs/{job.id}"
        body: dict[str, Any] = {"id": job.id, "state": "queued", "status_url": url}
        if submit.get("omit_id"):
            del body["id"]
        headers = self.submit_headers(submit)
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
        job, submit, refused = await self.new_job(request, family)
        if refused is not None:
            return refused
        body = self.status_body(request, job, {"state": state})
        if submit.get("omit_id"):
            body.pop("name" if family.name == "google" else "id", None)
        return web.json_response(body, status=200, headers=self.submit_headers(submit))

    async def _submit_azure(self, request: web.Request) -> web.Response:
        job, submit, refused = await self.new_job(request, FAMILIES["azure"])
        if refused is not None:
            return refused
        headers = self.submit_headers(submit)
        if not submit.get("omit_id"):
            query = request.query_string or "api-version=2024-11-30"
            url = f"{self.base(request)}{AZURE_PREFIX}/analyzeResults/{job.id}?{query}"
            headers["Operation-Location"] = url
        return web.Response(status=202, headers=headers)

    # -- status -------------------------------------------------------------------------
    def find_job(
        self, request: web.Request, kind: str, job_id: str | None = None
    ) -> Job | web.Response:
        info = request.match_info
        if job_id is None and "job_id" not in info:  # a Google operation: its resource name
            job_id = (
                f"projects/{info['project']}/locations/{info['location']}/operations/{info['op']}"
            )
        return super().find_job(request, kind, job_id)

    def _batch_body(
        self: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
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
        self: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
    ) -> dict[str, Any]:
        """An Azure AI Document Intelligence analyze result."""
        body: dict[str, Any] = {
            "status": state,
            "createdDateTime": self.instant(job.created_at - self.clock()),
            "lastUpdatedDateTime": self.instant(0),
        }
        if state == "Succeeded":
            body["analyzeResult"] = job.family.result_value
        if state in ("failed", "Failed"):
            body["error"] = {"code": "demo_failure", "message": "scripted failure"}
        return body

    def _anthropic_body(
        self: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
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
            "created_at": self.instant(job.created_at - self.clock()),
            "expires_at": self.instant(job.created_at + 86400 - self.clock()),
            "ended_at": self.instant(0) if ended else None,
            "cancel_initiated_at": (
                None if cancelled_at is None else self.instant(cancelled_at - self.clock())
            ),
            "archived_at": None,
            "results_url": (
                f"{self.base(request)}{ANTHROPIC_PREFIX}/{job.id}/results" if ended else None
            ),
        }

    def _google_body(
        self: Jobs, request: web.Request, job: Job, state: str, step: dict[str, Any]
    ) -> dict[str, Any]:
        """A google.longrunning.Operation."""
        body: dict[str, Any] = {
            "name": job.id,
            "metadata": {
                "@type": "type.googleapis.com/demo.v1.JobMetadata",
                "createTime": self.instant(job.created_at - self.clock()),
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
        job = self.find_job(request, "result")
        if isinstance(job, web.Response):
            return job
        return web.json_response({"id": job.id, "data": job.family.result_value})

    async def _anthropic_results(self, request: web.Request) -> web.Response:
        job = self.find_job(request, "result")
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
        job = self.find_job(request, "cancel")
        if isinstance(job, web.Response):
            return job
        family = job.family.name
        self.cancel_job(job, CANCELLED_SCRIPT.get(family))
        if family == "google":
            return web.json_response({})
        if family in ("batches", "anthropic"):
            state = "cancelling" if family == "batches" else "canceling"
            return web.json_response(self.status_body(request, job, {"state": state}))
        return web.json_response({"id": job.id, job.family.state_field: "cancelled"})

    # -- files around batches -----------------------------------------------------------
    async def _upload(self, request: web.Request) -> web.Response:
        self.record(request, None, "file")
        if not self.authorised(request, FAMILIES["batches"]):
            return self.denied()
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
        self.record(request, file_id, "file")
        if not self.authorised(request, FAMILIES["batches"]):
            return self.denied()
        content = self.files.get(file_id)
        if content is None and any(output_file(job) == file_id for job in self.jobs):
            content = BATCH_OUTPUT
        if content is None:
            return web.json_response({"error": {"code": "not_found"}}, status=404)
        return web.Response(body=content, content_type="application/jsonl")


_SHAPES: dict[str, Body] = {
    "batches": DemoProvider._batch_body,
    "azure": DemoProvider._azure_body,
    "anthropic": DemoProvider._anthropic_body,
    "google": DemoProvider._google_body,
}


def run(host: str, port: int, a2a_port: int | None = None) -> None:
    """The demo provider on ``port`` and, when a2a-sdk and uvicorn are installed, the demo
    A2A agent (gateway/demo/a2a_agent.py) on ``a2a_port`` (default ``port + 1``: 8082, where
    make run's config sends policies/demo-agent.yaml)."""
    provider = DemoProvider(api_key=os.environ.get("DEMO_API_KEY", DEFAULT_KEY))
    print(f"demo provider listening on http://{host}:{port}", flush=True)
    try:
        import uvicorn

        from gateway.demo import a2a_agent
    except ImportError:  # the a2a extra is not installed (make run's venv has the runtime only)
        print(
            "demo A2A agent not started: a2a-sdk and uvicorn are not installed "
            "(pip install 'statusgate[a2a]'); demo-agent calls through the gateway get 503",
            flush=True,
        )
        web.run_app(provider.app(), host=host, port=port, print=None, access_log=None)
        return
    agent_port = port + 1 if a2a_port is None else a2a_port
    url = f"http://{host}:{agent_port}"
    config = uvicorn.Config(a2a_agent.app(url), host=host, port=agent_port, log_level="warning")
    print(f"demo A2A agent listening on {url}", flush=True)
    asyncio.run(_both(provider, host, port, uvicorn.Server(config)))


async def _both(provider: DemoProvider, host: str, port: int, agent: Any) -> None:
    runner = web.AppRunner(provider.app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    try:
        await agent.serve()  # until SIGINT / SIGTERM (uvicorn's own handlers)
    except SystemExit:  # uvicorn exits when it cannot listen (its port taken)
        print(
            f"demo A2A agent: {host}:{agent.config.port} is taken; "
            "the demo provider goes on without it",
            flush=True,
        )
        if agent.should_exit:  # a signal came while uvicorn was starting: it swallowed it
            return
        stop = asyncio.Event()  # the provider alone, until SIGINT / SIGTERM
        for number in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(number, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
