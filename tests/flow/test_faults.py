"""Provider faults from the scriptable demo provider: each ends as the SPEC table says,
within the configured timeout, and the connection pool stays healthy afterwards."""

from __future__ import annotations

import time
from typing import Any

import pytest

from conftest import Harness

TIMEOUT = 0.3

FAULTS: list[tuple[str, dict[str, Any], int, str]] = [
    ("hang before headers", {"state": "running", "delay": 2}, 504, "provider-timeout"),
    ("hang mid-body", {"stall_body": 2}, 504, "provider-timeout"),
    ("reset mid-body", {"reset_body": True}, 503, "provider-unavailable"),
    (
        "truncated JSON",
        {"body": '{"state": "runn', "content_type": "application/json"},
        409,
        "operation-escalated",
    ),
    ("deeply nested JSON", {"nested": 20000}, 409, "operation-escalated"),
    ("huge JSON", {"state": "running", "pad": 200_000}, 409, "operation-escalated"),
    ("gzip bomb", {"gzip_bomb": 50}, 409, "operation-escalated"),
    (
        "HTML instead of JSON",
        {"body": "<html>ok</html>", "content_type": "text/html"},
        409,
        "operation-escalated",
    ),
    (
        "3xx to another host",
        {"http": 302, "headers": {"Location": "http://198.51.100.9/x"}},
        409,
        "operation-escalated",
    ),
]


@pytest.fixture
async def faulty(make_harness: Any) -> Harness:
    harness: Harness = await make_harness(
        config_changes={"limits": {"upstream_timeout": f"{int(TIMEOUT * 1000)}ms"}}
    )
    return harness


@pytest.mark.parametrize(("name", "step", "status", "slug"), FAULTS, ids=[f[0] for f in FAULTS])
async def test_fault_ends_as_the_table_says(
    faulty: Harness, name: str, step: dict[str, Any], status: int, slug: str
) -> None:
    """Each provider fault (hang, reset, bad body, gzip bomb, redirect) ends as its row says,
    within the timeout, spending one status request and never passing a Location on."""
    job = (await (await faulty.submit([step], key="fault")).json())["id"]
    started = time.perf_counter()
    response = await faulty.poll_when_due(job)
    took = time.perf_counter() - started
    assert response.status == status, (name, await response.text())
    body = await response.json()
    assert body["type"] == f"/problems/{slug}"
    assert took < TIMEOUT + 1.0, (name, took)
    assert "Location" not in response.headers
    record = await faulty.record(job)
    assert record.status_requests_used == 1
    if slug == "operation-escalated":
        assert body["reason"] == "integration_failure"
    else:
        assert record.transport_failures_used == 1
        assert "Retry-After" in response.headers
    healthy = (await (await faulty.submit([{"state": "running"}], key="after")).json())["id"]
    assert (await faulty.poll_when_due(healthy)).status == 200


async def test_json_with_a_wrong_content_type_is_still_read(faulty: Harness) -> None:
    """Providers mislabel JSON; the state table decides, not the Content-Type."""
    step = {"body": '{"state": "running"}', "content_type": "text/plain"}
    job = (await (await faulty.submit([step])).json())["id"]
    response = await faulty.poll_when_due(job)
    assert response.status == 200
    assert response.headers["Statusgate-Provider-State"] == "running"
