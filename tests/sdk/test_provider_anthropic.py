"""policies/anthropic-batches.yaml driven end to end by the real ``anthropic`` SDK as the
agent, through a real gateway on real time (delays scaled down) in front of the demo provider
speaking the Message Batches API. The SDK owns x-api-key, so the agent's gateway token
travels as ``Statusgate-Token``."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import anthropic

from gateway.demo.provider import DemoProvider

from conftest import (
    AGENT_TOKEN,
    PROVIDER_KEY,
    Harness,
    Wire,
    fast_polling,
    live_gateway,
    permitted_polls,
)

REQUESTS: list[Any] = [
    {
        "custom_id": f"request-{i}",
        "params": {
            "model": "claude-demo",
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "Say hello"}],
        },
    }
    for i in (1, 2)
]


def sdk(harness: Harness, wire: Wire, **kw: Any) -> anthropic.Anthropic:
    """The agent's client: the gateway as base URL, its token in Statusgate-Token."""
    http = anthropic.DefaultHttpxClient(event_hooks={"response": [wire.note]})
    return anthropic.Anthropic(
        base_url=str(harness.client.make_url("/p/anthropic-batches")),
        api_key=AGENT_TOKEN,
        default_headers={"Statusgate-Token": AGENT_TOKEN},
        http_client=http,
        **kw,
    )


def status_calls(demo: DemoProvider, job: str) -> list[dict[str, Any]]:
    return [e for e in demo.log if e["job_id"] == job and e["kind"] == "status"]


def wait_until_ended(client: anthropic.Anthropic, batch: Any, limit: float) -> tuple[Any, int]:
    """A naive agent's loop: retrieve again at once until the batch has ended."""
    calls, stop = 0, time.monotonic() + limit
    while batch.processing_status != "ended" and time.monotonic() < stop and calls < 10_000:
        batch = client.messages.batches.retrieve(batch.id)
        calls += 1
    return batch, calls


async def test_anthropic_sdk_runs_a_message_batch_through_the_gateway(
    tmp_path: Path, live_demo: tuple[DemoProvider, str]
) -> None:
    """batches.create and a tight batches.retrieve loop work unchanged, early calls get the
    last answer replayed (never a 429), the provider sees one poll per state, and only ever
    the gateway's x-api-key."""
    demo, upstream = live_demo
    polling = fast_polling()
    changes = {"anthropic-batches": {"polling": polling}}
    wire = Wire()
    script = [{"state": "in_progress"}, {"state": "in_progress"}, {"state": "ended"}]

    def agent(client: anthropic.Anthropic) -> tuple[Any, int]:
        batch = client.messages.batches.create(
            requests=REQUESTS, extra_body={"demo_script": script}
        )
        return wait_until_ended(client, batch, 20.0)

    async with live_gateway(tmp_path, upstream, demo, policy_changes=changes) as harness:
        started = time.monotonic()
        batch, calls = await asyncio.to_thread(agent, sdk(harness, wire))
        elapsed = time.monotonic() - started
        results = await harness.client.get(
            f"/p/anthropic-batches/v1/messages/batches/{batch.id}/results",
            headers={"Statusgate-Token": AGENT_TOKEN},
        )
        assert results.status == 200, await results.text()
        lines = (await results.text()).splitlines()
        record = await harness.record(batch.id, "anthropic-batches")
    assert batch.processing_status == "ended"
    assert [json.loads(line)["custom_id"] for line in lines] == ["request-1", "request-2"]
    polls = status_calls(demo, batch.id)
    assert len(polls) == len(script) == record.status_requests_used
    assert len(polls) <= permitted_polls(polling, elapsed)
    assert wire.count(429) == 0 and calls > len(polls)  # early calls were replayed
    assert record.result_fetches == 1
    for entry in demo.log:
        assert entry["headers"]["x-api-key"] == PROVIDER_KEY
        assert AGENT_TOKEN not in str(entry["headers"])
    print(
        f"anthropic-batches, SDK retrieve loop: {calls} retrieve calls, "
        f"{len(wire.statuses)} HTTP answers ({wire.count(429)} too-early), "
        f"{len(polls)} provider polls"
    )


