"""MCP 2026-07-28 at /mcp (SPEC 21): the official SDK negotiating the stateless revision and
running every tool against a real gateway and the real demo provider, the tasks extension
of that revision, and the transport's rules for its headers and envelope."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

from mcp_wire import EXTENSION, MODERN, SCRIPT, TASK_CAPS, Rpc, Wire, submitted

from gateway.flow.runtime import RUNTIME

from conftest import AGENT_TOKEN, OTHER_TOKEN, Harness


@contextlib.asynccontextmanager
async def sdk(
    harness: Harness,
    mode: str = "auto",
    token: str = AGENT_TOKEN,
    extensions: Sequence[Any] | None = None,
) -> AsyncIterator[Any]:
    """The official mcp Client over Streamable HTTP with the agent's bearer token."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    url = str(harness.client.make_url("/mcp"))
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http,
        Client(
            streamable_http_client(url, http_client=http), mode=mode, extensions=extensions
        ) as client,
    ):
        yield client


def job(script: list[dict[str, Any]] = SCRIPT) -> dict[str, Any]:
    return {"input": "report.pdf", "demo_script": script}


def submits(harness: Harness) -> list[dict[str, Any]]:
    return [e for e in harness.provider.log if e["method"] == "POST" and e["kind"] == "submit"]


def polls(harness: Harness, job_id: str) -> list[dict[str, Any]]:
    return [e for e in harness.provider.log if e["job_id"] == job_id and e["kind"] == "status"]


def too_early(harness: Harness) -> float:
    metrics = harness.client.app[RUNTIME].effects.metrics
    labels = {"provider": "demo-jobs", "route": "status", "outcome": "too-early"}
    value = metrics.registry.get_sample_value("statusgate_agent_requests_total", labels)
    return float(value or 0.0)


# -- the official SDK ----------------------------------------------------------------------


async def test_sdk_auto_negotiates_the_stateless_revision(harness: Harness) -> None:
    """The official client in mode="auto" probes server/discover and settles on 2026-07-28
    (no initialize, no session), seeing the server's identity and the tasks extension."""
    async with sdk(harness) as client:
        assert client.protocol_version == MODERN
        assert client.server_info is not None and client.server_info.name == "statusgate"
        assert EXTENSION in (client.server_capabilities.extensions or {})
        assert client.session.initialize_result is None


async def test_sdk_pinned_lists_and_calls_every_tool(harness: Harness) -> None:
    """Pinned to 2026-07-28 the official client lists the five tools with truthful
    annotations and calls each of them successfully."""
    async with sdk(harness, mode=MODERN) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(listed) == {
            "list_operations",
            "get_operation",
            "wait_for_operation",
            "start_job",
            "get_result",
        }
        for name in ("wait_for_operation", "start_job", "get_result"):
            hints = listed[name].annotations
            assert hints is not None and hints.read_only_hint is False
            assert hints.open_world_hint is True and hints.destructive_hint is False
        for name in ("list_operations", "get_operation"):
            hints = listed[name].annotations
            assert hints is not None and hints.read_only_hint is True
        quick = job([{"state": "succeeded"}])
        started = await client.call_tool(
            "start_job", {"provider": "demo-jobs", "body": quick, "idempotency_key": "p"}
        )
        assert not started.is_error, started.content
        operation_id = started.structured_content["operation_id"]
        assert started.structured_content["submit_response"]["status"] == 202
        found = await client.call_tool("list_operations", {"provider": "demo-jobs"})
        assert [o["operation_id"] for o in found.structured_content["operations"]] == [operation_id]
        one = await client.call_tool("get_operation", {"operation_id": operation_id})
        assert one.structured_content["outcome"] == "pending"
        harness.clock.advance(5)
        waited = await client.call_tool(
            "wait_for_operation", {"operation_id": operation_id, "max_wait_seconds": 0}
        )
        assert waited.structured_content["outcome"] == "succeeded"
        got = await client.call_tool("get_result", {"operation_id": operation_id})
        assert not got.is_error and got.structured_content["result"]["status"] == 200


