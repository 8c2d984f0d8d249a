"""MCP methods: what each JSON-RPC request is answered with, in both eras.

Owns initialize (revision negotiation, capabilities per revision, serverInfo) and ping of the
handshake era, server/discover of the stateless one (2026-07-28, whose results carry
``resultType`` and the server's identity in ``_meta``), tools/list, tools/call (plain or as
a task) and the tasks/* methods, and turns every failure into a JSON-RPC error or an
``isError`` result: a method never raises past ``answer``, so no input reaches the client as
a 500. Never logs a request's params or anything secret.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from gateway import StoreError, __version__
from gateway.http.mcp import tasks, tools
from gateway.http.mcp.caller import Caller, Refused, owned
from gateway.http.mcp.jsonrpc import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    MISSING_CAPABILITY,
    Message,
    RpcError,
    error,
    result,
)
from gateway.http.mcp.sessions import LEGACY_TASKS, MODERN, Session, issue, negotiate

log = logging.getLogger("statusgate")
EXTENSION = "io.modelcontextprotocol/tasks"
CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO = "io.modelcontextprotocol/serverInfo"
INSTRUCTIONS = (
    "Statusgate tracks your asynchronous provider jobs as operations. start_job submits one "
    "(with an idempotency key, so a retry never starts a second job); list_operations and "
    "get_operation read them; wait_for_operation waits for one to end without extra "
    "provider calls (the gateway polls only when the provider's schedule permits); "
    "get_result fetches a succeeded job's result. An escalated operation needs a person's "
    "decision: waiting will not change it."
)
IDENTITY = {"name": "statusgate", "title": "Statusgate", "version": __version__}
LISTING_TTL_MS = 300_000  # discover and tools/list are the same for every account

Method = Callable[[Caller, dict[str, Any]], Awaitable[dict[str, Any]]]


def declares_extension(capabilities: Any) -> bool:
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    return isinstance(extensions, dict) and EXTENSION in extensions


def per_request_extension(params: dict[str, Any]) -> bool:
    """The tasks extension declared in this request's ``_meta`` client capabilities."""
    meta = params.get("_meta")
    return isinstance(meta, dict) and declares_extension(meta.get(CLIENT_CAPABILITIES))


def initialize(params: dict[str, Any], token: str) -> tuple[Session, dict[str, Any]]:
    """A new session at the client's revision when spoken here (else the latest spoken)."""
    version = negotiate(params.get("protocolVersion"))
    declared = declares_extension(params.get("capabilities"))
    session = issue(token, version, declared)
    capabilities: dict[str, Any] = {"tools": {}, "extensions": {EXTENSION: {}}}
    if version in LEGACY_TASKS and not declared:
        capabilities["tasks"] = {"list": {}, "requests": {"tools": {"call": {}}}}
    return session, {
        "protocolVersion": version,
        "capabilities": capabilities,
        "serverInfo": IDENTITY,
        "instructions": INSTRUCTIONS,
    }


def _legacy(caller: Caller) -> bool:
    """The 2025-11-25 tasks utility applies (the extension was not declared)."""
    return caller.version in LEGACY_TASKS and not caller.extension


