"""policies/fal-queue.yaml driven by the official ``fal-client`` at its defaults, on virtual
time, against the demo provider's fal double (gateway/demo/pack/fal_queue.py): ``submit`` +
``status`` / ``get``, and ``subscribe``, which polls every 0.1 s. The routes name the app
(``/{owner}/{app}/requests/{id}``) besides the job id.

How fal-client is pointed at the gateway: it reads no base URL setting; its queue URL is the
module constant ``fal_client.client.QUEUE_URL_FORMAT``, built at import from the
``FAL_QUEUE_RUN_HOST`` environment variable as ``https://<host>/``. Against a gateway served
over TLS, ``FAL_QUEUE_RUN_HOST=gateway.example/p/fal-queue`` set before the import is the
whole configuration; this test's gateway is plain HTTP on loopback, so the test sets the
constant itself (the same value, ``http://``). The key is ``FAL_KEY``, sent as
``Authorization: Key <key>``: the agent sets it to its gateway token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fal_client
import fal_client.client
import pytest
from paced import assert_paced, shipped_polling
from test_sdk_agents import MAX_CALLS, Setup, gateway, polls_at, table

from conftest import AGENT_TOKEN

PROVIDER = "fal-queue"
APP = "fal-ai/fast-sdxl"
SCRIPT = [
    {"state": "IN_QUEUE", "position": 3, "until": 20},
    {"state": "IN_PROGRESS", "until": 60},
    {"state": "COMPLETED"},
]


@pytest.fixture(autouse=True)
def fal_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """fal-client's key is the agent's gateway token."""
    monkeypatch.setenv("FAL_KEY", AGENT_TOKEN)


def client(setup: Setup, monkeypatch: pytest.MonkeyPatch) -> fal_client.SyncClient:
    monkeypatch.setattr(fal_client.client, "QUEUE_URL_FORMAT", f"{setup.base}/p/{PROVIDER}/")
    return fal_client.SyncClient()


async def test_fal_submit_status_loop_and_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``submit`` answers URLs that lead back to the gateway; a naive ``status`` loop ends
    COMPLETED with no exception, queue positions in the answers it replays; ``get()`` then
    fetches the output through the gateway's result route."""
    async with gateway(tmp_path) as setup:
        setup.demo.default_scripts["fal-queue"] = SCRIPT
        fal, agent = client(setup, monkeypatch), setup.agent
        started = agent.clock.now

        def work() -> tuple[Any, list[Any], Any]:
            handle = fal.submit(APP, {"prompt": "a lighthouse at dusk"})
            seen = [handle.status()]
            while not isinstance(seen[-1], fal_client.Completed) and len(agent.calls) < MAX_CALLS:
                seen.append(handle.status())
            return handle, seen, handle.get()

        handle, seen, output = await agent.run(work)
        times = polls_at(setup.demo, handle.request_id)
    table("fal-client 1.0.3", "submit + naive status + get", agent, len(times))
    assert handle.status_url.startswith(f"{setup.base}/p/{PROVIDER}/{APP}/requests/")
    assert any(isinstance(s, fal_client.Queued) and s.position == 3 for s in seen)
    assert output["images"][0]["url"].startswith("https://v3.fal.media/")
    assert_paced(times, started, shipped_polling(PROVIDER))


async def test_fal_subscribe_at_default_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``subscribe`` (a status call every 0.1 s, then the result) returns the output with no
    exception; the provider polled on the policy's schedule."""
    async with gateway(tmp_path) as setup:
        setup.demo.default_scripts["fal-queue"] = SCRIPT
        fal, agent = client(setup, monkeypatch), setup.agent
        started = agent.clock.now
        output = await agent.run(lambda: fal.subscribe(APP, {"prompt": "a lighthouse"}))
        (job,) = {e["job_id"] for e in setup.demo.log if e["kind"] == "status"}
        times = polls_at(setup.demo, job)
    table("fal-client 1.0.3", "subscribe", agent, len(times))
    assert output["images"][0]["url"].startswith("https://v3.fal.media/")
    assert_paced(times, started, shipped_polling(PROVIDER))


async def test_fal_app_with_a_sub_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An app's endpoint (``fal-ai/flux/dev``, a submit of the policy's ``more_paths``) is
    submitted there; its URLs name ``fal-ai/flux/requests/...``, where the gateway polls,
    and ``subscribe`` returns the output with no exception."""
    async with gateway(tmp_path) as setup:
        setup.demo.default_scripts["fal-queue"] = SCRIPT
        fal, agent = client(setup, monkeypatch), setup.agent
        started = agent.clock.now
        output = await agent.run(lambda: fal.subscribe("fal-ai/flux/dev", {"prompt": "a fox"}))
        (job,) = {e["job_id"] for e in setup.demo.log if e["kind"] == "status"}
        times = polls_at(setup.demo, job)
    table("fal-client 1.0.3", "subscribe, app with a sub-path", agent, len(times))
    assert output["images"][0]["url"].startswith("https://v3.fal.media/")
    assert_paced(times, started, shipped_polling(PROVIDER))
