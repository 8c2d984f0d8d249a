"""policies/vertex-batch-prediction.yaml driven by the real ``google-genai`` client against
Vertex AI (``vertexai=True``) at its default settings, only its base URL changed and the
gateway token as its OAuth credential (google-genai sends it as ``Authorization: Bearer``),
against the demo provider's double of Vertex AI batch prediction
(gateway/demo/pack/vertex_batch_prediction.py), on virtual time with the policy's
production schedule (tests/sdk/cloud_agents.py).

google-genai has no wait helper for batch jobs: the agent loops on ``batches.get`` until
``job.done``. The SDK's default API version against Vertex is ``v1beta1`` and the reference's
is ``v1``: both are served, the provider is always sent ``v1``. The agent names its project
by number: Vertex names jobs with the project number, the gateway keys the operation by
that name, and google-genai builds the status path from its own ``project`` and the job's
trailing id, so a client configured with the project id would ask for a name the gateway
never saw (docs/providers.md, "What is not covered"). The predictions themselves are in
Cloud Storage (another host); what the SDK fetches through the gateway is the final job,
whose ``outputInfo`` names them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import google.oauth2.credentials
import pytest
from cloud_agents import Setup, assert_paced, gateway, phases, polls_at, row
from google import genai
from google.genai import errors, types

from gateway.demo.pack.vertex_batch_prediction import FAMILY, PROJECT_NUMBER

from conftest import AGENT_TOKEN, OPERATOR_TOKEN, PROVIDER_KEY

PROVIDER = "vertex-batch-prediction"
SOURCE = "gs://team-in/requests.jsonl"
SCRIPT = phases(
    "JOB_STATE_QUEUED", "JOB_STATE_PENDING", "JOB_STATE_RUNNING", last="JOB_STATE_SUCCEEDED",
    each=1200,
)  # fmt: skip


def vertex(setup: Setup, api_version: str | None = None) -> genai.Client:
    """google-genai against Vertex at its defaults: the gateway as base URL, the gateway
    token as the OAuth access token."""
    return genai.Client(
        vertexai=True,
        project=PROJECT_NUMBER,
        location="us-central1",
        credentials=google.oauth2.credentials.Credentials(AGENT_TOKEN),  # type: ignore[no-untyped-call]
        http_options=types.HttpOptions(
            base_url=f"{setup.base}/p/{PROVIDER}", api_version=api_version
        ),
    )


def loop(setup: Setup, client: genai.Client) -> types.BatchJob:
    """Create, then get until done; an error is caught, counted, and the loop goes on."""
    agent = setup.agent
    job = client.batches.create(model="gemini-2.5-flash", src=SOURCE)
    while not job.done and not agent.busy:
        try:
            job = client.batches.get(name=str(job.name))
        except errors.APIError as error:
            agent.caught(error)
    return job


@pytest.mark.parametrize("api_version", [None, "v1"], ids=["sdk-default", "v1"])
async def test_naive_loop_through_an_hour_long_vertex_batch(
    tmp_path: Path, api_version: Any
) -> None:
    """A naive batches.get loop at google-genai's defaults (and pinned to v1) sees an
    hour-long Vertex batch job to JOB_STATE_SUCCEEDED with no exception, its output
    directory named, the provider polled on v1 no sooner than the policy's schedule allows
    and sent the gateway's token, never the agent's."""
    async with gateway(tmp_path, scripts={FAMILY.name: SCRIPT}, step=5.0) as setup:
        client, agent = vertex(setup, api_version), setup.agent
        started = agent.clock.now
        job = await agent.run(lambda: loop(setup, client))
        record = await setup.record(PROVIDER, str(job.name))
        times = polls_at(setup.demo, str(job.name))
        polling = setup.polling(PROVIDER)
        elapsed = agent.clock.now - started
    name = "naive batches.get (default api version)" if api_version is None else "naive, v1"
    row(PROVIDER, "google-genai (vertexai)", name, agent, len(times), elapsed)
    assert agent.exceptions == []
    assert job.state == types.JobState.JOB_STATE_SUCCEEDED
    assert record.outcome.value == "succeeded"
    assert str(job.name).startswith(f"projects/{PROJECT_NUMBER}/locations/us-central1/")
    assert job.output_info is not None
    assert (
        job.output_info.gcs_output_directory == "gs://team-in/requests/dest/prediction-model-demo"
    )
    assert_paced(times, started, polling)
    sent = [e for e in setup.demo.log if e["job_id"] == job.name]
    assert all(e["path"].startswith("/v1/projects/") for e in sent)
    assert all(e["headers"]["Authorization"] == f"Bearer {PROVIDER_KEY}" for e in sent)
    if api_version is None:  # what the SDK sent by default
        assert any(f"/p/{PROVIDER}/v1beta1/projects/" in call for call in agent.calls)


async def test_an_operator_cancel_ends_the_job_cancelled(tmp_path: Path) -> None:
    """An operator's cancel is sent as POST /v1/{name}:cancel; the job goes CANCELLING
    (still pending) and then CANCELLED, the outcome the agent's loop ends on."""
    async with gateway(tmp_path, scripts={FAMILY.name: [{"state": "JOB_STATE_RUNNING"}]}) as setup:
        client, agent = vertex(setup, "v1"), setup.agent  # path forms: the first test's business
        job = await agent.run(lambda: client.batches.create(model="gemini-2.5-flash", src=SOURCE))
        record = await setup.record(PROVIDER, str(job.name))
        answer = await setup.client.post(
            f"/admin/operations/{record.operation_id}/cancel",
            json={"reason": "wrong model"},
            headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
        )
        assert answer.status == 200, await answer.text()

        def until_done() -> types.BatchJob:
            current = job
            while not current.done and not agent.busy:
                current = client.batches.get(name=str(current.name))
            return current

        final = await agent.run(until_done)
        record = await setup.record(PROVIDER, str(job.name))
    cancels = [e["path"] for e in setup.demo.log if e["kind"] == "cancel"]
    assert cancels == [f"/v1/{job.name}:cancel"]
    assert final.state == types.JobState.JOB_STATE_CANCELLED
    assert record.outcome.value == "cancelled"


async def test_a_success_without_its_output_info_is_not_a_success(tmp_path: Path) -> None:
    """A job reported SUCCEEDED with no outputInfo stays pending (the agent sees a pending
    state, never a success whose predictions cannot be found) until outputInfo is there;
    then the agent's loop ends with it."""
    script = [{"state": "JOB_STATE_RUNNING", "until": 600}]
    script.append({"state": "JOB_STATE_SUCCEEDED", "output_info": False, "until": 900})
    script.append({"state": "JOB_STATE_SUCCEEDED"})
    async with gateway(tmp_path, scripts={FAMILY.name: script}) as setup:
        client, agent = vertex(setup, "v1"), setup.agent  # path forms: the first test's business
        seen: list[Any] = []

        def run() -> str:
            job = client.batches.create(model="gemini-2.5-flash", src=SOURCE)
            while not job.done and not agent.exceptions and not agent.busy:
                try:
                    job = client.batches.get(name=str(job.name))
                    seen.append(job)
                except errors.APIError as error:
                    agent.caught(error)
            return str(job.name)

        name = await agent.run(run)
        record = await setup.record(PROVIDER, name)
    assert record.outcome.value == "succeeded"
    assert agent.exceptions == []
    assert all(j.dest is not None for j in seen if j.done)
