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
HEADER_MISMATCH = -32020  # 2026-07-28: a routing header missing or not what the body says
MISSING_CAPABILITY = -32021  # 2026-07-28: the request needs a capability it did not declare
UNSUPPORTED_VERSION = -32022  # 2026-07-28: a protocol version this server does not speak
# The gateway's own codes lie outside the range JSON-RPC reserves (-32768 to -32000), as
# 2026-07-28 asks of new codes: -30000 minus the HTTP status of the problem they carry.
OPERATION_ENDED = -30409  # a task whose operation ended without success (tasks extension)
APPROVAL_REQUIRED = -30403  # an agent asked for an operator's decision (a task cancel)
TOO_LARGE = -30413  # a batch's answers past limits.max_response_body
MAX_BATCH = 50  # messages in one JSON-RPC batch (2025-03-26)
# 2026-07-28 over HTTP: the status of an error answer (others are 200), as the spec and the
# official SDK map them.
HTTP_STATUS = {
    PARSE_ERROR: 400,
    INVALID_REQUEST: 400,
    INVALID_PARAMS: 400,
    HEADER_MISMATCH: 400,
    MISSING_CAPABILITY: 400,
    UNSUPPORTED_VERSION: 400,
    METHOD_NOT_FOUND: 404,
}

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
        if len(data) > MAX_BATCH:
            detail = f"Invalid Request: a batch holds at most {MAX_BATCH} messages."
            return error(None, INVALID_REQUEST, detail, {"max_batch": MAX_BATCH})
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


def status_of(answer: dict[str, Any]) -> int:
    """The HTTP status of a 2026-07-28 answer: 200 for a result, the table's for an error."""
    found = answer.get("error")
    code = found.get("code") if isinstance(found, dict) else None
    return HTTP_STATUS.get(code, 200) if isinstance(code, int) else 200


def result(ident: Id, value: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": ident, "result": value}


def error(ident: Id, code: int, message: str, data: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        body["data"] = data
    return {"jsonrpc": "2.0", "id": ident, "error": body}
