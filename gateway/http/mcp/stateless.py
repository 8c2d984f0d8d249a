"""The stateless revision of MCP (2026-07-28) over Streamable HTTP at ``/mcp``: one JSON-RPC
message per POST, no ``initialize``, no session; every request carries its protocol version
and the client's capabilities in ``params._meta``, and mirrors its method (and, for
``tools/call`` and ``tasks/*``, its name) in the ``Mcp-Method`` and ``Mcp-Name`` headers.

Pure: no I/O. Owns the order of the checks, as the revision's transport asks: the routing
headers first, before the body is parsed (a missing or unserved method, a version not spoken,
a missing ``Mcp-Name``), then the body against them (a disagreeing header is
``HeaderMismatch``, 400), then the per-request envelope. Never reads or mints a session id.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping
from typing import Any

from gateway.http.mcp.jsonrpc import (
    HEADER_MISMATCH,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    UNSUPPORTED_VERSION,
    Message,
    error,
)
from gateway.http.mcp.sessions import MODERN, VERSIONS

VERSION = "mcp-protocol-version"
METHOD = "mcp-method"
NAME = "mcp-name"
PROTOCOL_VERSION = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES = "io.modelcontextprotocol/clientCapabilities"
# the params member each named method mirrors in Mcp-Name (tasks: the extension's rule)
NAMED = {
    "tools/call": "name",
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
}
_SENTINEL = re.compile(r"^=\?base64\?(?P<payload>.*)\?=$")


def wanted(headers: Mapping[str, str]) -> bool:
    """Whether a POST is of the stateless era: its MCP-Protocol-Version names no revision of
    the handshake era (a revision not spoken at all is answered as this era answers it)."""
    version = headers.get(VERSION)
    return version is not None and version.strip() not in VERSIONS


def before_body(
    raw_headers: Iterable[tuple[str, str]], headers: Mapping[str, str], served: frozenset[str]
) -> dict[str, Any] | None:
    """The error answering a POST from its headers alone, or None to go on and read it."""
    seen: set[str] = set()
    for name, _ in raw_headers:
        key = name.lower()
        if key in (VERSION, METHOD, NAME):
            if key in seen:
                return _mismatch(f"the {name} header appears more than once.")
            seen.add(key)
    version = headers.get(VERSION, "").strip()
    if version not in MODERN:
        data = {"supported": list(MODERN), "requested": version[:100]}
        return error(None, UNSUPPORTED_VERSION, "Unsupported protocol version.", data)
    method = headers.get(METHOD)
    if method is None:
        return _mismatch("the Mcp-Method header is missing.")
    if method.startswith("notifications/"):
        return None  # accepted and dropped once read (no header rules for notifications)
    if method not in served:
        return error(None, METHOD_NOT_FOUND, f"Method not found: {method[:100]}")
    if method in NAMED and headers.get(NAME) is None:
        return _mismatch(f"the Mcp-Name header is missing ({method} names its {NAMED[method]}).")
    return None


def against_body(headers: Mapping[str, str], message: Message) -> dict[str, Any] | None:
    """The error when the body disagrees with its headers or lacks the per-request
    envelope (``_meta`` with the protocol version and the client's capabilities)."""
    params = message.params
    if not isinstance(params, dict):
        return error(message.id, INVALID_PARAMS, "Invalid params: params must be an object.")
    if headers.get(METHOD) != message.method:
        return _mismatch("the Mcp-Method header does not match the body's method.", message.id)
    key = NAMED.get(message.method or "")
    if key is not None and decode(headers.get(NAME)) != params.get(key):
        detail = f"the Mcp-Name header does not match the body's {key!r}."
        return _mismatch(detail, message.id)
    meta = params.get("_meta")
    if not isinstance(meta, dict) or PROTOCOL_VERSION not in meta:
        detail = f"Invalid params: params._meta must carry {PROTOCOL_VERSION!r}."
        return error(message.id, INVALID_PARAMS, detail)
    if CLIENT_CAPABILITIES not in meta:
        detail = f"Invalid params: params._meta must carry {CLIENT_CAPABILITIES!r}."
        return error(message.id, INVALID_PARAMS, detail)
    if meta[PROTOCOL_VERSION] != headers.get(VERSION, "").strip():
        detail = "the MCP-Protocol-Version header does not match the request's _meta."
        return _mismatch(detail, message.id)
    return None


def decode(value: str | None) -> str | None:
    """A header value as sent, or the text inside the ``=?base64?...?=`` sentinel; None for
    a malformed sentinel (it then matches no body value)."""
    if value is None:
        return None
    found = _SENTINEL.fullmatch(value)
    if found is None:
        return value
    payload = found.group("payload")
    try:
        decoded = base64.b64decode(payload, validate=True)
        if base64.b64encode(decoded).decode("ascii") != payload:
            return None
        return decoded.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def not_one_message(ident: Any = None) -> dict[str, Any]:
    detail = "Invalid Request: the body must be one JSON-RPC request or notification."
    return error(ident, INVALID_REQUEST, detail)


def _mismatch(detail: str, ident: str | int | None = None) -> dict[str, Any]:
    return error(ident, HEADER_MISMATCH, f"Header mismatch: {detail}")
