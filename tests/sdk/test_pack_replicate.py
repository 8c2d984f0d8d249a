"""policies/replicate.yaml driven by the official ``replicate`` SDK at its defaults (only
``base_url`` changed, the gateway token as its API token), on virtual time, against the demo
provider's Replicate double (gateway/demo/pack/replicate.py), with the policy's schedule as
shipped: ``predictions.create`` then the SDK's own ``wait()`` (every 0.5 s) or a naive
``predictions.get`` loop, and ``replicate.run``. The SDK's create body takes no extra field,
so the double's jobs follow ``default_scripts``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import replicate
from paced import assert_paced, operator_headers, shipped_polling
from pydantic import v1 as pydantic
from replicate.exceptions import ReplicateError
from test_sdk_agents import MAX_CALLS, Setup, gateway, polls_at, table

from gateway.flow.runtime import RUNTIME

from conftest import AGENT_TOKEN, PROVIDER_KEY

PROVIDER = "replicate"
VERSION = "5599ed30703defd1d160a25a63321b4dec97101d98b4674bcc56e41f62f35637"
DONE = {"succeeded", "failed", "canceled", "aborted"}
SCRIPT = [
    {"state": "starting", "until": 45},
    {"state": "processing", "until": 120},
    {"state": "succeeded"},
]


def client(setup: Setup) -> replicate.Client:
    return replicate.Client(api_token=AGENT_TOKEN, base_url=f"{setup.base}/p/{PROVIDER}")


def create(rc: replicate.Client) -> Any:
    return rc.predictions.create(version=VERSION, input={"prompt": "an astronaut on a horse"})


def provider_headers_ok(setup: Setup) -> None:
    for entry in setup.demo.log:
        assert entry["headers"]["Authorization"] == f"Bearer {PROVIDER_KEY}"
        assert "Prefer" not in entry["headers"]
        assert AGENT_TOKEN not in str(entry["headers"])


async def test_replicate_wait_at_default_settings(tmp_path: Path) -> None:
    """``predictions.create(...)`` then ``prediction.wait()`` (a reload every 0.5 s) ends
    succeeded with the output URLs untouched, no exception, the provider polled on the
    policy's schedule; urls.get and urls.cancel lead to the gateway, urls.stream does not."""
    async with gateway(tmp_path) as setup:
        setup.demo.default_scripts["replicate"] = SCRIPT
        rc, agent = client(setup), setup.agent
        started = agent.clock.now

        def work() -> Any:
            prediction = create(rc)
            prediction.wait()
            return prediction

        prediction = await agent.run(work)
        times = polls_at(setup.demo, prediction.id)
    table("replicate 1.0.7", "predictions.create + wait()", agent, len(times))
    assert prediction.status == "succeeded"
    assert prediction.output == [f"https://replicate.delivery/xezq/{prediction.id}/out-0.webp"]
    gateway_base = f"{setup.base}/p/{PROVIDER}/v1/predictions/{prediction.id}"
    assert prediction.urls["get"] == gateway_base
    assert prediction.urls["cancel"] == f"{gateway_base}/cancel"
    assert prediction.urls["stream"].startswith("https://stream.replicate.com/")
    assert_paced(times, started, shipped_polling(PROVIDER))
    assert len(agent.calls) > 2 * len(times)
    provider_headers_ok(setup)


async def test_replicate_naive_get_loop_at_default_settings(tmp_path: Path) -> None:
    """A naive ``predictions.get`` loop with no sleep ends succeeded with no exception,
    early calls answered with the last prediction, the provider polled on schedule."""
    async with gateway(tmp_path) as setup:
        setup.demo.default_scripts["replicate"] = SCRIPT
        rc, agent = client(setup), setup.agent
        started = agent.clock.now

        def work() -> Any:
            prediction = create(rc)
            while prediction.status not in DONE and len(agent.calls) < MAX_CALLS:
                try:
                    prediction = rc.predictions.get(prediction.id)
                except ReplicateError as error:
                    agent.caught(error)
            return prediction

        prediction = await agent.run(work)
        times = polls_at(setup.demo, prediction.id)
    table("replicate 1.0.7", "naive predictions.get", agent, len(times))
    assert agent.exceptions == []
    assert prediction.status == "succeeded" and prediction.output
    assert_paced(times, started, shipped_polling(PROVIDER))


