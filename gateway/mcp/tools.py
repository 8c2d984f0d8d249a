"""The three MCP tools: list_operations, get_operation, wait_for_operation (SPEC 15).

Owns their input and output schemas, the checking of arguments, and the results: JSON in
``structuredContent`` that matches the outputSchema, a short text summary, and the same JSON
serialised as text for clients without structured content. A tool-level failure is an
``isError`` result naming the problem slug. Never polls except through caller.wait.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gateway.core.models import OperationFilter, OperationRecord, Outcome
from gateway.mcp import views
from gateway.mcp.caller import Caller, Refused, owned, policy_of, wait
from gateway.mcp.jsonrpc import INVALID_PARAMS, RpcError

LIST_LIMIT = 100
NEW_VALIDATION = frozenset({"2025-11-25"})  # input errors are tool errors (SEP-1303)
WAIT_TOOL = "wait_for_operation"


class BadArguments(Exception):
    """Arguments that do not fit the tool's inputSchema."""


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    title: str
    description: str
    input: dict[str, Any]
    output: dict[str, Any]
    run: Callable[[Caller, dict[str, Any]], Awaitable[dict[str, Any]]]


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


OPERATION_ID = {"type": "string", "minLength": 1, "maxLength": 200}


# -- arguments -------------------------------------------------------------------------------


def _text(args: dict[str, Any], name: str, *, required: bool = False) -> str | None:
    value = args.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise BadArguments(f"{name} must be a non-empty string")
    return value


def _checked(args: Any, allowed: set[str]) -> dict[str, Any]:
    if args is None:
        return {}
    if not isinstance(args, dict):
        raise BadArguments("arguments must be an object")
    unknown = sorted(set(args) - allowed)
    if unknown:
        raise BadArguments(f"unknown argument(s): {', '.join(unknown)}")
    return args


def _seconds(args: dict[str, Any], name: str) -> float | None:
    value = args.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadArguments(f"{name} must be a number of seconds")
    if not math.isfinite(value) or value < 0:
        raise BadArguments(f"{name} must be a finite number >= 0")
    return float(value)


# -- results ---------------------------------------------------------------------------------


def result(structured: dict[str, Any], summary: str) -> dict[str, Any]:
    content = [
        {"type": "text", "text": summary},
        {"type": "text", "text": json.dumps(structured)},
    ]
    return {"content": content, "structuredContent": structured, "isError": False}


def failure(refused: Refused) -> dict[str, Any]:
    problem = refused.problem()
    text = f"{refused.slug}: {refused.detail}"
    content = [{"type": "text", "text": text}, {"type": "text", "text": json.dumps(problem)}]
    return {"content": content, "isError": True}


def summary(record: OperationRecord) -> str:
    """One line an agent (or a model) can act on."""
    head = f"Operation {record.operation_id} ({record.provider}, job {record.provider_job_id})"
    state = f", provider state {record.last_known_state}" if record.last_known_state else ""
    if record.outcome is Outcome.PENDING:
        left = max(0, record.max_status_requests - record.status_requests_used)
        return f"{head} is pending{state}; {left} status requests left."
    if record.outcome is Outcome.ESCALATED and record.escalation is not None:
        reason = record.escalation.reason.value
        return f"{head} is escalated ({reason}): waiting has ended until an operator decides."
    return f"{head} is {record.outcome.value}{state}."


# -- the tools -------------------------------------------------------------------------------


async def list_operations(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    args = _checked(args, {"provider", "outcome"})
    provider = _text(args, "provider")
    outcome_name = _text(args, "outcome")
    try:
        outcome = Outcome(outcome_name) if outcome_name is not None else None
    except ValueError:
        raise BadArguments(
            "outcome must be one of " + ", ".join(o.value for o in Outcome)
        ) from None
    where = OperationFilter(
        outcome=outcome, provider=provider, account=caller.account.id, limit=LIST_LIMIT
    )
    found = await caller.runtime.records.list(where)
    structured = {"operations": [views.operation(r) for r in found], "count": len(found)}
    counts: dict[str, int] = {}
    for record in found:
        counts[record.outcome.value] = counts.get(record.outcome.value, 0) + 1
    detail = ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))
    text = f"{len(found)} operation(s), newest first" + (f": {detail}." if detail else ".")
    return result(structured, text)


async def _record(caller: Caller, args: dict[str, Any]) -> OperationRecord:
    operation_id = _text(args, "operation_id", required=True)
    assert operation_id is not None
    record = await owned(caller, operation_id)
    if record is None:
        detail = "This account has no operation with that id."
        raise Refused("unknown-operation", detail)
    return record


