"""Fleet pacing: a provider-wide ceiling on status calls, shared by replicas, tightened by
the provider's own RateLimit fields and 429s."""

from __future__ import annotations

from gateway.core.pacing import Pacer, PauseNotes, bounded
from gateway.core.schedule import provider_limit


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
