"""policies/azure-openai-batch.yaml driven by the official ``openai`` SDK's ``AzureOpenAI``
client at its defaults (only azure_endpoint set to the gateway, the gateway token as its
API key, which it sends in the ``api-key`` header, and an api_version) through a real
gateway, against the pack's Azure double (gateway/demo/pack/azure_openai_batch.py), on the
shipped policy's production schedule in virtual time. The SDK has no wait helper for
batches: the agent is a naive ``batches.retrieve`` loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
from virtual_time import Setup, assert_paced, held, pack_gateway, provider_keys, table

from conftest import AGENT_TOKEN, PROVIDER_KEY

PROVIDER = "azure-openai-batch"
API_VERSION = "2025-03-01-preview"  # the agent's own; the policy's routes carry theirs
TERMINAL = {"completed", "failed", "expired", "cancelled"}
INPUT = b'{"custom_id": "request-1", "method": "POST", "url": "/chat/completions"}\n'


def client(setup: Setup) -> openai.AzureOpenAI:
    return openai.AzureOpenAI(
        azure_endpoint=setup.url(PROVIDER), api_key=AGENT_TOKEN, api_version=API_VERSION
    )


def naive_batch(setup: Setup, sdk: openai.AzureOpenAI, script: list[dict[str, Any]]) -> Any:
    """Upload, create, retrieve in a loop with no sleep until the batch ends."""
    agent = setup.agent
    uploaded = sdk.files.create(file=("input.jsonl", INPUT), purpose="batch")
    batch: Any = sdk.batches.create(
        input_file_id=uploaded.id,
        endpoint="/chat/completions",
        completion_window="24h",
        extra_body={"demo_script": script},
    )
    while batch.status not in TERMINAL and agent.busy:
        try:
            batch = sdk.batches.retrieve(batch.id)
        except openai.APIError as problem:
            agent.caught(problem)
    return batch


async def test_azure_openai_sdk_runs_a_batch_on_the_shipped_schedule(tmp_path: Path) -> None:
    """files.create, batches.create, a naive batches.retrieve loop through 30 minutes of
    validating / in_progress / finalizing, and files.content(output_file_id) all work at
    the AzureOpenAI client's defaults: no exception, the provider polled within the
    shipped schedule with the gateway's api-key and the policy's api-version, the output
    downloaded through the gateway's counted result route."""
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
                    output = sdk.files.content(batch.output_file_id).content
                except openai.APIError as problem:
                    agent.caught(problem)
            return batch, output

        batch, output = await agent.run(work)
        times = setup.polls(batch.id)
        record = await setup.record(PROVIDER, batch.id)
    sdk_name = f"openai {openai.__version__} (AzureOpenAI)"
    table(PROVIDER, sdk_name, "naive batches.retrieve", setup, len(times), started)
    assert agent.exceptions == []
    assert batch.status == "completed" and output is not None and b"request-1" in output
    assert record.outcome.value == "succeeded" and record.result_fetches == 1
    assert_paced(PROVIDER, times, started, agent.clock.now)
    provider_keys(setup, "api-key", PROVIDER_KEY)
    polled = [e["path"] for e in setup.calls("status")]
    assert polled and all(path.endswith("?api-version=2024-10-21") for path in polled)


@pytest.mark.parametrize(
    ("last", "outcome"),
    [("failed", "failed"), ("expired", "expired"), ("cancelled", "cancelled")],
)
async def test_azure_terminal_statuses_end_the_wait(
    tmp_path: Path, last: str, outcome: str
) -> None:
    """Each documented terminal status ends the SDK's loop and the operation with its own
    outcome, not an escalation."""
    script = [held("in_progress", 600), {"state": last}]
    async with pack_gateway(tmp_path) as setup:
        sdk, agent = client(setup), setup.agent
        batch = await agent.run(lambda: naive_batch(setup, sdk, script))
        record = await setup.record(PROVIDER, batch.id)
    assert agent.exceptions == []
    assert batch.status == last and record.outcome.value == outcome


async def test_azure_operator_cancel_reaches_the_provider_with_an_api_version(
    tmp_path: Path,
) -> None:
    """batches.cancel from the agent is refused (PermissionDeniedError, not retried); an
    operator's cancel, which has no agent request to take an api-version from, reaches
    the provider's cancel route once with the policy's api-version, and the SDK loop then
    sees cancelled."""
    async with pack_gateway(tmp_path) as setup:
        sdk, agent = client(setup), setup.agent
        batch = await agent.run(
            lambda: sdk.batches.create(
                input_file_id="file-x",
                endpoint="/chat/completions",
                completion_window="24h",
                extra_body={"demo_script": [{"state": "in_progress"}]},
            )
        )
        with pytest.raises(openai.PermissionDeniedError):
            await agent.run(lambda: sdk.batches.cancel(batch.id))
        assert await setup.operator_cancel(PROVIDER, batch.id) == 200

        def until_done() -> Any:
            seen: Any = sdk.batches.retrieve(batch.id)
            while seen.status not in TERMINAL and agent.busy:
                seen = sdk.batches.retrieve(batch.id)
            return seen

        ended = await agent.run(until_done)
    assert ended.status == "cancelled"
    assert [(e["api"], e["path"]) for e in setup.calls("cancel")] == [
        (PROVIDER, f"/openai/batches/{batch.id}/cancel?api-version=2024-10-21")
    ]
