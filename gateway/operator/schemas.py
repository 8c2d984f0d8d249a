"""The component schemas of ``GET /openapi.json`` (gateway/operator/openapi.py): the
operation record's fields from the models the handlers use (the outcome, reason and
delay-source enums, the record and its parts), the problem table, the operator API's
answers and request bodies, and the agent keys. Pure."""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

from gateway.core.models import (
    DelaySource,
    Escalation,
    FinalResponse,
    KeptResult,
    LastAnswer,
    OperationRecord,
    Outcome,
    Reason,
)
from gateway.core.problems import PROBLEMS
from gateway.core.roles import NEEDS
from gateway.settings.config import MAX_QUOTA, ROLES

ACTIONS = ["extend", "cancel", "abandon", "resume"]
PERMITTED_ACTIONS = ["extend", "cancel_at_provider", "resume", "abandon"]
INSTANT = {"type": "string", "format": "date-time"}
ROLE = {"enum": list(ROLES)}
JSON_TYPES: dict[type, dict[str, Any]] = {
    str: {"type": "string"},
    bytes: {"type": "string"},  # bodies, shown as text
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
}


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


# -- schemas from the models -----------------------------------------------------------------


# fields a record's JSON leaves out while they are empty (OperationRecord.to_json)
OMITTED_WHEN_EMPTY = frozenset({"route_values", "kept_result", "copy_attempts", "next_copy_at"})


def _field_schema(name: str, kind: Any) -> dict[str, Any]:
    """One dataclass field as the operator API shows it (admin.view): instants as RFC 3339
    strings, enums by value, nested records by reference."""
    args = typing.get_args(kind)
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        inner = [a for a in args if a is not type(None)]
        return nullable(_field_schema(name, inner[0]))
    if name == "at" or name.endswith("_at"):
        return INSTANT
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return ref(kind.__name__)
    if kind in (FinalResponse, Escalation, LastAnswer, KeptResult):
        return ref(f"Record{kind.__name__}")
    if name == "route_values":  # (name, value) pairs, shown as an object (to_json)
        return {"type": "object", "additionalProperties": {"type": "string"}}
    if name == "usage":  # (kind, number) pairs, shown as an object (admin.view)
        return {
            "type": "object",
            "additionalProperties": {"type": "number"},
            "description": "Numbers the final answer reported, by the policy's usage keys.",
        }
    if name == "announce":
        return {
            "type": "boolean",
            "description": "An operation.completed event is owed (a webhook was configured).",
        }
    if typing.get_origin(kind) is tuple:
        return {"type": "array", "items": JSON_TYPES[args[0]]}
    return JSON_TYPES[kind]


def _record_schema(model: type) -> dict[str, Any]:
    hints = typing.get_type_hints(model)
    names = [f.name for f in dataclasses.fields(model)]
    properties = {name: _field_schema(name, hints[name]) for name in names}
    required = [name for name in names if name not in OMITTED_WHEN_EMPTY]
    return {"type": "object", "properties": properties, "required": required}


def _enum(kind: type[enum.Enum], description: str) -> dict[str, Any]:
    return {"type": "string", "enum": [m.value for m in kind], "description": description}


def problem_schema() -> dict[str, Any]:
    slugs = sorted(PROBLEMS)
    return {
        "type": "object",
        "description": "RFC 9457 problem details; every error of the gateway is one.",
        "properties": {
            "type": {"type": "string", "enum": [f"/problems/{s}" for s in slugs]},
            "title": {"type": "string"},
            "status": {"type": "integer", "enum": sorted({p.status for p in PROBLEMS.values()})},
            "detail": {"type": "string"},
            "operation_id": {"type": "string"},
            "reason": {"type": "string"},
            "escalated_at": INSTANT,
            "permitted_actions": {"type": "array", "items": {"type": "string"}},
            "message": {"type": "string"},
            "problems": {"type": "array", "items": {"type": "string"}},
            "required_role": {**ROLE, "description": "forbidden-role: the role needed."},
            "role": {**ROLE, "description": "forbidden-role: the caller's role."},
            "error": {
                "type": "object",
                "description": "The envelope OpenAI-compatible SDKs print (SPEC 20).",
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string", "enum": slugs},
                    "code": {"type": "string", "enum": slugs},
                },
                "required": ["message", "type", "code"],
            },
        },
        "required": ["type", "title", "status", "detail", "error"],
    }


def obj(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required or []}


STRING = {"type": "string"}
STRINGS = {"type": "array", "items": STRING}
COUNT = {"type": "integer", "minimum": 0}


def model_schemas() -> dict[str, Any]:
    """The enums and the operation record, from models.py."""
    return {
        "Problem": problem_schema(),
        "Outcome": _enum(Outcome, "Where an operation stands."),
        "Reason": _enum(Reason, "Why waiting ended for a person (an escalation)."),
        "DelaySource": _enum(DelaySource, "What set the next permitted poll."),
        "RecordFinalResponse": {
            **_record_schema(FinalResponse),
            "description": "The provider answer that ended the operation; body as text.",
        },
        "RecordEscalation": _record_schema(Escalation),
        "RecordLastAnswer": {
            **_record_schema(LastAnswer),
            "description": "The last pending provider answer, replayed to early status calls "
            "(early_calls: replay); body as text.",
        },
        "RecordKeptResult": {
            **_record_schema(KeptResult),
            "description": "The copy of a succeeded job's result the gateway keeps "
            "(results.keep); name empty when it was over results.max_bytes.",
        },
        "OperationRecord": _record_schema(OperationRecord),
    }


