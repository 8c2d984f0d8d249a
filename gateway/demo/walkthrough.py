"""``statusgate demo``: a self-contained show of what the gateway does for looping agents.

Starts the demo provider and a gateway (memory store, audit log in a temporary folder) on
free loopback ports, lets a few agents submit scripted jobs and poll in tight loops, then
prints what the gateway refused, what reached the provider, the escalations and one
operation's audit story. Bounded: every agent stops after its job
ends or after ``AGENT_LIMIT`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from gateway.core.story import story
from gateway.demo import sites
from gateway.demo.provider import DemoProvider
from gateway.observe.audit import records
from gateway.run.app import create_app
from gateway.settings.config import GatewayFile, Settings
from gateway.settings.policy import ProviderPolicy

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


def demo_policy(upstream: str, polling: dict[str, Any] | None = None) -> ProviderPolicy:
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
                **(polling or {}),
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


@contextlib.asynccontextmanager
async def _stack(
    polling: dict[str, Any] | None = None,
) -> AsyncIterator[tuple[DemoProvider, str, Path]]:
    """The demo provider and a gateway in front of it, on free loopback ports."""
    provider = DemoProvider(api_key=KEY)
    provider_runner, provider_port = await sites.start(provider.app())
    policy = demo_policy(f"http://127.0.0.1:{provider_port}", polling)
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
        gateway_runner, gateway_port = await sites.start(create_app(settings))
        try:
            yield provider, f"http://127.0.0.1:{gateway_port}/p/demo-jobs", Path(folder)
        finally:
            await gateway_runner.cleanup()
            await provider_runner.cleanup()


async def show() -> list[str]:
    async with _stack() as (provider, base, folder), aiohttp.ClientSession() as http:
        reports = await asyncio.gather(
            *(_agent(http, base, scene, script, n) for n, (scene, script) in enumerate(SCENES))
        )
        audit = list(records(folder / "audit.jsonl"))
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


def run(agents: int = 25) -> int:
    async def both() -> list[str]:
        return [*await show(), "", *await fleet(agents)]

    for line in asyncio.run(both()):
        print(line)
    return 0


FLEET_SECONDS = 10.0


@dataclass
class FleetResult:
    agent_calls: int
    provider_calls: list[int]  # status calls per job
    peak: int  # most status calls the provider saw in any one second
    finished: int  # agents that saw their job succeed

    def row(self, name: str) -> str:
        calls = self.provider_calls
        mean = sum(calls) / len(calls) if calls else 0.0
        return (
            f"{name:<22} {self.agent_calls:>12} {sum(calls):>15} {mean:>13.1f} "
            f"{max(calls, default=0):>12} {self.peak:>15} {self.finished:>9}"
        )


def peak_per_second(times: list[float]) -> int:
    times = sorted(times)
    best = 0
    for i, start in enumerate(times):
        best = max(best, sum(1 for t in times[i:] if t < start + 1.0))
    return best


async def _fleet_agent(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], stop: float
) -> tuple[int, bool]:
    calls = 0
    while time.monotonic() < stop:
        async with http.get(url, headers=headers) as response:
            calls += 1
            body = await response.read()
            if response.status == 200 and b'"succeeded"' in body:
                return calls, True
        await asyncio.sleep(TIGHT_LOOP)
    return calls, False


async def _fleet(
    base: str, provider: DemoProvider, headers: dict[str, str], agents: int, finish_after: float
) -> FleetResult:
    stop = time.monotonic() + FLEET_SECONDS
    script = [{"state": "running", "until": finish_after}, {"state": "succeeded"}]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        jobs = []
        for n in range(agents):
            submit = {**headers, "Idempotency-Key": f"fleet-{n}-{time.time()}"}
            async with http.post(
                f"{base}/v1/jobs", json={"demo_script": script}, headers=submit
            ) as r:
                jobs.append((await r.json())["id"])
        results = await asyncio.gather(
            *(_fleet_agent(http, f"{base}/v1/jobs/{job}", headers, stop) for job in jobs)
        )
    status_calls = [e for e in provider.log if e["method"] == "GET" and e["job_id"] in jobs]
    per_job = [sum(1 for e in status_calls if e["job_id"] == job) for job in jobs]
    return FleetResult(
        sum(calls for calls, _ in results),
        per_job,
        peak_per_second([e["at"] for e in status_calls]),
        sum(1 for _, done in results if done),
    )


async def fleet(agents: int = 25, rate: str = "10/s", finish_after: float = 4.0) -> list[str]:
    """The same fleet twice: straight at the provider, then through the gateway."""
    provider = DemoProvider(api_key=KEY)
    runner, port = await sites.start(provider.app())
    try:
        direct = await _fleet(
            f"http://127.0.0.1:{port}",
            provider,
            {"Authorization": f"Bearer {KEY}"},
            agents,
            finish_after,
        )
    finally:
        await runner.cleanup()
    pacing = {
        "provider_rate": rate,
        "base_delay": "1s",
        "max_delay": "4s",
        "max_status_requests": 12,
    }
    async with _stack(pacing) as (paced, base, _):
        auth = {"Authorization": f"Bearer {TOKEN}"}
        gated = await _fleet(base, paced, auth, agents, finish_after)
    heading = (
        "",
        "agent calls",
        "provider calls",
        "per job mean",
        "per job max",
        "peak calls/1 s",
        "finished",
    )
    return [
        f"Fleet: {agents} agents submit in the same second and poll every "
        f"{TIGHT_LOOP * 1000:.0f} ms; each job finishes after {finish_after:g} s "
        f"(gateway ceiling {rate}).",
        "",
        "{:<22} {:>12} {:>15} {:>13} {:>12} {:>15} {:>9}".format(*heading),
        direct.row("straight to provider"),
        gated.row("through Statusgate"),
    ]
