"""SPEC 24 end to end: the official a2a-sdk client, through the gateway, against an a2a-sdk
server (gateway/demo/a2a_agent.py), over both bindings, on real time with a short schedule."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml
from a2a.client import ClientConfig, create_client
from a2a.server.tasks import BasePushNotificationSender, InMemoryPushNotificationConfigStore
from a2a.types import CancelTaskRequest, GetTaskRequest, Message, Part, Role, SendMessageRequest
from aiohttp.test_utils import TestServer

from gateway.demo import a2a_agent
from gateway.run.app import create_app
from gateway.settings.config import load_settings
from gateway.store import store_from_url

from conftest import AGENT_TOKEN, OPERATOR_TOKEN, OTHER_TOKEN, PROVIDER_KEY, free_port, sha

BINDINGS = ["JSONRPC", "HTTP+JSON"]
DONE = {"TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED", "TASK_STATE_REJECTED"}
MAX_REQUESTS = 12


@dataclass
class Setup:
    gateway: str
    agent: a2a_agent.Counting
    folder: Path

    def polls(self) -> int:
        return sum(n for k, n in self.agent.calls.items() if k.startswith("GET /tasks/"))

    def audit(self) -> list[dict[str, Any]]:
        return [
            yaml.safe_load(line) for line in (self.folder / "audit.jsonl").read_text().splitlines()
        ]


@contextlib.asynccontextmanager
async def started(
    folder: Path, work: float = 2.0, *, push: bool = False, **policy: Any
) -> AsyncIterator[Setup]:
    """The demo agent on uvicorn and a gateway before it, with an a2a policy; ``push``:
    the agent sends push notifications (a2a-sdk's sender)."""
    agent_port, gateway_port = free_port(), free_port()
    handler: dict[str, Any] = {}
    if push:
        store = InMemoryPushNotificationConfigStore()
        sender = BasePushNotificationSender(httpx.AsyncClient(timeout=10), store)
        handler = {"push_config_store": store, "push_sender": sender}
    agent = a2a_agent.app(f"http://127.0.0.1:{agent_port}", work_seconds=work, **handler)
    server = uvicorn.Server(
        uvicorn.Config(agent, host="127.0.0.1", port=agent_port, log_level="warning")
    )
    serving = asyncio.create_task(server.serve())
    (folder / "policies").mkdir(parents=True)
    data = {
        "provider": "demo-agent",
        "protocol": "a2a",
        "upstream": f"http://127.0.0.1:{agent_port}",
        "credential": {"header": "Authorization", "value": f"Bearer {PROVIDER_KEY}"},
        "polling": {
            "base_delay": "300ms",
            "max_delay": "1s",
            "deadline": "2m",
            "max_status_requests": MAX_REQUESTS,
            "max_hold": "1s",
        },
        **policy,
    }
    (folder / "policies" / "demo-agent.yaml").write_text(yaml.safe_dump(data))
    base = f"http://127.0.0.1:{gateway_port}"
    config = {
        "listen": {"host": "127.0.0.1", "port": gateway_port},
        "public_base_url": base,
        "store": "memory://",
        "policies_dir": "policies",
        "accounts": [
            {"id": "team-a", "token_sha256": [sha(AGENT_TOKEN)], "providers": ["*"]},
            {"id": "team-b", "token_sha256": [sha(OTHER_TOKEN)], "providers": ["*"]},
        ],
        "operators": [{"id": "alice", "token_sha256": sha(OPERATOR_TOKEN)}],
        "audit": {"path": "audit.jsonl"},
    }
    (folder / "gateway.yaml").write_text(yaml.safe_dump(config))
    settings = load_settings(folder / "gateway.yaml", env={})
    app = create_app(settings, store=store_from_url("memory://"), rng=random.Random(7))
    gateway = TestServer(app, host="127.0.0.1", port=gateway_port)
    await gateway.start_server()
    while not server.started:
        await asyncio.sleep(0.02)
    try:
        yield Setup(base, agent, folder)
    finally:
        await gateway.close()
        server.should_exit = True
        await serving


async def client(setup: Setup, binding: str, token: str = AGENT_TOKEN) -> Any:
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
    config = ClientConfig(streaming=False, httpx_client=http, supported_protocol_bindings=[binding])
    return await create_client(f"{setup.gateway}/a2a/demo-agent", client_config=config)


def message(text: str, task_id: str = "") -> SendMessageRequest:
    sent = Message(role=Role.ROLE_USER, message_id=f"m-{random.random()}", parts=[Part(text=text)])
    if task_id:
        sent.task_id = task_id
    request = SendMessageRequest(message=sent)
    request.configuration.return_immediately = True
    return request


async def send(agent: Any, request: SendMessageRequest) -> Any:
    async for event in agent.send_message(request):
        return event.task
    raise AssertionError("no answer")


async def naive_loop(agent: Any, task_id: str, states: set[str], limit: int = 2000) -> Any:
    from a2a.types import TaskState

    for _ in range(limit):
        task = await agent.get_task(GetTaskRequest(id=task_id))
        if TaskState.Name(task.status.state) in states:
            return task
        await asyncio.sleep(0.01)
    raise AssertionError("the loop never saw the state")


async def serve_on_loopback(app: Any) -> tuple[Any, int]:
    """``app`` (an aiohttp Application) served on a free loopback port: its runner (to
    clean up) and the port."""
    from aiohttp import web

    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


@pytest.mark.parametrize("binding", BINDINGS)
async def test_naive_get_task_loop_is_paced(tmp_path: Path, binding: str) -> None:
    """A naive GetTask loop through the gateway gets the completed task and its artifact,
    the remote agent polled within the policy's budget and with the gateway's credential,
    never the caller's token."""
    async with started(tmp_path) as setup:
        agent = await client(setup, binding)
        task = await send(agent, message("hello"))
        done = await naive_loop(agent, task.id, DONE)
        assert done.artifacts[0].parts[0].text == "done: hello"
        calls = await naive_loop(agent, task.id, DONE)  # answered from the record
        assert calls.id == task.id
        assert 1 <= setup.polls() <= MAX_REQUESTS
        for headers in setup.agent.headers:
            assert AGENT_TOKEN not in str(headers)
            if headers.get("authorization"):
                assert headers["authorization"] == f"Bearer {PROVIDER_KEY}"
        assert any(h.get("a2a-version") == "1.0" for h in setup.agent.headers)


@pytest.mark.parametrize("binding", BINDINGS)
async def test_input_required_spends_no_polls_until_the_reply(tmp_path: Path, binding: str) -> None:
    """A task at INPUT_REQUIRED is answered from the record without any poll while it
    waits; the caller's reply resumes pacing and the task completes."""
    async with started(tmp_path, work=0.5) as setup:
        agent = await client(setup, binding)
        task = await send(agent, message("ask me"))
        asked = await naive_loop(agent, task.id, {"TASK_STATE_INPUT_REQUIRED"})
        before = setup.polls()
        for _ in range(50):
            again = await agent.get_task(GetTaskRequest(id=task.id))
            assert again.status.message.parts[0].text == "Which city?"
        assert setup.polls() == before
        assert asked.id == task.id
        await send(agent, message("Paris", task.id))
        done = await naive_loop(agent, task.id, DONE)
        assert done.artifacts[0].parts[0].text == "done: Paris"


@pytest.mark.parametrize("binding", BINDINGS)
async def test_another_account_cannot_read_the_task(tmp_path: Path, binding: str) -> None:
    """Account B's GetTask, CancelTask and follow-up for account A's task are refused as
    unknown, and reach nothing."""
    async with started(tmp_path) as setup:
        task = await send(await client(setup, binding), message("hello"))
        other = await client(setup, binding, OTHER_TOKEN)
        before = sum(setup.agent.calls.values())
        for call in (
            other.get_task(GetTaskRequest(id=task.id)),
            other.cancel_task(CancelTaskRequest(id=task.id)),
            send(other, message("more", task.id)),
        ):
            with pytest.raises(Exception) as raised:
                await call
            shown = repr(raised.value)
            assert "unknown-operation" in shown or "TaskNotFound" in shown or "not found" in shown
        assert sum(setup.agent.calls.values()) == before


@pytest.mark.parametrize("binding", BINDINGS)
async def test_cancel_by_agent_and_by_operator(tmp_path: Path, binding: str) -> None:
    """Under routes.cancel.by: agent the caller's CancelTask reaches the agent once and the
    task ends CANCELED; under the default it is refused, and an operator's cancel works."""
    async with started(tmp_path / "a", work=30, routes={"cancel": {"by": "agent"}}) as setup:
        agent = await client(setup, binding)
        task = await send(agent, message("hello"))
        await agent.cancel_task(CancelTaskRequest(id=task.id))
        await agent.cancel_task(CancelTaskRequest(id=task.id))
        assert setup.agent.calls[f"POST /tasks/{task.id}:cancel"] == 1
        done = await naive_loop(agent, task.id, DONE)
        assert done.status.state == 5 or "CANCEL" in str(done.status)
    async with started(tmp_path / "b", work=30) as setup:
        agent = await client(setup, binding)
        task = await send(agent, message("hello"))
        with pytest.raises(Exception) as raised:
            await agent.cancel_task(CancelTaskRequest(id=task.id))
        shown = repr(raised.value)
        assert "approval-required" in shown or "TaskNotCancelable" in shown or "403" in shown
        assert setup.agent.calls[f"POST /tasks/{task.id}:cancel"] == 0
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}) as op:
            listed = (await op.get(f"{setup.gateway}/admin/operations")).json()
            operation = listed["operations"][0]["operation_id"]
            answer = await op.post(
                f"{setup.gateway}/admin/operations/{operation}/cancel", json={"reason": "test"}
            )
            assert answer.status_code == 200, answer.text
        assert setup.agent.calls[f"POST /tasks/{task.id}:cancel"] == 1
        done = await naive_loop(agent, task.id, DONE)
        assert "CANCEL" in str(done.status) or done.status.state == 5


