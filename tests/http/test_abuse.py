"""Abuse from agents: path tricks, header tricks, oversized input, token spraying. Nothing
of it reaches the provider, and nothing of it costs the gateway a traceback."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from conftest import AGENT_TOKEN, Harness, raw


def request_bytes(path: str, *headers: str) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: gateway.test", f"Authorization: Bearer {AGENT_TOKEN}"]
    return ("\r\n".join([*lines, *headers, "Connection: close", "", ""])).encode("latin-1")


async def test_path_traversal_and_encoded_slashes_never_reach_the_provider(
    harness: Harness,
) -> None:
    """Dot segments, encoded slashes and NUL bytes in a path are refused and never reach the
    provider."""
    job = (await (await harness.submit([{"state": "running"}])).json())["id"]
    for path in (
        f"/p/demo-jobs/v1/jobs/{job}/../../../_demo/log",
        "/p/demo-jobs/v1/jobs/..",
        "/p/demo-jobs/v1/jobs/%2e%2e",
        "/p/demo-jobs/v1/jobs/%2e%2e%2f_demo%2flog",
        f"/p/demo-jobs/v1/jobs/{job}%2f..%2f..%2f_demo%2flog",
        "/p/demo-jobs/v1/jobs/a%252fb",
        "/p/demo-jobs/../../_demo/log",
        "/p/demo-jobs/v1/jobs/job%00x",
        "/p/demo-jobs//v1/jobs/x",
    ):
        status, body = await raw(harness, request_bytes(path))
        assert status in (400, 404), (path, status)
        assert b"/problems/" in body or status == 400, path
    assert [e["path"] for e in harness.provider.log] == ["/v1/jobs"]  # the submit only


async def test_header_injection_and_oversize_headers_are_refused(harness: Harness) -> None:
    """A bare CR in a header, one huge header and too many headers are refused before any
    provider call."""
    job = (await (await harness.submit([{"state": "running"}])).json())["id"]
    path = f"/p/demo-jobs/v1/jobs/{job}"
    injected = request_bytes(path, "X-Note: a\rX-Injected: yes")
    assert (await raw(harness, injected))[0] == 400
    huge = request_bytes(path, "X-Huge: " + "a" * 20_000)
    assert (await raw(harness, huge))[0] in (400, 431)
    many = request_bytes(path, *(f"X-H{i}: v" for i in range(500)))
    assert (await raw(harness, many))[0] in (400, 431, 429)
    assert [e["path"] for e in harness.provider.log] == ["/v1/jobs"]


async def test_spoofed_forwarding_headers_are_not_trusted_or_forwarded(harness: Harness) -> None:
    """Forwarding headers from the agent are neither trusted nor sent to the provider."""
    headers = {"X-Forwarded-For": "10.0.0.1", "Forwarded": "for=10.0.0.1", "X-Real-IP": "1.2.3.4"}
    response = await harness.client.post(
        "/p/demo-jobs/v1/jobs",
        json={"demo_script": [{"state": "running"}]},
        headers={**harness.auth(), "Idempotency-Key": "s", **headers},
    )
    assert response.status == 202
    sent = {k.lower() for k in harness.provider.log[0]["headers"]}
    assert not sent & {"x-forwarded-for", "forwarded", "x-real-ip"}


async def test_thousands_of_unknown_tokens(harness: Harness) -> None:
    """2,000 requests with random tokens: all 401, nothing forwarded, nothing kept."""
    semaphore = asyncio.Semaphore(50)

    async def attempt() -> int:
        async with semaphore:
            headers = {"Authorization": f"Bearer {secrets.token_urlsafe(24)}"}
            response = await harness.client.get("/p/demo-jobs/v1/jobs/job_1", headers=headers)
            await response.read()
            return response.status

    statuses = await asyncio.gather(*(attempt() for _ in range(2000)))
    assert set(statuses) == {401}
    assert len(harness.provider.log) == 0


async def test_oversize_body_and_bad_json_on_submit(harness: Harness) -> None:
    """Oversize submit bodies, sized or chunked, are 413 and nothing reaches the provider."""
    big = await harness.client.post(
        "/p/demo-jobs/v1/jobs",
        data=b"x" * 200_000,
        headers={**harness.auth(), "Idempotency-Key": "big", "Content-Type": "application/json"},
    )
    assert big.status == 413
    chunked = await harness.client.post(
        "/p/demo-jobs/v1/jobs",
        data=_chunks(),
        headers={**harness.auth(), "Idempotency-Key": "chunked"},
    )
    assert chunked.status == 413
    assert len(harness.provider.log) == 0


async def _chunks() -> Any:
    for _ in range(40):
        yield b"y" * 4096