async def test_anthropic_sdk_results_follow_results_url_through_the_gateway(
    tmp_path: Path, live_demo: tuple[DemoProvider, str]
) -> None:
    """batches.results() retrieves the ended batch again (answered from the record) and
    follows its results_url, which must lead back to the gateway's result route."""
    demo, upstream = live_demo
    changes = {"anthropic-batches": {"polling": fast_polling()}}
    demo.default_scripts["anthropic"] = [{"state": "in_progress"}, {"state": "ended"}]

    def agent(client: anthropic.Anthropic) -> tuple[Any, list[Any]]:
        batch = client.messages.batches.create(requests=REQUESTS)
        batch, _ = wait_until_ended(client, batch, 20.0)
        return batch, list(client.messages.batches.results(batch.id))

    async with live_gateway(tmp_path, upstream, demo, policy_changes=changes) as harness:
        client = sdk(harness, Wire())
        batch, results = await asyncio.to_thread(agent, client)
        again = await asyncio.to_thread(client.messages.batches.retrieve, batch.id)
        gateway = str(harness.client.make_url("/p/anthropic-batches"))
    assert again.results_url.startswith(gateway)
    assert [r.custom_id for r in results] == ["request-1", "request-2"]
    assert all(r.result.type == "succeeded" for r in results)
    assert all(e["headers"]["x-api-key"] == PROVIDER_KEY for e in demo.log)


async def test_anthropic_sdk_tight_loop_without_retries_is_held_to_the_schedule(
    tmp_path: Path, live_demo: tuple[DemoProvider, str]
) -> None:
    """An agent with the SDK's retries off that retries every RateLimitError at once is
    answered by the gateway; the provider sees no more polls than the schedule permits."""
    demo, upstream = live_demo
    polling = fast_polling()
    changes = {"anthropic-batches": {"polling": polling}}
    wire = Wire()
    demo.default_scripts["anthropic"] = [{"state": "in_progress", "until": 2.0}, {"state": "ended"}]

    def agent(client: anthropic.Anthropic) -> tuple[Any, int, float]:
        batch = client.messages.batches.create(requests=REQUESTS)  # no extra field at all
        started, calls = time.monotonic(), 0
        while (
            batch.processing_status != "ended" and time.monotonic() < started + 8 and calls < 50_000
        ):
            calls += 1
            try:
                batch = client.messages.batches.retrieve(batch.id)
            except anthropic.RateLimitError:
                continue
        return batch, calls, time.monotonic() - started

    async with live_gateway(tmp_path, upstream, demo, policy_changes=changes) as harness:
        batch, calls, elapsed = await asyncio.to_thread(agent, sdk(harness, wire, max_retries=0))
    polls = status_calls(demo, batch.id)
    assert batch.processing_status == "ended"
    assert calls > 20 * len(polls)
    assert len(polls) <= permitted_polls(polling, elapsed)
    print(
        f"anthropic-batches, no-retry tight loop: {calls} calls in {elapsed:.1f}s, "
        f"{wire.count(429)} too-early, {len(polls)} provider polls "
        f"(schedule permits at most {permitted_polls(polling, elapsed)})"
    )


async def test_anthropic_sdk_cancels_its_own_batch(
    tmp_path: Path, live_demo: tuple[DemoProvider, str]
) -> None:
    """The agent's own batches.cancel (the policy's ``cancel.by: agent``) reaches the
    provider once, even called twice, and the batch passes through canceling to ended with
    its requests counted as canceled."""
    demo, upstream = live_demo
    changes = {"anthropic-batches": {"polling": fast_polling()}}
    wire = Wire()
    demo.default_scripts["anthropic"] = [{"state": "in_progress"}]
    async with live_gateway(tmp_path, upstream, demo, policy_changes=changes) as harness:
        client = sdk(harness, wire)
        batch = await asyncio.to_thread(client.messages.batches.create, requests=REQUESTS)
        canceling = await asyncio.to_thread(client.messages.batches.cancel, batch.id)
        assert canceling.id == batch.id and canceling.processing_status == "canceling"
        again = await asyncio.to_thread(client.messages.batches.cancel, batch.id)
        assert again.id == batch.id
        assert wire.count(403) == 0
        ended, _ = await asyncio.to_thread(wait_until_ended, client, batch, 10.0)
        record = await harness.record(batch.id, "anthropic-batches")
    assert ended.processing_status == "ended"
    assert ended.request_counts.canceled == len(REQUESTS)
    assert record.outcome.value == "succeeded"  # the job is over; its results say canceled
    assert [e["kind"] for e in demo.log if e["job_id"] == batch.id].count("cancel") == 1