@pytest.mark.parametrize("binding", BINDINGS)
async def test_one_send_is_one_line_of_the_story(tmp_path: Path, binding: str) -> None:
    """The audit story of a task (the admin API's, as the console and ``audit story`` tell
    it) has one line for the SendMessage that started it, saying the task's state, and one
    for each follow-up message: no second line for the same send."""
    async with started(tmp_path, work=0.5) as setup:
        agent = await client(setup, binding)
        task = await send(agent, message("ask me"))
        await naive_loop(agent, task.id, {"TASK_STATE_INPUT_REQUIRED"})
        await send(agent, message("Paris", task.id))
        await naive_loop(agent, task.id, DONE)
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}) as op:
            listed = (await op.get(f"{setup.gateway}/admin/operations")).json()
            operation = listed["operations"][0]["operation_id"]
            shown = (await op.get(f"{setup.gateway}/admin/operations/{operation}")).json()
    story = [line.split(" ", 1)[1] for line in shown["story"]]
    sends = [line for line in story if line.startswith(("submitted", "message_sent"))]
    assert len(sends) == 2, story
    assert sends[0].startswith("submitted, state TASK_STATE_SUBMITTED, next poll "), story
    assert sends[1].startswith("message_sent: follow-up, state TASK_STATE_"), story
    events = [line["event"] for line in setup.audit() if line["operation_id"] == operation]
    assert events.count("submitted") == 1 and events.count("message_sent") == 1, events