async def test_sdk_runs_start_wait_and_result_without_raw_http(harness: Harness) -> None:
    """start_job -> wait_for_operation -> get_result through the official client alone:
    one submission at the provider, polls only on schedule, the result fetched through the
    result route (counted and audited)."""
    async with sdk(harness) as client:
        started = await client.call_tool(
            "start_job", {"provider": "demo-jobs", "body": job(), "idempotency_key": "flow-1"}
        )
        operation_id = started.structured_content["operation_id"]
        waited = await client.call_tool(
            "wait_for_operation", {"operation_id": operation_id, "max_wait_seconds": 60}
        )
        assert waited.structured_content["outcome"] == "succeeded"
        assert waited.structured_content["final_response"]["json"]["result"] == {"pages": 3}
        got = await client.call_tool("get_result", {"operation_id": operation_id})
    assert got.structured_content["result"]["json"]["data"] == {"pages": 3}
    record = await harness.client.app[RUNTIME].store.get(operation_id)
    assert record is not None and record.result_fetches == 1
    assert len(submits(harness)) == 1
    assert len(polls(harness, record.provider_job_id)) == record.status_requests_used <= 6
    events = [line["event"] for line in harness.audit_lines()]
    assert events[0] == "submitted" and events[-1] == "result_fetched"


