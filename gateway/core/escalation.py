"""The plain-text escalation message of SPEC section 6, built from the record alone.

Pure. Offers only the actions the escalation's reason permits, each with its bound, so the
person deciding never faces an open-ended "continue?".
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from gateway.core.actions import offered
from gateway.core.decide import extension_left
from gateway.core.models import OperationRecord
from gateway.settings.policy import ProviderPolicy
from gateway.settings.units import rfc3339


def suggested_extension(policy: ProviderPolicy, record: OperationRecord) -> tuple[float, int]:
    """Half the policy's maximum extension (at least one minute and one check), never more
    than what ``max_extension`` still has left for this operation (SPEC 12)."""
    bound = policy.escalation.max_extension
    seconds = max(60.0, math.floor(bound.time / 2 / 60) * 60.0)
    requests = max(1, bound.requests // 2)
    left = extension_left(policy, record)
    if left is None:
        return 0.0, 0
    return min(seconds, left[0]), min(requests, left[1])


def _option(action: str, policy: ProviderPolicy, record: OperationRecord) -> str:
    if action == "extend":
        seconds, requests = suggested_extension(policy, record)
        return f"extend by {_span(seconds)} with {requests} additional checks"
    return {
        "cancel_at_provider": "cancel at provider",
        "resume": "resume (after the policy or credential is fixed)",
        "abandon": "abandon",
    }.get(action, action)


def _span(seconds: float) -> str:
    if seconds >= 60:
        minutes = math.floor(seconds / 60)
        return f"{minutes} minute" if minutes == 1 else f"{minutes} minutes"
    return f"{math.floor(seconds)} seconds"


def _clock(instant: float) -> str:
    return datetime.fromtimestamp(instant, UTC).strftime("%H:%M")


def message(record: OperationRecord, policy: ProviderPolicy) -> str:
    escalation = record.escalation
    if escalation is None:
        return ""
    elapsed = max(0, round((escalation.at - record.started_at) / 60))
    if record.last_http_status is not None and record.last_polled_at is not None:
        last = f"{record.last_http_status} at {_clock(record.last_polled_at)} UTC"
    elif record.last_polled_at is not None:
        last = f"no answer (transport failure) at {_clock(record.last_polled_at)} UTC"
    else:
        last = "none yet"
    options = ", ".join(_option(a, policy, record) for a in offered(policy, record)) or "none"
    return "\n".join(
        [
            "External job needs a decision",
            f"Operation: {record.operation_id} ({record.provider}, {record.account})",
            f"Provider job: {record.provider_job_id}",
            f"Last state: {record.last_known_state or 'unknown'}",
            f"Elapsed time: {elapsed} minutes",
            f"Status requests: {record.status_requests_used} of {record.max_status_requests}",
            f"Last HTTP result: {last}",
            f"Stopped because: {escalation.reason.value}",
            f"Detail: {escalation.detail}",
            f"Safe options: {options}",
        ]
    )


def problem_members(record: OperationRecord, policy: ProviderPolicy) -> dict[str, Any]:
    """The members operation-escalated problems carry (SPEC section 5)."""
    escalation = record.escalation
    if escalation is None:  # abandoned without an escalation
        return {"reason": record.outcome.value, "permitted_actions": []}
    return {
        "reason": escalation.reason.value,
        "escalated_at": rfc3339(escalation.at),
        "permitted_actions": list(offered(policy, record)),
        "message": message(record, policy),
    }
