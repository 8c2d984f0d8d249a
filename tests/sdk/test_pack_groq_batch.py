"""policies/groq-batch.yaml driven by the official ``groq`` SDK at its defaults (only the
base URL changed, the gateway token as its API key) through a real gateway, against the
pack's Groq double (gateway/demo/pack/groq_batch.py), on the shipped policy's production
schedule in virtual time. The SDK has no wait helper for batches: the agent is a naive
``batches.retrieve`` loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import groq
import pytest
from virtual_time import Setup, assert_paced, held, pack_gateway, provider_keys, table

from conftest import AGENT_TOKEN, PROVIDER_KEY

PROVIDER = "groq-batch"
TERMINAL = {"completed", "failed", "expired", "cancelled"}
INPUT = b'{"custom_id": "request-1", "method": "POST", "url": "/v1/chat/completions"}\n'


def client(setup: Setup) -> groq.Groq:
    return groq.Groq(base_url=setup.url(PROVIDER), api_key=AGENT_TOKEN)


def naive_batch(setup: Setup, sdk: groq.Groq, script: list[dict[str, Any]]) -> Any:
    """Upload, create, retrieve in a loop with no sleep until the batch ends."""
    agent = setup.agent
    uploaded = sdk.files.create(file=("input.jsonl", INPUT), purpose="batch")
    batch: Any = sdk.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_body={"demo_script": script},
    )
    while batch.status not in TERMINAL and agent.busy:
        try:
            batch = sdk.batches.retrieve(batch.id)
        except groq.APIError as problem:
            agent.caught(problem)
    return batch


async def test_groq_sdk_runs_a_batch_on_the_shipped_schedule(tmp_path: Path) -> None:
    """files.create, batches.create, a naive batches.retrieve loop through 30 minutes of
    validating / in_progress / finalizing, and files.content(output_file_id) all work at
    the SDK's defaults: no exception, the provider polled within the shipped schedule,
    the output downloaded through the gateway's counted result route."""
    script = [held("validating", 120), held("in_progress", 1800), held("finalizing", 1900)]
    script.append({"state": "completed"})
    async with pack_gateway(tmp_path) as setup:
        sdk, agent = client(setup), setup.agent
        started = agent.clock.now

        def work() -> tuple[Any, bytes | None]:
            batch = naive_batch(setup, sdk, script)
            output = None
            if batch.output_file_id is not None:
                try:
                    output = sdk.files.content(batch.output_file_id).read()
                except groq.APIError as problem:
                    agent.caught(problem)
            return batch, output

        batch, output = await agent.run(work)
        times = setup.polls(batch.id)
        record = await setup.record(PROVIDER, batch.id)
    table(
        PROVIDER, f"groq {groq.__version__}", "naive batches.retrieve", setup, len(times), started
    )
    assert agent.exceptions == []
    assert batch.status == "completed" and output is not None and b"request-1" in output
    assert record.outcome.value == "succeeded" and record.result_fetches == 1
    assert_paced(PROVIDER, times, started, agent.clock.now)
    provider_keys(setup, "Authorization", f"Bearer {PROVIDER_KEY}")


@pytest.mark.parametrize(
    ("last", "outcome"),
    [("failed", "failed"), ("expired", "expired"), ("cancelled", "cancelled")],
)
async def test_groq_terminal_statuses_end_the_wait(tmp_path: Path, last: str, outcome: str) -> None:
    """Each documented terminal status ends the SDK's loop and the operation with its own
    outcome, not an escalation."""
    script = [held("in_progress", 600), {"state": last}]
    async with pack_gateway(tmp_path) as setup:
        sdk, agent = client(setup), setup.agent
        batch = await agent.run(lambda: naive_batch(setup, sdk, script))
        record = await setup.record(PROVIDER, batch.id)
    assert agent.exceptions == []
    assert batch.status == last and record.outcome.value == outcome


async def test_groq_cancel_is_an_operator_decision(tmp_path: Path) -> None:
    """batches.cancel from the agent is refused (PermissionDeniedError, not retried); an
    operator's cancel reaches the provider's cancel route once and the SDK loop then sees
    cancelling, then cancelled."""
    async with pack_gateway(tmp_path) as setup:
        sdk, agent = client(setup), setup.agent
        batch = await agent.run(
            lambda: sdk.batches.create(
                input_file_id="file_x",
                endpoint="/v1/chat/completions",
                completion_window="24h",
                extra_body={"demo_script": [{"state": "in_progress"}]},
            )
        )
        with pytest.raises(groq.PermissionDeniedError):
            await agent.run(lambda: sdk.batches.cancel(batch.id))
        assert await setup.operator_cancel(PROVIDER, batch.id) == 200
        ended = await agent.run(lambda: naive_batch_after(setup, sdk, batch.id))
    assert ended.status == "cancelled"
    assert [(e["api"], e["path"]) for e in setup.calls("cancel")] == [
        (PROVIDER, f"/openai/v1/batches/{batch.id}/cancel")
    ]


def naive_batch_after(setup: Setup, sdk: groq.Groq, batch_id: str) -> Any:
    batch: Any = sdk.batches.retrieve(batch_id)
    while batch.status not in TERMINAL and setup.agent.busy:
        batch = sdk.batches.retrieve(batch_id)
    return batch