class TaskResolver:
    """A client side of the tasks extension for the official SDK: declares it, and resolves a
    task by polling tasks/get, advancing the gateway's fake clock by pollIntervalMs instead of
    sleeping; its first tasks/get comes right after the task was created, early."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.gets = 0
        self.identifier = EXTENSION

    def extension(self) -> Any:
        from mcp.client.extension import ClientExtension, ResultClaim
        from mcp_types import CallToolResult, Request, RequestParams, Result
        from pydantic import ConfigDict

        resolver = self

        class TaskHandle(Result):
            model_config = ConfigDict(extra="allow")
            result_type: Literal["task"] = "task"

        class GetTaskParams(RequestParams):
            model_config = ConfigDict(extra="allow")
            taskId: str  # the wire name

        class GetTask(Request[GetTaskParams, Literal["tasks/get"]]):
            method: Literal["tasks/get"] = "tasks/get"
            name_param = "taskId"

        class Polled(Result):
            model_config = ConfigDict(extra="allow")

        async def resolve(handle: TaskHandle, ctx: Any) -> CallToolResult:
            task = handle.model_dump(by_alias=True)
            task_id = task["taskId"]
            request = GetTask(params=GetTaskParams(taskId=task_id))
            while True:
                polled = (await ctx.session.send_request(request, Polled)).model_dump(by_alias=True)
                resolver.gets += 1
                if polled["status"] == "completed":
                    return CallToolResult.model_validate(polled["result"])
                assert polled["status"] == "working", polled
                resolver.harness.clock.advance(polled["pollIntervalMs"] / 1000)

        class Tasks(ClientExtension):
            identifier = EXTENSION

            def claims(self) -> Sequence[ResultClaim[Any]]:
                return [ResultClaim(result_type="task", model=TaskHandle, resolve=resolve)]

        return Tasks()


async def test_sdk_start_job_as_a_task_ends_in_the_final_answer(harness: Harness) -> None:
    """With the tasks extension declared, start_job answers a task whose id is the
    operation's; tasks/get answers from the record until the next permitted poll (no
    provider call, counted as a too-early status call) and inlines the final provider
    answer once the job ended."""
    resolver = TaskResolver(harness)
    async with sdk(harness, mode=MODERN, extensions=[resolver.extension()]) as client:
        done = await client.call_tool(
            "start_job", {"provider": "demo-jobs", "body": job(), "idempotency_key": "task-1"}
        )
        assert not done.is_error, done.content
        assert done.structured_content["outcome"] == "succeeded"
        assert done.structured_content["final_response"]["json"]["result"] == {"pages": 3}
        operation_id = done.structured_content["operation_id"]
        got = await client.call_tool("get_result", {"operation_id": operation_id})
        assert got.structured_content["result"]["status"] == 200
    record = await harness.client.app[RUNTIME].store.get(operation_id)
    assert record is not None
    assert len(polls(harness, record.provider_job_id)) == record.status_requests_used
    assert resolver.gets == record.status_requests_used + 1  # the early one made no call
    assert too_early(harness) == 1
    refused = [x for x in harness.audit_lines() if x["event"] == "refused"]
    assert [x["count"] for x in refused] == [1]  # its refusal window, closed by the next poll


async def test_start_job_keeps_the_submit_rules(harness: Harness) -> None:
    """start_job is POST /p/...: the same key replays the first answer (one job), another
    body under it is a conflict, no key on a policy that requires one is a tool error naming
    idempotency_key (nothing sent), and unknown or forbidden providers are refused."""
    async with sdk(harness, mode=MODERN) as client:
        args = {"provider": "demo-jobs", "body": job(), "idempotency_key": "same"}
        first = await client.call_tool("start_job", args)
        again = await client.call_tool("start_job", args)
        assert again.structured_content["operation_id"] == first.structured_content["operation_id"]
        conflict = await client.call_tool("start_job", {**args, "body": {"input": "other"}})
        assert conflict.is_error and "idempotency-key-conflict" in conflict.content[0].text
        keyless = await client.call_tool("start_job", {"provider": "demo-jobs", "body": job()})
        assert keyless.is_error and "idempotency_key" in keyless.content[0].text
        assert "idempotency-key-missing" in keyless.content[0].text
        unknown = await client.call_tool("start_job", {"provider": "nope", "body": {}})
        assert unknown.is_error and "unknown-provider" in unknown.content[0].text
        wrong = await client.call_tool(
            "start_job", {"provider": "demo-jobs", "route": "/v1/other", "body": {}}
        )
        assert wrong.is_error and "route-not-allowed" in wrong.content[0].text
    assert len(submits(harness)) == 1
    async with sdk(harness, mode=MODERN, token=OTHER_TOKEN) as other:
        refused = await other.call_tool(
            "start_job", {"provider": "openai-batch", "body": {}, "idempotency_key": "b"}
        )
        assert refused.is_error and "forbidden" in refused.content[0].text


async def test_get_result_is_gated_counted_and_per_account(harness: Harness) -> None:
    """get_result is refused before success (not-ready), counted against
    max_result_fetches after it (result-budget-exhausted past it), and another account's
    operation is unknown to it."""
    async with sdk(harness, mode=MODERN) as client:
        started = await client.call_tool(
            "start_job", {"provider": "demo-jobs", "body": job(), "idempotency_key": "r1"}
        )
        operation_id = started.structured_content["operation_id"]
        early = await client.call_tool("get_result", {"operation_id": operation_id})
        assert early.is_error and "not-ready" in early.content[0].text
        await client.call_tool(
            "wait_for_operation", {"operation_id": operation_id, "max_wait_seconds": 60}
        )
        limit = harness.client.app[RUNTIME].settings.policies["demo-jobs"].polling
        for _ in range(limit.max_result_fetches):
            fetched = await client.call_tool("get_result", {"operation_id": operation_id})
            assert not fetched.is_error
        over = await client.call_tool("get_result", {"operation_id": operation_id})
        assert over.is_error and "result-budget-exhausted" in over.content[0].text
    async with sdk(harness, mode=MODERN, token=OTHER_TOKEN) as other:
        theirs = await other.call_tool("get_result", {"operation_id": operation_id})
        assert theirs.is_error and "unknown-operation" in theirs.content[0].text
    fetched_lines = [x for x in harness.audit_lines() if x["event"] == "result_fetched"]
    assert len(fetched_lines) == limit.max_result_fetches


# -- the wire, raw -------------------------------------------------------------------------


async def test_routing_headers_are_checked_before_and_against_the_body(harness: Harness) -> None:
    """An Mcp-Name that disagrees with the body, a missing Mcp-Method or Mcp-Name, and a
    header version that disagrees with _meta are 400 HeaderMismatch (-32020); a method the
    header names and the server does not serve is 404 -32601 without the body being read;
    an unsupported version is 400 -32022 naming the supported one."""
    wire = Wire(harness)
    call = wire.message("tools/call", {"name": "list_operations", "arguments": {}})
    other = await wire.post(call, **{"Mcp-Name": "get_operation"})
    assert other.status == 400 and (await other.json())["error"]["code"] == -32020
    encoded = await wire.post(call, **{"Mcp-Name": "=?base64?bGlzdF9vcGVyYXRpb25z?="})
    assert encoded.status == 200
    no_name = wire.message("tools/call", {"name": "list_operations"})
    missing = await wire.post(no_name, **{"Mcp-Name": ""})
    assert missing.status == 400
    no_method = await wire.harness.client.post(
        "/mcp",
        json=wire.message("tools/list"),
        headers={"Authorization": f"Bearer {AGENT_TOKEN}", "MCP-Protocol-Version": MODERN},
    )
    assert no_method.status == 400 and (await no_method.json())["error"]["code"] == -32020
    unserved = await wire.post(b"not even json", **{"Mcp-Method": "resources/list"})
    assert unserved.status == 404 and (await unserved.json())["error"]["code"] == -32601
    told = await wire.post(wire.message("tools/list"), **{"Mcp-Method": "server/discover"})
    assert told.status == 400 and (await told.json())["error"]["code"] == -32020
    future = await wire.post(wire.message("tools/list"), **{"MCP-Protocol-Version": "2099-01-01"})
    answer = await future.json()
    assert future.status == 400 and answer["error"]["code"] == -32022
    assert answer["error"]["data"]["supported"] == [MODERN]
    bare = wire.message("tools/list")
    del bare["params"]["_meta"]
    unwrapped = await wire.post(bare)
    assert unwrapped.status == 400 and (await unwrapped.json())["error"]["code"] == -32602


async def test_stateless_answers_carry_result_type_and_no_session(harness: Harness) -> None:
    """server/discover lists 2026-07-28 and the tasks extension, every result carries
    resultType and the server's identity, no session is minted; batches are refused,
    notifications accepted (202), DELETE and ping are not of this revision."""
    wire = Wire(harness)
    status, found = await wire.call("server/discover")
    assert status == 200 and found["result"]["supportedVersions"] == [MODERN]
    assert found["result"]["resultType"] == "complete" and found["result"]["ttlMs"] >= 0
    assert found["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "statusgate"
    status, listed = await wire.call("tools/list")
    assert listed["result"]["resultType"] == "complete" and len(listed["result"]["tools"]) == 5
    batch = await wire.post([wire.message("tools/list")], **{"Mcp-Method": "tools/list"})
    assert batch.status == 400 and (await batch.json())["error"]["code"] == -32600
    note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {}}
    assert (await wire.post(note)).status == 202
    status, ping = await wire.call("ping")
    assert status == 404 and ping["error"]["code"] == -32601
    headers = {"Authorization": f"Bearer {AGENT_TOKEN}", "MCP-Protocol-Version": MODERN}
    assert (await harness.client.delete("/mcp", headers=headers)).status == 405


# -- tasks of 2026-07-28, raw -----------------------------------------------------------------


async def test_tasks_extension_of_the_stateless_revision(harness: Harness) -> None:
    """tasks/* need the extension declared on the request (-32021) and Mcp-Name = taskId;
    pollIntervalMs is the time to next_poll_at; an early tasks/get makes no provider call
    and is counted as a too-early status call; tasks/update is acknowledged, tasks/cancel
    refused as approval-required; another account's task is not found."""
    operation_id = await submitted(harness)
    record = await harness.client.app[RUNTIME].store.get(operation_id)
    assert record is not None
    wire = Wire(harness)
    status, refused = await wire.call("tasks/get", {"taskId": operation_id})
    assert status == 400 and refused["error"]["code"] == -32021
    nameless = wire.message("tasks/get", {"taskId": operation_id}, **TASK_CAPS)
    response = await wire.post(nameless, **{"Mcp-Name": "op_other"})
    assert response.status == 400 and (await response.json())["error"]["code"] == -32020
    status, created = await wire.call(
        "tools/call",
        {"name": "wait_for_operation", "arguments": {"operation_id": operation_id}},
        **TASK_CAPS,
    )
    task = created["result"]
    assert task["resultType"] == "task" and task["taskId"] == operation_id
    expected = round((record.next_poll_at - harness.clock.now) * 1000)
    assert abs(task["pollIntervalMs"] - expected) <= 1
    before = len(harness.provider_calls(record.provider_job_id))
    for _ in range(3):
        status, got = await wire.call("tasks/get", {"taskId": operation_id}, **TASK_CAPS)
        assert status == 200 and got["result"]["status"] == "working"
    assert len(harness.provider_calls(record.provider_job_id)) == before
    assert too_early(harness) == 3
    status, updated = await wire.call(
        "tasks/update", {"taskId": operation_id, "inputResponses": {}}, **TASK_CAPS
    )
    assert updated["result"]["resultType"] == "complete"
    status, cancelled = await wire.call("tasks/cancel", {"taskId": operation_id}, **TASK_CAPS)
    assert cancelled["error"]["code"] == -30403
    assert cancelled["error"]["data"]["type"] == "/problems/approval-required"
    assert (await harness.client.app[RUNTIME].store.get(operation_id)).outcome.value == "pending"
    stranger = Wire(harness, OTHER_TOKEN)
    status, unknown = await stranger.call("tasks/get", {"taskId": operation_id}, **TASK_CAPS)
    assert status == 400 and unknown["error"]["code"] == -32602


async def test_failed_task_carries_its_error_inline(harness: Harness) -> None:
    """A job that failed at the provider is a failed task whose error and data (the
    operation and its final provider answer) come inline in tasks/get."""
    operation_id = await submitted(harness, [{"state": "failed"}])
    harness.clock.advance(5)
    wire = Wire(harness)
    await wire.call(
        "tools/call",
        {"name": "wait_for_operation", "arguments": {"operation_id": operation_id}},
    )
    status, got = await wire.call("tasks/get", {"taskId": operation_id}, **TASK_CAPS)
    assert status == 200
    assert got["result"]["status"] == "failed" and got["result"]["error"]["code"] == -30409
    assert got["result"]["error"]["data"]["final_response"]["json"]["state"] == "failed"


async def test_unknown_tool_and_bad_arguments(harness: Harness) -> None:
    """An unknown tool is -32602 (400); arguments that do not fit are an isError result
    naming the argument, as 2025-11-25 and later ask."""
    wire = Wire(harness)
    status, unknown = await wire.call("tools/call", {"name": "nope", "arguments": {}})
    assert status == 400 and unknown["error"]["code"] == -32602
    status, bad = await wire.call(
        "tools/call", {"name": "start_job", "arguments": {"provider": "demo-jobs"}}
    )
    assert bad["result"]["isError"] is True and "body" in bad["result"]["content"][0]["text"]


async def test_start_job_as_a_2025_11_25_task(harness: Harness) -> None:
    """In a 2025-11-25 session start_job with a task param answers the task at once (its id
    the new operation's) and tasks/result gives the final provider answer."""
    rpc = Rpc(harness.client)
    await rpc.open()
    arguments = {"provider": "demo-jobs", "body": job(), "idempotency_key": "legacy-task"}
    created = await rpc.call(
        "tools/call", {"name": "start_job", "arguments": arguments, "task": {}}
    )
    task = created["result"]["task"]
    assert task["status"] == "working" and task["taskId"].startswith("op_")
    done = (await rpc.call("tasks/result", {"taskId": task["taskId"]}))["result"]
    assert done["structuredContent"]["final_response"]["json"]["result"] == {"pages": 3}
    assert len(submits(harness)) == 1


async def test_sse_only_client_of_the_stateless_revision(harness: Harness) -> None:
    """A 2026-07-28 client that accepts only text/event-stream gets its answer as one SSE
    message event, with resultType."""
    wire = Wire(harness)
    response = await wire.post(wire.message("tools/list"), Accept="text/event-stream")
    assert response.status == 200 and response.content_type == "text/event-stream"
    event = json.loads((await response.text()).split("data: ", 1)[1])
    assert event["result"]["resultType"] == "complete"
