"""The scripted jobs of the demo provider and of the provider pack's doubles.

A job's status answers follow a script: a list of steps fixed at submit time (``demo_script``
in the submit body, else the family's default); each status call consumes one step and the
last step repeats. A *family* is one API's way of writing a job: its state field, id prefix,
success state, and, for the pack's doubles, the hooks that write its bodies and check its
credential. Owns nothing else: no routes, no HTTP.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from gateway.demo.faults import FAULTS, bomb

DEFAULT_KEY = "demo-provider-key"
Body = Callable[["Jobs", web.Request, "Job", str, dict[str, Any]], dict[str, Any]]
Auth = Callable[[web.Request, str], bool]
NewId = Callable[[web.Request], str]
PREFIX = web.AppKey("prefix", str)  # a mounted API's path prefix, for URLs in its answers

DEFAULT_SCRIPT: list[dict[str, Any]] = [
    {"state": "queued"},
    {"state": "running"},
    {"state": "running"},
    {"state": "succeeded"},
]


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
    # The pack's doubles (gateway/demo/pack) bring their own ways; the five families of
    # provider.py keep theirs there.
    body: Body | None = None  # the status object for a state and a step
    auth: Auth | None = None  # does this request carry the key (the demo's api_key)?
    new_id: NewId | None = None  # a new job id (default: id_prefix + 12 hex digits)
    cancelled_script: tuple[dict[str, Any], ...] = ({"state": "cancelled"},)
    """The script a job follows once a cancel is accepted."""
    usage: dict[str, int] | None = None
    """Numbers a success reports under ``usage`` (demo-jobs: tokens, for SPEC 23's usage)."""


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
class Jobs:
    """The jobs of a demo provider and what every API of it does with them: create one
    from a submit (scripted, deduplicated by ``Idempotency-Key``, logged), find the one a
    request names, answer a status call from its script (faults, scripted statuses and
    headers included), accept a cancel. The routes and bodies are each API's own."""

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

    def record(self, request: web.Request, job_id: str | None, kind: str) -> None:
        """Log a call (``GET /_demo/log`` shows it; tests count provider calls with it): its
        path as the provider's API has it (without the ``/<provider>`` of a mounted API,
        named in ``api``)."""
        prefix = request.app.get(PREFIX, "")
        self.log.append(
            {
                "at": self.clock(),
                "api": prefix.removeprefix("/") or None,
                "method": request.method,
                "path": request.path_qs.removeprefix(prefix),
                "job_id": job_id,
                "kind": kind,
                "headers": dict(request.headers),
            }
        )

    def authorised(self, request: web.Request, family: Family) -> bool:
        if family.auth is not None:
            return family.auth(request, self.api_key)
        return request.headers.get("Authorization") == f"Bearer {self.api_key}"

    def denied(self) -> web.Response:
        return web.json_response({"error": {"code": "unauthorized"}}, status=401)

    def instant(self, seconds_from_now: float) -> str:
        """An RFC 3339 UTC instant this many seconds from now (the demo's clock)."""
        moment = datetime.fromtimestamp(self.clock() + seconds_from_now, tz=UTC)
        return moment.isoformat().replace("+00:00", "Z")

    def new_id(self, request: web.Request, family: Family) -> str:
        # unique across restarts, so a gateway store that outlives the provider never sees
        # a job id come back
        if family.new_id is not None:
            return family.new_id(request)
        return f"{family.id_prefix}{secrets.token_hex(6)}"

    async def new_job(
        self, request: web.Request, family: Family, payload: dict[str, Any] | None = None
    ) -> tuple[Job, dict[str, Any], web.Response | None]:
        """A job for this submit (the JSON body unless ``payload`` is given), its
        ``demo_submit`` directions, and the answer to give instead when it is refused."""
        if payload is None:
            try:
                payload = await request.json()
            except ValueError:
                payload = {}
            if not isinstance(payload, dict):
                payload = {}
        key = request.headers.get("Idempotency-Key")
        if key is not None and key in self._keys:  # the provider dedups retried submissions
            job = self.jobs[self._keys[key]]
            self.record(request, job.id, "submit")
            return job, {}, None
        job_id = self.new_id(request, family)
        script = (
            payload.get("demo_script")
            or self.default_scripts.get(family.name)
            or list(family.default_script)
        )
        submit = payload.get("demo_submit") or {}
        for step in script:
            if isinstance(step, dict) and isinstance(step.get("gzip_bomb"), int | float):
                bomb(float(step["gzip_bomb"]))  # made now, not while a poll waits
        job = Job(job_id, family, list(script), created_at=self.clock(), request=payload)
        job.cancel_ignored = submit.get("cancel") == "ignored"
        self.record(request, job_id, "submit")
        if not self.authorised(request, family):
            return job, submit, self.denied()
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

    def base(self, request: web.Request) -> str:
        """Where this request's API lives: the origin, and the prefix of an API mounted
        under /<provider> (so URLs in answers lead back to the same API)."""
        return f"{request.scheme}://{request.host}{request.app.get(PREFIX, '')}"

    @staticmethod
    def submit_headers(submit: dict[str, Any]) -> dict[str, str]:
        return {"Retry-After": str(submit["retry_after"])} if "retry_after" in submit else {}

    def find_job(
        self, request: web.Request, kind: str, job_id: str | None = None
    ) -> Job | web.Response:
        """The job a request names (``job_id``, else the route's ``{job_id}``), logged as
        ``kind``, or the 404/401 answer to give instead."""
        if job_id is None:
            job_id = request.match_info["job_id"]
        self.record(request, job_id, kind)
        job = self.jobs.get(job_id)
        if job is None:
            return web.json_response({"error": {"code": "not_found"}}, status=404)
        if not self.authorised(request, job.family):
            return self.denied()
        return job

    async def status(self, request: web.Request, job_id: str | None = None) -> web.StreamResponse:
        """A status call: the job's next scripted step, answered."""
        job = self.find_job(request, "status", job_id)
        if isinstance(job, web.Response):
            return job
        step = job.next_step(self.clock())
        self.in_flight[job.id] = self.in_flight.get(job.id, 0) + 1
        self.most_in_flight[job.id] = max(
            self.most_in_flight.get(job.id, 0), self.in_flight[job.id]
        )
        try:
            answer = await self.answer(request, job, step)
            if self.before_answer is not None:
                await self.before_answer(job.id)
            return answer
        finally:
            self.in_flight[job.id] -= 1

    async def answer(
        self, request: web.Request, job: Job, step: dict[str, Any]
    ) -> web.StreamResponse:
        """One step as an answer: a fault, a scripted status or body, else the status body."""
        if step.get("delay"):
            await asyncio.sleep(float(step["delay"]))
        fault = FAULTS.get(next((name for name in FAULTS if name in step), ""))
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
        body = self.status_body(request, job, step)
        if step.get("echo_auth"):
            received = request.headers.get("Authorization", "")
            body["debug"] = {"authorization": received}
            headers["X-Debug-Auth"] = received
        return web.json_response(body, headers=headers)

    def shape(self, family: Family) -> Body | None:
        """How ``family`` writes its status object (None: ``{id, <state field>}``)."""
        return family.body

    def status_body(self, request: web.Request, job: Job, step: dict[str, Any]) -> dict[str, Any]:
        """The job's status object at this step, with the step's extras applied."""
        family = job.family
        state = step.get("state", family.pending)
        shape = self.shape(family)
        if shape is not None:
            body = shape(self, request, job, state, step)
        else:
            body = {"id": job.id, family.state_field: state}
            if state == family.success:
                body[family.result_field] = family.result_value
                if family.usage is not None:
                    body["usage"] = dict(family.usage)
            if state in ("failed", "Failed"):
                body[family.error_field] = {"code": "demo_failure", "message": "scripted failure"}
        if "poll_after_seconds" in step:
            body["poll_after_seconds"] = step["poll_after_seconds"]
        if "next_check_in" in step:
            body["next_check_at"] = self.instant(float(step["next_check_in"]))
        if "expires_in" in step:
            body["expires_at"] = self.instant(float(step["expires_in"]))
        if "pad" in step:
            body["pad"] = "x" * int(step["pad"])
        for name in step.get("omit", []):
            body.pop(name, None)
        body.update(step.get("set", {}))
        return body

    def cancel_job(self, job: Job, script: list[dict[str, Any]] | None = None) -> None:
        """A cancel accepted: the job follows ``script`` (default: its family's cancelled
        script) from its next status call, unless it was submitted to ignore cancels."""
        job.cancelled = True
        job.cancelled_at = self.clock()
        if not job.cancel_ignored:
            job.script = list(script if script is not None else job.family.cancelled_script)
            job.index = 0

    async def show_log(self, request: web.Request) -> web.Response:
        """``GET /_demo/log[?job=ID]``: every call logged, or one job's."""
        wanted = request.query.get("job")
        entries = [e for e in self.log if wanted is None or e["job_id"] == wanted]
        return web.json_response(entries)
