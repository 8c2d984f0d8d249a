"""The idempotency rules of SPEC section 4 (submit, step 2), as pure functions.

No submission is ever sent twice by the gateway's own doing: a key whose original may have
reached the provider, with no word back, stays "outcome unknown" unless the provider itself
deduplicates by the forwarded key.
"""

from __future__ import annotations

import enum
import hashlib
import re

from gateway.core.models import Failure, IdempotencyEntry, IdemState

KEY = re.compile(r"[\x21-\x7e]{1,255}")


def valid_key(key: str) -> bool:
    """SPEC 16: an Idempotency-Key is 1 to 255 visible ASCII characters."""
    return KEY.fullmatch(key) is not None


def forwarded_key(account: str, key: str) -> str:
    """The key the provider sees (SPEC 16): derived from the account and the agent's key,
    so two accounts that chose the same key never meet under the one shared credential;
    stable across restarts and replicas."""
    digest = hashlib.sha256(f"{account}:{key}".encode()).hexdigest()
    return f"sg1-{digest[:32]}"


class Seen(enum.Enum):
    """What a submit whose key was already claimed gets."""

    CONFLICT = "idempotency-key-conflict"  # same key, another request
    IN_USE = "idempotency-key-in-use"  # the original is still at the provider
    REPLAY = "replay"  # the stored answer, without forwarding
    UNKNOWN = "submission-outcome-unknown"  # the original's answer was lost


def judge(seen: IdempotencyEntry, fingerprint: str, now: float, in_flight_limit: float) -> Seen:
    """``in_flight_limit``: seconds after which an original still "in flight" is lost
    (its gateway died or timed out without recording it)."""
    if seen.fingerprint != fingerprint:
        return Seen.CONFLICT
    if seen.state is IdemState.IN_FLIGHT:
        return Seen.IN_USE if now - seen.created_at <= in_flight_limit else Seen.UNKNOWN
    if seen.state is IdemState.COMPLETED and seen.response is not None and seen.operation_id:
        return Seen.REPLAY
    return Seen.UNKNOWN


def retry_is_safe(failure: Failure | None, provider_dedups: bool) -> bool:
    """After a failed forward: may the key be released for a retry? Only when nothing was
    sent, or when the provider deduplicates by the key it was sent."""
    return failure is Failure.UNREACHABLE or provider_dedups
