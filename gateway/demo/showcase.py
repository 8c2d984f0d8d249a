"""``statusgate demo --provider NAME``: one shipped policy, as its agents meet it.

Starts the demo provider (which speaks every shipped policy's API under ``/<provider>``)
and a gateway with the named policy as shipped, its upstream pointed at the demo provider,
on free loopback ports and on a simulated clock: a job that runs for twenty minutes takes
a second. A few agents submit the policy's example job and poll its status route in a
naive loop every few (simulated) seconds; the show prints what each agent got, what reached
the provider, and the operation's audit story. Never contacts a real provider: every
credential the policy reads is set to the demo provider's own key.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from gateway import ConfigError
from gateway.core.models import OperationRecord
from gateway.core.routing import fill, job_values
from gateway.core.story import story
from gateway.demo.env import demo_env
from gateway.demo.jobs import Family
from gateway.demo.pack import Double, Example, doubles
from gateway.demo.provider import FAMILIES, DemoProvider
from gateway.demo.sites import gateway_app, start
from gateway.flow.runtime import RUNTIME
from gateway.observe.audit import records
from gateway.settings.policy import ProviderPolicy, load_policy

TOKEN = "demo-agent-token"  # noqa: S105 (the demo's own throwaway token)
KEY = "demo-show-key"  # the demo provider's key in this process only
AGENTS = 3
AGENT_EVERY = 5.0  # simulated seconds between one agent's calls
JOB_SECONDS = 1200.0  # simulated seconds the job stays pending (less on a tight policy)
STORY_LINES = 14  # lines of the audit story shown (its start and its end)
GIVE_UP = 3 * 3600.0  # simulated seconds after which the agents stop

# The five families of the demo provider: the shipped policies they speak for, and the
# submit an agent of each sends.
LEGACY: dict[str, tuple[str, Example]] = {
    "demo-jobs": ("jobs", Example("/v1/jobs", {"input": "report.pdf"})),
    "batch-api": ("batches", Example("/v1/batches", {"input_file_id": "file-demo-input"})),
    "openai-batch": (
        "batches",
        Example(
            "/v1/batches",
            {
                "input_file_id": "file-demo-input",
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        ),
    ),
    "anthropic-batches": (
        "anthropic",
        Example("/v1/messages/batches", {"requests": [{"custom_id": "request-1", "params": {}}]}),
    ),
    "azure-read": (
        "azure",
        Example(
            "/documentintelligence/documentModels/prebuilt-read:analyze?api-version=2024-11-30",
            {"urlSource": "https://example.com/scan.pdf"},
        ),
    ),
    "google-operations": ("google", Example("/v1/projects/demo/locations/us-central1/jobs", {})),
}


class SimulatedClock:
    """Time that passes only when the show says so (and when the gateway sleeps)."""

    def __init__(self) -> None:
        self.now = float(int(time.time()))

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)
        await asyncio.sleep(0)


def shipped_policy(name: str, folder: Path) -> ProviderPolicy:
    """The policy ``name`` from ``folder``, every credential it reads set to the demo key."""
    path = folder / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in folder.glob("*.yaml"))
        raise ConfigError([f"{folder}: no policy {name!r} (shipped: {', '.join(known)})"])
    env = {**demo_env(folder, KEY), "DEMO_API_KEY": KEY}
    return load_policy(path, str(path), env)


def family_and_example(name: str) -> tuple[Family, Example]:
    double: Double | None = doubles().get(name)
    if double is not None:
        return double.family, double.example
    if name in LEGACY:
        family, example = LEGACY[name]
        return FAMILIES[family], example
    raise ConfigError([f"demo --provider {name}: the demo provider does not speak this API"])


@contextlib.asynccontextmanager
async def _stack(
    policy: ProviderPolicy, clock: SimulatedClock
) -> AsyncIterator[tuple[DemoProvider, web.Application, str, Path]]:
    provider = DemoProvider(api_key=KEY, clock=clock)
    provider_runner, provider_port = await start(provider.app())
    upstream = f"http://127.0.0.1:{provider_port}/{policy.provider}"
    policy = policy.model_copy(update={"upstream": upstream})
    with tempfile.TemporaryDirectory() as folder:
        app = gateway_app(policy, clock, TOKEN, Path(folder))
        gateway_runner, gateway_port = await start(app)
        try:
            base = f"http://127.0.0.1:{gateway_port}/p/{policy.provider}"
            yield provider, app, base, Path(folder)
        finally:
            await gateway_runner.cleanup()
            await provider_runner.cleanup()


def _script(family: Family, seconds: float) -> list[dict[str, Any]]:
    """The family's own way to success, its first pending state held for ``seconds``."""
    steps = [dict(step) for step in family.default_script]
    steps[0]["until"] = seconds
    return steps


