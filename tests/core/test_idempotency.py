"""The idempotency rules as pure functions: every case of SPEC section 4, submit step 2."""

from __future__ import annotations

from gateway.core.idempotency import Seen, judge, retry_is_safe
from gateway.core.models import Failure, IdempotencyEntry, IdemState, StoredResponse

NOW = 1_800_000_000.0


def entry(state: IdemState, *, fingerprint: str = "f", age: float = 0.0) -> IdempotencyEntry:
    response = StoredResponse(202, (), b"{}") if state is IdemState.COMPLETED else None
    operation = "op_1" if state is IdemState.COMPLETED else None
    return IdempotencyEntry("k", fingerprint, state, NOW - age, NOW + 3600, operation, response)


def test_other_request_with_the_same_key_is_a_conflict() -> None:
    """A key seen with another request's fingerprint is a conflict in every state."""
    for state in IdemState:
        assert judge(entry(state, fingerprint="other"), "f", NOW, 31) is Seen.CONFLICT


def test_original_in_flight_is_in_use_until_it_must_have_ended() -> None:
    """A key whose first request is in flight is in use until that request must have ended,
    then unknown."""
    assert judge(entry(IdemState.IN_FLIGHT, age=5), "f", NOW, 31) is Seen.IN_USE
    assert judge(entry(IdemState.IN_FLIGHT, age=40), "f", NOW, 31) is Seen.UNKNOWN


def test_completed_replays_and_unknown_stays_unknown() -> None:
    """A completed key replays its answer and an outcome-unknown key stays unknown."""
    assert judge(entry(IdemState.COMPLETED), "f", NOW, 31) is Seen.REPLAY
    assert judge(entry(IdemState.UNKNOWN), "f", NOW, 31) is Seen.UNKNOWN


def test_a_retry_is_safe_only_if_nothing_was_sent_or_the_provider_deduplicates() -> None:
    """A submit is retried only when nothing reached the provider or the provider deduplicates
    by key."""
    assert retry_is_safe(Failure.UNREACHABLE, provider_dedups=False)
    for failure in (Failure.TIMEOUT, Failure.CONNECTION, Failure.TOO_LARGE, None):
        assert not retry_is_safe(failure, provider_dedups=False)
        assert retry_is_safe(failure, provider_dedups=True)
