"""A scripted session with a known credential and token: neither appears in any response,
log line or error, and the agent token never reaches the provider."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from conftest import AGENT_TOKEN, OPERATOR_TOKEN, PROVIDER_KEY, Harness

SECRETS = (PROVIDER_KEY, AGENT_TOKEN, OPERATOR_TOKEN)


async def dump(response: Any) -> str:
    body = await response.read()
    headers = "\n".join(f"{k}: {v}" for k, v in response.headers.items())
    return f"{response.status}\n{headers}\n{body.decode('latin-1')}"


async def test_no_secret_in_any_answer_or_log(
    make_harness: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The provider credential never appears in any answer, header or log line, even when the
    provider echoes it."""
    caplog.set_level(logging.DEBUG)
    harness: Harness = await make_harness(config_changes={"limits": {"upstream_timeout": "300ms"}})
    seen: list[str] = []
    scripts = [
        [{"state": "running", "echo_auth": True}, {"state": "succeeded", "echo_auth": True}],
        [{"http": 401}],
        [{"http": 503, "retry_after": "2"}, {"state": "weird"}],
        [{"state": "running", "delay": 1}],
        [{"body": "oops", "content_type": "text/plain"}],
    ]
    for i, script in enumerate(scripts):
        submitted = await harness.submit(script, key=f"s{i}")
        seen.append(await dump(submitted))
        job = (await submitted.json())["id"]
        seen.append(await dump(await harness.poll(job)))
        for _ in range(3):
            seen.append(await dump(await harness.poll_when_due(job)))
        seen.append(await dump(await harness.poll(job, path="/v1/jobs/{job_id}/result")))
    for headers in ({}, {"Authorization": f"Bearer {PROVIDER_KEY}"}, {"Authorization": "Bearer x"}):
        seen.append(await dump(await harness.client.get("/p/demo-jobs/v1/jobs/j", headers=headers)))
    seen.append(await dump(await harness.submit(submit={"http": 500}, key="fail")))
    echoed = [text for text in seen if "[redacted]" in text]
    assert echoed, "the careless provider's echo should have been redacted"
    everything = "\n".join(seen) + "\n".join(r.getMessage() for r in caplog.records)
    for secret in SECRETS:
        assert secret not in everything
    for entry in harness.provider.log:
        assert AGENT_TOKEN not in str(entry)