async def _submit(
    http: aiohttp.ClientSession, base: str, example: Example, script: list[dict[str, Any]]
) -> tuple[int, str]:
    body = None if example.body is None else {**example.body, "demo_script": script}
    headers = {"Statusgate-Token": TOKEN, "Idempotency-Key": "demo-show-1", **example.headers}
    async with http.request(example.method, base + example.path, json=body, headers=headers) as r:
        await r.read()
        return r.status, r.headers.get("Statusgate-Operation", "")


def _status_call(
    policy: ProviderPolicy, record: OperationRecord
) -> tuple[str, str, dict[str, Any] | None]:
    route, job_id = policy.routes.status, record.provider_job_id
    if route.job_id is not None:  # the job id goes in the request body (JSON-RPC style)
        return route.method, route.path, {route.job_id.path or "id": job_id}
    # fill encodes a {job_id} into its one segment (an ARN as boto3 sends it); fal's app
    # segments are the submit's
    return route.method, fill(route.path, job_values(record)), None


async def _agents(
    http: aiohttp.ClientSession,
    base: str,
    policy: ProviderPolicy,
    record: OperationRecord,
    clock: Any,
) -> tuple[Counter[str], str]:
    """Naive agents taking turns: each calls every AGENT_EVERY seconds until the job ends."""
    method, path, body = _status_call(policy, record)
    headers = {"Statusgate-Token": TOKEN, **route_match(policy)}
    seen: Counter[str] = Counter()
    outcome = "pending"
    stop = clock.now + GIVE_UP
    while outcome == "pending" and clock.now < stop:
        async with http.request(method, base + path, json=body, headers=headers) as r:
            await r.read()
            outcome = r.headers.get("Statusgate-Outcome", outcome)
            seen[_kind(r.status, r.headers)] += 1
        clock.now += AGENT_EVERY / AGENTS
    return seen, outcome


def route_match(policy: ProviderPolicy) -> dict[str, str]:
    """The headers that make a request the status route (X-Amz-Target...)."""
    match = policy.routes.status.match
    return {} if match is None else dict(match.headers)


def _kind(status: int, headers: Any) -> str:
    if "Age" in headers:
        return f"{status} replayed"
    if headers.get("Content-Type", "").startswith("application/problem+json"):
        return f"{status} refused"
    return f"{status} answered"


async def show(name: str, folder: Path) -> list[str]:
    policy = shipped_policy(name, folder)
    if policy.protocol == "a2a":
        from gateway.demo import a2a_show  # a2a-sdk is an extra

        return await a2a_show.show(name, policy, SimulatedClock(), TOKEN, AGENTS, AGENT_EVERY)
    family, example = family_and_example(name)
    clock = SimulatedClock()
    started = clock.now
    polling = policy.polling  # a job that fits well within the policy's deadline and budget
    pending = min(
        JOB_SECONDS, polling.deadline / 4, polling.max_delay * polling.max_status_requests / 4
    )
    async with _stack(policy, clock) as (provider, app, base, audit_dir):
        provider.default_scripts[family.name] = _script(family, pending)
        async with aiohttp.ClientSession() as http:
            status, operation_id = await _submit(http, base, example, _script(family, pending))
            if not operation_id:
                return [f"demo --provider {name}: the submit was answered {status}, no job"]
            record = await app[RUNTIME].store.get(operation_id)
            assert record is not None
            seen, outcome = await _agents(http, base, policy, record, clock)
            ended = await app[RUNTIME].store.get(operation_id) or record
        job_calls = [e for e in provider.log if e["job_id"] == record.provider_job_id]
        audit = list(records(audit_dir / "audit.jsonl"))
    minutes = (clock.now - started) / 60
    lines = [
        f"Statusgate demo of {name} ({policy.routes.status.method} {policy.routes.status.path}):"
        f" {AGENTS} agents each call every {AGENT_EVERY:g} s until the job ends;",
        f"the job stays pending for {pending / 60:g} minutes (simulated time,"
        f" {minutes:.0f} minutes shown).",
        "",
        f"Agents' status calls: {sum(seen.values())}, "
        + ", ".join(f"{kind}: {count}" for kind, count in sorted(seen.items())),
        f"Calls that reached the provider: {len(job_calls)} "
        + "("
        + ", ".join(f"{k}: {v}" for k, v in sorted(Counter(e["kind"] for e in job_calls).items()))
        + ")",
        f"Outcome: {outcome}",
        *(["Usage: " + ", ".join(f"{k} {v}" for k, v in ended.usage)] if ended.usage else []),
        "",
        f"Audit story of {operation_id}:",
    ]
    told = story(audit, operation_id)
    if len(told) > STORY_LINES:
        half = STORY_LINES // 2
        told = [*told[:half], f"... {len(told) - STORY_LINES} lines ...", *told[-half:]]
    return lines + ["  " + line for line in told]


def run(name: str, folder: Path) -> int:
    try:
        lines = asyncio.run(show(name, folder))
    except ConfigError as exc:
        for line in exc.problems:
            print(line)
        return 1
    for line in lines:
        print(line)
    return 0
