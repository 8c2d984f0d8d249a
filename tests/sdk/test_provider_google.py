"""policies/google-operations.yaml driven end to end over plain HTTP (aiohttp) against the
demo provider speaking Google long-running operations: resource-name job ids with slashes,
boolean ``done`` (absent while running), ``error`` on a done operation, and the API key in the
query, through a real gateway on real time (delays scaled down)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import aiohttp

from gateway.demo.provider import DemoProvider

from conftest import (
    AGENT_TOKEN,
    OPERATOR_TOKEN,
    PROVIDER_KEY,
    Harness,
    fast_polling,
    live_gateway,
    permitted_polls,
)

AUTH = {"Authorization": f"Bearer {AGENT_TOKEN}"}
SUBMIT = "/p/google-operations/v1/projects/demo-project/locations/us/jobs"


def status_calls(demo: DemoProvider, name: str) -> list[dict[str, Any]]:
    return [e for e in demo.log if e["job_id"] == name and e["kind"] == "status"]


async def submit(http: aiohttp.ClientSession, harness: Harness, script: list[Any]) -> str:
    url = harness.client.make_url(SUBMIT)
    body = {"input": "gs://bucket/doc.pdf", "demo_script": script}
    async with http.post(url, json=body, headers=AUTH, params={"key": "agent-guess"}) as answer:
        assert answer.status == 200, await answer.text()
        assert "done" not in await answer.json()  # proto3 JSON leaves out false
        return str((await answer.json())["name"])


async def tight_loop(
    http: aiohttp.ClientSession, harness: Harness, name: str, limit: float
) -> tuple[int, list[str], dict[str, Any]]:
    """A naive agent: GET the operation again at once until it is done, no sleep."""
    url = harness.client.make_url(f"/p/google-operations/v1/{name}")
    calls, seen, body = 0, [], {}
    stop = time.monotonic() + limit
    while time.monotonic() < stop and calls < 50_000:
        calls += 1
        async with http.get(url, headers=AUTH) as answer:
            text = await answer.text()
            seen.append(text)
            if answer.status == 200 and answer.headers["Statusgate-Outcome"] != "pending":
                body = await answer.json()
                break
            assert answer.status in (200, 429), text
    return calls, seen, body


async def test_google_operation_polled_by_resource_name_with_the_key_in_the_query(
    tmp_path: Path, live_demo: tuple[DemoProvider, str]
) -> None:
    """A resource-name job id is tracked through {job_id*} (done absent or false pending,
    true succeeded) with the gateway's key in the query and never in an answer, and a tight
    loop gets the provider no more polls than the schedule permits."""
    demo, upstream = live_demo
    polling = fast_polling()
    changes = {"google-operations": {"polling": polling}}
    script = [
        {"state": "running", "until": 1.0},
        {"state": "pending", "until": 2.0},
        {"state": "done"},
    ]
    async with (
        live_gateway(tmp_path, upstream, demo, policy_changes=changes) as harness,
        aiohttp.ClientSession() as http,
    ):
        name = await submit(http, harness, script)
        started = time.monotonic()
        calls, seen, final = await tight_loop(http, harness, name, 10.0)
        elapsed = time.monotonic() - started
        record = await harness.record(name, "google-operations")
    assert name.startswith("projects/demo-project/locations/us/operations/op-")
    assert final["done"] is True and final["response"]["pages"] == 3
    assert record.outcome.value == "succeeded"
    polls = status_calls(demo, name)
    assert 3 <= len(polls) <= permitted_polls(polling, elapsed)
    assert calls > 20 * len(polls)
    for entry in demo.log:
        assert entry["path"].endswith(f"?key={PROVIDER_KEY}")
        assert "agent-guess" not in entry["path"]
    assert not any(PROVIDER_KEY in text for text in seen)
    print(
        f"google-operations, tight loop: {calls} calls in {elapsed:.1f}s, "
        f"{len(polls)} provider polls (schedule permits at most "
        f"{permitted_polls(polling, elapsed)})"
    )


async def test_google_operation_done_with_an_error_is_a_failure(
    tmp_path: Path, live_demo: tuple[DemoProvider, str]
) -> None:
    """failure_if_present: done true with an error is failed, and the error is kept."""
    demo, upstream = live_demo
    changes = {"google-operations": {"polling": fast_polling()}}
    async with (
        live_gateway(tmp_path, upstream, demo, policy_changes=changes) as harness,
        aiohttp.ClientSession() as http,
    ):
        name = await submit(http, harness, [{"state": "running"}, {"state": "failed"}])
        _, _, final = await tight_loop(http, harness, name, 10.0)
        record = await harness.record(name, "google-operations")
    assert final["done"] is True and final["error"]["code"] == 3
    assert record.outcome.value == "failed"
    assert len(status_calls(demo, name)) == 2


async def test_google_operation_cancelled_by_an_operator_ends_with_its_error(
    tmp_path: Path, live_demo: tuple[DemoProvider, str]
) -> None:
    """An operator's cancel is sent as POST /v1/{name}:cancel with the key; the operation
    then ends done with error code 1 (CANCELLED), which the state table reads as failed."""
    demo, upstream = live_demo
    changes = {"google-operations": {"polling": fast_polling()}}
    async with (
        live_gateway(tmp_path, upstream, demo, policy_changes=changes) as harness,
        aiohttp.ClientSession() as http,
    ):
        name = await submit(http, harness, [{"state": "running"}])
        record = await harness.record(name, "google-operations")
        answer = await harness.client.post(
            f"/admin/operations/{record.operation_id}/cancel",
            json={"reason": "no longer needed"},
            headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
        )
        assert answer.status == 200, await answer.text()
        _, _, final = await tight_loop(http, harness, name, 10.0)
        record = await harness.record(name, "google-operations")
    cancels = [e for e in demo.log if e["kind"] == "cancel"]
    assert [e["path"] for e in cancels] == [f"/v1/{name}:cancel?key={PROVIDER_KEY}"]
    assert final["error"] == {"code": 1, "message": "CANCELLED"}
    assert record.outcome.value == "failed"
