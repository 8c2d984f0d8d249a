"""How a record lies in the PostgreSQL store's tables: the operations row, the arguments of
``sg_cas`` (the compare-and-set every record write goes through) and what its answer
means, the idempotency row, and a record read back. Pure data shaping: no connection."""

from __future__ import annotations

from typing import Any

import orjson

from gateway import NotAdmissible
from gateway.core.models import IdempotencyEntry, OperationRecord, Outcome

CASArgs = tuple[Any, ...]
COLUMNS = (
    "operation_id",
    "account",
    "provider",
    "provider_job_id",
    "outcome",
    "started_at",
    "deadline_at",
    "ended_at",
    "reason",
    "used",
    "budget",
    "next_poll_at",
    "version",
    "data",
)  # the operations table's, in order (sql/layout_1.sql)
SYNC_TOLERANCE = 0.05  # next_poll_at slack between a replica's synced clock and the database's


def operation_row(record: OperationRecord) -> CASArgs:
    """A record as a row of the operations table, in column order."""
    escalation = record.escalation
    return (
        record.operation_id,
        record.account,
        record.provider,
        record.provider_job_id,
        record.outcome.value,
        record.started_at,
        record.deadline_at,
        record.ended_at,
        escalation.reason.value if escalation is not None else None,
        record.status_requests_used,
        record.max_status_requests,
        record.next_poll_at,
        record.version,
        orjson.dumps(record.to_dict()).decode(),
    )


def cas_args(record: OperationRecord) -> CASArgs:
    """sg_cas's arguments for writing ``record`` (stored as version + 1)."""
    data = record.to_dict()
    data["version"] = record.version + 1  # as stored; cheaper than evolving a copy first
    escalation = record.escalation
    reason = None
    if record.outcome is Outcome.ESCALATED and escalation is not None:
        reason = escalation.reason.value
    return (
        record.operation_id,
        record.version,
        orjson.dumps(data).decode(),
        record.outcome.value,
        record.status_requests_used,
        record.max_status_requests,
        record.next_poll_at,
        record.deadline_at,
        record.ended_at,
        reason,
        SYNC_TOLERANCE,
    )


def written(answer: int) -> bool:
    """sg_cas's answer: True written, False stale or gone; refused by the clock raises."""
    if answer == -2:
        raise NotAdmissible("by the database clock this status request is not permitted now")
    return answer == 1


def idem_row(entry: IdempotencyEntry) -> tuple[str, float, str]:
    return entry.key, entry.expires_at, orjson.dumps(entry.to_dict()).decode()


def load(row: Any) -> OperationRecord | None:
    return None if row is None else OperationRecord.from_dict(orjson.loads(row[0]))
