"""policies/mistral-batch.yaml driven by the official ``mistralai`` SDK at its defaults (only
server_url changed, the gateway token as its API key; the SDK retries nothing by default)
through a real gateway, against the pack's Mistral double
(gateway/demo/pack/mistral_batch.py), on the shipped policy's production schedule in
virtual time. The SDK has no wait helper for batch jobs: the agent is a naive
``batch.jobs.get`` loop. The SDK cannot add a field to a request body, so the double's
script for the job is set on the demo provider (``default_scripts``)."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from mistralai.client import Mistral
from mistralai.client.errors import MistralError
from virtual_time import Setup, assert_paced, held, pack_gateway, provider_keys, table

from conftest import AGENT_TOKEN, PROVIDER_KEY

PROVIDER = "mistral-batch"
TERMINAL = {"SUCCESS", "FAILED", "TIMEOUT_EXCEEDED", "CANCELLED"}
INPUT = b'{"custom_id": "request-1", "body": {"max_tokens": 8, "messages": []}}\n'


def client(setup: Setup) -> Mistral:
    return Mistral(api_key=AGENT_TOKEN, server_url=setup.url(PROVIDER))


def naive_job(setup: Setup, sdk: Mistral) -> Any:
    """Upload the input, create the job, get it in a loop with no sleep until it ends."""
    agent = setup.agent
    uploaded = sdk.files.upload(
        file={"file_name": "input.jsonl", "content": INPUT}, purpose="batch"
    )
    job: Any = sdk.batch.jobs.create(
        input_files=[uploaded.id], endpoint="/v1/chat/completions", model="mistral-small-latest"
    )
    while job.status not in TERMINAL and agent.busy:
        try:
            job = sdk.batch.jobs.get(job_id=job.id)
        except MistralError as problem:
            agent.caught(problem)
    return job


async def test_mistral_sdk_runs_a_batch_job_on_the_shipped_schedule(tmp_path: Path) -> None:
    """files.upload, batch.jobs.create, a naive batch.jobs.get loop through 40 minutes of
    QUEUED / RUNNING, and files.download(output_file) all work at the SDK's defaults,
    which retry nothing (a 429 would be an exception): no exception, the provider polled
    within the shipped schedule, the output downloaded through the counted result route."""
    async with pack_gateway(tmp_path) as setup:
        setup.demo.default_scripts[PROVIDER] = [
            held("QUEUED", 300),
            held("RUNNING", 2400),
            {"state": "SUCCESS"},
        ]
        sdk, agent = client(setup), setup.agent
        started = agent.clock.now

        def work() -> tuple[Any, bytes | None]:
            job = naive_job(setup, sdk)
            output = None
            if job.output_file:
                try:
                    output = sdk.files.download(file_id=job.output_file).read()
                except MistralError as problem:
                    agent.caught(problem)
            return job, output

        job, output = await agent.run(work)
        times = setup.polls(job.id)
        record = await setup.record(PROVIDER, job.id)
    sdk_name = f"mistralai {version('mistralai')}"
    table(PROVIDER, sdk_name, "naive batch.jobs.get", setup, len(times), started)
    assert agent.exceptions == []
    assert job.status == "SUCCESS" and output is not None and b"request-1" in output
    assert record.outcome.value == "succeeded" and record.result_fetches == 1
    assert_paced(PROVIDER, times, started, agent.clock.now)
    provider_keys(setup, "Authorization", f"Bearer {PROVIDER_KEY}")


@pytest.mark.parametrize(
    ("path", "outcome"),
    [
        (["FAILED"], "failed"),
        (["TIMEOUT_EXCEEDED"], "expired"),
        (["CANCELLATION_REQUESTED", "CANCELLED"], "cancelled"),
    ],
)
async def test_mistral_terminal_statuses_end_the_wait(
    tmp_path: Path, path: list[str], outcome: str
) -> None:
    """FAILED, TIMEOUT_EXCEEDED (the job ran past its timeout_hours) and CANCELLED (after
    CANCELLATION_REQUESTED) end the SDK's loop and the operation with their own outcome,
    no escalation, no exception."""
    script = [held("RUNNING", 600)]
    script += [held(state, 600 + 300 * (n + 1)) for n, state in enumerate(path[:-1])]
    script.append({"state": path[-1]})
    async with pack_gateway(tmp_path) as setup:
        setup.demo.default_scripts[PROVIDER] = script
        sdk, agent = client(setup), setup.agent
        job = await agent.run(lambda: naive_job(setup, sdk))
        record = await setup.record(PROVIDER, job.id)
    assert agent.exceptions == []
    assert job.status == path[-1] and record.outcome.value == outcome


async def test_mistral_cancel_is_an_operator_decision(tmp_path: Path) -> None:
    """batch.jobs.cancel from the agent is refused (an SDKError with the gateway's 403);
    an operator's cancel reaches POST /v1/batch/jobs/{id}/cancel once and the SDK's loop
    then ends with CANCELLED."""
    async with pack_gateway(tmp_path) as setup:
        setup.demo.default_scripts[PROVIDER] = [{"state": "RUNNING"}]
        sdk, agent = client(setup), setup.agent
        job: Any = await agent.run(
            lambda: sdk.batch.jobs.create(
                input_files=["f-1"], endpoint="/v1/chat/completions", model="m"
            )
        )
        with pytest.raises(MistralError) as refused:
            await agent.run(lambda: sdk.batch.jobs.cancel(job_id=job.id))
        assert refused.value.status_code == 403
        assert await setup.operator_cancel(PROVIDER, job.id) == 200

        def until_done() -> Any:
            seen: Any = sdk.batch.jobs.get(job_id=job.id)
            while seen.status not in TERMINAL and agent.busy:
                seen = sdk.batch.jobs.get(job_id=job.id)
            return seen

        ended = await agent.run(until_done)
    assert ended.status == "CANCELLED"
    assert [(e["api"], e["path"]) for e in setup.calls("cancel")] == [
        (PROVIDER, f"/v1/batch/jobs/{job.id}/cancel")
    ]