async def test_a_task_done_at_once_is_one_submitted_and_one_finished_line(tmp_path: Path) -> None:
    """A remote agent that answers SendMessage with a task already COMPLETED: the story has
    the send's one ``submitted`` line and the end's ``finished`` line, nothing else; the
    caller gets the completed task."""
    from aiohttp import web

    async def answer(request: web.Request) -> web.Response:
        sent = await request.json()
        task = {
            "id": "t-done",
            "contextId": "c-1",
            "status": {"state": "TASK_STATE_COMPLETED"},
            "history": [sent["message"]],
        }
        return web.json_response({"task": task})

    remote = web.Application()
    remote.router.add_post("/message:send", answer)
    runner, port = await serve_on_loopback(remote)
    try:
        upstream = f"http://127.0.0.1:{port}"
        async with started(tmp_path, upstream=upstream, a2a={"push": False}) as setup:
            headers = {"Authorization": f"Bearer {AGENT_TOKEN}", "A2A-Version": "1.0"}
            sent = {"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "x"}]}}
            body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": sent}
            async with httpx.AsyncClient(headers=headers, timeout=30) as http:
                answered = (await http.post(f"{setup.gateway}/a2a/demo-agent", json=body)).json()
            assert answered["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
            events = [line["event"] for line in setup.audit()]
        assert events == ["submitted", "finished"], events
    finally:
        await runner.cleanup()


async def test_agent_gone_mid_task_escalates_provider_failure(tmp_path: Path) -> None:
    """When the remote agent stops answering mid-task, the transport failures are counted
    and the task escalates provider_failure, its problem carried in the JSON-RPC error."""
    async with started(tmp_path, work=60, polling={"max_transport_failures": 1}) as setup:
        agent = await client(setup, "JSONRPC")
        task = await send(agent, message("hello"))
        setup.agent.app = _gone  # the agent's process answers nothing but 503 from now on
        seen = ""
        for _ in range(3000):
            try:
                await agent.get_task(GetTaskRequest(id=task.id))
            except Exception as exc:
                seen = repr(exc)
                if "OPERATION_ESCALATED" in seen or "operation-escalated" in seen:
                    break
            await asyncio.sleep(0.02)
        assert "provider_failure" in seen
        escalated = [line for line in setup.audit() if line["event"] == "escalated"]
        assert escalated and escalated[0]["reason"] == "provider_failure"


async def _gone(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 503, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def test_input_required_escalates_to_operators(tmp_path: Path) -> None:
    """Under on_input_required: escalate the task goes to operators with reason
    input_required, and the escalation names the remote agent's question."""
    async with started(tmp_path, a2a={"on_input_required": "escalate"}) as setup:
        agent = await client(setup, "HTTP+JSON")
        task = await send(agent, message("ask me"))
        seen = ""
        for _ in range(400):
            try:
                await agent.get_task(GetTaskRequest(id=task.id))
            except Exception as exc:
                seen = repr(exc)
                break
            await asyncio.sleep(0.02)
        assert "operation-escalated" in seen or "409" in seen
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}) as op:
            listed = (await op.get(f"{setup.gateway}/admin/operations")).json()
            record = listed["operations"][0]
        assert record["outcome"] == "escalated"
        assert record["escalation"]["reason"] == "input_required"
        assert "Which city?" in record["escalation"]["detail"]
        assert "cancel_at_provider" in record["escalation"]["permitted_actions"]


async def test_v03_method_names_answer_in_v03_shape(tmp_path: Path) -> None:
    """A caller speaking 0.3 (message/send, tasks/get) gets 0.3-shaped tasks; an unknown
    task is -32001 with the problem as an ErrorInfo in data."""
    async with started(tmp_path, work=0.2) as setup:
        url = f"{setup.gateway}/a2a/demo-agent"
        headers = {"Authorization": f"Bearer {AGENT_TOKEN}"}
        sent = {
            "message": {
                "kind": "message",
                "messageId": "m-03",
                "role": "user",
                "parts": [{"kind": "text", "text": "hello"}],
            },
            "configuration": {"blocking": False},
        }
        async with httpx.AsyncClient(headers=headers, timeout=30) as http:
            body = {"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": sent}
            task = (await http.post(url, json=body)).json()["result"]
            assert task["kind"] == "task" and task["status"]["state"] in ("submitted", "working")
            for _ in range(500):
                body = {
                    "jsonrpc": "2.0",
                    "id": 2,
                    "method": "tasks/get",
                    "params": {"id": task["id"]},
                }
                got = (await http.post(url, json=body)).json()["result"]
                if got["status"]["state"] == "completed":
                    break
                await asyncio.sleep(0.02)
            assert got["artifacts"][0]["parts"][0]["text"] == "done: hello"
            body = {"jsonrpc": "2.0", "id": 3, "method": "tasks/get", "params": {"id": "nope"}}
            error = (await http.post(url, json=body)).json()["error"]
        assert error["code"] == -32001
        assert error["data"][0]["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
        assert error["data"][0]["reason"] == "UNKNOWN_OPERATION"


async def test_pushes_update_the_record_without_polls(tmp_path: Path) -> None:
    """Where the remote agent's card offers push notifications the gateway registers itself
    (token checked): with no caller polling at all, the agent's pushes end the operation
    (a status-update push makes one poll at once, within the budget), and a GetTask is then
    answered from the record; a push with a wrong token is refused and changes nothing."""
    async with started(tmp_path, work=0.3, push=True) as setup:
        agent = await client(setup, "HTTP+JSON")
        task = await send(agent, message("hello"))
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}) as op:
            forged = await op.post(
                f"{setup.gateway}/a2a/demo-agent/push",
                headers={"X-A2A-Notification-Token": "team-a.0000"},
                json={"task": {"id": task.id, "status": {"state": "TASK_STATE_FAILED"}}},
            )
            assert forged.status_code == 401
            for _ in range(500):
                record = (await op.get(f"{setup.gateway}/admin/operations")).json()["operations"][0]
                if record["outcome"] != "pending":
                    break
                await asyncio.sleep(0.02)
        assert record["outcome"] == "succeeded"
        polls = setup.polls()
        assert polls <= MAX_REQUESTS
        done = await agent.get_task(GetTaskRequest(id=task.id))
        assert done.artifacts[0].parts[0].text == "done: hello"
        assert setup.polls() == polls


