"""policies/openai-fine-tuning.yaml driven by the official ``openai`` SDK at its defaults
(only the base URL changed, the gateway token as its API key) through a real gateway,
against the pack's fine-tuning double (gateway/demo/pack/openai_fine_tuning.py), on the
shipped policy's production schedule in virtual time. The SDK has no wait helper for
fine-tuning jobs: the agent is a naive ``fine_tuning.jobs.retrieve`` loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
from virtual_time import Setup, assert_paced, held, pack_gateway, provider_keys, table

from conftest import AGENT_TOKEN, PROVIDER_KEY

PROVIDER = "openai-fine-tuning"
TERMINAL = {"succeeded", "failed", "cancelled"}
TRAINING = (
    b'{"messages": [{"role": "user", "content": "hi"},'
    b' {"role": "assistant", "content": "hello"}]}\n'
)


def client(setup: Setup) -> openai.OpenAI:
    return openai.OpenAI(base_url=setup.url(PROVIDER, "/v1"), api_key=AGENT_TOKEN)


def naive_job(setup: Setup, sdk: openai.OpenAI, script: list[dict[str, Any]]) -> Any:
    """Upload the training file, create the job, retrieve it in a loop with no sleep."""
    agent = setup.agent
    training = sdk.files.create(file=("train.jsonl", TRAINING), purpose="fine-tune")
    job: Any = sdk.fine_tuning.jobs.create(
        model="gpt-4o-mini-2024-07-18",
        training_file=training.id,
        extra_body={"demo_script": script},
    )
    while job.status not in TERMINAL and agent.busy:
        try:
            job = sdk.fine_tuning.jobs.retrieve(job.id)
        except openai.APIError as problem:
            agent.caught(problem)
    return job


async def test_openai_sdk_fine_tunes_on_the_shipped_schedule(tmp_path: Path) -> None:
    """files.create, fine_tuning.jobs.create, a naive retrieve loop through an hour of
    validating_files / queued / running, and files.content(job.result_files[0]) all work
    at the SDK's defaults: no exception, the provider polled within the shipped schedule,
    the results file downloaded through the gateway's counted result route."""
    script = [held("validating_files", 60), held("queued", 600), held("running", 3600)]
    script.append({"state": "succeeded"})
    async with pack_gateway(tmp_path) as setup:
        sdk, agent = client(setup), setup.agent
        started = agent.clock.now

        def work() -> tuple[Any, bytes | None]:
            job = naive_job(setup, sdk, script)
            results = None
            if job.result_files:
                try:
                    results = sdk.files.content(job.result_files[0]).content
                except openai.APIError as problem:
                    agent.caught(problem)
            return job, results

        job, results = await agent.run(work)
        times = setup.polls(job.id)
        record = await setup.record(PROVIDER, job.id)
    loop = "naive fine_tuning.jobs.retrieve"
    table(PROVIDER, f"openai {openai.__version__}", loop, setup, len(times), started)
    assert agent.exceptions == []
    assert job.status == "succeeded" and job.fine_tuned_model.startswith("ft:gpt-4o-mini")
    assert results is not None and results.startswith(b"step,train_loss")
    assert record.outcome.value == "succeeded" and record.result_fetches == 1
    assert_paced(PROVIDER, times, started, agent.clock.now)
    provider_keys(setup, "Authorization", f"Bearer {PROVIDER_KEY}")


async def test_a_paused_fine_tuning_job_is_waited_for(tmp_path: Path) -> None:
    """pausing and paused (in the API reference, not in the SDK's type) keep the wait
    going: the job resumes and succeeds, with no exception and no escalation."""
    script = [held("running", 300), held("pausing", 360), held("paused", 1800)]
    script += [held("running", 2400), {"state": "succeeded"}]
    async with pack_gateway(tmp_path) as setup:
        sdk, agent = client(setup), setup.agent
        job = await agent.run(lambda: naive_job(setup, sdk, script))
        record = await setup.record(PROVIDER, job.id)
    assert agent.exceptions == []
    assert job.status == "succeeded" and record.outcome.value == "succeeded"
    assert record.last_known_state == "succeeded"


@pytest.mark.parametrize("last", ["failed", "cancelled"])
async def test_failed_and_cancelled_jobs_end_the_wait(tmp_path: Path, last: str) -> None:
    """failed (with its error) and cancelled end the SDK's loop and the operation with
    their own outcome, not an escalation; a failed job has no result to fetch."""
    script = [held("running", 600), {"state": last}]
    async with pack_gateway(tmp_path) as setup:
        sdk, agent = client(setup), setup.agent
        job = await agent.run(lambda: naive_job(setup, sdk, script))
        record = await setup.record(PROVIDER, job.id)
    assert agent.exceptions == []
    assert job.status == last and record.outcome.value == last
    if last == "failed":
        assert job.error.code == "invalid_training_file"
