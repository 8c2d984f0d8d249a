"""policies/openai-batch.yaml driven end to end by the real ``openai`` SDK as the agent,
through a real gateway on real time (delays scaled down) in front of the demo provider
speaking the Batch API."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import openai

from gateway.demo.provider import DemoProvider, output_file

from conftest import (
    AGENT_TOKEN,
    PROVIDER_KEY,
    Harness,
    Wire,
    fast_polling,
    live_gateway,
    permitted_polls,
)

TERMINAL = {"completed", "failed", "expired", "cancelled"}
INPUT = b'{"custom_id": "request-1", "method": "POST", "url": "/v1/chat/completions"}\n'


def sdk(harness: Harness, wire: Wire, **kw: Any) -> openai.OpenAI:
    """The agent's client: the gateway as base URL, the gateway token as the API key."""
    base = str(harness.client.make_url("/p/openai-batch/v1"))
    hooks = {"response": [wire.note]}
    http = openai.DefaultHttpxClient(event_hooks=hooks)
    return openai.OpenAI(base_url=base, api_key=AGENT_TOKEN, http_client=http, **kw)


def status_calls(demo: DemoProvider, job: str) -> list[dict[str, Any]]:
    return [e for e in demo.log if e["job_id"] == job and e["kind"] == "status"]


def run_batch(client: openai.OpenAI, script: list[dict[str, Any]], limit: float) -> dict[str, Any]:
    """What a naive agent does: upload, create, retrieve in a loop with no sleep, download."""
    uploaded = client.files.create(file=("input.jsonl", INPUT), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_body={"demo_script": script},
    )
    calls, stop = 0, time.monotonic() + limit
    while batch.status not in TERMINAL and time.monotonic() < stop and calls < 10_000:
        batch = client.batches.retrieve(batch.id)
        calls += 1
    output = None
    if batch.output_file_id is not None:
        output = client.files.content(batch.output_file_id).content
    return {"file": uploaded.id, "batch": batch, "calls": calls, "output": output}


async def test_openai_sdk_runs_a_batch_through_the_gateway(
    tmp_path: Path, live_demo: tuple[DemoProvider, str]
) -> None:
    """files.create, batches.create, a tight batches.retrieve loop and files.content all
    work unchanged through the gateway; early calls get the last answer replayed, never a
    429, and the provider sees one poll per state."""
    demo, upstream = live_demo
    polling = fast_polling()
    changes = {"openai-batch": {"polling": polling}}
    wire = Wire()
    script = [
        {"state": "validating"},
        {"state": "in_progress"},
        {"state": "finalizing"},
        {"state": "completed"},
    ]
    async with live_gateway(tmp_path, upstream, demo, policy_changes=changes) as harness:
        client = sdk(harness, wire)
        started = time.monotonic()
        done = await asyncio.to_thread(run_batch, client, script, 20.0)
        elapsed = time.monotonic() - started
        batch = done["batch"]
        record = await harness.record(batch.id, "openai-batch")
    assert batch.status == "completed" and batch.output_file_id == output_file(batch.id)
    assert done["output"] is not None and b"request-1" in done["output"]
    assert demo.files[done["file"]] == INPUT  # the multipart upload arrived whole
    polls = status_calls(demo, batch.id)
    assert len(polls) == len(script) == record.status_requests_used
    assert len(polls) <= permitted_polls(polling, elapsed)
    assert wire.count(429) == 0 and done["calls"] > len(polls)  # early calls were replayed
    assert record.result_fetches == 1  # files.content was the counted result route
    for entry in demo.log:
        assert entry["headers"]["Authorization"] == f"Bearer {PROVIDER_KEY}"
    print(
        f"openai-batch, SDK retrieve loop: {done['calls']} retrieve calls, "
        f"{len(wire.statuses)} HTTP answers ({wire.count(429)} too-early), "
        f"{len(polls)} provider polls"
    )


async def test_openai_sdk_without_retries_in_a_tight_loop_is_held_to_the_schedule(
    tmp_path: Path, live_demo: tuple[DemoProvider, str]
) -> None:
    """An agent that turns the SDK's retries off and retries every RateLimitError at once
    makes thousands of calls; the provider sees no more polls than the schedule permits."""
    demo, upstream = live_demo
    polling = fast_polling()
    changes = {"openai-batch": {"polling": polling}}
    wire = Wire()
    script = [{"state": "in_progress", "until": 2.0}, {"state": "completed"}]

    def agent(client: openai.OpenAI) -> tuple[Any, int, float]:
        batch = client.batches.create(
            input_file_id="file-x",
            endpoint="/v1/chat/completions",
            completion_window="24h",
            extra_body={"demo_script": script},
        )
        started, calls = time.monotonic(), 0
        while batch.status not in TERMINAL and time.monotonic() < started + 8 and calls < 50_000:
            calls += 1
            try:
                batch = client.batches.retrieve(batch.id)
            except openai.RateLimitError:
                continue
        return batch, calls, time.monotonic() - started

    async with live_gateway(tmp_path, upstream, demo, policy_changes=changes) as harness:
        client = sdk(harness, wire, max_retries=0)
        batch, calls, elapsed = await asyncio.to_thread(agent, client)
    polls = status_calls(demo, batch.id)
    assert batch.status == "completed"
    assert calls > 20 * len(polls)
    assert len(polls) <= permitted_polls(polling, elapsed)
    print(
        f"openai-batch, no-retry tight loop: {calls} calls in {elapsed:.1f}s, "
        f"{wire.count(429)} too-early, {len(polls)} provider polls "
        f"(schedule permits at most {permitted_polls(polling, elapsed)})"
    )


async def test_openai_sdk_cancels_its_own_batch(
    tmp_path: Path, live_demo: tuple[DemoProvider, str]
) -> None:
    """batches.cancel from the agent's own SDK (the policy's ``cancel.by: agent``) reaches
    the provider once and returns the batch cancelling; a second batches.cancel is answered
    from the record; the SDK loop then sees cancelled."""
    demo, upstream = live_demo
    changes = {"openai-batch": {"polling": fast_polling()}}
    wire = Wire()
    async with live_gateway(tmp_path, upstream, demo, policy_changes=changes) as harness:
        client = sdk(harness, wire)
        batch = await asyncio.to_thread(
            client.batches.create,
            input_file_id="file-x",
            endpoint="/v1/chat/completions",
            completion_window="24h",
            extra_body={"demo_script": [{"state": "in_progress"}]},
        )
        cancelling = await asyncio.to_thread(client.batches.cancel, batch.id)
        assert cancelling.id == batch.id and cancelling.status == "cancelling"
        again = await asyncio.to_thread(client.batches.cancel, batch.id)
        assert again.id == batch.id
        assert wire.count(403) == 0

        def wait_for_end() -> Any:
            seen = batch
            stop = time.monotonic() + 10
            while seen.status not in TERMINAL and time.monotonic() < stop:
                seen = client.batches.retrieve(batch.id)
            return seen

        ended = await asyncio.to_thread(wait_for_end)
    assert ended.status == "cancelled"
    cancels = [e for e in demo.log if e["kind"] == "cancel"]
    assert [e["path"] for e in cancels] == [f"/v1/batches/{batch.id}/cancel"]
