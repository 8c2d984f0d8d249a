"""``statusgate demo``: a self-contained show of what the gateway does for looping agents.

Starts the demo provider and a gateway (memory store, audit log in a temporary folder) on
free loopback ports, lets a few agents submit scripted jobs and poll in tight loops, then
prints what the gateway refused, what reached the provider, the escalations and one
operation's audit story. Bounded: every agent stops after its job
ends or after ``AGENT_LIMIT`` seconds.
"""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from .app import create_app
from .audit import records
from .config import GatewayFile, Settings
from .demo_provider import DemoProvider
from .policy import ProviderPolicy
from .story import story

TOKEN = "demo-agent-token"  # noqa: S105 (the demo's own throwaway token)
KEY = "demo-show-key"  # a stand-in provider key that exists only in this process
AGENT_LIMIT = 12.0
TIGHT_LOOP = 0.05

SCENES: list[tuple[str, list[dict[str, Any]]]] = [
    ("finishes after a while", [{"state": "queued"}, {"state": "running"}, {"state": "succeeded"}]),
    ("never finishes", [{"state": "running"}]),
    ("provider invents a state", [{"state": "running"}, {"state": "paused_for_review"}]),
    (
        "provider has an outage",
        [{"http": 503, "retry_after": "1"}, {"http": 503}, {"state": "succeeded"}],
    ),
]


def demo_policy(upstream: str) -> ProviderPolicy:
    return ProviderPolicy.model_validate(
        {
            "provider": "demo-jobs",
            "upstream": upstream,
            "credential": {"header": "Authorization", "value": f"Bearer {KEY}"},
            "routes": {
                "submit": {
                    "path": "/v1/jobs",
                    "job_id": {"from": "body", "path": "id"},
                    "idempotency": {"required": True, "forward_header": "Idempotency-Key"},
                },
                "status": {"path": "/v1/jobs/{job_id}"},
                "result": {"path": "/v1/jobs/{job_id}/result"},
                "cancel": {"method": "POST", "path": "/v1/jobs/{job_id}/cancel"},
            },
            "states": {
                "field": "state",
                "pending": ["queued", "running"],
                "success": ["succeeded"],
                "failure": ["failed"],
                "success_requires": ["result"],
            },
            "polling": {
                "base_delay": "300ms",
                "max_delay": "2s",
                "deadline": "10s",
                "max_status_requests": 6,
                "final_poll_margin": "100ms",
            },
            "escalation": {"max_extension": {"time": "10m", "requests": 4}},
        }
    )


@dataclass
class AgentReport:
    scene: str
    job_id: str
    operation_id: str
    calls: int = 0
    refused: int = 0
    answered: int = 0
    final_status: int = 0
    outcome: str = ""
    escalation: dict[str, Any] | None = None


async def _start(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert server is not None and server.sockets  # type: ignore[attr-defined]
    port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]
    return runner, port


async def _agent(
    http: aiohttp.ClientSession, base: str, scene: str, script: list[dict[str, Any]], n: int
) -> AgentReport:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    submit_headers = {**auth, "Idempotency-Key": f"demo-{n}"}
    async with http.post(
        f"{base}/v1/jobs", json={"demo_script": script}, headers=submit_headers
    ) as r:
        job_id = (await r.json())["id"]
        report = AgentReport(scene, job_id, r.headers["Statusgate-Operation"])
    stop = time.monotonic() + AGENT_LIMIT
    while time.monotonic() < stop:
        async with http.get(f"{base}/v1/jobs/{job_id}", headers=auth) as r:
            report.calls += 1
            report.final_status = r.status
            report.outcome = r.headers.get("Statusgate-Outcome", "")
            if r.status == 429 and r.headers.get("Content-Type") == "application/problem+json":
                report.refused += 1
            else:
                report.answered += 1
            if r.status == 409:
                report.escalation = await r.json()
                break
            if report.outcome not in ("pending", ""):
                break
        await asyncio.sleep(TIGHT_LOOP)  # a careless agent: poll again almost at once
    return report


async def show() -> list[str]:
    provider = DemoProvider(api_key=KEY)
    provider_runner, provider_port = await _start(provider.app())
    policy = demo_policy(f"http://127.0.0.1:{provider_port}")
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    with tempfile.TemporaryDirectory() as folder:
        gateway_file = GatewayFile.model_validate(
            {
                "store": "memory://",
                "accounts": [{"id": "demo-team", "token_sha256": [digest]}],
                "limits": {"upstream_timeout": "5s"},
                "audit": {"path": "audit.jsonl"},
            }
        )
        settings = Settings(
            file=gateway_file, base_dir=Path(folder), policies={policy.provider: policy}
        )
        gateway_runner, gateway_port = await _start(create_app(settings))
        base = f"http://127.0.0.1:{gateway_port}/p/demo-jobs"
        try:
            async with aiohttp.ClientSession() as http:
                reports = await asyncio.gather(
                    *(
                        _agent(http, base, scene, script, n)
                        for n, (scene, script) in enumerate(SCENES)
                    )
                )
        finally:
            await gateway_runner.cleanup()
            await provider_runner.cleanup()
        audit = list(records(Path(folder) / "audit.jsonl"))
    return _render(reports, provider, audit)


def _render(
    reports: list[AgentReport], provider: DemoProvider, audit: list[dict[str, Any]]
) -> list[str]:
    lines = [
        "Statusgate demo: four agents poll every 50 ms until their job ends.",
        "",
        f"{'agent job':<28} {'agent calls':>11} {'refused':>8} {'reached provider':>17}  outcome",
    ]
    total_calls = total_provider = 0
    for report in reports:
        reached = sum(
            1 for e in provider.log if e["job_id"] == report.job_id and e["method"] == "GET"
        )
        total_calls += report.calls
        total_provider += reached
        lines.append(
            f"{report.scene:<28} {report.calls:>11} {report.refused:>8} {reached:>17}  "
            f"{report.outcome}"
        )
    lines += [
        "",
        f"Agents made {total_calls} status calls; {total_provider} reached the provider.",
        "",
        "Escalations (what an operator is shown):",
    ]
    for report in reports:
        if report.escalation is not None:
            lines += ["", *("  " + line for line in report.escalation["message"].splitlines())]
    outage = reports[-1]
    lines += ["", f"Audit story of '{outage.scene}' ({outage.operation_id}):"]
    lines += ["  " + line for line in story(audit, outage.operation_id)]
    return lines


def run() -> int:
    for line in asyncio.run(show()):
        print(line)
    return 0
