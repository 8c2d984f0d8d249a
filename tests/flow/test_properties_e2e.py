"""Properties through a real gateway and the real demo provider, on loopback.

Hypothesis draws a provider answer script and the agent's call times; the fake clock moves
between calls. Whatever the draw: the provider never receives a status call before
next_poll_at, at or after the deadline, or beyond max_status_requests; a terminal outcome
never changes; counters never decrease.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.core.models import Outcome
from gateway.demo.provider import DemoProvider

from conftest import PROVIDER_KEY, FakeClock, start_harness

STEPS = st.sampled_from(
    [
        {"state": "queued"},
        {"state": "running"},
        {"state": "running", "poll_after_seconds": 0},
        {"state": "running", "poll_after_seconds": 4},
        {"state": "running", "retry_after": "junk"},
        {"state": "running", "next_check_in": 2},
        {"state": "succeeded"},
        {"state": "succeeded", "omit": ["result"]},
        {"state": "failed"},
        {"state": "mystery"},
        {"http": 404},
        {"http": 429},
        {"http": 429, "retry_after": "3"},
        {"http": 500},
        {"http": 503, "retry_after": "5"},
        {"body": "<html/>", "content_type": "text/html"},
    ]
)
COUNTERS = ("status_requests_used", "transport_failures_used", "rate_limited_used")


async def scenario(script: list[dict[str, Any]], gaps: list[float]) -> None:
    clock = FakeClock()
    demo = DemoProvider(api_key=PROVIDER_KEY, clock=clock)
    provider = TestServer(demo.app(), host="127.0.0.1")
    await provider.start_server()
    with tempfile.TemporaryDirectory() as folder:
        harness = await start_harness(
            Path(folder),
            clock,
            demo,
            upstream=str(provider.make_url("")).rstrip("/"),
            policy_changes={
                "demo-jobs": {"polling": {"max_status_requests": 6, "deadline": "90s"}}
            },
        )
        try:
            job = (await (await harness.submit(script)).json())["id"]
            for gap in gaps:
                clock.advance(gap)
                before = await harness.record(job)
                calls_before = len(harness.provider_calls(job))
                response = await harness.poll(job)
                assert response.status < 500 or response.status in (503, 504)
                after = await harness.record(job)
                sent = len(harness.provider_calls(job)) - calls_before
                assert sent <= 1
                if sent:
                    assert clock.now >= before.next_poll_at
                    assert clock.now < before.deadline_at
                    assert before.status_requests_used < before.max_status_requests
                if before.outcome is not Outcome.PENDING:
                    assert after.outcome is before.outcome
                    assert sent == 0
                for counter in COUNTERS:
                    assert getattr(after, counter) >= getattr(before, counter)
            total = len(harness.provider_calls(job))
            assert total == (await harness.record(job)).status_requests_used <= 6
        finally:
            await harness.client.close()
            await provider.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    script=st.lists(STEPS, min_size=1, max_size=8),
    gaps=st.lists(st.floats(min_value=0, max_value=20), min_size=1, max_size=25),
)
def test_provider_never_polled_early_late_or_over_budget(
    script: list[dict[str, Any]], gaps: list[float]
) -> None:
    """Whatever the provider answers and however agents time their calls, the provider is
    never polled before next_poll_at, after the deadline or over the budget, and a final
    outcome never changes."""
    asyncio.run(scenario(script, gaps))
