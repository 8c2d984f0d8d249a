"""A scriptable provider double and a gateway in front of it, for the shape tests.

The double is a real aiohttp server on loopback that records every request it gets and
answers from a function the test gives it; the gateway is the real app on the test's fake
clock, with the shipped policies plus the ones a test writes.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.flow.runtime import RUNTIME
from gateway.run.app import create_app
from gateway.settings.config import load_settings

from conftest import AGENT_TOKEN, PROVIDER_ENV, AgentServer, FakeClock, write_config

Answer = tuple[int, Any, dict[str, str]]  # status, JSON body, headers


@dataclass
class Seen:
    method: str
    path: str  # raw path and query, as received
    headers: dict[str, str]
    body: bytes


@dataclass
class Double:
    """Answers every request with ``answer(seen)``; keeps every request in ``log``."""

    answer: Callable[[Seen], Answer]
    log: list[Seen] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        seen = Seen(
            request.method, request.rel_url.raw_path_qs, dict(request.headers), await request.read()
        )
        self.log.append(seen)
        status, body, headers = self.answer(seen)
        return web.json_response(body, status=status, headers=headers)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    def calls(self, method: str, prefix: str) -> list[Seen]:
        return [s for s in self.log if s.method == method and s.path.startswith(prefix)]


async def serve(double: Double) -> TestServer:
    server = TestServer(double.app(), host="127.0.0.1")
    await server.start_server()
    return server


async def gateway(
    folder: Path,
    clock: FakeClock,
    upstream: str,
    policies: dict[str, dict[str, Any]],
    env: dict[str, str] | None = None,
) -> TestClient[Any, Any]:
    """The gateway on ``clock`` with the shipped policies and ``policies`` (by file name);
    the caller closes the client."""
    path = write_config(folder, upstream)
    for name, policy in policies.items():
        (folder / "policies" / f"{name}.yaml").write_text(yaml.safe_dump(policy))
    settings = load_settings(path, env={**os.environ, **PROVIDER_ENV, **(env or {})})
    app = create_app(
        settings,
        store=None,
        clock=clock,
        rng=random.Random(7),
        sleep=clock.sleep,
    )
    client: TestClient[Any, Any] = TestClient(AgentServer(app, host="127.0.0.1"))
    await client.start_server()
    return client


def bearer(token: str = AGENT_TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def record_of(client: TestClient[Any, Any], provider: str, job_id: str) -> Any:
    """The operation record of team-a's job (the harness account)."""
    record = await client.app[RUNTIME].store.find("team-a", provider, job_id)
    assert record is not None
    return record


async def due(client: TestClient[Any, Any], clock: FakeClock, provider: str, job_id: str) -> None:
    """Move the fake clock to the operation's next permitted poll."""
    record = await record_of(client, provider, job_id)
    clock.now = max(clock.now, record.next_poll_at)
