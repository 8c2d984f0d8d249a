"""MCP with an agent key made through the operator API (SPEC 25): start_job runs the same
submission as POST /p/..., so the key's account and quotas hold there too."""

from __future__ import annotations

import json

from mcp_wire import Rpc

from gateway.flow.runtime import RUNTIME

from conftest import OPERATOR_TOKEN, Harness


async def test_a_key_and_its_quota_hold_for_start_job(harness: Harness) -> None:
    """The first start_job with a key opens an operation of the key's account; the second
    is refused quota-exceeded (submits_per_hour 1) and nothing reaches the provider."""
    made = await harness.client.post(
        "/admin/keys",
        json={"account": "team-m", "providers": ["demo-jobs"], "quotas": {"submits_per_hour": 1}},
        headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
    )
    token = (await made.json())["token"]
    rpc = Rpc(harness.client, token=token)
    await rpc.open()
    body = {"input": "x", "demo_script": [{"state": "running"}]}
    first = await rpc.tool("start_job", provider="demo-jobs", body=body, idempotency_key="m1")
    assert not first.get("isError"), first
    operation = first["structuredContent"]["operation_id"]
    record = await harness.client.app[RUNTIME].store.get(operation)
    assert record is not None and record.account == "team-m"
    posts = sum(1 for entry in harness.provider.log if entry["method"] == "POST")
    second = await rpc.tool("start_job", provider="demo-jobs", body=body, idempotency_key="m2")
    assert second.get("isError") and "quota-exceeded" in json.dumps(second)
    assert sum(1 for entry in harness.provider.log if entry["method"] == "POST") == posts
