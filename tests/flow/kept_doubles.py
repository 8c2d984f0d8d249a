"""A provider double for kept results (SPEC 23) and the gateway in front of it.

The double is a real aiohttp server: a job succeeds at its first status call, and its result
route streams ``body`` (in two halves, the second held back while ``hold`` is unset when a
test asks, so a copy can be caught half made), or answers 404 once the provider has
forgotten it. The gateway is the real app on a fake clock, with the repository's demo-jobs
policy pointed at the double.
"""

from __future__ import annotations

import asyncio
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.run.app import create_app
from gateway.settings.config import load_settings

from conftest import AGENT_TOKEN, PROVIDER_ENV, AgentServer, FakeClock, write_config

AUTH = {"Authorization": f"Bearer {AGENT_TOKEN}"}
RESULT_TYPE = "application/jsonl"


def result_body(size: int) -> bytes:
    """``size`` bytes of JSON lines, different in every line (a copy cut or shifted shows)."""
    lines, total, n = [], 0, 0
    while total < size:
        line = b'{"line": %d}\n' % n
        lines.append(line)
        total += len(line)
        n += 1
    return b"".join(lines)[:size]


@dataclass
class ResultDouble:
    body: bytes
    chunked: bool = False  # no Content-Length: the size is known only once read
    gone: bool = False  # the provider forgot the result: 404
    failing: int | None = None  # the result route answers this status (a 3xx redirects)
    hold: asyncio.Event | None = None  # set: the second half waits for it
    pause: float = 0.0  # seconds between the halves
    break_off: bool = False  # the connection is closed after the first half
    result_calls: int = 0
    half_sent: asyncio.Event = field(default_factory=asyncio.Event)
    jobs: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/jobs", self.submit)
        app.router.add_get("/v1/jobs/{job}", self.status)
        app.router.add_get("/v1/jobs/{job}/result", self.result)
        return app

    async def submit(self, request: web.Request) -> web.Response:
        self.jobs += 1
        return web.json_response({"id": f"job-{self.jobs}", "state": "queued"}, status=202)

    async def status(self, request: web.Request) -> web.Response:
        job = request.match_info["job"]
        return web.json_response({"id": job, "state": "succeeded", "result": "ready"})

    async def result(self, request: web.Request) -> web.StreamResponse:
        self.result_calls += 1
        if self.gone:
            return web.json_response({"error": "no such result"}, status=404)
        if self.failing is not None:
            elsewhere = {"Location": "/elsewhere"} if 300 <= self.failing < 400 else None
            return web.json_response({"error": "not now"}, status=self.failing, headers=elsewhere)
        if not self.chunked and self.hold is None and not self.pause and not self.break_off:
            return web.Response(body=self.body, content_type=RESULT_TYPE)
        response = web.StreamResponse(headers={"Content-Type": RESULT_TYPE})
        if not self.chunked:
            response.content_length = len(self.body)
        await response.prepare(request)
        half = len(self.body) // 2
        await response.write(self.body[:half])
        self.half_sent.set()
        if self.break_off and request.transport is not None:
            await asyncio.sleep(0.1)  # the first half is on its way
            request.transport.close()
            return response
        if self.hold is not None:
            await self.hold.wait()
        if self.pause:
            await asyncio.sleep(self.pause)
        await response.write(self.body[half:])
        await response.write_eof()
        return response


async def serve(double: ResultDouble) -> tuple[TestServer, str]:
    server = TestServer(double.app(), host="127.0.0.1")
    await server.start_server()
    return server, str(server.make_url("")).rstrip("/")


def kept_config(
    folder: Path,
    upstream: str,
    *,
    store: str = "memory://",
    results: dict[str, Any] | None = None,
    results_store: str | None = None,
    **config: Any,
) -> Path:
    """A config whose demo-jobs policy keeps results (``results``) at ``upstream``."""
    keep = {"keep": True, **(results or {})}
    polling = {"base_delay": "100ms", "max_delay": "100ms", "jitter": {"min": 1.0, "max": 1.0}}
    changes: dict[str, Any] = dict(config)
    if results_store is not None:
        changes["results_store"] = results_store
    return write_config(
        folder,
        upstream,
        store=store,
        policy_changes={"demo-jobs": {"results": keep, "polling": polling}},
        config_changes=changes,
    )


async def gateway(path: Path, clock: FakeClock, *, lane: bool = True) -> TestClient[Any, Any]:
    """The real gateway app for ``path`` on ``clock``: on the agent lane, as ``serve``
    listens, or (``lane=False``) on aiohttp's own server."""
    settings = load_settings(path, env={**os.environ, **PROVIDER_ENV})
    app = create_app(settings, clock=clock, rng=random.Random(7), sleep=clock.sleep)
    server = AgentServer(app, host="127.0.0.1") if lane else TestServer(app, host="127.0.0.1")
    client: TestClient[Any, Any] = TestClient(server)
    await client.start_server()
    return client


async def succeeded_job(client: TestClient[Any, Any], clock: FakeClock, key: str = "k1") -> str:
    """Submit a job and poll it once it may be: it succeeds. Its id."""
    submitted = await client.post(
        "/p/demo-jobs/v1/jobs", json={}, headers={**AUTH, "Idempotency-Key": key}
    )
    assert submitted.status == 202, await submitted.text()
    job = str((await submitted.json())["id"])
    clock.advance(5)
    polled = await client.get(f"/p/demo-jobs/v1/jobs/{job}", headers=AUTH)
    assert polled.status == 200, await polled.text()
    assert polled.headers["Statusgate-Outcome"] == "succeeded"
    return job
