"""A provider-wide pause is bounded by policy (issue 22, bug 7): one answer with a month-long
Retry-After slows the provider for at most ``polling.max_provider_pause``, on every store."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis

from gateway.flow.runtime import RUNTIME

from conftest import OPERATOR_TOKEN, Harness, real_time_harness

MONTH = "2505600"  # 29 days, as the fault probe sent
OPS = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


def _clamped(metrics: str) -> float:
    line = 'statusgate_provider_pauses_clamped_total{provider="demo-jobs"}'
    return float(next(x for x in metrics.splitlines() if x.startswith(line)).split()[-1])


@pytest.mark.parametrize("kind", ["memory", "sqlite", "redis"])
async def test_a_month_long_retry_after_pauses_the_provider_only_up_to_the_cap(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    """On each store kind, a 429 asking for 29 days pauses the provider for at most
    max_provider_pause: other operations are told to wait that long, not escalated, the
    clamp is counted and logged once, and on Redis the clamped instant is what is stored."""
    url = {
        "memory": "memory://",
        "sqlite": f"sqlite:///{tmp_path / 'pause.db'}",
    }.get(kind) or request.getfixturevalue("redis_url")
    polling = {"base_delay": "100ms", "max_delay": "2m", "max_provider_pause": "90s"}
    caplog.set_level(logging.WARNING, logger="statusgate")
    async with real_time_harness(
        tmp_path, store_url=url, policy_changes={"demo-jobs": {"polling": polling}}
    ) as harness:
        month = [{"http": 429, "retry_after": MONTH}] * 3
        first = (await (await harness.submit(month, key="a")).json())["id"]
        second = (await (await harness.submit([{"state": "running"}], key="b")).json())["id"]
        third = (await (await harness.submit(month, key="c")).json())["id"]
        await harness.poll_when_due(first)
        asked_at = harness.client.app[RUNTIME].clock()
        for job in (second, third):
            answer = await harness.poll_when_due(job)
            assert answer.status == 429, await answer.text()
            assert (await answer.json())["type"] == "/problems/too-early"
            assert 80 <= float(answer.headers["Retry-After"]) <= 91
            assert harness.provider_calls(job) == []
        assert (await harness.record(second)).outcome.value == "pending"
        metrics = await (await harness.client.get("/metrics")).text()
        assert _clamped(metrics) == 1
        said = [r for r in caplog.records if "max_provider_pause" in r.getMessage()]
        assert len(said) == 1 and "demo-jobs" in said[0].getMessage()
        if kind == "redis":
            store = harness.client.app[RUNTIME].store
            key = store.keys.pace("demo-jobs")[1]  # type: ignore[attr-defined]
            base = url.partition("?")[0]
            client = sync_redis.Redis.from_url(base)
            until = float(client.hget(key, "until") or 0)
            ttl = client.pttl(key)
            client.close()
            assert asked_at < until <= asked_at + 91, (until, asked_at)
            assert 0 < ttl <= 92_000


async def test_extend_after_a_clamped_pause_does_not_re_escalate_at_once(
    make_harness: Any,
) -> None:
    """An operation escalated because the (clamped) pause outlasts its short deadline,
    extended by an operator beyond the pause, waits for the pause and is then polled once,
    instead of escalating again at its next poll."""
    polling = {"deadline": "60s", "max_delay": "2m"}
    harness: Harness = await make_harness(policy_changes={"demo-jobs": {"polling": polling}})
    first = (await (await harness.submit([{"http": 429, "retry_after": MONTH}], key="a")).json())[
        "id"
    ]
    second = (await (await harness.submit([{"state": "running"}], key="b")).json())["id"]
    await harness.poll_when_due(first)
    paused_at = harness.clock.now
    answer = await harness.poll_when_due(second)
    assert answer.status == 409, await answer.text()
    assert (await answer.json())["reason"] == "deadline_exceeded"
    operation = (await harness.record(second)).operation_id
    extended = await harness.client.post(
        f"/admin/operations/{operation}/extend",
        json={"time": "15m", "requests": 2, "reason": "provider paused"},
        headers=OPS,
    )
    assert extended.status == 200, await extended.text()
    for _ in range(200):  # the gateway's own poll after the decision (SPEC 20)
        record = await harness.record(second)
        if record.status_requests_used or record.outcome.value != "pending":
            break
        await asyncio.sleep(0.01)
    assert record.outcome.value == "pending", record.escalation
    assert record.last_polled_at is not None and record.last_polled_at >= paused_at + 120
    assert len(harness.provider_calls(second)) == 1
    answer = await harness.poll(second)
    assert answer.status != 409, await answer.text()


async def test_a_month_long_pause_stored_on_redis_by_an_older_version_is_bounded_at_start(
    redis_url: str, tmp_path: Path
) -> None:
    """A pause an older version stored on Redis (29 days in the tightening hash) ends at the
    policy's cap once a gateway starts: status calls are told to wait at most the cap."""
    prefix = redis_url.partition("prefix=")[2]
    client = sync_redis.Redis.from_url(redis_url.partition("?")[0])
    key = f"{prefix}:tight:{{pace:demo-jobs}}"
    now = time.time()
    client.hset(key, mapping={"rate": 0, "until": now + 2_505_600})
    polling = {"base_delay": "100ms", "max_delay": "2m"}
    try:
        async with real_time_harness(
            tmp_path, store_url=redis_url, policy_changes={"demo-jobs": {"polling": polling}}
        ) as harness:
            until = float(client.hget(key, "until") or 0)
            assert until <= time.time() + 121
            job = (await (await harness.submit([{"state": "running"}], key="a")).json())["id"]
            answer = await harness.poll_when_due(job)
            assert answer.status == 429, await answer.text()
            assert float(answer.headers["Retry-After"]) <= 121
    finally:
        client.close()