async def test_mcp_start_job_and_wait_for_operation(tmp_path: Path) -> None:
    """An MCP-native agent delegates to the A2A agent: start_job submits a SendMessage for
    its account and wait_for_operation waits, within the schedule, until the task completes
    with its artifact."""
    async with started(tmp_path, work=0.5) as setup:
        headers = {
            "Authorization": f"Bearer {AGENT_TOKEN}",
            "Accept": "application/json, text/event-stream",
        }
        async with httpx.AsyncClient(base_url=setup.gateway, headers=headers, timeout=30) as http:
            init = {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "0"},
            }
            answer = await http.post(
                "/mcp", json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init}
            )
            http.headers["Mcp-Session-Id"] = answer.headers["Mcp-Session-Id"]
            http.headers["MCP-Protocol-Version"] = "2025-11-25"
            await http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"})

            async def tool(name: str, **arguments: Any) -> Any:
                params = {"name": name, "arguments": arguments}
                body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
                return (await http.post("/mcp", json=body)).json()["result"]

            sent = {
                "message": {"role": "ROLE_USER", "messageId": "mcp-1", "parts": [{"text": "hi"}]},
                "configuration": {"returnImmediately": True},
            }
            started_job = await tool(
                "start_job", provider="demo-agent", body=sent, idempotency_key="mcp-1"
            )
            assert "structuredContent" in started_job, started_job
            operation = started_job["structuredContent"]["operation_id"]
            for _ in range(100):
                waited = await tool(
                    "wait_for_operation", operation_id=operation, max_wait_seconds=1
                )
                view = waited["structuredContent"]
                if view["outcome"] != "pending":
                    break
        assert view["outcome"] == "succeeded", view
        assert "done: hi" in json.dumps(view)
        assert 1 <= setup.polls() <= MAX_REQUESTS


