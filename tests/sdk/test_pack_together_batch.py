"""policies/together-batch.yaml driven by the official ``together`` SDK at its defaults
(only the base URL changed, the gateway token as its API key) through a real gateway,
against the pack's Together double (gateway/demo/pack/together_batch.py), on the shipped
policy's production schedule (Together's "poll every 30 to 60 seconds") in virtual time.
The SDK has no wait helper for batches: the agent is a naive ``batches.retrieve`` loop.
The input file is not uploaded through the gateway: Together answers files.upload with a
redirect to object storage on another origin, which the gateway never hands out."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import together
from virtual_time import Setup, assert_paced, held, pack_gateway, provider_keys, table

from conftest import AGENT_TOKEN, PROVIDER_KEY

PROVIDER = "together-batch"
TERMINAL = {"COMPLETED", "FAILED", "EXPIRED", "CANCELLED"}


def client(setup: Setup) -> together.Together:
    return together.Together(base_url=setup.url(PROVIDER), api_key=AGENT_TOKEN)


def naive_batch(setup: Setup, sdk: together.Together, script: list[dict[str, Any]]) -> Any:
    """Create a batch and retrieve it in a loop with no sleep until it ends."""
    agent = setup.agent
    created = sdk.batches.create(
        endpoint="/v1/chat/completions",
        input_file_id="file-2d3c9a6e-batch-input",
        extra_body={"demo_script": script},
    )
    assert created.job is not None and created.job.id is not None
    batch: Any = created.job
    while batch.status not in TERMINAL and agent.busy:
        try:
            batch = sdk.batches.retrieve(created.job.id)
        except together.APIError as problem:
            agent.caught(problem)
    return batch


async def test_together_sdk_runs_a_batch_at_together_pace(tmp_path: Path) -> None:
    """batches.create (its answer wraps the batch in "job"), a naive batches.retrieve loop
    through 40 minutes of VALIDATING / IN_PROGRESS, and files.content(output_file_id) all
    work at the SDK's defaults: no exception, no two provider polls less than 30 s apart
    (Together's guidance), within the shipped schedule, the output downloaded through the
    gateway's counted result route."""
    script = [held("VALIDATING", 300), held("IN_PROGRESS", 2400), {"state": "COMPLETED"}]
    async with pack_gateway(tmp_path) as setup:
        sdk, agent = client(setup), setup.agent
        started = agent.clock.now

        def work() -> tuple[Any, bytes | None]:
            batch = naive_batch(setup, sdk, script)
            output = None
            if batch.output_file_id is not None:
                try:
                    output = sdk.files.content(batch.output_file_id).read()
                except together.APIError as problem:
                    agent.caught(problem)
            return batch, output

        batch, output = await agent.run(work)
        times = setup.polls(batch.id)
        record = await setup.record(PROVIDER, batch.id)
    sdk_name = f"together {together.__version__}"
    table(PROVIDER, sdk_name, "naive batches.retrieve", setup, len(times), started)
    assert agent.exceptions == []
    assert batch.status == "COMPLETED" and output is not None and b"request-1" in output
    assert record.outcome.value == "succeeded" and record.result_fetches == 1
    assert_paced(PROVIDER, times, started, agent.clock.now)
    assert all(b - a >= 30 for a, b in itertools.pairwise([started, *times]))
    provider_keys(setup, "Authorization", f"Bearer {PROVIDER_KEY}")


@pytest.mark.parametrize(
    ("path", "outcome"),
    [
        (["FAILED"], "failed"),
        (["EXPIRED"], "expired"),
        (["CANCELING", "CANCELLED"], "cancelled"),
    ],
)
async def test_together_terminal_statuses_end_the_wait(
    tmp_path: Path, path: list[str], outcome: str
) -> None:
    """FAILED, EXPIRED and CANCELLED (after CANCELING, which Together's own earlier SDK
    lists) end the SDK's loop and the operation with their own outcome, no escalation."""
    script = [held("IN_PROGRESS", 600)]
    script += [held(state, 600 + 300 * (n + 1)) for n, state in enumerate(path[:-1])]
    script.append({"state": path[-1]})
    async with pack_gateway(tmp_path) as setup:
        sdk, agent = client(setup), setup.agent
        batch = await agent.run(lambda: naive_batch(setup, sdk, script))
        record = await setup.record(PROVIDER, batch.id)
    assert agent.exceptions == []
    assert batch.status == path[-1] and record.outcome.value == outcome


async def test_together_cancel_is_an_operator_decision(tmp_path: Path) -> None:
    """batches.cancel from the agent is refused (PermissionDeniedError, not retried); an
    operator's cancel reaches POST /v1/batches/{id}/cancel once and the SDK's loop then
    ends with CANCELLED."""
    async with pack_gateway(tmp_path) as setup:
        sdk, agent = client(setup), setup.agent
        created = await agent.run(
            lambda: sdk.batches.create(
                endpoint="/v1/chat/completions",
                input_file_id="file-x",
                extra_body={"demo_script": [{"state": "IN_PROGRESS"}]},
            )
        )
        assert created.job is not None and created.job.id is not None
        job_id = created.job.id
        with pytest.raises(together.PermissionDeniedError):
            await agent.run(lambda: sdk.batches.cancel(job_id))
        assert await setup.operator_cancel(PROVIDER, job_id) == 200

        def until_done() -> Any:
            seen: Any = sdk.batches.retrieve(job_id)
            while seen.status not in TERMINAL and agent.busy:
                seen = sdk.batches.retrieve(job_id)
            return seen

        ended = await agent.run(until_done)
    assert ended.status == "CANCELLED"
    assert [(e["api"], e["path"]) for e in setup.calls("cancel")] == [
        (PROVIDER, f"/v1/batches/{job_id}/cancel")
    ]
