"""The Model Context Protocol server at ``/mcp`` (SPEC 15): agents' native interface to their
operations, over the Streamable HTTP transport, built on aiohttp.

Revisions spoken: 2025-11-25 (latest), 2025-06-18 and 2025-03-26 (the only one with JSON-RPC
batches), negotiated at ``initialize``. Tasks for ``wait_for_operation``: the tasks utility
of 2025-11-25, and the ``io.modelcontextprotocol/tasks`` extension for clients that declare
it (see tasks.py). Modules: transport (HTTP), sessions, jsonrpc (pure), methods, tools, tasks,
views (pure), caller (what an account may touch).

Owns nothing about polling: every wait goes through polls.wait_for, so the schedule, the
budgets and the shared poll hold exactly as for ``Prefer: wait``. Must never show one
account another account's operations, nor any token, credential or upstream URL.
"""

from __future__ import annotations

from gateway.mcp.transport import handle, routes

__all__ = ["handle", "routes"]
