"""The Model Context Protocol server at ``/mcp`` (SPEC 15 and 21): agents' native interface
to their operations, over the Streamable HTTP transport, built on aiohttp.

Both eras on one endpoint: the stateless revision 2026-07-28 (``server/discover``, no
session, per-request ``_meta``, ``Mcp-Method``/``Mcp-Name`` checked) and the handshake era,
2025-11-25, 2025-06-18 and 2025-03-26 (the only one with JSON-RPC batches), negotiated at
``initialize``. Tasks for ``wait_for_operation`` and ``start_job``: the tasks utility of
2025-11-25, and the ``io.modelcontextprotocol/tasks`` extension for clients that declare it
(see tasks.py). Modules: transport (HTTP), stateless (the 2026-07-28 checks, pure), sessions,
jsonrpc (pure), methods, tools, jobs (start_job and get_result through the HTTP routes), tasks,
views (pure), caller (what an account may touch).

Owns nothing about polling: every wait goes through polls.wait_for, so the schedule, the
budgets and the shared poll hold exactly as for ``Prefer: wait``; every submission and result
fetch goes through the same code as ``/p/...``. Must never show one account another
account's operations, nor any token, credential or upstream URL.
"""

from __future__ import annotations

from gateway.http.mcp.transport import handle, routes

__all__ = ["handle", "routes"]