async def test_a_callers_own_push_target_never_reaches_the_agent(tmp_path: Path) -> None:
    """A SendMessage naming the caller's own push target has it stripped before the agent
    sees it (the agent would push there under the gateway's credential, around pacing):
    with the policy's pushes off and an agent that pushes, the caller's URL gets nothing."""
    from aiohttp import web

    received: list[bytes] = []

    async def catch(request: web.Request) -> web.Response:
        received.append(await request.read())
        return web.Response()

    receiver = web.Application()
    receiver.router.add_post("/{tail:.*}", catch)
    runner, port = await serve_on_loopback(receiver)
    try:
        async with started(tmp_path, work=0.3, push=True, a2a={"push": False}) as setup:
            headers = {"Authorization": f"Bearer {AGENT_TOKEN}", "A2A-Version": "1.0"}
            target = {"url": f"http://127.0.0.1:{port}/mine", "token": "caller-token"}
            sent = {
                "message": {"messageId": "m-own", "role": "ROLE_USER", "parts": [{"text": "hi"}]},
                "configuration": {"returnImmediately": True, "taskPushNotificationConfig": target},
            }
            body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": sent}
            async with httpx.AsyncClient(headers=headers, timeout=30) as http:
                answer = (await http.post(f"{setup.gateway}/a2a/demo-agent", json=body)).json()
            task = answer["result"]["task"]
            agent = await client(setup, "JSONRPC")
            await naive_loop(agent, task["id"], DONE)
            await asyncio.sleep(1.0)  # an agent's push at completion would have landed
        assert received == []
    finally:
        await runner.cleanup()


async def test_a_03_call_without_a2a_sdk_is_a_clear_error_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an install without the a2a extra a 0.3 call (its answer needs a2a-sdk's
    conversions) is a JSON-RPC error naming the extra, before anything is forwarded."""
    async with started(tmp_path) as setup:
        monkeypatch.setitem(sys.modules, "a2a.compat.v0_3", None)  # as if not installed
        headers = {"Authorization": f"Bearer {AGENT_TOKEN}"}
        body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "t-1"}}
        async with httpx.AsyncClient(headers=headers, timeout=30) as http:
            answer = await http.post(f"{setup.gateway}/a2a/demo-agent", json=body)
        assert answer.status_code == 200
        error = answer.json()["error"]
        assert error["code"] == -32602 and "statusgate[a2a]" in error["message"]
        assert setup.polls() == 0
