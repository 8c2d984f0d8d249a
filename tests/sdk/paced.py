"""What the provider pack's SDK tests share: the shipped policy's schedule, the check that
the provider's polls kept to it, and the calls an operator makes.

The tests run the official SDKs against the gateway on a FakeClock (``gateway`` of
test_sdk_agents.py: every agent request moves the clock on by its STEP, every ``time.sleep``
of the agent's thread by its length), with each policy's production schedule as shipped.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from gateway.settings.policy import Polling, load_policy

from conftest import OPERATOR_TOKEN, PROVIDER_ENV, ROOT, FakeClock


def shipped_polling(provider: str) -> Polling:
    """The polling section of ``policies/<provider>.yaml`` as shipped."""
    path = ROOT / "policies" / f"{provider}.yaml"
    return load_policy(path, path.name, PROVIDER_ENV).polling


def assert_paced(times: list[float], submitted: float, polling: Polling) -> None:
    """The provider's polls kept to the policy's local backoff: the first no sooner than
    ``base_delay x jitter.min`` after the submit, the k-th after the one before no sooner
    than ``min(max_delay, base_delay x 2^k) x jitter.min``; and no more than the budget."""
    assert times, "the provider was never polled"
    assert len(times) <= polling.max_status_requests
    floor = polling.jitter.min
    earliest = [submitted, *times]
    for k, (before, at) in enumerate(itertools.pairwise(earliest)):
        least = floor * min(polling.max_delay, polling.base_delay * 2.0**k)
        assert at - before >= least - 1e-6, (k, at - before, least)


def operator_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


class VirtualTime:
    """A stand-in for the ``time`` module an SDK's waiter reads: ``time()`` is the
    FakeClock, ``sleep`` the (patched) ``time.sleep`` that moves it on."""

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock

    def time(self) -> float:
        return self._clock.now

    def monotonic(self) -> float:
        return self._clock.now

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)
