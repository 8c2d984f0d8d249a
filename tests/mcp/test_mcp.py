"""MCP at /mcp: the official SDK client against a real gateway process, tasks polled to
completion without early provider calls, and every kind of bad input answered as the
Streamable HTTP transport and JSON-RPC say (never a 500)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mcp_wire import EXTENSION, Rpc, submitted

from gateway import __version__
from gateway.flow.runtime import RUNTIME
from gateway.http.mcp.sessions import read

from conftest import (
    AGENT_TOKEN,
    OTHER_TOKEN,
    Harness,
    Served,
    fast_polling,
    permitted_polls,
    real_time_harness,
)

# -- the official SDK against a real gateway process ------------------------------------------


async def test_sdk_client_lists_and_calls_every_tool(
    tmp_path: Path, upstream: tuple[Any, str], gateways: list[Served]
) -> None:
    """The official mcp client, over Streamable HTTP with the agent's bearer token, lists the
    three tools and calls each against a real `statusgate serve`; waiting costs no provider
    call beyond what the schedule permits."""
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    demo, url = upstream
    polling = fast_polling()
    served = Served(
        tmp_path, url, tmp_path / "g.db", policy_changes={"demo-jobs": {"polling": polling}}
    )
    gateways.append(served)
    await served.up()
    base = f"http://127.0.0.1:{served.port}"
    auth = {"Authorization": f"Bearer {AGENT_TOKEN}"}
    async with aiohttp.ClientSession() as agent:
        script = [{"state": "running", "until": 1.5}, {"state": "succeeded"}]
        submit = await agent.post(
            f"{base}/p/demo-jobs/v1/jobs",
            json={"input": "a.pdf", "demo_script": script},
            headers={**auth, "Idempotency-Key": "sdk-1"},
        )
        assert submit.status == 202
        operation_id = submit.headers["Statusgate-Operation"]
        job = (await submit.json())["id"]
    async with (
        httpx2.AsyncClient(headers=auth, timeout=30) as http,
        streamable_http_client(f"{base}/mcp", http_client=http) as (read_stream, write_stream),
        ClientSession(read_stream, write_stream) as session,
    ):
        init = await session.initialize()
        assert init.protocol_version == "2025-11-25"
        assert init.server_info.name == "statusgate" and init.server_info.version == __version__
        listed = await session.list_tools()
        assert {t.name for t in listed.tools} == {
            "list_operations",
            "get_operation",
            "wait_for_operation",
            "start_job",
            "get_result",
        }
        assert all(t.output_schema for t in listed.tools)
        found = await session.call_tool("list_operations", {"provider": "demo-jobs"})
        assert not found.is_error
        assert [o["operation_id"] for o in found.structured_content["operations"]] == [operation_id]
        one = await session.call_tool("get_operation", {"operation_id": operation_id})
        assert one.structured_content["outcome"] == "pending"
        assert one.structured_content["provider_job_id"] == job
        waited = await session.call_tool(
            "wait_for_operation", {"operation_id": operation_id, "max_wait_seconds": 20}
        )
        assert not waited.is_error, waited.content
        data = waited.structured_content
        assert data["outcome"] == "succeeded"
        assert data["final_response"]["json"]["result"] == {"pages": 3}
        assert data["wait_applied_seconds"] == 20
        assert "succeeded" in waited.content[0].text
        assert one.structured_content["usage"] == {}  # pending: nothing reported yet
        ended = await session.call_tool("get_operation", {"operation_id": operation_id})
        usage = {"input_tokens": 1200, "output_tokens": 350, "pages": 3}  # SPEC 23
        assert ended.structured_content["usage"] == usage
    polls = [e for e in demo.log if e["job_id"] == job and e["kind"] == "status"]
    assert 1 <= len(polls) <= permitted_polls(polling, data["waited_seconds"] + 1)


# -- tasks, raw JSON-RPC -----------------------------------------------------------------------


async def test_task_polled_to_completion_makes_no_early_provider_call(harness: Harness) -> None:
    """A task-augmented wait_for_operation (2025-11-25 tasks) polled with tasks/get until it
    completes: every tasks/get earlier than the poll interval is answered from the record
    without a provider call, each due one makes at most one, and tasks/result gives the
    final provider answer."""
    operation_id = await submitted(harness)
    rpc = Rpc(harness.client)
    opened = await rpc.open()
    assert opened["result"]["capabilities"]["tasks"]["requests"] == {"tools": {"call": {}}}
    listed_tools = (await rpc.call("tools/list"))["result"]["tools"]
    support = {t["name"]: t["execution"]["taskSupport"] for t in listed_tools}
    assert support == {
        "list_operations": "forbidden",
        "get_operation": "forbidden",
        "wait_for_operation": "optional",
        "start_job": "optional",
        "get_result": "forbidden",
    }
    not_a_task = {"name": "get_operation", "arguments": {"operation_id": operation_id}}
    refused = await rpc.call("tools/call", {**not_a_task, "task": {}})
    assert refused["error"]["code"] == -32601
    assert (await rpc.call("tasks/cancel", {"taskId": operation_id}))["error"]["code"] == -32601
    created = await rpc.call(
        "tools/call",
        {
            "name": "wait_for_operation",
            "arguments": {"operation_id": operation_id},
            "task": {"ttl": 60000},
        },
    )
    task = created["result"]["task"]
    assert task["taskId"] == operation_id and task["status"] == "working"
    record = await _record(harness, operation_id)
    assert task["pollInterval"] >= 250

    def calls() -> int:
        return len(harness.provider_calls(record.provider_job_id))

    assert calls() == 0  # creating the task made no provider call
    status, polls = "working", 0
    for _ in range(40):
        before = calls()
        for _early in range(3):  # before the poll interval: answered from the record
            early = (await rpc.call("tasks/get", {"taskId": operation_id}))["result"]
            assert early["taskId"] == operation_id and early["status"] == "working"
        assert calls() == before
        harness.clock.advance(early["pollInterval"] / 1000)
        got = (await rpc.call("tasks/get", {"taskId": operation_id}))["result"]
        assert calls() - before == 1  # the due poll, exactly once
        polls += 1
        status = got["status"]
        if status != "working":
            break
    assert status == "completed"
    record = await _record(harness, operation_id)
    assert calls() == record.status_requests_used == polls <= 6
    result = (await rpc.call("tasks/result", {"taskId": operation_id}))["result"]
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": operation_id}
    assert result["structuredContent"]["final_response"]["json"]["result"] == {"pages": 3}
    listed = (await rpc.call("tasks/list"))["result"]
    assert [t["taskId"] for t in listed["tasks"]] == [operation_id]


async def test_task_result_blocks_until_done_polling_on_schedule(harness: Harness) -> None:
    """tasks/result called right after the task is created holds until the job ends and
    answers what wait_for_operation would, every provider call at or after its permitted
    time."""
    operation_id = await submitted(harness)
    rpc = Rpc(harness.client)
    await rpc.open()
    call = {"name": "wait_for_operation", "arguments": {"operation_id": operation_id}}
    await rpc.call("tools/call", {**call, "task": {}})
    started = harness.clock.now
    result = (await rpc.call("tasks/result", {"taskId": operation_id}))["result"]
    assert result["structuredContent"]["outcome"] == "succeeded"
    assert harness.clock.now - started >= 10 - 1
    record = await _record(harness, operation_id)
    calls = harness.provider_calls(record.provider_job_id)
    assert len(calls) == record.status_requests_used <= 6
    scheduled = [line for line in harness.audit_lines() if line["event"] in ("submitted", "polled")]
    for made, line in zip(calls, scheduled, strict=False):
        assert made["at"] >= _epoch(line["next_poll_at"]) - 0.001


async def test_held_wait_is_answered_at_shutdown(tmp_path: Path) -> None:
    """A wait_for_operation held for a poll half a minute away is answered at once, pending,
    when the gateway shuts down."""
    async with real_time_harness(tmp_path) as harness:
        response = await harness.submit([{"state": "running"}], submit={"poll_after_seconds": 30})
        operation_id = response.headers["Statusgate-Operation"]
        rpc = Rpc(harness.client)
        await rpc.open()
        held = asyncio.create_task(
            rpc.tool("wait_for_operation", operation_id=operation_id, max_wait_seconds=50)
        )
        await asyncio.sleep(0.2)
        assert harness.client.app[RUNTIME].holding == 1
        started = time.perf_counter()
        await harness.client.app.shutdown()
        result = await asyncio.wait_for(held, 2)
        assert time.perf_counter() - started < 1.0
        assert result["structuredContent"]["outcome"] == "pending"


async def _record(harness: Harness, operation_id: str) -> Any:
    record = await harness.client.app[RUNTIME].store.get(operation_id)
    assert record is not None
    return record


async def test_tasks_cancel_sends_the_cancel_where_agents_may(make_harness: Any) -> None:
    """Under ``routes.cancel.by: agent``, tasks/cancel of the account's working task sends
    the provider's cancel route once (a second tasks/cancel is acknowledged from the record),
    audited ``cancel_requested`` with the account; the task then ends cancelled."""
    changes = {"demo-jobs": {"routes": {"cancel": {"by": "agent"}}}}
    harness: Harness = await make_harness(policy_changes=changes)
    operation_id = await submitted(harness, [{"state": "running"}])
    rpc = Rpc(harness.client)
    await rpc.open()
    meta = {"io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}}}
    for _ in range(2):
        cancelled = await rpc.call("tasks/cancel", {"taskId": operation_id, "_meta": meta})
        assert cancelled["result"]["resultType"] == "complete", cancelled
    record = await _record(harness, operation_id)
    assert record.outcome.value == "pending" and record.cancel_requested_at is not None
    sent = [e for e in harness.provider.log if e["kind"] == "cancel"]
    assert len(sent) == 1 and sent[0]["job_id"] == record.provider_job_id
    lines = [line for line in harness.audit_lines() if line["event"] == "cancel_requested"]
    assert [line["actor"] for line in lines] == ["account:team-a"]
    got = (await rpc.call("tasks/get", {"taskId": operation_id, "_meta": meta}))["result"]
    assert got["status"] == "cancelled", got


async def test_extension_tasks_inline_the_result(harness: Harness) -> None:
    """With the io.modelcontextprotocol/tasks extension declared on the request, a wait is a
    task (resultType "task", pollIntervalMs); tasks/get carries the final result inline, and
    tasks/cancel is refused as approval-required: the operation goes on."""
    operation_id = await submitted(harness)
    rpc = Rpc(harness.client)
    await rpc.open()
    meta = {"io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}}}
    created = await rpc.call(
        "tools/call",
        {"name": "wait_for_operation", "arguments": {"operation_id": operation_id}, "_meta": meta},
    )
    task = created["result"]
    assert task["resultType"] == "task" and task["taskId"] == operation_id
    assert task["status"] == "working" and task["pollIntervalMs"] >= 250
    assert "ttlMs" in task and "task" not in task
    cancelled = await rpc.call("tasks/cancel", {"taskId": operation_id, "_meta": meta})
    assert cancelled["error"]["code"] == -30403
    assert cancelled["error"]["data"]["type"] == "/problems/approval-required"
    assert (await _record(harness, operation_id)).outcome.value == "pending"
    got: dict[str, Any] = {}
    for _ in range(30):
        got = (await rpc.call("tasks/get", {"taskId": operation_id, "_meta": meta}))["result"]
        if got["status"] != "working":
            break
        harness.clock.advance(got["pollIntervalMs"] / 1000)
    assert got["status"] == "completed" and got["resultType"] == "complete"
    assert got["result"]["structuredContent"]["outcome"] == "succeeded"
    assert (await rpc.call("tasks/result", {"taskId": operation_id, "_meta": meta}))["error"][
        "code"
    ] == -32601


async def test_escalated_task_is_working_and_failed_maps_to_failed(harness: Harness) -> None:
    """An escalated operation is a working task whose statusMessage names the reason; a job
    that failed at the provider is a failed task."""
    stuck = await submitted(harness, [{"state": "bogus"}], key="k-esc")
    failed = await submitted(harness, [{"state": "failed", "error": {"code": "x"}}], key="k-f")
    harness.clock.advance(5)
    rpc = Rpc(harness.client)
    await rpc.open()
    for operation_id in (stuck, failed):
        await rpc.tool("wait_for_operation", operation_id=operation_id, max_wait_seconds=0)
    escalated = (await rpc.call("tasks/get", {"taskId": stuck}))["result"]
    assert escalated["status"] == "working"
    assert "unknown_state" in escalated["statusMessage"]
    assert (await rpc.call("tasks/get", {"taskId": failed}))["result"]["status"] == "failed"
    view = (await rpc.tool("get_operation", operation_id=stuck))["structuredContent"]
    assert view["outcome"] == "escalated" and view["escalation"]["reason"] == "unknown_state"
    assert "Safe options" in view["escalation"]["message"]


async def test_wait_is_capped_at_max_hold_and_polls_only_on_schedule(harness: Harness) -> None:
    """max_wait_seconds over the policy's max_hold is capped, not refused; the wait ends
    with the operation pending and the provider saw only the scheduled polls."""
    operation_id = await submitted(harness, [{"state": "running"}])
    rpc = Rpc(harness.client)
    await rpc.open()
    started = harness.clock.now
    result = await rpc.tool("wait_for_operation", operation_id=operation_id, max_wait_seconds=3600)
    data = result["structuredContent"]
    assert data["wait_applied_seconds"] == 60 and data["outcome"] == "pending"
    assert harness.clock.now - started <= 60
    record = await _record(harness, operation_id)
    calls = harness.provider_calls(record.provider_job_id)
    assert len(calls) == record.status_requests_used <= 7  # 1 s doubling within 60 s
    scheduled = [line for line in harness.audit_lines() if line["event"] in ("submitted", "polled")]
    for call, line in zip(calls, scheduled, strict=False):
        assert call["at"] >= _epoch(line["next_poll_at"]) - 0.001


def _epoch(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp).timestamp()


# -- bad input ---------------------------------------------------------------------------------


async def test_malformed_json_unknown_method_and_wrong_params(harness: Harness) -> None:
    """-32700 for a body that is not JSON, -32601 for an unknown method, -32602 for params
    that do not fit (and, in 2025-11-25, an isError result for tool arguments)."""
    rpc = Rpc(harness.client)
    await rpc.open()
    broken = await rpc.post(b'{"jsonrpc": "2.0", "id": 1, "method": ')
    assert broken.status == 400
    assert (await broken.json())["error"]["code"] == -32700
    assert (await rpc.call("resources/list"))["error"]["code"] == -32601
    assert (await rpc.call("tasks/get", {}))["error"]["code"] == -32602
    assert (await rpc.call("tools/call", {"arguments": {}}))["error"]["code"] == -32602
    assert (await rpc.call("tools/call", {"name": "nope"}))["error"]["code"] == -32602
    assert (await rpc.call("tools/list", [1]))["error"]["code"] == -32602  # type: ignore[arg-type]
    bad = await rpc.tool("wait_for_operation", operation_id="x", max_wait_seconds="soon")
    assert bad["isError"] is True and "invalid-request" in bad["content"][0]["text"]
    older = Rpc(harness.client)
    await older.open("2025-06-18")
    assert older.version == "2025-06-18"
    wrong = await older.call(
        "tools/call", {"name": "get_operation", "arguments": {"operation_id": 7}}
    )
    assert wrong["error"]["code"] == -32602
    invalid = await rpc.post({"jsonrpc": "1.0", "id": 1, "method": "ping"})
    assert invalid.status == 400 and (await invalid.json())["error"]["code"] == -32600


async def test_oversize_body_is_413(harness: Harness) -> None:
    """A body over limits.max_request_body is 413 request-too-large, as on every route."""
    rpc = Rpc(harness.client)
    await rpc.open()
    padding = "x" * (70 * 1024)
    response = await rpc.post(
        {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"p": padding}}
    )
    assert response.status == 413
    assert (await response.json())["type"] == "/problems/request-too-large"


async def test_accounts_see_only_their_own_operations(harness: Harness) -> None:
    """Another account's operation is indistinguishable from none: not listed, unknown to
    get_operation, wait_for_operation and tasks/get alike."""
    operation_id = await submitted(harness)
    other = Rpc(harness.client, OTHER_TOKEN)
    await other.open()
    listed = await other.tool("list_operations")
    assert listed["structuredContent"] == {"operations": [], "count": 0}
    for tool in ("get_operation", "wait_for_operation"):
        answer = await other.tool(tool, operation_id=operation_id)
        assert answer["isError"] is True
        problem = json.loads(answer["content"][1]["text"])
        assert problem["type"] == "/problems/unknown-operation"
    missing = await other.tool("get_operation", operation_id="op_missing")
    assert missing["content"][1]["text"] == answer["content"][1]["text"]
    assert (await other.call("tasks/get", {"taskId": operation_id}))["error"]["code"] == -32602
    assert (await other.call("tasks/list"))["result"]["tasks"] == []


async def test_no_token_is_401_and_sessions_are_checked(harness: Harness) -> None:
    """Without a token /mcp is 401 with WWW-Authenticate, and sessions are enforced (400 with
    none, 404 for another token's or an ended one, 400 for another protocol version)."""
    response = await harness.client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert response.status == 401 and "Bearer" in response.headers["WWW-Authenticate"]
    rpc = Rpc(harness.client)
    assert (await rpc.post({"jsonrpc": "2.0", "id": 1, "method": "ping"})).status == 400
    await rpc.open()
    assert (await rpc.call("ping"))["result"] == {}
    other = Rpc(harness.client, OTHER_TOKEN)
    other.session = rpc.session
    assert (await other.post({"jsonrpc": "2.0", "id": 1, "method": "ping"})).status == 404
    wrong = await rpc.post(
        {"jsonrpc": "2.0", "id": 1, "method": "ping"}, **{"MCP-Protocol-Version": "2025-06-18"}
    )
    assert wrong.status == 400
    ended = await harness.client.delete("/mcp", headers=rpc.headers())
    assert ended.status == 204
    assert (await rpc.post({"jsonrpc": "2.0", "id": 1, "method": "ping"})).status == 404
    assert (await harness.client.get("/mcp", headers=rpc.headers())).status == 405
    assert rpc.session is not None and read(rpc.session, AGENT_TOKEN) is not None
    assert AGENT_TOKEN not in rpc.session


async def test_batches_only_where_the_revision_has_them(harness: Harness) -> None:
    """A JSON-RPC batch is -32600 Invalid Request in 2025-11-25 (batching was removed in
    2025-06-18) and answered element by element in 2025-03-26."""
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "nope"},
        {"id": 3},
    ]
    rpc = Rpc(harness.client)
    await rpc.open()
    refused = await rpc.post(batch)
    assert refused.status == 400 and (await refused.json())["error"]["code"] == -32600
    old = Rpc(harness.client)
    assert (await old.open("2025-03-26"))["result"]["protocolVersion"] == "2025-03-26"
    answered = await old.post(batch)
    assert answered.status == 200
    answers = await answered.json()
    assert [a["id"] for a in answers] == [1, 2, 3]
    assert answers[0]["result"] == {} and answers[1]["error"]["code"] == -32601
    assert answers[2]["error"]["code"] == -32600
    only_notes = await old.post([{"jsonrpc": "2.0", "method": "notifications/initialized"}])
    assert only_notes.status == 202


