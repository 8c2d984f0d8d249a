"""policies/fireworks-batch.yaml driven by the official ``fireworks-ai`` SDK at its defaults
(only the base URL changed, the gateway token as its API key, an account id) through a
real gateway, against the pack's Fireworks double (gateway/demo/pack/fireworks_batch.py),
on the shipped policy's production schedule in virtual time. The SDK has no wait helper
for batch inference jobs: the agent is a naive ``batch_inference_jobs.get`` loop. The
job's output is a dataset whose download the gateway does not route (docs/providers.md):
the test checks the output dataset named in the final answer instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fireworks
import pytest
from virtual_time import Setup, assert_paced, held, pack_gateway, provider_keys, table

from conftest import AGENT_TOKEN, PROVIDER_KEY

PROVIDER = "fireworks-batch"
ACCOUNT = "demo-account"
# the job states that end a job, by the reference; hand-written clients often stop at
# the first four and poll a paused or deleted job forever
ENDED = {
    "JOB_STATE_COMPLETED",
    "JOB_STATE_FAILED",
    "JOB_STATE_EXPIRED",
    "JOB_STATE_CANCELLED",
    "JOB_STATE_EARLY_STOPPED",
    "JOB_STATE_DELETING",
    "JOB_STATE_DELETING_CLEANING_UP",
}
HAND_WRITTEN = {"JOB_STATE_COMPLETED", "JOB_STATE_FAILED", "JOB_STATE_EXPIRED"}


def client(setup: Setup) -> fireworks.Fireworks:
    return fireworks.Fireworks(
        base_url=setup.url(PROVIDER), api_key=AGENT_TOKEN, account_id=ACCOUNT
    )


def create(sdk: fireworks.Fireworks, script: list[dict[str, Any]]) -> tuple[Any, str]:
    job = sdk.batch_inference_jobs.create(
        model="accounts/fireworks/models/llama-v3p1-8b-instruct",
        input_dataset_id=f"accounts/{ACCOUNT}/datasets/batch-input",
        output_dataset_id=f"accounts/{ACCOUNT}/datasets/batch-output",
        extra_body={"demo_script": script},
    )
    assert job.name is not None
    return job, job.name.rsplit("/", 1)[1]


def naive_job(
    setup: Setup, sdk: fireworks.Fireworks, script: list[dict[str, Any]], ended: set[str]
) -> Any:
    """Create a job and get it in a loop with no sleep until its state is in ``ended``."""
    agent = setup.agent
    job, short = create(sdk, script)
    while job.state not in ended and agent.busy:
        try:
            job = sdk.batch_inference_jobs.get(short)
        except fireworks.APIError as problem:
            agent.caught(problem)
    return job


async def test_fireworks_sdk_runs_a_batch_job_on_the_shipped_schedule(tmp_path: Path) -> None:
    """batch_inference_jobs.create and a naive batch_inference_jobs.get loop through 40
    minutes of VALIDATING / PENDING / RUNNING / WRITING_RESULTS end with the completed job
    naming its output dataset: no exception, the job's resource name (several segments)
    polled within the shipped schedule."""
    script = [held("JOB_STATE_VALIDATING", 120), held("JOB_STATE_PENDING", 600)]
    script += [held("JOB_STATE_RUNNING", 2300), held("JOB_STATE_WRITING_RESULTS", 2400)]
    script.append({"state": "JOB_STATE_COMPLETED"})
    async with pack_gateway(tmp_path) as setup:
        sdk, agent = client(setup), setup.agent
        started = agent.clock.now
        job = await agent.run(lambda: naive_job(setup, sdk, script, ENDED))
        times = setup.polls(job.name)
        record = await setup.record(PROVIDER, job.name)
    loop = "naive batch_inference_jobs.get"
    table(PROVIDER, f"fireworks-ai {fireworks.__version__}", loop, setup, len(times), started)
    assert agent.exceptions == []
    assert job.state == "JOB_STATE_COMPLETED"
    assert job.output_dataset_id == f"accounts/{ACCOUNT}/datasets/batch-output"
    assert record.outcome.value == "succeeded"
    assert_paced(PROVIDER, times, started, agent.clock.now)
    provider_keys(setup, "Authorization", f"Bearer {PROVIDER_KEY}")


async def test_a_paused_fireworks_job_is_waited_for(tmp_path: Path) -> None:
    """JOB_STATE_PAUSED (waiting on capacity; it resumes by itself) keeps the wait going:
    the job resumes and completes, no exception, no escalation."""
    script = [held("JOB_STATE_RUNNING", 600), held("JOB_STATE_PAUSED", 2400)]
    script += [held("JOB_STATE_RUNNING", 3000), {"state": "JOB_STATE_COMPLETED"}]
    async with pack_gateway(tmp_path) as setup:
        sdk, agent = client(setup), setup.agent
        job = await agent.run(lambda: naive_job(setup, sdk, script, ENDED))
        record = await setup.record(PROVIDER, job.name)
    assert agent.exceptions == []
    assert job.state == "JOB_STATE_COMPLETED" and record.outcome.value == "succeeded"


@pytest.mark.parametrize(
    ("last", "outcome"),
    [
        ("JOB_STATE_FAILED", "failed"),
        ("JOB_STATE_EARLY_STOPPED", "failed"),
        ("JOB_STATE_EXPIRED", "expired"),
        ("JOB_STATE_CANCELLED", "cancelled"),
        ("JOB_STATE_DELETING", "cancelled"),
        ("JOB_STATE_DELETING_CLEANING_UP", "cancelled"),
    ],
)
async def test_every_ending_state_ends_the_operation(
    tmp_path: Path, last: str, outcome: str
) -> None:
    """Each state that ends a job ends the operation with an outcome, not an escalation;
    a loop that only knows COMPLETED, FAILED and EXPIRED (as hand-written clients do) is
    answered from the record once the job has ended: it keeps calling, the provider is
    never polled again."""
    script = [held("JOB_STATE_RUNNING", 600), {"state": last}]
    async with pack_gateway(tmp_path) as setup:
        sdk, agent = client(setup), setup.agent

        def hand_written() -> Any:
            job, short = create(sdk, script)
            for _ in range(600):  # 20 virtual minutes of a loop that does not stop
                if job.state in HAND_WRITTEN:
                    break
                job = sdk.batch_inference_jobs.get(short)
            return job

        job = await agent.run(hand_written)
        record = await setup.record(PROVIDER, job.name)
        polls = setup.polls(job.name)
    assert agent.exceptions == []
    assert job.state == last and record.outcome.value == outcome
    assert record.ended_at is not None and polls[-1] <= record.ended_at  # none after the end
    assert len(polls) <= 8
