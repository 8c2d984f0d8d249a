"""What MCP answers say about an operation: views of a record and their JSON Schemas.

Pure. The schemas are written from the same enums the records use (Outcome, Reason), so a
tool's outputSchema and the structuredContent it returns cannot drift apart. Never shows
the account's token, the provider credential, or an upstream URL (URL fields of a final body
are rewritten to the gateway like every provider answer).
"""

from __future__ import annotations

import json
from typing import Any

from gateway.core.escalation import problem_members
from gateway.core.models import OperationRecord, Outcome, Reason
from gateway.provider.headers import Rewriter
from gateway.settings.policy import ProviderPolicy
from gateway.settings.units import rfc3339

STRING = {"type": "string"}
INSTANT = {"type": "string", "format": "date-time"}
ESCALATION_REASONS = [*(r.value for r in Reason), Outcome.ABANDONED.value]


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def operation(record: OperationRecord) -> dict[str, Any]:
    """The fields every tool shows for an operation."""
    pending = record.outcome is Outcome.PENDING
    return {
        "operation_id": record.operation_id,
        "provider": record.provider,
        "provider_job_id": record.provider_job_id,
        "outcome": record.outcome.value,
        "provider_state": record.last_known_state,
        "requests_remaining": max(0, record.max_status_requests - record.status_requests_used),
        "deadline": rfc3339(record.deadline_at),
        "next_poll_at": rfc3339(record.next_poll_at, millis=True) if pending else None,
    }


def detailed(record: OperationRecord, policy: ProviderPolicy | None) -> dict[str, Any]:
    """``operation`` plus the escalation (null unless waiting ended for a person) and the
    usage numbers the final answer reported (SPEC 23; empty until it ended)."""
    return {
        **operation(record),
        "escalation": escalation(record, policy),
        "usage": dict(record.usage),
    }


def escalation(record: OperationRecord, policy: ProviderPolicy | None) -> dict[str, Any] | None:
    if record.escalation is None and record.outcome is not Outcome.ABANDONED:
        return None
    if policy is not None:
        return problem_members(record, policy)
    found = record.escalation
    if found is None:
        return {"reason": record.outcome.value, "permitted_actions": []}
    return {
        "reason": found.reason.value,
        "escalated_at": rfc3339(found.at),
        "permitted_actions": list(found.permitted_actions),
    }


def final(record: OperationRecord, rewriter: Rewriter | None, fields: list[str]) -> Any:
    """The final provider answer of a terminal operation: status, content type, the body as
    text and, when it is JSON, parsed; None while the operation has not ended there."""
    answer = record.final_response
    if answer is None or not record.outcome.terminal:
        return None
    text = answer.body.decode("utf-8", "replace")
    view: dict[str, Any] = {"status": answer.status, "content_type": answer.content_type}
    try:
        data = json.loads(text) if "json" in answer.content_type.lower() else None
    except (ValueError, RecursionError):
        data = None
    if data is not None and rewriter is not None and fields and rewriter.body_fields(data, fields):
        text = json.dumps(data)
    view["body"] = text
    if data is not None:
        view["json"] = data
    return view


OPERATION_PROPERTIES: dict[str, Any] = {
    "operation_id": {**STRING, "description": "The gateway's id; also the MCP task id."},
    "provider": STRING,
    "provider_job_id": STRING,
    "outcome": {"type": "string", "enum": [o.value for o in Outcome]},
    "provider_state": nullable({**STRING, "description": "The provider's last raw state."}),
    "requests_remaining": {"type": "integer", "minimum": 0},
    "deadline": INSTANT,
    "next_poll_at": nullable({**INSTANT, "description": "The next permitted poll (pending)."}),
}
OPERATION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": OPERATION_PROPERTIES,
    "required": list(OPERATION_PROPERTIES),
}
ESCALATION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "reason": {"type": "string", "enum": ESCALATION_REASONS},
        "escalated_at": INSTANT,
        "permitted_actions": {"type": "array", "items": STRING},
        "message": {**STRING, "description": "Plain text an operator decides from."},
    },
    "required": ["reason", "permitted_actions"],
}
FINAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "status": {"type": "integer"},
        "content_type": STRING,
        "body": {**STRING, "description": "The provider's final answer body as text."},
        "json": {"description": "The body parsed, when it is JSON."},
    },
    "required": ["status", "content_type", "body"],
}
ANSWER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "status": {"type": "integer"},
        "content_type": STRING,
        "body": {**STRING, "description": "The answer body as text (empty when base64)."},
        "body_base64": {**STRING, "description": "The body, when it is not UTF-8 text."},
        "json": {"description": "The body parsed, when it is JSON."},
        "kept": {
            "type": "boolean",
            "description": "True: the gateway's kept copy of the result (no provider call).",
        },
    },
    "required": ["status", "content_type", "body"],
}
USAGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": {"type": "number"},
    "description": "Numbers the final answer reported, by the policy's usage keys.",
}
DETAILED_PROPERTIES: dict[str, Any] = {
    **OPERATION_PROPERTIES,
    "escalation": nullable(ESCALATION_SCHEMA),
    "usage": USAGE_SCHEMA,
}
