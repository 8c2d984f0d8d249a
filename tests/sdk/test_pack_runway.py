"""policies/runway.yaml driven by the official ``runwayml`` SDK at its defaults (only
``base_url`` changed, the gateway token as its API key), on virtual time, against the demo
provider's Runway double (gateway/demo/pack/runway.py), with the policy's schedule as
shipped: ``image_to_video.create`` then the SDK's own ``wait_for_task_output`` or a naive
``tasks.retrieve`` loop. The waiter's clock and sleep are the FakeClock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import runwayml
import runwayml.lib.polling
from paced import VirtualTime, assert_paced, operator_headers, shipped_polling
from runwayml.lib.polling import TaskTimeoutError
from test_sdk_agents import MAX_CALLS, Setup, gateway, polls_at, table

from gateway.flow.runtime import RUNTIME

from conftest import AGENT_TOKEN, PROVIDER_KEY

DONE = {"SUCCEEDED", "FAILED", "CANCELLED"}
SCRIPT = [
    {"state": "PENDING", "until": 40},
    {"state": "THROTTLED", "until": 100},
    {"state": "RUNNING", "progress": 0.4, "until": 200},
    {"state": "SUCCEEDED"},
]


def client(setup: Setup, monkeypatch: pytest.MonkeyPatch) -> runwayml.RunwayML:
    """The agent's client; the waiter's ``time`` (its sleep and its timeout) is virtual."""
    monkeypatch.setattr(runwayml.lib.polling, "time", VirtualTime(setup.agent.clock))
    return runwayml.RunwayML(base_url=f"{setup.base}/p/runway", api_key=AGENT_TOKEN)


def create(runway: runwayml.RunwayML, script: list[dict[str, Any]]) -> Any:
    return runway.image_to_video.create(
        model="gen4_turbo",
        prompt_image="https://example.com/first-frame.jpg",
        ratio="1280:720",
        duration=5,
        extra_body={"demo_script": script},
    )


def provider_headers_ok(setup: Setup) -> None:
    """Every call that reached Runway carried its key and the API version, never ours."""
    for entry in setup.demo.log:
        assert entry["headers"]["Authorization"] == f"Bearer {PROVIDER_KEY}"
        assert entry["headers"]["X-Runway-Version"] == "2024-11-06"
        assert AGENT_TOKEN not in str(entry["headers"])


async def test_runway_wait_for_task_output_at_default_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """image_to_video.create(...).wait_for_task_output() returns the SUCCEEDED task with its
    output URLs (Runway's CDN, untouched) through PENDING, THROTTLED and RUNNING, no
    exception, the provider polled on the policy's schedule while the waiter called every
    six seconds."""
    async with gateway(tmp_path) as setup:
        runway, agent = client(setup, monkeypatch), setup.agent
        started = agent.clock.now

        def work() -> Any:
            try:
                return create(runway, SCRIPT).wait_for_task_output()
            except (runwayml.APIError, TaskTimeoutError) as error:
                agent.caught(error)
                return None

        task = await agent.run(work)
        times = polls_at(setup.demo, task.id if task else "")
    table("runwayml 5.24.0", "wait_for_task_output", agent, len(times))
    assert agent.exceptions == []
    assert task.status == "SUCCEEDED"
    assert task.output[0].startswith("https://dnznrvs05pmza.cloudfront.net/")
    assert_paced(times, started, shipped_polling("runway"))
    assert len(agent.calls) > len(times) + 1  # the waiter's early calls were replayed
    provider_headers_ok(setup)


async def test_runway_naive_retrieve_loop_at_default_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A naive ``tasks.retrieve`` loop with no sleep reaches SUCCEEDED with no exception;
    its early calls are answered with the last task, the provider polled on schedule."""
    async with gateway(tmp_path) as setup:
        runway, agent = client(setup, monkeypatch), setup.agent
        started = agent.clock.now

        def work() -> Any:
            task = runway.tasks.retrieve(create(runway, SCRIPT).id)
            while task.status not in DONE and len(agent.calls) < MAX_CALLS:
                try:
                    task = runway.tasks.retrieve(task.id)
                except runwayml.APIError as error:
                    agent.caught(error)
            return task

        task = await agent.run(work)
        times = polls_at(setup.demo, task.id)
    table("runwayml 5.24.0", "naive tasks.retrieve", agent, len(times))
    assert agent.exceptions == []
    assert task.status == "SUCCEEDED" and task.output
    assert_paced(times, started, shipped_polling("runway"))
    assert len(agent.calls) > 5 * len(times)


async def test_runway_cancelled_task_ends_at_the_gateway_while_the_waiter_loops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's ``tasks.delete`` is 403 approval-required; an operator's cancel sends
    DELETE /v1/tasks/{id} with the API version; the task reports CANCELLED and the
    operation ends cancelled. The SDK's waiter, which does not end on CANCELLED, keeps
    retrieving until its ten-minute timeout: every one of those calls is answered from the
    record, none reaches Runway."""
    async with gateway(tmp_path) as setup:
        runway, agent = client(setup, monkeypatch), setup.agent
        created = await agent.run(lambda: create(runway, [{"state": "RUNNING"}]))
        with pytest.raises(runwayml.PermissionDeniedError):
            await agent.run(lambda: runway.tasks.delete(created.id))
        record = await find(setup, created.id)
        answer = await setup.client.post(
            f"/admin/operations/{record.operation_id}/cancel",
            json={"reason": "the user closed the tab"},
            headers=operator_headers(),
        )
        assert answer.status == 200, await answer.text()
        before = len(agent.calls)

        def work() -> Any:
            try:
                return created.wait_for_task_output()
            except TaskTimeoutError as error:  # the SDK's own behaviour on CANCELLED
                return error.task_details

        task = await agent.run(work)
        record = await find(setup, created.id)
        calls = [e for e in setup.demo.log if e["job_id"] == created.id]
    kinds = [e["kind"] for e in calls]
    waiter_calls = len(agent.calls) - before
    table("runwayml 5.24.0", "wait_for_task_output on CANCELLED", agent, kinds.count("status"))
    assert task.status == "CANCELLED"
    assert record.outcome.value == "cancelled"
    assert kinds.count("cancel") == 1 and calls[kinds.index("cancel")]["method"] == "DELETE"
    after_cancel = kinds[kinds.index("cancel") :]
    assert after_cancel.count("status") == 1  # one poll learnt CANCELLED, then the record
    assert waiter_calls > 50  # the waiter looped for ten (virtual) minutes
    provider_headers_ok(setup)


async def find(setup: Setup, job_id: str) -> Any:
    record = await setup.client.app[RUNTIME].store.find("team-a", "runway", job_id)
    assert record is not None
    return record
