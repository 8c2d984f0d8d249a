"""The MCP tools: list_operations, get_operation, wait_for_operation (SPEC 15), start_job
and get_result (SPEC 21).

Owns their input and output schemas, the checking of arguments, and the results: JSON in
``structuredContent`` that matches the outputSchema, a short text summary, and the same JSON
serialised as text for clients without structured content. A tool-level failure is an
``isError`` result naming the problem slug. Never polls except through caller.wait, never
calls a provider except through jobs.py (the submit and result routes).
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gateway.core.models import OperationFilter, OperationRecord, Outcome
from gateway.http.mcp import jobs, views
from gateway.http.mcp.caller import Caller, Refused, owned, policy_of, wait
from gateway.http.mcp.jsonrpc import INVALID_PARAMS, RpcError

LIST_LIMIT = 100
NEW_VALIDATION = frozenset({"2025-11-25", "2026-07-28"})  # input errors are tool errors
WAIT_TOOL = "wait_for_operation"
START_TOOL = "start_job"
TASK_TOOLS = frozenset({WAIT_TOOL, START_TOOL})  # the tools that may answer with a task
MAX_WAIT = 86_400  # max_wait_seconds beyond a day is an input error (capped at max_hold below)


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
    annotations: dict[str, bool]


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


def _seconds(args: dict[str, Any], name: str, top: int) -> float | None:
    """A number of seconds from 0 to ``top``. Integers are compared before any conversion
    to float (a 401-digit integer is valid JSON and would overflow one); NaN and the
    infinities (which Python's JSON reader accepts) are refused."""
    value = args.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadArguments(f"{name} must be a number of seconds")
    if isinstance(value, float) and not math.isfinite(value):
        raise BadArguments(f"{name} must be a finite number of seconds")
    if not 0 <= value <= top:
        raise BadArguments(f"{name} must be between 0 and {top} seconds")
    return float(value)


def _json_body(args: dict[str, Any], name: str) -> bytes:
    """The argument as the JSON body sent to the provider: NaN and the infinities are not
    JSON, and a value nested too deep to write is refused, both naming the argument."""
    if name not in args:
        raise BadArguments(f"{name} is required")
    try:
        return json.dumps(args[name], allow_nan=False).encode()
    except (ValueError, RecursionError):
        raise BadArguments(f"{name} must be JSON (no NaN or Infinity)") from None


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
    return operation_id, _seconds(args, "max_wait_seconds", MAX_WAIT)


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


async def start_job(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    """Submit through the provider's submit route for the caller's account (SPEC 21)."""
    args = _checked(args, {"provider", "route", "body", "idempotency_key"})
    provider = _text(args, "provider", required=True)
    assert provider is not None
    route, key = _text(args, "route"), _text(args, "idempotency_key")
    body = _json_body(args, "body")
    try:
        record, submitted = await jobs.start(caller, provider, route, body, key)
    except jobs.ProviderRefused as refused:
        return provider_failure("The provider refused the submission", refused.view)
    structured = {
        **views.detailed(record, policy_of(caller, record)),
        "submit_response": submitted,
        "final_response": _final(caller, record),
    }
    text = f"Started: {summary(record)} Wait for it with wait_for_operation."
    return result(structured, text)


async def get_result(caller: Caller, args: dict[str, Any]) -> dict[str, Any]:
    """The job's result through the provider's result route: after success only, counted
    against max_result_fetches and audited (SPEC 21); from the kept copy when the gateway
    keeps it (SPEC 23), with no provider call."""
    args = _checked(args, {"operation_id"})
    operation_id = _text(args, "operation_id", required=True)
    assert operation_id is not None
    try:
        record, fetched = await jobs.result(caller, operation_id)
    except jobs.ProviderRefused as refused:
        return provider_failure("The provider refused the result fetch", refused.view)
    structured = {**views.detailed(record, policy_of(caller, record)), "result": fetched}
    policy = policy_of(caller, record)
    limit = policy.polling.max_result_fetches if policy is not None else record.result_fetches
    text = (
        f"Result of operation {record.operation_id}: provider answered {fetched['status']} "
        f"(fetch {record.result_fetches} of {limit})."
    )
    if fetched.get("kept"):
        text = f"Result of operation {record.operation_id}: the gateway's kept copy."
    return result(structured, text)


def provider_failure(what: str, view: dict[str, Any]) -> dict[str, Any]:
    """An isError result for a provider's own error answer, passed through."""
    text = f"{what}: it answered {view['status']}."
    content = [{"type": "text", "text": text}, {"type": "text", "text": json.dumps(view)}]
    return {"content": content, "isError": True}


def _final(caller: Caller, record: OperationRecord) -> Any:
    policy = policy_of(caller, record)
    rewriter = caller.runtime.rewriters.get(record.provider)
    fields = list(policy.routes.submit.status_url_fields) if policy is not None else []
    return views.final(record, rewriter, fields)


WAIT_OUTPUT: dict[str, Any] = {
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
START_OUTPUT: dict[
    str, Any
] = {  # also fits a start_job task's result: wait_for_operation's, once it ended
    "type": "object",
    "properties": {
        **WAIT_OUTPUT["properties"],
        "submit_response": {
            **views.nullable(views.ANSWER_SCHEMA),
            "description": "The submit route's answer (status, body), as POST /p/... gives it.",
        },
    },
    "required": [*views.DETAILED_PROPERTIES, "final_response"],
}
RESULT_OUTPUT = {
    "type": "object",
    "properties": {**views.DETAILED_PROPERTIES, "result": views.ANSWER_SCHEMA},
    "required": [*views.DETAILED_PROPERTIES, "result"],
}
READ = {"readOnlyHint": True, "openWorldHint": False, "idempotentHint": True}
PROVIDER_CALLS = {"readOnlyHint": False, "destructiveHint": False, "openWorldHint": True}

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
            READ,
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
            READ,
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
                    "max_wait_seconds": {"type": "number", "minimum": 0, "maximum": MAX_WAIT},
                },
                ["operation_id"],
            ),
            WAIT_OUTPUT,
            wait_for_operation,
            # it may poll the provider (spending the operation's budget): not read-only
            {**PROVIDER_CALLS, "idempotentHint": False},
        ),
        Tool(
            START_TOOL,
            "Start a provider job",
            "Submit a job to a provider through the gateway, exactly as POST "
            "/p/{provider}{route} with this body would: the provider's credential is added, "
            "the idempotency key makes a retry replay the first answer instead of starting a "
            "second job, and the operation is recorded before you get it. route is the "
            "provider path of the submit route (default: its declared path). Returns the "
            "operation (its operation_id is what the other tools take) and the provider's "
            "submit answer.",
            _object(
                {
                    "provider": {"type": "string", "minLength": 1, "maxLength": 200},
                    "route": {"type": "string", "minLength": 1, "maxLength": jobs.MAX_ROUTE},
                    "body": {"description": "The JSON body of the submission."},
                    "idempotency_key": {"type": "string", "minLength": 1, "maxLength": 255},
                },
                ["provider", "body"],
            ),
            START_OUTPUT,
            start_job,
            # a retry with the same idempotency_key is replayed; without one it is a new job
            {**PROVIDER_CALLS, "idempotentHint": False},
        ),
        Tool(
            "get_result",
            "Get a job's result",
            "Fetch the result of a succeeded operation through the provider's result route "
            "(refused before success). Each fetch is counted against the policy's "
            "max_result_fetches and audited.",
            _object({"operation_id": OPERATION_ID}, ["operation_id"]),
            RESULT_OUTPUT,
            get_result,
            # a provider call that spends the result budget
            {**PROVIDER_CALLS, "idempotentHint": False},
        ),
    )
}


def listing(legacy_tasks: bool) -> list[dict[str, Any]]:
    """tools/list; with the 2025-11-25 tasks utility, each tool says whether it runs as a
    task (wait_for_operation and start_job do)."""
    described = []
    for tool in TOOLS.values():
        entry: dict[str, Any] = {
            "name": tool.name,
            "title": tool.title,
            "description": tool.description,
            "inputSchema": tool.input,
            "outputSchema": tool.output,
            "annotations": {"title": tool.title, **tool.annotations},
        }
        if legacy_tasks:
            support = "optional" if tool.name in TASK_TOOLS else "forbidden"
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