def answer_schemas() -> dict[str, Any]:
    """The operator API's answers and request bodies."""
    members = {
        "reason": STRING,
        "escalated_at": INSTANT,
        "permitted_actions": {"type": "array", "items": {"enum": PERMITTED_ACTIONS}},
        "message": STRING,
    }
    left = {"time": STRING, "seconds": {"type": "number"}, "requests": COUNT}
    left |= {"max_time": STRING, "max_requests": COUNT}
    cursor = {**nullable(STRING), "description": "cursor of the next page; null on the last."}
    return {
        "EscalationMembers": obj(members, ["reason", "permitted_actions"]),
        "OperationList": obj(
            {
                "operations": {"type": "array", "items": ref("OperationRecord")},
                "next_cursor": cursor,
            },
            ["operations"],
        ),
        "OperationDetail": obj(
            {
                "record": ref("OperationRecord"),
                "escalation": nullable(ref("EscalationMembers")),
                "message": nullable(STRING),
                **story_schemas(),
                "extension_left": nullable(obj(left, list(left))),
            },
            ["record", "escalation", "message", "story"],
        ),
        "ActionRequest": obj(
            {
                "time": {**STRING, "description": 'extend: a duration like "15m"'},
                "requests": {"type": "integer", "description": "extend: checks added"},
                "reason": {**STRING, "description": "audited (its first 500 characters)"},
            }
        ),
        "ActionResult": obj(
            {"action": {"enum": ACTIONS}, "record": ref("OperationRecord")}, ["action", "record"]
        ),
        "ReloadResult": obj(
            {"result": {"const": "ok"}, "policies": STRINGS, "actor": STRING},
            ["result", "policies", "actor"],
        ),
        "Caller": obj(
            {
                "id": {**STRING, "description": "The name audit lines give the caller."},
                "role": ROLE,
                "via": {"enum": ["token", "oidc"]},
                "may": obj({name: {"type": "boolean"} for name in NEEDS}, list(NEEDS)),
                "expires_at": {**nullable(INSTANT), "description": "A JWT's exp; else null."},
            },
            ["id", "role", "via", "may", "expires_at"],
        ),
        "EscalationQueue": obj(
            {"escalations": {"type": "array", "items": queued()}, "total": COUNT, "now": INSTANT},
            ["escalations", "total"],
        ),
    }


def story_schemas() -> dict[str, Any]:
    """An operation's audit story in its detail: the lines, where each came from (the
    replica), and why lines may be missing."""
    return {
        "story": {
            **STRINGS,
            "description": "The audit story, one line per event; on PostgreSQL every"
            " replica's lines in time order, each ending (replica NAME).",
        },
        "story_lines": {
            "type": "array",
            "description": "Where each story line came from, in the same order.",
            "items": obj(
                {
                    "at": nullable(STRING),
                    "replica": STRING,
                    "seq": {"type": "integer"},
                    "event": nullable(STRING),
                },
                ["at", "replica", "seq", "event"],
            ),
        },
        "story_note": nullable(
            {
                **STRING,
                "description": "Why lines may be missing (the store's copy"
                " could not be read; lines that cannot be told left out), or null.",
            }
        ),
    }


def queued() -> dict[str, Any]:
    """One entry of the escalation queue."""
    return obj(
        {
            "operation_id": STRING,
            "provider": STRING,
            "account": STRING,
            "provider_job_id": STRING,
            "reason": nullable(STRING),
            "escalated_at": INSTANT,
            "age_seconds": {"type": "number", "minimum": 0},
            "permitted_actions": STRINGS,
            "message": STRING,
        },
        ["operation_id", "provider", "account", "reason", "permitted_actions", "message"],
    )


LIMIT_OR_NONE = nullable({"type": "integer", "minimum": 1, "maximum": MAX_QUOTA})


def key_schemas() -> dict[str, Any]:
    """Agent keys (SPEC 25): the request, a key as listed, a new key with its token."""
    quotas = obj({"max_active_operations": LIMIT_OR_NONE, "submits_per_hour": LIMIT_OR_NONE})
    shown = {
        "id": STRING,
        "account": STRING,
        "providers": STRINGS,
        "expires_at": nullable(INSTANT),
        "quotas": ref("Quotas"),
        "created_at": INSTANT,
        "created_by": STRING,
        "expired": {"type": "boolean"},
    }
    token = {**STRING, "description": "The key's token: in this answer only, never again."}
    request = {
        "account": {**STRING, "minLength": 1, "description": "The account records carry."},
        "providers": {**STRINGS, "minItems": 1, "description": 'Provider names, or ["*"].'},
        "expires_at": {**nullable(INSTANT), "description": "RFC 3339; refused after it."},
        "quotas": ref("Quotas"),
    }
    return {
        "Quotas": {**quotas, "additionalProperties": False},
        "KeyRequest": {**obj(request, ["account", "providers"]), "additionalProperties": False},
        "AgentKey": obj(shown, list(shown)),
        "NewAgentKey": obj({**shown, "token": token}, [*shown, "token"]),
        "KeyList": obj({"keys": {"type": "array", "items": ref("AgentKey")}, "now": INSTANT}),
    }
