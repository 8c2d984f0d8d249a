"""The schedule rules of SPEC section 4, exactly, without a clock or sleeping."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from gateway.core.models import DelaySource
from gateway.core.schedule import (
    MAX_GUIDANCE,
    AnswerKind,
    Guidance,
    backoff,
    guidance,
    parse_next_check_at,
    parse_poll_after,
    parse_retry_after,
    plan,
)
from gateway.settings.policy import Jitter, Polling

NOW = 1_800_000_000.0
POLLING = Polling(base_delay="5s", max_delay="120s", jitter=Jitter(min=0.5, max=1.0))


def test_backoff_doubles_per_attempt_and_caps() -> None:
    """raw = min(max_delay, base * 2^attempt), scaled by the jitter draw."""
    assert [backoff(POLLING, a, 1.0) for a in range(7)] == [5, 10, 20, 40, 80, 120, 120]
    assert backoff(POLLING, 0, 0.0) == 2.5
    assert backoff(POLLING, 2, 0.5) == 0.75 * 20
    assert backoff(POLLING, 10_000, 1.0) == 120


def test_full_jitter_can_reach_zero() -> None:
    """{min: 0, max: 1} is full jitter."""
    full = Polling(base_delay="5s", max_delay="120s", jitter=Jitter(min=0, max=1))
    assert backoff(full, 3, 0.0) == 0


def test_retry_after_forms() -> None:
    """Delay-seconds and all three HTTP-date forms; 0 and past dates add no wait."""
    assert parse_retry_after("120", NOW) == 120
    assert parse_retry_after(" 0 ", NOW) == 0
    # NOW is 2027-01-15T08:00:00Z
    assert parse_retry_after("Fri, 15 Jan 2027 08:01:30 GMT", NOW) == 90
    assert parse_retry_after("Friday, 15-Jan-27 08:01:30 GMT", NOW) == 90
    assert parse_retry_after("Fri Jan 15 08:01:30 2027", NOW) == 90
    assert parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", NOW) == 0


def test_retry_after_junk_is_rejected() -> None:
    """Negative, fractional, garbage and absurd values are not guidance."""
    for junk in ("-5", "1.5", "soon", "", "NaN", "inf", "99999999999", "0x10", "१२"):
        assert parse_retry_after(junk, NOW) is None, junk


def test_poll_after_hint_validation() -> None:
    """A finite JSON number >= 0, not a bool or a string, not absurd."""
    assert parse_poll_after(3) == 3
    assert parse_poll_after(2.5) == 2.5
    assert parse_poll_after(0) == 0
    for junk in (-1, math.nan, math.inf, True, "5", None, MAX_GUIDANCE + 1, [1]):
        assert parse_poll_after(junk) is None, junk


def test_next_check_at_needs_an_offset() -> None:
    """RFC 3339 with an offset; naive or garbage timestamps are rejected."""
    assert parse_next_check_at("2027-01-15T08:00:10Z", 1_800_000_000.0) == 10
    assert parse_next_check_at("2027-01-15T09:00:10+01:00", 1_800_000_000.0) == 10
    assert parse_next_check_at("2027-01-15T08:00:10", 1_800_000_000.0) is None
    assert parse_next_check_at("tomorrow", NOW) is None
    assert parse_next_check_at(12, NOW) is None


def test_guidance_order_and_rejection() -> None:
    """Retry-After first, then poll_after_seconds, then next_check_at; junk is flagged."""
    assert guidance("7", 3, None, NOW) == Guidance(7, DelaySource.PROVIDER_RETRY_AFTER)
    assert guidance(None, 3, None, NOW) == Guidance(3, DelaySource.PROVIDER_POLL_HINT)
    assert guidance("junk", 3, None, NOW) == Guidance(3, DelaySource.PROVIDER_POLL_HINT, True)
    assert guidance(None, -1, None, NOW) == Guidance(rejected=True)
    assert guidance(None, None, None, NOW) == Guidance()
    assert guidance(None, 3, None, NOW, retry_after_only=True) == Guidance()


def _plan(
    kind: AnswerKind, hint: Guidance, *, attempt: int = 1, u: float = 1.0, deadline=NOW + 3600
):  # type: ignore[no-untyped-def]
    return plan(POLLING, now=NOW, deadline_at=deadline, attempt=attempt, u=u, kind=kind, hint=hint)


def test_pending_guidance_replaces_backoff_with_a_floor() -> None:
    """Guidance replaces local backoff on a pending answer, floored at base x jitter.min."""
    hinted = _plan(AnswerKind.PENDING, Guidance(30, DelaySource.PROVIDER_POLL_HINT))
    assert hinted.next_poll_at == NOW + 30
    assert hinted.source is DelaySource.PROVIDER_POLL_HINT
    zero = _plan(AnswerKind.PENDING, Guidance(0, DelaySource.PROVIDER_RETRY_AFTER))
    assert zero.next_poll_at == NOW + 2.5
    local = _plan(AnswerKind.PENDING, Guidance())
    assert local.next_poll_at == NOW + 10
    assert local.source is DelaySource.LOCAL_BACKOFF


def test_retry_after_is_a_minimum_on_429_and_503() -> None:
    """On 429/503, delay = max(Retry-After, local backoff)."""
    for kind in (AnswerKind.THROTTLED, AnswerKind.UNAVAILABLE):
        small = _plan(kind, Guidance(1, DelaySource.PROVIDER_RETRY_AFTER))
        assert small.next_poll_at == NOW + 10
        assert small.source is DelaySource.LOCAL_BACKOFF
        big = _plan(kind, Guidance(100, DelaySource.PROVIDER_RETRY_AFTER))
        assert big.next_poll_at == NOW + 100
        assert big.source is DelaySource.PROVIDER_RETRY_AFTER


def test_429_without_retry_after_multiplies_backoff() -> None:
    """A 429 without Retry-After multiplies the backoff by rate_limited_multiplier."""
    assert _plan(AnswerKind.THROTTLED, Guidance()).next_poll_at == NOW + 40


def test_local_backoff_is_clamped_to_the_final_poll() -> None:
    """Backoff landing after deadline - margin schedules the last poll at that instant; once
    that instant has passed the next permitted call is the deadline itself."""
    clamped = _plan(AnswerKind.PENDING, Guidance(), attempt=6, deadline=NOW + 60)
    assert clamped.next_poll_at == NOW + 59
    assert not clamped.beyond_deadline
    after = _plan(AnswerKind.PENDING, Guidance(), attempt=6, deadline=NOW + 0.5)
    assert after.next_poll_at == NOW + 0.5


def test_guidance_past_the_deadline_is_flagged() -> None:
    """Provider guidance past deadline - margin means escalate now, not wait in vain."""
    late = _plan(
        AnswerKind.PENDING, Guidance(600, DelaySource.PROVIDER_POLL_HINT), deadline=NOW + 60
    )
    assert late.beyond_deadline


@given(
    attempt=st.integers(min_value=0, max_value=10_000),
    u=st.floats(min_value=0, max_value=1, exclude_max=True),
    hint=st.one_of(st.none(), st.floats(min_value=0, max_value=MAX_GUIDANCE)),
    kind=st.sampled_from(list(AnswerKind)),
    horizon=st.floats(min_value=0.001, max_value=86400),
)
def test_plans_never_go_backwards_or_past_the_deadline(
    attempt: int, u: float, hint: float | None, kind: AnswerKind, horizon: float
) -> None:
    """Every plan is at or after now, and never after the deadline unless flagged."""
    g = Guidance() if hint is None else Guidance(hint, DelaySource.PROVIDER_RETRY_AFTER)
    result = _plan(kind, g, attempt=attempt, u=u, deadline=NOW + horizon)
    assert result.next_poll_at >= NOW
    assert result.beyond_deadline or result.next_poll_at <= NOW + horizon
