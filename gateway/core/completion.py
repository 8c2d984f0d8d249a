"""What an operation's end owes (SPEC 23): the usage numbers its final answer reports, the
``operation.completed`` event's body, and how far apart a failing delivery is tried again.

Pure: no I/O, no clock, no randomness of its own (instants and the random draw are passed
in). The store's outbox keeps which events are owed; gateway/flow/completions.py sends them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from gateway.core.models import OperationRecord, Outcome
from gateway.core.values import lookup, parse_json

EVENT = "operation.completed"
MAX_DELAY = 900.0  # a failing receiver is tried again at least every 15 minutes
INT64 = (-(2**63), 2**63 - 1)  # the integers a record's JSON may hold (orjson's range)
NUMERAL = re.compile(r"-?[0-9]{1,30}(\.[0-9]{1,30})?")  # a number written as a string


def usage_found(paths: Mapping[str, str], body: bytes) -> tuple[tuple[str, int | float], ...]:
    """The policy's usage numbers in a final answer, (kind, number) sorted by kind. A path
    that is missing, or holds anything but a number (``_number``), is left out: usage is
    reported, never required."""
    if not paths:
        return ()
    data = parse_json(body)
    found: list[tuple[str, int | float]] = []
    for kind, path in paths.items():
        number = _number(lookup(data, path))
        if number is not None:
            found.append((kind, number))
    return tuple(sorted(found))


def _number(value: Any) -> int | float | None:
    """A finite JSON number, or a decimal numeral in a string (Google's APIs write their
    int64 counts so: ``"requestCount": "100"``); anything else None."""
    if isinstance(value, str) and NUMERAL.fullmatch(value):
        value = float(value) if "." in value else int(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and not INT64[0] <= value <= INT64[1]:
        try:  # the stores write records with orjson: 64-bit integers at most
            value = float(value)
        except OverflowError:  # past any float too
            return None
    return value if math.isfinite(value) else None


def completed(
    before: OperationRecord,
    after: OperationRecord,
    paths: Mapping[str, str],
    body: bytes,
    *,
    announce: bool,
) -> OperationRecord:
    """``after`` as written when it ends ``before`` (pending) with a terminal outcome: its
    usage recorded, and the completion event owed when a webhook is configured. Any other
    change is ``after`` itself."""
    if before.outcome is not Outcome.PENDING or not after.outcome.terminal:
        return after
    usage = usage_found(paths, body)
    if not usage and not announce:
        return after
    return after.evolve(usage=usage, announce=announce)


def message_id(operation_id: str) -> str:
    """The ``webhook-id`` of an operation's completion event: the same on every attempt,
    from every replica, so a receiver that saw it already can tell."""
    return f"completed_{operation_id}"


def event_body(
    record: OperationRecord, at: str | None, result_url: str | None = None
) -> dict[str, Any]:
    """The ``operation.completed`` body (SPEC 23); ``result_url``, the gateway's URL of the
    kept result, only when a copy is kept (None leaves it out)."""
    body: dict[str, Any] = {
        "type": EVENT,
        "id": message_id(record.operation_id),
        "operation_id": record.operation_id,
        "provider": record.provider,
        "account": record.account,
        "outcome": record.outcome.value,
        "provider_state": record.last_known_state,
        "usage": dict(record.usage),
        "ended_at": at,
    }
    if result_url is not None:
        body["result_url"] = result_url
    return body


def retry_delay(failures: int, base: float, u: float) -> float:
    """Seconds before the next attempt after ``failures`` failed ones (1 or more): ``base``
    doubled each time up to MAX_DELAY, times a jitter factor in [0.5, 1.5) from ``u``
    (a uniform draw in [0, 1)), so replicas that failed together spread out."""
    exponent = min(failures - 1, 30)
    return min(MAX_DELAY, base * 2.0**exponent) * (0.5 + u)
