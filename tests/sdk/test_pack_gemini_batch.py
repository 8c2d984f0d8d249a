"""policies/gemini-batch.yaml driven by the real ``google-genai`` client at its default
settings, only its base URL changed and the gateway token as its API key
(``genai.Client(api_key=<token>, http_options=HttpOptions(base_url=...))``), against the
demo provider's double of the Gemini Batch API (gateway/demo/pack/gemini_batch.py), on
virtual time with the policy's production schedule (tests/sdk/cloud_agents.py).

google-genai has no wait helper for batches: the agent is the guide's loop,
``while not job.done: job = client.batches.get(name=job.name)``, without its sleep. The
SDK's default API version (``v1`` in google-genai 3.x) and ``v1beta`` (the reference's)
are both served; the provider is always sent ``v1beta``. The results of inlined requests
come back in the batch itself (``job.dest.inlined_responses``), fetched by the SDK's own
``batches.get`` through the gateway."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cloud_agents import Setup, assert_paced, gateway, phases, polls_at, row
from google import genai
from google.genai import errors, types

from gateway.demo.pack.gemini_batch import FAMILY

from conftest import AGENT_TOKEN, PROVIDER_KEY

PROVIDER = "gemini-batch"
REQUESTS = [
    {"contents": [{"parts": [{"text": "Summarise the report"}], "role": "user"}]},
    {"contents": [{"parts": [{"text": "List its open questions"}], "role": "user"}]},
]
SCRIPT = phases(
    "BATCH_STATE_PENDING", "BATCH_STATE_RUNNING", last="BATCH_STATE_SUCCEEDED", each=1800
)


def gemini(setup: Setup, api_version: str | None = None) -> genai.Client:
    """google-genai at its defaults, the gateway as base URL, its token as the API key."""
    options = types.HttpOptions(base_url=f"{setup.base}/p/{PROVIDER}", api_version=api_version)
    return genai.Client(api_key=AGENT_TOKEN, http_options=options)


def guide_loop(setup: Setup, client: genai.Client) -> types.BatchJob:
    """The batch guide's loop without its sleep: create, then get until done; an error is
    caught, counted, and the loop goes on."""
    agent = setup.agent
    job = client.batches.create(
        model="gemini-2.5-flash", src=REQUESTS, config={"display_name": "report-questions"}
    )
    while not job.done and not agent.busy:
        try:
            job = client.batches.get(name=str(job.name))
        except errors.APIError as error:
            agent.caught(error)
    return job


@pytest.mark.parametrize("api_version", [None, "v1beta"], ids=["sdk-default", "v1beta"])
async def test_guide_loop_through_an_hour_long_batch(tmp_path: Path, api_version: Any) -> None:
    """The guide's loop at google-genai's defaults (and pinned to v1beta) sees an hour-long
    batch to JOB_STATE_SUCCEEDED with no exception, its inlined responses in hand, the
    provider polled on v1beta no sooner than the policy's schedule allows and sent the
    gateway's key, never the agent's token."""
    async with gateway(tmp_path, scripts={FAMILY.name: SCRIPT}, step=5.0) as setup:
        client, agent = gemini(setup, api_version), setup.agent
        started = agent.clock.now
        job = await agent.run(lambda: guide_loop(setup, client))
        record = await setup.record(PROVIDER, str(job.name))
        times = polls_at(setup.demo, str(job.name))
        polling = setup.polling(PROVIDER)
        elapsed = agent.clock.now - started
    loop = "naive batches.get (default api version)" if api_version is None else "naive, v1beta"
    row(PROVIDER, "google-genai", loop, agent, len(times), elapsed)
    assert agent.exceptions == []
    assert job.state == types.JobState.JOB_STATE_SUCCEEDED
    assert record.outcome.value == "succeeded"
    assert job.dest is not None and job.dest.inlined_responses is not None
    texts = [r.response.text for r in job.dest.inlined_responses if r.response is not None]
    assert texts == ["demo answer 1", "demo answer 2"]
    assert_paced(times, started, polling)
    sent = [e for e in setup.demo.log if e["job_id"] == job.name]
    assert all(e["path"].startswith("/v1beta/") for e in sent)
    assert all(e["headers"]["x-goog-api-key"] == PROVIDER_KEY for e in sent)
    assert AGENT_TOKEN not in str([e["headers"] for e in setup.demo.log])
    if api_version is None:  # what the SDK sent by default
        assert any(call.startswith(f"GET /p/{PROVIDER}/v1/batches/") for call in agent.calls)


async def test_succeeded_before_the_output_exists_is_not_a_success(tmp_path: Path) -> None:
    """A batch the API reports SUCCEEDED with no output yet is never recorded, nor shown to
    the agent, as a success: it stays pending (the agent sees a pending state) and polling
    goes on until the output is attached; then the agent's loop ends with its responses."""
    script = [
        {"state": "BATCH_STATE_RUNNING", "until": 600},
        {"state": "BATCH_STATE_SUCCEEDED", "output": False, "until": 900},
        {"state": "BATCH_STATE_SUCCEEDED"},
    ]
    async with gateway(tmp_path, scripts={FAMILY.name: script}) as setup:
        client, agent = gemini(setup), setup.agent
        seen: list[types.BatchJob] = []

        def loop() -> types.BatchJob:
            job = client.batches.create(model="gemini-2.5-flash", src=REQUESTS)
            while not job.done and not agent.exceptions and not agent.busy:
                try:
                    job = client.batches.get(name=str(job.name))
                    seen.append(job)
                except errors.APIError as error:
                    agent.caught(error)
            return job

        job = await agent.run(loop)
        record = await setup.record(PROVIDER, str(job.name))
    assert record.outcome.value == "succeeded"
    assert agent.exceptions == []
    assert job.state == types.JobState.JOB_STATE_SUCCEEDED and job.dest is not None
    assert all(j.dest is not None for j in seen if j.state == types.JobState.JOB_STATE_SUCCEEDED)
