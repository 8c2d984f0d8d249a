"""MCP sessions over Streamable HTTP: the protocol revisions spoken, and session ids that any
gateway process can check without shared state.

A session id names the negotiated revision and whether the client declared the tasks
extension, signed with a key derived from the agent's own token: it is valid only with the
token that opened it, survives restarts, and works across ``--workers`` and replicas. Ending
a session (``DELETE /mcp``) is remembered by the process that ended it. Never stores or
reveals a token.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import OrderedDict
from dataclasses import dataclass

VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")  # the handshake era, newest first
LATEST = VERSIONS[0]
MODERN = ("2026-07-28",)  # the stateless era: no initialize, no session (stateless.py)
BATCHING = frozenset({"2025-03-26"})  # 2025-06-18 removed JSON-RPC batches
LEGACY_TASKS = frozenset({"2025-11-25"})  # the tasks utility of that revision
MAX_ENDED = 10_000
_PREFIX = "sg1"


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    version: str
    extension: bool  # the io.modelcontextprotocol/tasks extension was declared at initialize


def negotiate(requested: object) -> str:
    """The client's revision when spoken here, else the latest spoken (the client decides
    whether it can go on)."""
    return requested if isinstance(requested, str) and requested in VERSIONS else LATEST


def issue(token: str, version: str, extension: bool) -> Session:
    body = f"{_PREFIX}.{version}.{'x' if extension else 'n'}.{secrets.token_hex(12)}"
    return Session(f"{body}.{_mac(token, body)}", version, extension)


def read(session_id: str, token: str) -> Session | None:
    """The session a header names, if this token opened it; None otherwise."""
    if not session_id.isascii():  # bytes that were not UTF-8 arrive as surrogates
        return None
    parts = session_id.split(".")
    if len(parts) != 5 or parts[0] != _PREFIX or parts[1] not in VERSIONS:
        return None
    if parts[2] not in ("x", "n"):
        return None
    body = ".".join(parts[:4])
    if not hmac.compare_digest(parts[4], _mac(token, body)):
        return None
    return Session(session_id, parts[1], parts[2] == "x")


def _mac(token: str, body: str) -> str:
    key = hashlib.sha256(b"statusgate mcp session\0" + token.encode()).digest()
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()[:32]


class Ended:
    """Session ids ended in this process, the oldest forgotten past MAX_ENDED."""

    def __init__(self) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()

    def add(self, session_id: str) -> None:
        self._ids[session_id] = None
        while len(self._ids) > MAX_ENDED:
            self._ids.popitem(last=False)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._ids
