"""Fleet pacing end to end: a provider's 429 and RateLimit fields pause every operation of
that provider, the ceiling holds with 200 held calls on a real clock, and replicas share one
window on Redis. (The pure rules are in tests/core/test_pacing.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gateway.store import store_from_url

from conftest import Harness, real_time_harness


async def submit(harness: Harness, script: list[Any], key: str) -> str:
    return str((await (await harness.submit(script, key=key)).json())["id"])


async def test_provider_429_pauses_every_operation_of_that_provider(harness: Harness) -> None:
    first = await submit(harness, [{"http": 429, "retry_after": "10"}], "a")
    second = await submit(harness, [{"state": "running"}], "b")
    await harness.poll_when_due(first)
    response = await harness.poll_when_due(second)
    assert response.status == 429
    assert (await response.json())["type"] == "/problems/too-early"
    assert 8 <= int(response.headers["Retry-After"]) <= 10
    assert harness.provider_calls(second) == []
    harness.clock.advance(10)
    assert (await harness.poll(second)).status == 200


async def test_ratelimit_fields_pause_until_the_reset(harness: Harness) -> None:
    """RateLimit: remaining=0 on any answer pauses the provider until its reset."""
    exhausted = {"RateLimit": "limit=100, remaining=0, reset=6"}
    job = await submit(harness, [{"state": "running", "headers": exhausted}], "c")
    other = await submit(harness, [{"state": "running"}], "d")
    assert (await harness.poll_when_due(job)).status == 200
    response = await harness.poll_when_due(other)
    assert response.status == 429
    assert 5 <= int(response.headers["Retry-After"]) <= 6
    assert harness.provider_calls(other) == []


async def test_two_hundred_operations_under_twenty_a_second(tmp_path: Path) -> None:
    """200 operations submitted within a second, every agent holding its status call: the
    provider never sees more than 20 status calls in any one-second window."""
    polling = {"provider_rate": "20/s", "base_delay": "200ms", "jitter": {"min": 1.0}}
    async with real_time_harness(
        tmp_path, policy_changes={"demo-jobs": {"polling": polling}}
    ) as harness:
        jobs = await asyncio.gather(
            *(submit(harness, [{"state": "running"}], f"k{i}") for i in range(200))
        )
        answers = await asyncio.gather(
            *(harness.poll(job, headers={"Prefer": "wait=3"}) for job in jobs)
        )
        assert {a.status for a in answers} <= {200, 429}
        times = sorted(e["at"] for e in harness.provider.log if e["method"] == "GET")
        assert len(times) >= 40
        for i, start in enumerate(times):
            in_window = [t for t in times[i:] if t < start + 1.0]
            assert len(in_window) <= 20, (start, len(in_window))


async def test_replicas_share_one_window_on_redis(redis_url: str) -> None:
    """Two stores on one Redis (two replicas) together stay under the ceiling, and a
    tightening one replica learns of holds for the other."""
    first, second = store_from_url(redis_url), store_from_url(redis_url)
    try:
        waits = [await (first if i % 2 else second).pace("demo-jobs", 20, 0.0) for i in range(40)]
        assert waits.count(0.0) == 20
        assert all(0 < wait <= 1.05 for wait in waits if wait)
        await first.tighten("slow-provider", 0.0, first.clock() + 30)
        assert 29 < await second.pace("slow-provider", None, 0.0) <= 30
        assert await second.pace("demo-jobs-2", None, 0.0) == 0
    finally:
        await first.close()
        await second.close()
