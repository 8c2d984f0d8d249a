"""When the next status request may go out (SPEC section 4, "Scheduling the next poll").

Pure: no clock, no randomness, no I/O. The caller passes ``now`` and a uniform draw ``u`` in
[0, 1); the same inputs always give the same plan. Provider guidance (Retry-After, poll hints)
is parsed here and anything unusable is rejected rather than trusted.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from gateway.core.models import DelaySource
from gateway.settings.policy import Polling

# Guidance beyond this is absurd (a typo or a unit mix-up), not a real request to wait.
MAX_GUIDANCE = 30 * 86400.0
_DIGITS = re.compile(r"[0-9]{1,12}")


class AnswerKind(enum.Enum):
    """What the schedule needs to know about the answer it plans after."""

    PENDING = "pending"  # 2xx, still running: provider guidance replaces local backoff
    THROTTLED = "throttled"  # 429: Retry-After is a minimum, else backoff x multiplier
    UNAVAILABLE = "unavailable"  # 5xx, connection error, timeout: Retry-After is a minimum
    NOT_VISIBLE = "not_visible"  # 404 within the grace period: plain backoff


@dataclass(frozen=True, slots=True)
class Guidance:
    """What the provider asked for: ``seconds`` to wait, or None; ``rejected`` if it was junk."""

    seconds: float | None = None
    source: DelaySource = DelaySource.LOCAL_BACKOFF
    rejected: bool = False


@dataclass(frozen=True, slots=True)
class Plan:
    next_poll_at: float
    source: DelaySource
    hint_rejected: bool
    beyond_deadline: bool  # provider guidance asks to wait past the last permitted poll


def backoff(polling: Polling, attempt: int, u: float) -> float:
    """``uniform(jitter.min, jitter.max) * min(max_delay, base_delay * 2^attempt)``."""
    exponent = min(max(attempt, 0), 64)
    raw = min(polling.max_delay, polling.base_delay * (2.0**exponent))
    jitter = polling.jitter
    return (jitter.min + (jitter.max - jitter.min) * u) * raw


def parse_retry_after(value: str, now: float) -> float | None:
    """Seconds to wait from a Retry-After value (delay-seconds or an HTTP-date), else None."""
    text = value.strip()
    if _DIGITS.fullmatch(text):
        seconds = float(text)
    else:
        instant = _http_date(text)
        if instant is None:
            return None
        seconds = max(0.0, instant - now)
    return seconds if seconds <= MAX_GUIDANCE else None


def _http_date(text: str) -> float | None:
    try:
        parsed = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if parsed.tzinfo is None:  # asctime form carries no zone; HTTP dates are always GMT
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def parse_poll_after(value: object) -> float | None:
    """A poll_after_seconds hint: a finite JSON number >= 0 and not absurd, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_GUIDANCE:
        return None
    return seconds


def parse_instant(value: object) -> float | None:
    """An RFC 3339 timestamp with an offset, as epoch seconds; None if unusable."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None
    try:
        return parsed.timestamp()
    except (OverflowError, OSError, ValueError):
        return None


def parse_next_check_at(value: object, now: float) -> float | None:
    instant = parse_instant(value)
    if instant is None:
        return None
    seconds = max(0.0, instant - now)
    return seconds if seconds <= MAX_GUIDANCE else None


def guidance(
    retry_after: str | None,
    poll_after: object,
    next_check_at: object,
    now: float,
    *,
    retry_after_only: bool = False,
) -> Guidance:
    """The first usable piece of guidance, in SPEC order; junk is skipped and flagged."""
    rejected = False
    if retry_after is not None:
        seconds = parse_retry_after(retry_after, now)
        if seconds is not None:
            return Guidance(seconds, DelaySource.PROVIDER_RETRY_AFTER)
        rejected = True
    if not retry_after_only:
        candidates = (
            (poll_after, parse_poll_after(poll_after)),
            (next_check_at, parse_next_check_at(next_check_at, now)),
        )
        for raw, seconds in candidates:
            if seconds is not None:
                return Guidance(seconds, DelaySource.PROVIDER_POLL_HINT, rejected)
            if raw is not None:
                rejected = True
    return Guidance(rejected=rejected)


def plan(
    polling: Polling,
    *,
    now: float,
    deadline_at: float,
    attempt: int,
    u: float,
    kind: AnswerKind,
    hint: Guidance,
) -> Plan:
    """The next permitted poll after an answer of ``kind`` (SPEC section 4 schedule rules)."""
    local = backoff(polling, attempt, u)
    delay, source, guided = local, DelaySource.LOCAL_BACKOFF, False
    if hint.seconds is not None and kind is AnswerKind.PENDING:
        delay = max(hint.seconds, polling.base_delay * polling.jitter.min)
        source, guided = hint.source, True
    elif hint.seconds is not None and kind in (AnswerKind.THROTTLED, AnswerKind.UNAVAILABLE):
        if hint.seconds >= local:
            delay, source, guided = hint.seconds, hint.source, True
    elif kind is AnswerKind.THROTTLED:
        delay = local * polling.rate_limited_multiplier
    at = now + delay
    last_poll = deadline_at - polling.final_poll_margin
    if at > last_poll:
        if guided:
            return Plan(at, source, hint.rejected, beyond_deadline=True)
        # The final poll goes out at the margin; once that has passed, the deadline is next.
        at = last_poll if last_poll > now else deadline_at
    return Plan(at, source, hint.rejected, beyond_deadline=False)


_RL_MEMBER = re.compile(r"\b(limit|remaining|reset|r|t)\s*=\s*\"?(\d{1,12})\"?", re.IGNORECASE)


def provider_limit(
    status: int | None, headers: Mapping[str, str], now: float
) -> tuple[float, float] | None:
    """(rate per second, until) a provider asked its client to keep to, or None.

    Reads a 429's Retry-After (pause until then) and the IETF RateLimit fields in the
    forms providers send: ``RateLimit-Remaining`` + ``RateLimit-Reset``,
    ``RateLimit: limit=100, remaining=0, reset=30`` and ``RateLimit: "q";r=0;t=30``.
    """
    if status == 429:
        retry_after = headers.get("Retry-After")
        seconds = parse_retry_after(retry_after, now) if retry_after is not None else None
        if seconds:
            return 0.0, now + seconds
    values: dict[str, int] = {}
    combined = headers.get("RateLimit")
    if combined is not None:
        for name, number in _RL_MEMBER.findall(combined[:500]):
            key = {"r": "remaining", "t": "reset"}.get(name.lower(), name.lower())
            values.setdefault(key, int(number))
    for key in ("remaining", "reset"):
        raw = headers.get(f"RateLimit-{key.capitalize()}")
        if raw is not None and _DIGITS.fullmatch(raw.strip()):
            values.setdefault(key, int(raw.strip()))
    remaining, reset = values.get("remaining"), values.get("reset")
    if remaining is None or not reset or reset > MAX_GUIDANCE:
        return None
    return remaining / reset, now + reset
