"""A real gateway and the real demo provider on one virtual clock, for the provider pack's
SDK tests (tests/sdk/test_pack_*.py): the shipped policies as they are (their production
schedules: seconds to minutes between polls, deadlines of hours), only the upstream
pointed at the pack's double for each.

Time is virtual so that a job that runs for forty minutes takes a second: the gateway and
the demo provider share a FakeClock; every agent request to the gateway moves it on by
STEP seconds (one turn of an agent's loop), and every ``time.sleep`` of the agent's thread
(an SDK's retry back-off) moves it on by its length instead of sleeping. HTTP is real:
the SDK talks to the gateway over loopback, the gateway to the demo provider.
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

import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.core.models import OperationRecord
from gateway.demo.provider import DemoProvider
from gateway.flow.runtime import RUNTIME
from gateway.run.app import create_app
from gateway.settings.config import load_settings
from gateway.settings.units import parse_duration
from gateway.store import store_from_url

from conftest import (
    OPERATOR_TOKEN,
    PROVIDER_ENV,
    PROVIDER_KEY,
    ROOT,
    FakeClock,
    free_port,
    permitted_polls,
    write_config,
)

T = TypeVar("T")
STEP = 2.0  # virtual seconds one turn of an agent's loop takes
MAX_CALLS = 20_000  # a naive loop that never ends is stopped here (and fails its test)


@dataclass
class Agent:
    """The agent's side of virtual time and what it did: requests it sent to the gateway,
    seconds its SDK slept, exceptions that reached its code."""

    clock: FakeClock
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
        """Whether a naive loop may go on (it is stopped at MAX_CALLS)."""
        return len(self.calls) < MAX_CALLS


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
    """Middleware: each agent request moves the clock on by STEP (its loop's turn)."""

    @web.middleware
    async def tick(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/p/"):
            agent.calls.append(f"{request.method} {request.path}")
            agent.clock.advance(STEP)
        response: web.StreamResponse = await handler(request)
        return response

    return tick


@dataclass
class Setup:
    base: str  # the gateway's own base URL
    demo: DemoProvider
    agent: Agent
    client: TestClient[Any, Any]

    def url(self, provider: str, suffix: str = "") -> str:
        """The base URL an SDK is given for ``provider``: the gateway's, plus ``suffix``."""
        return f"{self.base}/p/{provider}{suffix}"

    async def record(self, provider: str, job_id: str) -> OperationRecord:
        """The account's operation of this job."""
        record = await self.client.app[RUNTIME].store.find("team-a", provider, job_id)
        assert record is not None, f"no operation of {provider} for {job_id}"
        return record

    async def operator_cancel(self, provider: str, job_id: str) -> int:
        """An operator's cancel of the job's operation; the answer's status."""
        record = await self.record(provider, job_id)
        answer = await self.client.post(
            f"/admin/operations/{record.operation_id}/cancel",
            json={"reason": "no longer needed"},
            headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
        )
        await answer.read()
        return answer.status

    def polls(self, job_id: str) -> list[float]:
        """When the provider answered a status call about ``job_id`` (virtual time)."""
        return [e["at"] for e in self.demo.log if e["job_id"] == job_id and e["kind"] == "status"]

    def calls(self, kind: str) -> list[dict[str, Any]]:
        """Every provider call of this kind (submit, status, cancel, file, result)."""
        return [e for e in self.demo.log if e["kind"] == kind]


def shipped_polling(provider: str) -> dict[str, Any]:
    """The polling section of the shipped policy, as written."""
    data = yaml.safe_load((ROOT / "policies" / f"{provider}.yaml").read_text())
    polling: dict[str, Any] = data["polling"]
    return polling


def assert_paced(provider: str, times: list[float], submitted: float, now: float) -> None:
    """The provider's polls kept to the shipped schedule: no more than it permits in the
    time that passed, and none sooner after the previous one than the first backoff step
    allows (base_delay x jitter.min)."""
    polling = shipped_polling(provider)
    assert times, "the provider was never polled"
    assert times[0] >= submitted
    assert len(times) <= permitted_polls(polling, now - submitted), times
    floor = parse_duration(polling["base_delay"]) * float(polling["jitter"]["min"])
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap >= floor - 1e-6 for gap in gaps), gaps


def table(provider: str, sdk: str, loop: str, setup: Setup, polls: int, started: float) -> None:
    """One row of docs/providers.md, for the report (pytest -s shows it)."""
    agent = setup.agent
    minutes = (agent.clock.now - started) / 60
    row = [provider, sdk, loop, str(len(agent.calls)), str(polls), str(len(agent.exceptions))]
    print(
        "\nPACK-TABLE | "
        + " | ".join(row)
        + f" | {minutes:.0f} virtual min | "
        + "; ".join(agent.exceptions[:2])
    )


@contextlib.asynccontextmanager
async def pack_gateway(
    tmp_path: Path, *, policy_changes: dict[str, Any] | None = None
) -> AsyncIterator[Setup]:
    """The gateway on a FakeClock, its public base URL its own loopback address, in front
    of the demo provider (every pack double under /<provider>) on the same clock, with
    the shipped policies as they are but for the upstream."""
    clock = FakeClock()
    agent = Agent(clock)
    demo = DemoProvider(api_key=PROVIDER_KEY, clock=clock)
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


def held(state: str, until: float) -> dict[str, Any]:
    """A script step: ``state`` on every poll until ``until`` virtual seconds after submit."""
    return {"state": state, "until": until}


def provider_keys(setup: Setup, header: str, value: str) -> None:
    """Every call that reached the provider carried the gateway's key, never the agent's."""
    for entry in setup.demo.log:
        sent = {k.lower(): v for k, v in entry["headers"].items()}
        assert sent.get(header.lower()) == value, (entry["path"], sent.get(header.lower()))