async def get_operation(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    record = await _record(caller, _checked(args, {"operation_id"}))
    return result(views.detailed(record, policy_of(caller, record)), summary(record))


def wait_arguments(args: dict[str, Any]) -> tuple[str, float | None]:
    """wait_for_operation's operation id and max_wait_seconds; BadArguments if they do not
    fit its inputSchema."""
    args = _checked(args, {"operation_id", "max_wait_seconds"})
    operation_id = _text(args, "operation_id", required=True)
    assert operation_id is not None
    return operation_id, _seconds(args, "max_wait_seconds")


async def wait_for_operation(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    _, asked = wait_arguments(args)
    record = await _record(caller, args)
    policy = policy_of(caller, record)
    cap = policy.polling.max_hold if policy is not None else 0.0
    applied = cap if asked is None else min(asked, cap)
    started = caller.runtime.clock()
    record = await wait(caller, record, applied)
    return waited(caller, record, caller.runtime.clock() - started, applied)


def waited(caller: Caller, record: OperationRecord, spent: float, applied: float) -> dict[str, Any]:
    """wait_for_operation's result for ``record``: also what a task's result is."""
    policy = policy_of(caller, record)
    rewriter = caller.runtime.rewriters.get(record.provider)
    fields = list(policy.routes.submit.status_url_fields) if policy is not None else []
    structured = {
        **views.detailed(record, policy),
        "final_response": views.final(record, rewriter, fields),
        "waited_seconds": round(max(0.0, spent), 3),
        "wait_applied_seconds": applied,
    }
    return result(structured, summary(record))


WAIT_OUTPUT = {
    "type": "object",
    "properties": {
        **views.DETAILED_PROPERTIES,
        "final_response": views.nullable(views.FINAL_SCHEMA),
        "waited_seconds": {"type": "number", "minimum": 0},
        "wait_applied_seconds": {
            "type": "number",
            "minimum": 0,
            "description": "max_wait_seconds as honoured: capped at the policy's max_hold.",
        },
    },
    "required": [*views.DETAILED_PROPERTIES, "final_response", "waited_seconds"],
}

TOOLS = {
    tool.name: tool
    for tool in (
        Tool(
            "list_operations",
            "List operations",
            "The account's operations, newest first (at most 100), optionally only one "
            "provider's or one outcome's. Answered from the gateway's records: no provider call.",
            _object(
                {
                    "provider": {"type": "string", "minLength": 1},
                    "outcome": {"type": "string", "enum": [o.value for o in Outcome]},
                },
                [],
            ),
            {
                "type": "object",
                "properties": {
                    "operations": {"type": "array", "items": views.OPERATION_SCHEMA},
                    "count": {"type": "integer", "minimum": 0},
                },
                "required": ["operations", "count"],
            },
            list_operations,
        ),
        Tool(
            "get_operation",
            "Get an operation",
            "One operation of this account, with the escalation when waiting has ended for a "
            "person. Answered from the gateway's record: no provider call.",
            _object({"operation_id": OPERATION_ID}, ["operation_id"]),
            {
                "type": "object",
                "properties": views.DETAILED_PROPERTIES,
                "required": list(views.DETAILED_PROPERTIES),
            },
            get_operation,
        ),
        Tool(
            WAIT_TOOL,
            "Wait for an operation",
            "Wait up to max_wait_seconds (capped at the provider policy's max_hold; default "
            "that cap) for the operation to end. The gateway polls the provider for you only "
            "when its schedule permits, so waiting never costs extra provider calls. Returns "
            "the operation and, when it has ended at the provider, the final provider answer.",
            _object(
                {
                    "operation_id": OPERATION_ID,
                    "max_wait_seconds": {"type": "number", "minimum": 0},
                },
                ["operation_id"],
            ),
            WAIT_OUTPUT,
            wait_for_operation,
        ),
    )
}


def listing(legacy_tasks: bool) -> list[dict[str, Any]]:
    """tools/list; with the 2025-11-25 tasks utility, each tool says whether it runs as a
    task (only wait_for_operation does)."""
    described = []
    for tool in TOOLS.values():
        entry: dict[str, Any] = {
            "name": tool.name,
            "title": tool.title,
            "description": tool.description,
            "inputSchema": tool.input,
            "outputSchema": tool.output,
            "annotations": {"readOnlyHint": True, "openWorldHint": False},
        }
        if legacy_tasks:
            support = "optional" if tool.name == WAIT_TOOL else "forbidden"
            entry["execution"] = {"taskSupport": support}
        described.append(entry)
    return described


async def call(caller: Caller, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """tools/call of a known tool: its result, an ``isError`` result for a tool-level
    failure, or -32602 for arguments that do not fit (before 2025-11-25, where the spec
    still made those protocol errors)."""
    tool = TOOLS[name]
    try:
        return await tool.run(caller, args)
    except BadArguments as exc:
        if caller.version in NEW_VALIDATION:
            return failure(Refused("invalid-request", f"Invalid arguments: {exc}."))
        raise RpcError(INVALID_PARAMS, f"Invalid params: {exc}.") from None
    except Refused as refused:
        return failure(refused)
