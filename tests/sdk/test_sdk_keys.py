"""The real ``openai`` SDK as an agent with a key made through the operator API (SPEC 25):
the key works as its API key; revoked, the SDK gets 401 (openai.AuthenticationError)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import openai
import pytest

from gateway.demo.provider import DemoProvider

from conftest import OPERATOR_TOKEN, fast_polling, live_gateway

ADMIN = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


def batch_with(base: str, token: str) -> str:
    """files.create then batches.create and one retrieve, with ``token`` as the API key."""
    client = openai.OpenAI(base_url=base, api_key=token, max_retries=0)
    uploaded = client.files.create(file=("input.jsonl", b"{}\n"), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return client.batches.retrieve(batch.id).id


async def test_openai_sdk_with_a_made_key_then_revoked(
    tmp_path: Path, live_demo: tuple[DemoProvider, str]
) -> None:
    """A key for openai-batch made by an admin runs files.create, batches.create and
    batches.retrieve through the gateway; after DELETE the same calls raise
    AuthenticationError (401), and the provider saw no call of the revoked key."""
    demo, upstream = live_demo
    changes = {"openai-batch": {"polling": fast_polling()}}
    async with live_gateway(tmp_path, upstream, demo, policy_changes=changes) as harness:
        base = str(harness.client.make_url("/p/openai-batch/v1"))
        async with aiohttp.ClientSession() as http:
            async with http.post(
                harness.client.make_url("/admin/keys"),
                json={"account": "sdk-team", "providers": ["openai-batch"]},
                headers=ADMIN,
            ) as made:
                key = await made.json()
            batch = await asyncio.to_thread(batch_with, base, key["token"])
            assert (await harness.record(batch, "openai-batch", "sdk-team")).account == "sdk-team"
            async with http.delete(
                harness.client.make_url(f"/admin/keys/{key['id']}"), headers=ADMIN
            ) as revoked:
                assert revoked.status == 204
        calls = len(demo.log)
        with pytest.raises(openai.AuthenticationError) as refused:
            await asyncio.to_thread(batch_with, base, key["token"])
        assert refused.value.status_code == 401
        assert len(demo.log) == calls