async def ping(caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
    return {}


async def discover(caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
    """server/discover (2026-07-28): the versions, capabilities and identity."""
    return {
        "supportedVersions": list(MODERN),
        "capabilities": {"tools": {}, "extensions": {EXTENSION: {}}},
        "instructions": INSTRUCTIONS,
        "ttlMs": LISTING_TTL_MS,
        "cacheScope": "public",
    }


async def list_tools(caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
    listed: dict[str, Any] = {"tools": tools.listing(_legacy(caller))}
    if caller.modern:  # a cacheable result in 2026-07-28
        listed.update(ttlMs=LISTING_TTL_MS, cacheScope="public")
    return listed


async def call_tool(caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
    name, args = params.get("name"), params.get("arguments", {})
    if not isinstance(name, str) or (args is not None and not isinstance(args, dict)):
        raise RpcError(
            INVALID_PARAMS, "Invalid params: name must be a string, arguments an object."
        )
    if name not in tools.TOOLS:
        raise RpcError(INVALID_PARAMS, f"Unknown tool: {name[:100]}")
    if _legacy(caller) and "task" in params:
        if name not in tools.TASK_TOOLS:
            raise RpcError(METHOD_NOT_FOUND, f"Tool {name} does not run as a task.")
        if not isinstance(params["task"], dict):
            raise RpcError(INVALID_PARAMS, "Invalid params: task must be an object.")
    try:
        if name in tools.TASK_TOOLS and _as_task(caller, params):
            return await _task_call(caller, name, args or {})
        return await tools.call(caller, name, args or {})
    except StoreError as exc:
        _count(caller, exc)
        return tools.failure(Refused("store-unavailable", "The gateway cannot reach its store."))


def _as_task(caller: Caller, params: dict[str, Any]) -> bool:
    """Legacy: the client asked (``task`` param). Extension: the server decides, and does
    for every wait (the client declared it can take a task)."""
    if caller.extension:
        return True
    return _legacy(caller) and isinstance(params.get("task"), dict)


async def _task_call(caller: Caller, name: str, args: dict[str, Any]) -> dict[str, Any]:
    """A wait, or a job started, as a task whose id is the operation's. A wait is not held:
    the task is answered at once. Arguments that do not fit, an unknown operation, a
    submission that opened none and (extension) an operation already ended are answered
    as the plain tool call would be."""
    started: dict[str, Any] | None = None
    if name == tools.START_TOOL:
        started = await tools.call(caller, name, args)
        found = started.get("structuredContent")
        if started.get("isError") or not isinstance(found, dict):
            return started
        operation_id = str(found["operation_id"])
    else:
        try:
            operation_id, _ = tools.wait_arguments(args)
        except tools.BadArguments:
            return await tools.call(caller, name, args)
    record = await owned(caller, operation_id)
    if record is None or (caller.extension and tasks.done(record)):
        return started if started is not None else await tools.call(caller, name, args)
    return tasks.create(caller, record, legacy_shape=not caller.extension)


async def get_task(caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
    return await tasks.get(caller, params, legacy_shape=not caller.extension)


async def task_result(caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
    return await tasks.result(caller, params)


async def list_tasks(caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
    return await tasks.listing(caller, params)


async def ack_task(caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
    return await tasks.acknowledge(caller, params)


async def cancel_task(caller: Caller, params: dict[str, Any]) -> dict[str, Any]:
    return await tasks.cancel(caller, params)


METHODS: dict[str, Method] = {"ping": ping, "tools/list": list_tools, "tools/call": call_tool}
MODERN_METHODS: dict[str, Method] = {
    "server/discover": discover,
    "tools/list": list_tools,
    "tools/call": call_tool,
}
LEGACY_TASK_METHODS: dict[str, Method] = {
    "tasks/get": get_task,
    "tasks/result": task_result,
    "tasks/list": list_tasks,
}
EXTENSION_TASK_METHODS: dict[str, Method] = {
    "tasks/get": get_task,
    "tasks/update": ack_task,
    "tasks/cancel": cancel_task,
}
SERVED_MODERN = frozenset({*MODERN_METHODS, *EXTENSION_TASK_METHODS})


def _method(caller: Caller, name: str) -> Method | None:
    if caller.modern:
        if name in EXTENSION_TASK_METHODS and not caller.extension:
            required: dict[str, Any] = {"requiredCapabilities": {"extensions": {EXTENSION: {}}}}
            detail = f"Missing required client capability: {name} needs the {EXTENSION} extension."
            raise RpcError(MISSING_CAPABILITY, detail, required)
        return MODERN_METHODS.get(name) or EXTENSION_TASK_METHODS.get(name)
    if name in METHODS:
        return METHODS[name]
    if caller.extension:
        return EXTENSION_TASK_METHODS.get(name)
    return LEGACY_TASK_METHODS.get(name) if _legacy(caller) else None


async def answer(caller: Caller, message: Message) -> dict[str, Any] | None:
    """The answer to one message of a session; None for notifications and responses."""
    if not message.request:
        return None
    assert message.method is not None
    params = message.params
    if not isinstance(params, dict):
        return error(message.id, INVALID_PARAMS, "Invalid params: params must be an object.")
    if message.method == "initialize":
        return error(message.id, INVALID_REQUEST, "Invalid Request: initialize comes alone.")
    if per_request_extension(params):
        caller = dataclasses.replace(caller, extension=True)
    try:
        method = _method(caller, message.method)
        if method is None:
            detail = f"Method not found: {message.method[:100]}"
            return error(message.id, METHOD_NOT_FOUND, detail)
        value = await method(caller, params)
        return result(message.id, _stamped(value) if caller.modern else value)
    except RpcError as exc:
        return error(message.id, exc.code, exc.message, exc.data)
    except StoreError as exc:
        _count(caller, exc)
        data = {"type": "/problems/store-unavailable"}
        return error(message.id, INTERNAL_ERROR, "The gateway cannot reach its store.", data)
    except Exception:
        log.exception("unhandled error in MCP method %s", message.method[:100])
        return error(message.id, INTERNAL_ERROR, "Internal error.")


def _stamped(value: dict[str, Any]) -> dict[str, Any]:
    """A 2026-07-28 result: its ``resultType`` (``complete`` unless it is a task) and the
    server's identity in ``_meta``."""
    meta = value.get("_meta")
    return {
        **value,
        "resultType": value.get("resultType", "complete"),
        "_meta": {**(meta if isinstance(meta, dict) else {}), SERVER_INFO: IDENTITY},
    }


def _count(caller: Caller, exc: StoreError) -> None:
    log.warning("store unavailable: %s", exc)
    caller.runtime.effects.metrics.store_errors.labels(exc.operation).inc()
