"""JSON-RPC 2.0 as MCP uses it: reading a POST body into messages, and the answers.

Pure: no I/O, no clock. Owns the error codes and the one exception a method raises to answer
with a JSON-RPC error (RpcError). Never puts anything in an error but what the caller sent
and the gateway's own words: no stack traces, hosts, paths or credentials.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
OPERATION_ENDED = -32000  # a task whose operation ended without success (tasks extension)
NOT_OFFERED = -32001  # a request the gateway refuses by rule, e.g. an agent's task cancel

Id = str | int | None


class RpcError(Exception):
    """Raised by a method to answer its request with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


@dataclass(frozen=True, slots=True)
class Message:
    """One JSON-RPC message from the client: a request (``id`` set), a notification, or a
    response to a request of ours (``method`` None)."""

    method: str | None
    id: Id
    params: Any  # a JSON object (dict) for every well-formed MCP message; else invalid
    request: bool


@dataclass(frozen=True, slots=True)
class Parsed:
    messages: tuple[Message | dict[str, Any], ...]  # a dict is the error answering it
    batch: bool


def parse(body: bytes) -> Parsed | dict[str, Any]:
    """The messages of a POST body, or the error answering the whole body."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return error(None, PARSE_ERROR, "Parse error: the body is not JSON.")
    if isinstance(data, list):
        if not data:
            return error(None, INVALID_REQUEST, "Invalid Request: an empty batch.")
        return Parsed(tuple(read(item) for item in data), batch=True)
    message = read(data)
    if isinstance(message, dict):
        return message
    return Parsed((message,), batch=False)


def read(data: Any) -> Message | dict[str, Any]:
    """One message, or the Invalid Request error answering it."""
    if not isinstance(data, dict) or data.get("jsonrpc") != "2.0":
        return error(_id(data), INVALID_REQUEST, "Invalid Request: not a JSON-RPC 2.0 object.")
    has_id = "id" in data
    ident = data.get("id")
    if has_id and (isinstance(ident, bool) or not isinstance(ident, str | int)):
        return error(None, INVALID_REQUEST, "Invalid Request: id must be a string or an integer.")
    method = data.get("method")
    if method is None and has_id and ("result" in data or "error" in data):
        return Message(None, ident, None, request=False)
    if not isinstance(method, str):
        return error(_id(data), INVALID_REQUEST, "Invalid Request: method must be a string.")
    params = data.get("params", {})
    if not isinstance(params, dict | list):
        return error(_id(data), INVALID_REQUEST, "Invalid Request: params must be structured.")
    return Message(method, ident, params, request=has_id)


def _id(data: Any) -> Id:
    ident = data.get("id") if isinstance(data, dict) else None
    return ident if isinstance(ident, str | int) and not isinstance(ident, bool) else None


def result(ident: Id, value: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "result": value}


def error(ident: Id, code: int, message: str, data: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        body["data"] = data
    return {"jsonrpc": "2.0", "id": ident, "error": body}
