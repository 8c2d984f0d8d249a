"""Raw JSON-RPC clients of /mcp for the MCP tests: a handshake-era session (Rpc) and
2026-07-28 POSTs with their routing headers (Wire)."""

from __future__ import annotations

import json
from typing import Any

from conftest import AGENT_TOKEN, Harness

MODERN = "2026-07-28"
EXTENSION = "io.modelcontextprotocol/tasks"
SCRIPT = [{"state": "running", "until": 10}, {"state": "succeeded"}]
CAPS = {"io.modelcontextprotocol/clientCapabilities": {}}
TASK_CAPS = {"io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}}}


class Rpc:
    """A raw JSON-RPC client of /mcp over aiohttp: one session, numbered requests."""

    def __init__(self, client: Any, token: str = AGENT_TOKEN) -> None:
        self.client = client
        self.token = token
        self.session: str | None = None
        self.version = "2025-11-25"
        self.next_id = 0

    def headers(self, **extra: str) -> dict[str, str]:
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
        }
        if self.session is not None:
            headers["Mcp-Session-Id"] = self.session
            headers["MCP-Protocol-Version"] = self.version
        return {**headers, **extra}

    async def post(self, payload: Any, **headers: str) -> Any:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        return await self.client.post("/mcp", data=data, headers=self.headers(**headers))

    async def open(self, version: str = "2025-11-25", **capabilities: Any) -> dict[str, Any]:
        params = {
            "protocolVersion": version,
            "capabilities": capabilities,
            "clientInfo": {"name": "raw", "version": "0"},
        }
        response = await self.post(
            {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": params}
        )
        assert response.status == 200, await response.text()
        self.session = response.headers["Mcp-Session-Id"]
        answer: dict[str, Any] = await response.json()
        self.version = answer["result"]["protocolVersion"]
        note = await self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert note.status == 202 and await note.read() == b""
        return answer

    async def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.next_id += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self.next_id, "method": method}
        if params is not None:
            message["params"] = params
        response = await self.post(message)
        assert response.status == 200, await response.text()
        assert response.content_type == "application/json"
        answer: dict[str, Any] = await response.json()
        assert answer["id"] == self.next_id
        return answer

    async def tool(self, name: str, **arguments: Any) -> dict[str, Any]:
        answer = await self.call("tools/call", {"name": name, "arguments": arguments})
        result: dict[str, Any] = answer["result"]
        return result


async def submitted(
    harness: Harness, script: list[dict[str, Any]] = SCRIPT, key: str = "k1"
) -> str:
    """Submit a demo job; its operation id."""
    response = await harness.submit(script, key=key)
    assert response.status == 202
    return str(response.headers["Statusgate-Operation"])


class Wire:
    """Raw 2026-07-28 POSTs: headers mirrored from the body unless a test says otherwise."""

    def __init__(self, harness: Harness, token: str = AGENT_TOKEN) -> None:
        self.harness = harness
        self.token = token
        self.next_id = 0

    def message(self, method: str, params: dict[str, Any] | None = None, **meta: Any) -> Any:
        self.next_id += 1
        envelope = {"io.modelcontextprotocol/protocolVersion": MODERN, **CAPS, **meta}
        return {
            "jsonrpc": "2.0",
            "id": self.next_id,
            "method": method,
            "params": {**(params or {}), "_meta": envelope},
        }

    async def post(self, body: Any, **headers: str) -> Any:
        sent = {
            "Authorization": f"Bearer {self.token}",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "MCP-Protocol-Version": MODERN,
        }
        if isinstance(body, dict) and "method" in body:
            sent["Mcp-Method"] = body["method"]
            params = body.get("params") or {}
            name = params.get("name", params.get("taskId"))
            if isinstance(name, str):
                sent["Mcp-Name"] = name
        sent.update(headers)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return await self.harness.client.post("/mcp", data=data, headers=sent)

    async def call(
        self, method: str, params: dict[str, Any] | None = None, **meta: Any
    ) -> tuple[int, dict[str, Any]]:
        response = await self.post(self.message(method, params, **meta))
        assert "Mcp-Session-Id" not in response.headers
        return response.status, await response.json()