async def test_replicate_run_at_default_settings(tmp_path: Path) -> None:
    """``replicate.run("owner/name:version", input)``, which first reads the version
    through the public passthrough, sends ``Prefer: wait`` on the create and then polls
    every 0.5 s, returns the output with no exception; the provider polled on schedule."""
    async with gateway(tmp_path) as setup:
        setup.demo.default_scripts["replicate"] = SCRIPT
        rc, agent = client(setup), setup.agent
        started = agent.clock.now
        output = await agent.run(
            lambda: rc.run(f"demo/flux-schnell:{VERSION}", input={"prompt": "a horse"})
        )
        (job,) = {e["job_id"] for e in setup.demo.log if e["kind"] == "status"}
        times = polls_at(setup.demo, job)
    table("replicate 1.0.7", "replicate.run (version lookup, Prefer: wait)", agent, len(times))
    assert agent.exceptions == []
    assert_paced(times, started, shipped_polling(PROVIDER))
    urls = [str(item) for item in output]
    assert len(urls) == 1 and urls[0].startswith("https://replicate.delivery/xezq/")


async def test_replicate_aborted_ends_at_the_gateway_though_the_sdk_cannot_read_it(
    tmp_path: Path,
) -> None:
    """A prediction whose deadline passed before it started reports ``aborted``: the
    operation ends expired. replicate 1.0.7 does not know that status (its model refuses
    it with a pydantic ValidationError, and ``wait()`` would not stop on it); an agent that
    keeps asking is answered from the record, and none of those calls reaches Replicate."""
    async with gateway(tmp_path) as setup:
        setup.demo.default_scripts["replicate"] = [
            {"state": "starting", "until": 60},
            {"state": "aborted"},
        ]
        rc, agent = client(setup), setup.agent

        def work() -> tuple[str, list[str]]:
            prediction, refused = create(rc), []
            while len(refused) < 50 and len(agent.calls) < MAX_CALLS:
                try:
                    prediction = rc.predictions.get(prediction.id)
                except pydantic.ValidationError as error:  # the SDK's own model
                    refused.append(str(error).splitlines()[1])
            return prediction.id, refused

        job, refused = await agent.run(work)
        record = await setup.client.app[RUNTIME].store.find("team-a", PROVIDER, job)
        kinds = [e["kind"] for e in setup.demo.log if e["job_id"] == job]
    table("replicate 1.0.7", "naive get on aborted (SDK refuses it)", agent, kinds.count("status"))
    assert refused == ["status"] * 50
    assert record.outcome.value == "expired" and record.last_known_state == "aborted"
    assert kinds.count("status") == record.status_requests_used  # the 49 after: the record
    provider_headers_ok(setup)


async def test_replicate_cancel_by_an_operator(tmp_path: Path) -> None:
    """The agent's ``predictions.cancel`` is 403 approval-required; an operator's cancel
    reaches Replicate once and ``wait()`` then ends with the prediction canceled."""
    async with gateway(tmp_path) as setup:
        setup.demo.default_scripts["replicate"] = [{"state": "processing"}]
        rc, agent = client(setup), setup.agent
        prediction = await agent.run(lambda: create(rc))
        with pytest.raises(ReplicateError) as refused:
            await agent.run(lambda: rc.predictions.cancel(prediction.id))
        assert refused.value.status == 403
        record = await setup.client.app[RUNTIME].store.find("team-a", PROVIDER, prediction.id)
        answer = await setup.client.post(
            f"/admin/operations/{record.operation_id}/cancel",
            json={"reason": "the user left"},
            headers=operator_headers(),
        )
        assert answer.status == 200, await answer.text()
        await agent.run(prediction.wait)
        record = await setup.client.app[RUNTIME].store.find("team-a", PROVIDER, prediction.id)
        kinds = [e["kind"] for e in setup.demo.log if e["job_id"] == prediction.id]
    table("replicate 1.0.7", "wait() after an operator's cancel", agent, kinds.count("status"))
    assert prediction.status == "canceled" and record.outcome.value == "cancelled"
    assert kinds.count("cancel") == 1
