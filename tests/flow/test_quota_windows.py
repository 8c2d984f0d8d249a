"""Quota refusal windows (flow/refusals.py, QuotaWindows): however fast an agent retries
against a full quota, the audit lines stay bounded by time, not by calls, and no refusal
goes uncounted."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.core.keys import QuotaRefusal
from gateway.flow.refusals import QUOTA_WINDOW, QuotaWindows

ACTIVE = QuotaRefusal("team-k", "key_1", "demo-jobs", "max_active_operations", 1, 30)
HOURLY = QuotaRefusal("team-k", "key_1", "demo-jobs", "submits_per_hour", 5, 3500)


@given(
    gaps=st.lists(st.floats(min_value=0, max_value=90), min_size=1, max_size=300),
    sweeps=st.lists(st.booleans(), min_size=300, max_size=300),
    hourly=st.booleans(),
)
def test_lines_are_bounded_by_time_and_count_every_refusal(
    gaps: list[float], sweeps: list[bool], hourly: bool
) -> None:
    """Refusals at any instants, with the sweeper closing ended windows at any of them and
    shutdown closing the rest: the lines' counts add up to the refusals, and there are at
    most two lines a window, a window lasting min(Retry-After, 60 s), so at most
    2 x (1 + span / window) lines whatever the rate."""
    refusal = HOURLY if hourly else ACTIVE
    window = min(QUOTA_WINDOW, float(refusal.retry_after))
    windows = QuotaWindows()
    counts: list[int] = []
    now = 1_000.0
    for gap, sweep in zip(gaps, sweeps, strict=False):
        now += gap
        if sweep:
            counts += [w.count for w in windows.close(now) if w.count]
        ended, opened = windows.note(refusal, now)
        if ended is not None and ended.count:
            counts.append(ended.count)
        if opened:
            counts.append(1)
    counts += [w.count for w in windows.close() if w.count]
    assert sum(counts) == len(gaps)
    span = now - 1_000.0
    assert len(counts) <= 2 * (1 + span / window)


def test_keys_providers_and_quotas_have_windows_of_their_own() -> None:
    """A refusal of another key, provider or quota opens its own window (its own first
    line), so one agent's hammering never hides another's refusals."""
    windows = QuotaWindows()
    assert windows.note(ACTIVE, 0.0) == (None, True)
    assert windows.note(ACTIVE, 1.0) == (None, False)
    assert windows.note(HOURLY, 1.0) == (None, True)
    other = QuotaRefusal("team-k", "key_2", "demo-jobs", "max_active_operations", 1, 30)
    assert windows.note(other, 1.0) == (None, True)
    elsewhere = QuotaRefusal("team-k", "key_1", "batch-api", "max_active_operations", 1, 30)
    assert windows.note(elsewhere, 1.0) == (None, True)
    assert [w.count for w in windows.close()] == [1, 0, 0, 0]
