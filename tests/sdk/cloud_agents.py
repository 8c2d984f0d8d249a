"""The harness of the cloud providers' SDK tests (tests/sdk/test_pack_gemini_batch.py,
test_pack_vertex_batch_prediction.py, test_pack_bedrock_*.py):
a real gateway with the shipped policy as it is but for the upstream, in front of the demo
provider's double of that API, both on one FakeClock, and an agent whose SDK runs at its
default settings in a thread of its own.

Virtual time, as in tests/sdk/test_sdk_agents.py: every agent request to the gateway moves
the clock on by STEP seconds (one turn of a naive loop), and every ``time.sleep`` outside
the event loop's thread (SDK retry back-offs, wait helpers) moves it on by its length
instead of sleeping, so production-length schedules (minutes between polls, hours of
deadline) run in seconds. Each test prints its row of docs/providers.md (``PACK-ROW``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.core.models import OperationRecord
from gateway.demo.provider import DemoProvider
from gateway.flow.runtime import RUNTIME
from gateway.run.app import create_app
from gateway.settings.config import load_settings
from gateway.settings.policy import Polling
from gateway.store import store_from_url

from conftest import PROVIDER_ENV, PROVIDER_KEY, FakeClock, free_port, write_config

T = TypeVar("T")
STEP = 2.0  # virtual seconds one turn of an agent's loop takes
MAX_CALLS = 5_000  # a naive loop that never ends is stopped here (and fails its test)


@dataclass
class Agent:
    """The agent's side of virtual time and what it did: the requests it sent to the
    gateway, the seconds its SDK slept, the exceptions that reached its code."""

    clock: FakeClock
    step: float = STEP  # virtual seconds one turn of this agent's loop takes
    calls: list[str] = field(default_factory=list)
    slept: list[float] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)

    async def run(self, work: Callable[[], T]) -> T:
        """``work`` in a thread of its own (its ``time.sleep`` is virtual)."""
        return await asyncio.to_thread(work)

    def caught(self, error: BaseException) -> None:
        self.exceptions.append(f"{type(error).__name__}: {str(error)[:160]}")

    @property
    def busy(self) -> bool:
        """Has the loop run away (more calls than any schedule needs)?"""
        return len(self.calls) >= MAX_CALLS


@contextlib.contextmanager
def virtual_sleep(agent: Agent) -> Iterator[None]:
    """``time.sleep`` outside the event loop's thread moves the clock on instead."""
    real, loop_thread = time.sleep, threading.get_ident()

    def sleep(seconds: float) -> None:
        if threading.get_ident() == loop_thread:
            real(seconds)
            return
        agent.slept.append(seconds)
        agent.clock.advance(max(0.0, seconds))
        real(0.0005)

    time.sleep = sleep  # type: ignore[assignment]
    try:
        yield
    finally:
        time.sleep = real


def ticking(agent: Agent) -> Any:
    """Middleware: each agent request moves the clock on by its loop's turn."""

    @web.middleware
    async def tick(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/p/"):
            agent.calls.append(f"{request.method} {request.path}")
            agent.clock.advance(agent.step)
        response: web.StreamResponse = await handler(request)
        return response

    return tick


@dataclass
class Setup:
    base: str  # the gateway's own base URL
    demo: DemoProvider
    agent: Agent
    client: TestClient[Any, Any]

    async def record(self, provider: str, job_id: str) -> OperationRecord:
        record = await self.client.app[RUNTIME].store.find("team-a", provider, job_id)
        assert record is not None, f"no operation for {job_id}"
        return record

    def polling(self, provider: str) -> Polling:
        return self.client.app[RUNTIME].settings.policies[provider].polling


@contextlib.asynccontextmanager
async def gateway(
    tmp_path: Path,
    *,
    scripts: dict[str, list[dict[str, Any]]] | None = None,
    policy_changes: dict[str, Any] | None = None,
    step: float = STEP,
) -> AsyncIterator[Setup]:
    """The gateway on a FakeClock, its public base URL its own loopback address, in front
    of the demo provider (the pack's doubles under /<provider>) on the same clock; jobs
    submitted without a ``demo_script`` follow ``scripts[family]``; each agent request
    moves the clock on by ``step`` seconds."""
    clock = FakeClock()
    agent = Agent(clock, step)
    demo = DemoProvider(api_key=PROVIDER_KEY, clock=clock)
    demo.default_scripts.update(scripts or {})
    provider = TestServer(demo.app(), host="127.0.0.1")
    await provider.start_server()
    port = free_port()
    changes = {"public_base_url": f"http://127.0.0.1:{port}"}
    target = str(provider.make_url("")).rstrip("/")
    path = write_config(tmp_path, target, policy_changes=policy_changes, config_changes=changes)
    settings = load_settings(path, env={**os.environ, **PROVIDER_ENV})
    app = create_app(
        settings,
        store=store_from_url("memory://"),
        clock=clock,
        rng=random.Random(7),
        sleep=clock.sleep,
    )
    app.middlewares.append(ticking(agent))
    client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1", port=port))
    await client.start_server()
    try:
        with virtual_sleep(agent):
            yield Setup(f"http://127.0.0.1:{port}", demo, agent, client)
    finally:
        await client.close()
        await provider.close()


def phases(*states: str, last: str, each: float) -> list[dict[str, Any]]:
    """A demo script: each state for ``each`` virtual seconds in turn, then ``last``."""
    steps = [{"state": state, "until": each * (n + 1)} for n, state in enumerate(states)]
    return [*steps, {"state": last}]


def polls_at(demo: DemoProvider, job: str, kind: str = "status") -> list[float]:
    """When the provider answered a call of ``kind`` about ``job`` (virtual time)."""
    return [e["at"] for e in demo.log if e["job_id"] == job and e["kind"] == kind]


def assert_paced(times: list[float], submitted: float, polling: Polling) -> None:
    """The provider was polled, never before the schedule allowed: the n-th poll came at
    least ``jitter.min x min(max_delay, base_delay x 2^n)`` after the call before it (the
    submit for the first), and no more polls than the budget."""
    assert times, "the provider was never polled"
    gaps = [b - a for a, b in itertools.pairwise([submitted, *times])]
    for n, gap in enumerate(gaps):
        least = polling.jitter.min * min(polling.max_delay, polling.base_delay * 2**n)
        assert gap >= least - 1e-6, (n, gap, least, gaps)
    assert len(times) <= polling.max_status_requests


def row(provider: str, sdk: str, loop: str, agent: Agent, polls: int, seconds: float) -> None:
    """One row of docs/providers.md, for the report (``pytest -s`` shows it)."""
    cells = [provider, sdk, loop, str(len(agent.calls)), str(polls), str(len(agent.exceptions))]
    cells.append(f"{seconds / 60:.0f} min")
    print("\nPACK-ROW | " + " | ".join(cells) + " | " + "; ".join(agent.exceptions[:2]))
