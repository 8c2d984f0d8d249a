"""Issue 23: past ``limits.max_in_flight`` agent requests in hand, a new one is answered 503
``overloaded`` with ``Retry-After: 1`` at once and reaches neither the store nor the
provider; held calls parked between looks are not counted; health, metrics and the operator
API are never bounded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.flow.runtime import RUNTIME

from conftest import OPERATOR_TOKEN, PROVIDER_ENV, Harness, real_time_harness

OPS = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
MCP_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}


class HeldProvider:
    """A provider whose submit route answers only once ``release`` is set: every call it
    got (in order), and an event set at each arrival."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.arrived = asyncio.Event()
        self.release = asyncio.Event()

    async def submit(self, request: web.Request) -> web.Response:
        self.calls.append(request.headers.get("Idempotency-Key", ""))  # as derived (sg1-...)
        job = f"job-{len(self.calls)}"
        self.arrived.set()
        await self.release.wait()
        return web.json_response({"id": job, "state": "queued"}, status=202)

    async def until_calls(self, count: int) -> None:
        async with asyncio.timeout(5):
            while len(self.calls) < count:
                self.arrived.clear()
                await self.arrived.wait()


@pytest.fixture
async def held_provider() -> AsyncIterator[tuple[HeldProvider, str]]:
    provider = HeldProvider()
    app = web.Application()
    app.router.add_post("/v1/jobs", provider.submit)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield provider, str(server.make_url("")).rstrip("/")
    provider.release.set()
    await server.close()


async def until(condition: Callable[[], bool]) -> None:
    """Wait (bounded) for a condition on the gateway's own counters, which have no event."""
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0.005)


async def test_past_the_bound_a_call_is_refused_at_once_and_never_forwarded(
    make_harness: Any, held_provider: tuple[HeldProvider, str]
) -> None:
    """With two submits in hand (the provider holding both), a third submit and an MCP call
    get 503 overloaded with Retry-After 1 while the two still wait, the provider sees only
    the two, no record or audit line is made for the refused; health, metrics and the
    operator API answer meanwhile; once the two finish, a new call passes."""
    provider, url = held_provider
    harness: Harness = await make_harness(
        upstream=url, config_changes={"limits": {"max_in_flight": 2}}
    )
    first = asyncio.create_task(harness.submit(key="k1"))
    second = asyncio.create_task(harness.submit(key="k2"))
    await provider.until_calls(2)

    refused = await harness.submit(key="k3")
    assert refused.status == 503
    body = await refused.json()
    assert body["type"] == "/problems/overloaded"
    assert body["error"]["code"] == "overloaded"
    assert refused.headers["Retry-After"] == "1"
    assert refused.headers["Retry-After-Ms"] == "1000"
    assert refused.headers["X-Should-Retry"] == "true"
    mcp = await harness.client.post("/mcp", json=MCP_LIST, headers=harness.auth())
    assert mcp.status == 503
    assert (await mcp.json())["type"] == "/problems/overloaded"

    assert (await harness.client.get("/healthz")).status == 200
    assert (await harness.client.get("/problems/overloaded")).status == 200
    admin = await harness.client.get("/admin/operations", headers=OPS)
    assert admin.status == 200
    scrape = await (await harness.client.get("/metrics")).text()
    assert "statusgate_overloaded_requests_total 2.0" in scrape

    assert not first.done() and not second.done()  # answered while both are still in hand
    assert len(provider.calls) == 2
    provider.release.set()
    assert (await first).status == 202
    assert (await second).status == 202
    assert harness.client.app[RUNTIME].in_flight == 0

    again = await harness.submit(key="k4")
    assert again.status == 202, await again.text()
    assert len(provider.calls) == 3
    assert [line["event"] for line in harness.audit_lines()] == ["submitted"] * 3


async def test_held_calls_parked_in_a_hold_are_not_counted(tmp_path: Path) -> None:
    """Three status calls parked in a Prefer: wait hold, with a bound of 2: a plain status
    call and a submit still get their usual answers (429 too-early, 202), not overloaded;
    the held calls are answered at shutdown."""
    async with real_time_harness(
        tmp_path, config_changes={"limits": {"max_in_flight": 2}}
    ) as harness:
        runtime = harness.client.app[RUNTIME]
        submitted = await harness.submit([{"state": "running"}], submit={"poll_after_seconds": 20})
        job = (await submitted.json())["id"]
        holds = []
        for n in range(1, 4):  # one by one: a hold counts until it parks
            holds.append(asyncio.create_task(harness.poll(job, headers={"Prefer": "wait=30"})))
            await until(lambda n=n: runtime.parked == n)
        assert runtime.in_flight == 3

        early = await harness.poll(job)
        assert early.status == 429, await early.text()
        assert (await early.json())["type"] == "/problems/too-early"
        another = await harness.submit([{"state": "running"}], key="key-2")
        assert another.status == 202, await another.text()

        await harness.client.app.shutdown()
        answers = await asyncio.wait_for(asyncio.gather(*holds), 5)
        assert all(answer.status != 503 for answer in answers)
        assert runtime.parked == 0


async def test_null_is_no_bound_and_a_reload_sets_one(
    make_harness: Any,
    held_provider: tuple[HeldProvider, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``limits.max_in_flight: null``: three submits in hand at once all reach the provider;
    after a reload to 1, a call arriving while one is in hand is refused overloaded."""
    provider, url = held_provider
    harness: Harness = await make_harness(
        upstream=url, config_changes={"limits": {"max_in_flight": None}}
    )
    calls = [asyncio.create_task(harness.submit(key=f"k{n}")) for n in range(3)]
    await provider.until_calls(3)
    provider.release.set()
    assert [answer.status for answer in await asyncio.gather(*calls)] == [202] * 3

    config = harness.client.app[RUNTIME].settings.path
    assert config is not None
    data = yaml.safe_load(config.read_text())
    data["limits"]["max_in_flight"] = 1
    config.write_text(yaml.safe_dump(data))
    for name, value in PROVIDER_ENV.items():
        monkeypatch.setenv(name, value)
    reloaded = await harness.client.post("/admin/reload", headers=OPS)
    assert reloaded.status == 200, await reloaded.text()
    provider.release.clear()
    in_hand = asyncio.create_task(harness.submit(key="k3"))
    await provider.until_calls(4)
    refused = await harness.submit(key="k4")
    assert (await refused.json())["type"] == "/problems/overloaded"
    provider.release.set()
    assert (await in_hand).status == 202
