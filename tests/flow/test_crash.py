"""A real gateway process killed with SIGKILL between polls loses nothing on SQLite or on
PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from conftest import (
    AGENT_TOKEN,
    PROVIDER_ENV,
    PROVIDER_KEY,
    free_port,
    start_statusgate,
    wait_until_up,
    write_config,
)


@pytest.fixture
def provider_process() -> Iterator[str]:
    port = free_port()
    env = {**os.environ, **PROVIDER_ENV}
    process = start_statusgate(["demo-provider", "--port", str(port)], env)
    wait_until_up(port, process)
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(5)


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def durable_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The stores that outlive the gateway's process: a SQLite file, a PostgreSQL schema,
    keys under a prefix of their own on a Redis."""
    if request.param != "sqlite":
        return str(request.getfixturevalue(f"{request.param}_url"))
    return f"sqlite:///{tmp_path}/gateway.db"


async def test_sigkill_between_polls_keeps_counters_deadline_and_next_poll(
    tmp_path: Path, provider_process: str, durable_store: str
) -> None:
    port = free_port()
    config = write_config(
        tmp_path,
        provider_process,
        store=durable_store,
        config_changes={"listen": {"port": port}},
    )
    env = {**os.environ, **PROVIDER_ENV}
    base = f"http://127.0.0.1:{port}/p/demo-jobs/v1/jobs"
    auth = {"Authorization": f"Bearer {AGENT_TOKEN}"}
    gateway = start_statusgate(["serve", "--config", str(config)], env)
    try:
        wait_until_up(port, gateway)
        async with aiohttp.ClientSession() as http:
            payload = {
                "demo_submit": {"poll_after_seconds": 0},
                "demo_script": [{"state": "running", "poll_after_seconds": 30}],
            }
            async with http.post(
                base, json=payload, headers={**auth, "Idempotency-Key": "c1"}
            ) as r:
                assert r.status == 202
                job = (await r.json())["id"]
            await asyncio.sleep(0.6)  # the first poll is due after base_delay x jitter.min = 0.5s
            async with http.get(f"{base}/{job}", headers=auth) as r:
                assert r.status == 200, await r.text()
                before = dict(r.headers)
        gateway.send_signal(signal.SIGKILL)
        gateway.wait(5)
        gateway = start_statusgate(["serve", "--config", str(config)], env)
        wait_until_up(port, gateway)
        async with aiohttp.ClientSession() as http, http.get(f"{base}/{job}", headers=auth) as r:
            assert r.status == 429
            after = dict(r.headers)
            assert (await r.json())["type"] == "/problems/too-early"
        for name in (
            "Statusgate-Operation",
            "Statusgate-Deadline",
            "Statusgate-Next-Poll-At",
            "Statusgate-Requests-Remaining",
            "Statusgate-Provider-State",
        ):
            assert after[name] == before[name], name
        assert before["Statusgate-Requests-Remaining"] == "11"
        assert 28 <= int(after["Retry-After"]) <= 30
    finally:
        gateway.kill()
        gateway.wait(5)
        stderr = gateway.stderr.read().decode() if gateway.stderr else ""
        assert "Traceback" not in stderr
        assert PROVIDER_KEY not in stderr
