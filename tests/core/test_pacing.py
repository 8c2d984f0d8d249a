"""Fleet pacing: a provider-wide ceiling on status calls, shared by replicas, tightened by
the provider's own RateLimit fields and 429s."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gateway.core.pacing import Pacer, PauseNotes, bounded
from gateway.core.schedule import provider_limit
from gateway.store import store_from_url

from conftest import Harness, real_time_harness


def test_sliding_window_keeps_under_the_rate() -> None:
    pacer = Pacer()
    allowed = [t / 100 for t in range(300) if pacer.pace("p", 20, t / 100) == 0]
    for start in allowed:
        in_window = [t for t in allowed if start <= t < start + 1]
        assert len(in_window) <= 20
    assert len(allowed) >= 50  # about 19 a second over 3 seconds


def test_wait_is_honest() -> None:
    pacer = Pacer()
    for _ in range(20):
        assert pacer.pace("p", 20, 100.0) == 0
    wait = pacer.pace("p", 20, 100.5)
    assert abs(wait - 0.55) < 1e-9  # the oldest leaves the 1.05 s window at 101.05
    assert pacer.pace("p", 20, 100.5 + wait) == 0


def test_a_month_long_retry_after_pauses_the_provider_only_up_to_the_cap() -> None:
    """A 429 asking for 29 days is clamped to the policy's cap on a fake clock: the provider
    is paused for the cap, then status calls go again; shorter asks are kept as they are."""
    now = 1_000.0
    limit = provider_limit(429, {"Retry-After": "2505600"}, now)
    assert limit == (0.0, now + 2_505_600)
    kept = bounded(*limit, now, cap=120.0)
    assert kept.clamped and kept.until == now + 120.0 and kept.asked == now + 2_505_600
    pacer = Pacer()
    pacer.tighten("p", kept.rate, kept.until)
    assert pacer.pace("p", None, now) == 120.0
    assert pacer.pace("p", None, now + 119.0) == 1.0
    assert pacer.pace("p", None, now + 120.0) == 0
    short = bounded(0.0, now + 30.0, now, cap=120.0)
    assert not short.clamped and short.until == now + 30.0


def test_a_clamped_pause_is_said_once_per_pause() -> None:
    """The same month-long ask repeated during one clamped pause is logged once; a new
    clamped pause after it ended is logged again; unclamped asks are never logged."""
    notes = PauseNotes()
    now = 1_000.0
    assert notes.first("p", bounded(0.0, now + 9e6, now, 120.0), now)
    assert not notes.first("p", bounded(0.0, now + 9e6 + 5, now + 5, 120.0), now + 5)
    assert notes.first("q", bounded(0.0, now + 9e6, now, 120.0), now)  # another provider
    assert not notes.first("p", bounded(0.0, now + 130, now + 125, 120.0), now + 125)
    assert notes.first("p", bounded(0.0, now + 9e6, now + 126, 120.0), now + 126)


def test_tightening_pauses_or_lowers_the_ceiling_until_the_reset() -> None:
    pacer = Pacer()
    pacer.tighten("p", 0.0, 110.0)
    assert pacer.pace("p", None, 100.0) == 10.0
    assert pacer.pace("other", None, 100.0) == 0
    assert pacer.pace("p", None, 110.0) == 0
    pacer.tighten("q", 1.0, 200.0)
    assert pacer.pace("q", 50, 100.0) == 0
    assert pacer.pace("q", 50, 100.1) > 0.9


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
