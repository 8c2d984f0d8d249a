"""MCP bugs of issue 22: JSON-RPC batches bounded in messages and in the size of their
answers without blocking the event loop, absurd numbers answered as input errors naming the
argument (never -32603, never a traceback), and tasks/result on an escalated operation
answering within max_hold."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest
from mcp_wire import TASK_CAPS, Rpc, Wire, submitted

from gateway.flow.runtime import RUNTIME

from conftest import Harness

LIST = {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "list_operations"}}


async def _many(harness: Harness, count: int) -> None:
    for n in range(count):
        response = await harness.submit([{"state": "running"}], key=f"many-{n}")
        assert response.status == 202


async def test_a_large_batch_is_refused_at_once_and_the_loop_stays_responsive(
    harness: Harness,
) -> None:
    """A 2025-03-26 batch of hundreds of list_operations calls is one -32600 error naming
    the limit, answered fast, and the event loop never stalls while it is read."""
    await _many(harness, 20)
    rpc = Rpc(harness.client)
    await rpc.open("2025-03-26")
    batch = [{**LIST, "id": n} for n in range(500)]  # 50 KB, within max_request_body
    stalls: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0.005)
            stalls.append(time.perf_counter() - before - 0.005)

    ticking = asyncio.create_task(ticker())
    started = time.perf_counter()
    response = await rpc.post(batch)
    elapsed = time.perf_counter() - started
    done.set()
    await ticking
    answer = await response.json()
    assert response.status == 400 and answer["error"]["code"] == -32600
    assert "at most 50" in answer["error"]["message"]
    assert elapsed < 1.0 and max(stalls) < 0.2


async def test_batch_answers_stop_at_max_response_body(harness: Harness) -> None:
    """A batch within the message limit whose answers would exceed
    limits.max_response_body gets the answers that fit and, for each one past it, a short
    error saying so: the whole answer stays near the limit."""
    await _many(harness, 40)
    rpc = Rpc(harness.client)
    await rpc.open("2025-03-26")
    response = await rpc.post([{**LIST, "id": n} for n in range(40)])
    assert response.status == 200
    body = await response.read()
    answers = json.loads(body)
    limit = harness.client.app[RUNTIME].settings.file.limits.max_response_body
    assert len(body) <= limit + 40 * 400
    kept = [a for a in answers if "result" in a]
    refused = [a for a in answers if "error" in a]
    assert kept and refused and len(kept) + len(refused) == 40
    assert all(a["error"]["code"] == -30413 for a in refused)
    assert "max_response_body" in refused[0]["error"]["message"]


ABSURD: list[Any] = [10**400, -1, -(10**400), 1e308, 86_401, "NaN", "Infinity", "-Infinity"]


@pytest.mark.parametrize("value", ABSURD, ids=lambda v: str(v)[:12])
async def test_absurd_numbers_are_input_errors_naming_the_argument(
    harness: Harness, value: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """max_wait_seconds as a 401-digit integer, negative, beyond a day, NaN or an infinity
    (which Python's JSON reader accepts) is -32602 before 2025-11-25 and an isError result
    from then on (also as a task, and in 2026-07-28), naming the argument; never -32603, no
    traceback in the logs."""
    operation_id = await submitted(harness)
    number = value if not isinstance(value, str) else f"__{value}__"
    arguments = {"operation_id": operation_id, "max_wait_seconds": number}

    def raw(message: dict[str, Any]) -> bytes:
        text = json.dumps(message)
        return text.replace(f'"__{value}__"', str(value)).encode()

    caplog.set_level(logging.INFO)
    for version in ("2025-06-18", "2025-11-25"):
        rpc = Rpc(harness.client)
        await rpc.open(version)
        params: dict[str, Any] = {"name": "wait_for_operation", "arguments": arguments}
        for extra in ({}, {"task": {}}):
            message = {"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": params}
            message["params"] = {**params, **extra}
            answer = await (await rpc.post(raw(message))).json()
            _check(answer, version)
    wire = Wire(harness)
    for meta in ({}, TASK_CAPS):
        message = wire.message("tools/call", {"name": "wait_for_operation"}, **meta)
        message["params"]["arguments"] = arguments
        response = await wire.post(
            raw(message), **{"Mcp-Method": "tools/call", "Mcp-Name": "wait_for_operation"}
        )
        _check(await response.json(), "2026-07-28")
    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def _check(answer: dict[str, Any], version: str) -> None:
    if version == "2025-06-18":
        assert answer["error"]["code"] == -32602, answer
        assert "max_wait_seconds" in answer["error"]["message"]
        return
    assert "error" not in answer, answer
    assert answer["result"]["isError"] is True
    assert "max_wait_seconds" in answer["result"]["content"][0]["text"]


async def test_a_huge_request_id_is_echoed(harness: Harness) -> None:
    """A request id of 401 digits is an integer JSON-RPC allows: answered, echoed as sent."""
    rpc = Rpc(harness.client)
    await rpc.open()
    ident = 10**400
    response = await rpc.post({"jsonrpc": "2.0", "id": ident, "method": "tools/list"})
    answer = await response.json()
    assert response.status == 200 and answer["id"] == ident and "result" in answer


async def test_tasks_result_on_an_escalated_operation_answers_within_max_hold(
    harness: Harness,
) -> None:
    """tasks/result on an escalated operation (which only an operator can move) answers
    after at most the policy's max_hold with the operation as it stands, instead of
    blocking for as long as nobody decides."""
    operation_id = await submitted(harness, [{"state": "bogus"}])
    harness.clock.advance(5)
    rpc = Rpc(harness.client)
    await rpc.open()
    await rpc.tool("wait_for_operation", operation_id=operation_id, max_wait_seconds=0)
    started = harness.clock.now
    answer = await asyncio.wait_for(rpc.call("tasks/result", {"taskId": operation_id}), 5)
    result = answer["result"]
    assert result["structuredContent"]["outcome"] == "escalated"
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": operation_id}
    assert harness.clock.now - started <= 60 + 5


async def test_a_disagreeing_mcp_name_is_refused_in_the_handshake_era(harness: Harness) -> None:
    """An Mcp-Name header sent in a 2025-11-25 session that disagrees with the tool named
    in the body is 400, as in 2026-07-28; one that agrees is served."""
    rpc = Rpc(harness.client)
    await rpc.open()
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "get_result"}}
    wrong = await rpc.post(call, **{"Mcp-Name": "start_job"})
    assert wrong.status == 400 and (await wrong.json())["error"]["code"] == -32020
    right = await rpc.post(call, **{"Mcp-Name": "get_result"})
    assert right.status == 200


async def test_start_job_body_that_is_not_json_names_the_argument(harness: Harness) -> None:
    """A start_job body holding NaN or an infinity (read by Python's JSON reader, not JSON
    a provider can take) is an isError result naming body; nothing is submitted; a 401-digit
    integer is JSON and goes to the provider as sent."""
    wire = Wire(harness)
    for bad in ("NaN", "-Infinity"):
        message = wire.message("tools/call", {"name": "start_job"})
        message["params"]["arguments"] = {"provider": "demo-jobs", "body": "__x__"}
        raw = json.dumps(message).replace('"__x__"', f'{{"input": {bad}}}').encode()
        response = await wire.post(raw, **{"Mcp-Method": "tools/call", "Mcp-Name": "start_job"})
        answer = await response.json()
        assert answer["result"]["isError"] is True
        assert "body" in answer["result"]["content"][0]["text"]
    assert not [e for e in harness.provider.log if e["method"] == "POST"]
    huge = {"input": "a.pdf", "pages": 10**400}
    status, answer = await wire.call(
        "tools/call",
        {
            "name": "start_job",
            "arguments": {"provider": "demo-jobs", "body": huge, "idempotency_key": "h"},
        },
    )
    assert status == 200 and answer["result"]["isError"] is False
