"""A provider's ask to slow down, applied to the whole provider within policy bounds.

Owns the one step between reading a 429 / RateLimit answer and storing the tightening: the
ask is clamped to ``polling.max_provider_pause`` (core/pacing.bounded), the clamp is counted
in ``statusgate_provider_pauses_clamped_total`` and logged once per pause, and only the
clamped tightening reaches the store (on Redis it is what outlives a restart). It never
stores an instant the provider chose beyond the policy's cap.
"""

from __future__ import annotations

import contextlib
import logging

from gateway import StoreError
from gateway.core.pacing import Tightening, bounded
from gateway.flow.runtime import Runtime
from gateway.settings.policy import ProviderPolicy
from gateway.settings.units import format_duration

log = logging.getLogger("statusgate")


async def tighten(runtime: Runtime, policy: ProviderPolicy, rate: float, until: float) -> None:
    """Store ``policy``'s provider's ask (``rate`` per second until ``until``), bounded."""
    now = runtime.clock()
    cap = policy.polling.provider_pause_cap
    tightening = bounded(rate, until, now, cap)
    if tightening.clamped:
        runtime.effects.metrics.provider_pauses_clamped.labels(policy.provider).inc()
        if runtime.pauses.first(policy.provider, tightening, now):
            log.warning(_clamped_line(policy, tightening, now, cap))
    await runtime.coordination.tighten(policy.provider, tightening.rate, tightening.until)


async def bound_pauses(runtime: Runtime) -> None:
    """At start and after a reload: a pause kept longer than its policy's cap from now (one
    stored by an older version on Redis, or before the cap was lowered) ends at the cap.
    A store that cannot be reached now is left as it is: the gateway fails closed anyway."""
    now = runtime.clock()
    with contextlib.suppress(StoreError):
        for name, policy in runtime.settings.policies.items():
            await runtime.coordination.bound_pause(name, now + policy.polling.provider_pause_cap)


def _clamped_line(policy: ProviderPolicy, t: Tightening, now: float, cap: float) -> str:
    what = "paused" if t.rate <= 0 else f"slowed to {t.rate:g}/s"
    return (
        f"provider {policy.provider} asked for every status call to be {what} for "
        f"{format_duration(t.asked - now)}; kept to polling.max_provider_pause "
        f"({format_duration(cap)}), later answers of this pause are counted, not logged"
    )
