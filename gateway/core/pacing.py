"""Fleet pacing: a per-provider ceiling on status calls per second
(``polling.provider_rate``), owned here whole: the shared sliding window (Pacer; the Redis
store runs the same rules in pacing.lua on Redis time), the tightening a provider asks for,
and the spacing of sends in one process (Spacer).

The window is pure bookkeeping with ``now`` passed in. A sliding window allows ``limit`` calls per
``window`` seconds, the window stretched by GUARD so that calls bunched by network jitter
still arrive at the provider under the ceiling. A provider's own signals (RateLimit headers,
429 with Retry-After) tighten its ceiling until their reset; a tightened rate of 0 pauses the
provider. The Redis store runs the same rules in one Lua script on Redis time.

A provider's ask is bounded by the policy (``polling.max_provider_pause``, default
``max_delay``): one answer with ``Retry-After: 2505600`` must not stop every operation of
the provider for a month, so a longer tightening is clamped (``bounded``), never trusted,
and said once per pause (``PauseNotes``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

GUARD = 1.05
MIN_WAIT = 0.001


def window_for(rate: float) -> tuple[int, float]:
    """(calls, seconds) of the sliding window that keeps under ``rate`` per second."""
    limit = max(1, math.floor(rate))
    return limit, limit / rate * GUARD


@dataclass
class Pacer:
    calls: dict[str, deque[float]] = field(default_factory=dict)
    tightened: dict[str, tuple[float, float]] = field(default_factory=dict)  # rate, until

    def pace(self, provider: str, rate: float | None, now: float) -> float:
        """0 if a status call to ``provider`` may go now (and count it), else seconds to wait."""
        tight = self.tightened.get(provider)
        if tight is not None and tight[1] > now:
            if tight[0] <= 0:
                return tight[1] - now
            rate = tight[0] if rate is None else min(rate, tight[0])
        if rate is None:
            return 0.0
        limit, window = window_for(rate)
        calls = self.calls.setdefault(provider, deque())
        while calls and calls[0] <= now - window:
            calls.popleft()
        if len(calls) < limit:
            calls.append(now)
            return 0.0
        return max(calls[0] + window - now, MIN_WAIT)  # a refusal is never "wait 0"

    def bound(self, provider: str, latest: float) -> None:
        """A tightening kept past ``latest`` ends at ``latest`` (a policy's cap, lowered)."""
        current = self.tightened.get(provider)
        if current is not None and current[1] > latest:
            self.tightened[provider] = (current[0], latest)

    def tighten(self, provider: str, rate: float, until: float) -> None:
        current = self.tightened.get(provider)
        if current is None or current[1] <= until or rate < current[0]:
            self.tightened[provider] = (rate, until)


@dataclass(frozen=True)
class Tightening:
    """What a provider asked for (rate per second until ``asked``), as the gateway keeps it:
    until ``until``, at most the policy's cap from now."""

    rate: float
    until: float
    asked: float

    @property
    def clamped(self) -> bool:
        return self.until < self.asked


def bounded(rate: float, until: float, now: float, cap: float) -> Tightening:
    """The provider's ``rate`` until ``until``, lasting no longer than ``cap`` from ``now``."""
    return Tightening(rate, min(until, now + cap), until)


@dataclass
class PauseNotes:
    """When to say that a provider's ask was clamped: once per pause, not once per answer
    (a provider sending the same month-long Retry-After on every call logs one line)."""

    said_until: dict[str, float] = field(default_factory=dict)

    def first(self, provider: str, tightening: Tightening, now: float) -> bool:
        """True if ``tightening`` is clamped and no clamped pause said before still runs."""
        if not tightening.clamped:
            return False
        if self.said_until.get(provider, float("-inf")) > now:
            return False
        self.said_until[provider] = tightening.until
        return True


@dataclass
class Spacer:
    """Keeps one process's status calls to a provider at least GUARD / rate apart.

    The shared window decides how many polls may be reserved; batched commits can release
    reserved polls together, so sends are spaced here, measured from the previous actual
    send, right before each one goes out."""

    last_send: dict[str, float] = field(default_factory=dict)

    async def wait(
        self,
        provider: str,
        rate: float,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        interval = GUARD / rate
        while True:
            now = clock()
            last = self.last_send.get(provider)
            if last is None or now - last >= interval:
                self.last_send[provider] = now
                return
            await sleep(interval - (now - last))