async def test_sse_for_clients_that_take_only_sse_and_origin_checked(harness: Harness) -> None:
    """A client that accepts only text/event-stream gets its answer as one SSE message
    event; a foreign Origin is 403; an unknown protocol version falls back to the latest."""
    rpc = Rpc(harness.client)
    opened = await rpc.open("1999-01-01")
    assert opened["result"]["protocolVersion"] == "2025-11-25"
    response = await rpc.post(
        {"jsonrpc": "2.0", "id": 9, "method": "tools/list"}, Accept="text/event-stream"
    )
    assert response.status == 200 and response.content_type == "text/event-stream"
    text = await response.text()
    assert text.startswith("event: message\ndata: ")
    event = json.loads(text.split("data: ", 1)[1])
    assert event["id"] == 9 and len(event["result"]["tools"]) == 5
    foreign = await rpc.post(
        {"jsonrpc": "2.0", "id": 1, "method": "ping"}, Origin="http://evil.test"
    )
    assert foreign.status == 403
    own = await rpc.post(
        {"jsonrpc": "2.0", "id": 1, "method": "ping"}, Origin="http://gateway.test"
    )
    assert own.status == 200
    neither = await rpc.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, Accept="image/png")
    assert neither.status == 406


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"null",
        b"[]",
        b"[1]",
        b"{}",
        b'"x"',
        b"\xff\xfe",
        b'{"jsonrpc":"2.0","id":true,"method":"x"}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_operation","arguments":[]}}',
        b'{"jsonrpc":"2.0","id":1,"method":"tasks/list","params":{"cursor":"!!"}}',
        b"[" * 5000 + b"]" * 5000,
    ],
)
async def test_no_input_is_a_server_error(harness: Harness, body: bytes) -> None:
    """Odd bodies get a JSON-RPC error or a problem, never a 500."""
    rpc = Rpc(harness.client)
    await rpc.open()
    response = await rpc.post(body)
    assert response.status < 500, await response.text()
    assert response.status in (200, 202, 400)
