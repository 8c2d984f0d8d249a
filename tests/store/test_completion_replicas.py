"""SPEC 23 across processes: two real gateway processes on one Redis (on PostgreSQL) send
one signed ``operation.completed`` per operation to a real webhook receiver, also when
both restart while the events are still owed (the receiver failing meanwhile)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import signal
import subprocess
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.demo.provider import DemoProvider

from conftest import (
    AGENT_TOKEN,
    PROVIDER_ENV,
    PROVIDER_KEY,
    free_port,
    start_statusgate,
    wait_until_up,
    write_config,
)

SECRET = "whsec_" + base64.b64encode(b"two-replicas-completion-key-0123").decode()
AUTH = {"Authorization": f"Bearer {AGENT_TOKEN}"}
STORES = {"redis": "redis_url", "postgres": "postgres_url"}


@dataclass
class Receiver:
    """Answers 503 while ``failing``, else 204; keeps every attempt."""

    failing: bool = True
    attempts: list[tuple[int, dict[str, str], bytes]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        status = 503 if self.failing else 204
        self.attempts.append((status, dict(request.headers), await request.read()))
        return web.Response(status=status)

    def delivered(self) -> Counter[str]:
        """Operation ids of the events answered 2xx, with how many times each was."""
        return Counter(json.loads(body)["operation_id"] for s, _, body in self.attempts if s < 300)


def verified(headers: dict[str, str], body: bytes) -> bool:
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    digest = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return headers["webhook-signature"] == f"v1,{digest}"


@dataclass
class Gateways:
    configs: list[Path]
    urls: list[str]
    env: dict[str, str]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    async def start(self) -> None:
        self.processes = [
            start_statusgate(["serve", "--config", str(c)], self.env) for c in self.configs
        ]
        for url, process in zip(self.urls, self.processes, strict=True):
            await asyncio.to_thread(wait_until_up, int(url.rsplit(":", 1)[1]), process)

    async def stop(self) -> None:
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            await asyncio.to_thread(process.wait, 30)
            stderr = process.stderr.read().decode() if process.stderr else ""
            assert "Traceback" not in stderr, stderr
        self.processes = []


@pytest.fixture(params=list(STORES))
async def setup(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Gateways, Receiver]]:
    store_url = request.getfixturevalue(STORES[request.param])
    demo = DemoProvider(api_key=PROVIDER_KEY)
    provider = TestServer(demo.app(), host="127.0.0.1")
    await provider.start_server()
    receiver = Receiver()
    hook_app = web.Application()
    hook_app.router.add_post("/hook", receiver.handle)
    hook = TestServer(hook_app, host="127.0.0.1")
    await hook.start_server()
    polling = {"base_delay": "200ms", "max_delay": "200ms", "jitter": {"min": 1.0, "max": 1.0}}
    configs, urls = [], []
    for index in range(2):
        port = free_port()
        configs.append(
            write_config(
                tmp_path / f"r{index}",
                str(provider.make_url("")).rstrip("/"),
                store=store_url,
                policy_changes={"demo-jobs": {"polling": polling}},
                config_changes={
                    "listen": {"port": port},
                    "audit": {"path": f"audit-{index}.jsonl"},
                    "escalation": {
                        "webhook_url": str(hook.make_url("/hook")),
                        "webhook_secret_env": "REPLICAS_HOOK_SECRET",
                        "webhook_backoff": "200ms",
                    },
                },
            )
        )
        urls.append(f"http://127.0.0.1:{port}")
    env = {**os.environ, **PROVIDER_ENV, "REPLICAS_HOOK_SECRET": SECRET}
    gateways = Gateways(configs, urls, env)
    await gateways.start()
    try:
        yield gateways, receiver
    finally:
        await gateways.stop()
        await hook.close()
        await provider.close()


async def finish(http: aiohttp.ClientSession, urls: list[str], key: str) -> str:
    """Submit a job that succeeds at its second poll and poll it through both replicas in
    turn until it has; its operation id."""
    script = [{"state": "running"}, {"state": "succeeded"}]
    headers = {**AUTH, "Idempotency-Key": key}
    async with http.post(
        f"{urls[0]}/p/demo-jobs/v1/jobs", json={"demo_script": script}, headers=headers
    ) as response:
        assert response.status == 202, await response.text()
        job, operation = (await response.json())["id"], response.headers["Statusgate-Operation"]
    async with asyncio.timeout(30):
        for turn in range(10_000):
            url = urls[turn % 2]
            async with http.get(f"{url}/p/demo-jobs/v1/jobs/{job}", headers=AUTH) as answer:
                if answer.headers.get("Statusgate-Outcome") == "succeeded":
                    return str(operation)
                assert answer.status in (200, 429), await answer.text()
            await asyncio.sleep(0.1)
    raise AssertionError("unreachable")


async def until(condition: Any, seconds: float = 60.0) -> None:
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.1)


async def test_two_replicas_and_a_restart_send_one_event_per_operation(
    setup: tuple[Gateways, Receiver],
) -> None:
    """Three operations end while the receiver fails (each event tried, kept owed); both
    replicas restart; three more end; the receiver recovers: each of the six operations is
    delivered exactly once, every attempt signed, carrying the operation's usage."""
    gateways, receiver = setup
    async with aiohttp.ClientSession() as http:
        first = [await finish(http, gateways.urls, f"a{n}") for n in range(3)]
        await until(
            lambda: {json.loads(b)["operation_id"] for _, _, b in receiver.attempts} >= set(first)
        )
        await gateways.stop()
        await gateways.start()
        later = [await finish(http, gateways.urls, f"b{n}") for n in range(3)]
        receiver.failing = False
        await until(lambda: set(receiver.delivered()) == set(first + later))
        await asyncio.sleep(3)  # both replicas look at the outbox again, several times
    assert receiver.delivered() == Counter({operation: 1 for operation in first + later})
    assert all(verified(headers, body) for _, headers, body in receiver.attempts)
    for _status, headers, body in receiver.attempts:
        event = json.loads(body)
        assert headers["webhook-id"] == f"completed_{event['operation_id']}"
        assert event["type"] == "operation.completed" and event["outcome"] == "succeeded"
        assert event["usage"] == {"input_tokens": 1200, "output_tokens": 350, "pages": 3}
