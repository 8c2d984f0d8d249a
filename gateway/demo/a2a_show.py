"""``statusgate demo --provider NAME`` for a ``protocol: a2a`` policy: the demo A2A agent
(gateway/demo/a2a_agent.py, a2a-sdk's server under uvicorn) on a free loopback port, the
gateway in front of it on the show's simulated clock, and a few naive callers that send one
message and then call ``GetTask`` (JSON-RPC, A2A 1.0) in a loop until the task ends.

The agent works in real time (a few seconds); the callers' clock moves on by their calling
interval at every call, so the show prints what a long task looks like in a second or two.
Needs the ``a2a`` extra (a2a-sdk and uvicorn).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from gateway import ConfigError
from gateway.core.story import story
from gateway.demo.sites import ShowClock, gateway_app, start
from gateway.observe.audit import records
from gateway.settings.policy import ProviderPolicy

WORK_SECONDS = 2.0  # real seconds the demo agent works on the task
REAL_PAUSE = 0.05  # real seconds between two callers' calls (the agent's time moves on)
TERMINAL = {"TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED"}
TERMINAL |= {"TASK_STATE_REJECTED"}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.asynccontextmanager
async def _agent(port: int) -> AsyncIterator[Any]:
    try:
        import uvicorn

        from gateway.demo import a2a_agent
    except ImportError as exc:
        extra = "pip install 'statusgate[a2a]'"
        problem = f"demo of an A2A policy: {exc.name} is not installed ({extra})"
        raise ConfigError([problem]) from None
    agent = a2a_agent.app(f"http://127.0.0.1:{port}", work_seconds=WORK_SECONDS)
    config = uvicorn.Config(agent, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if serving.done():
                raise ConfigError([f"demo A2A agent: could not listen on 127.0.0.1:{port}"])
            await asyncio.sleep(0.02)
        yield agent
    finally:
        server.should_exit = True
        await serving


def _call(method: str, params: dict[str, Any], number: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": number, "method": method, "params": params}


async def show(
    name: str, policy: ProviderPolicy, clock: ShowClock, token: str, agents: int, every: float
) -> list[str]:
    """Runs the show and returns its lines (as ``showcase.show`` does for HTTP APIs)."""
    port = _free_port()
    policy = policy.model_copy(update={"upstream": f"http://127.0.0.1:{port}"})
    with tempfile.TemporaryDirectory() as folder:
        app = gateway_app(policy, clock, token, Path(folder))
        async with _agent(port) as agent:
            runner, gateway_port = await start(app)
            try:
                url = f"http://127.0.0.1:{gateway_port}/a2a/{policy.provider}"
                started = clock.now
                seen, state, task_id, operation = await _callers(url, token, clock, agents, every)
            finally:
                await runner.cleanup()
        audit = list(records(Path(folder) / "audit.jsonl"))
    reached = Counter(agent.calls)
    minutes = (clock.now - started) / 60
    lines = [
        f"Statusgate demo of {name} (A2A GetTask at /a2a/{policy.provider}): {agents} callers"
        f" each call every {every:g} s until the task ends;",
        f"the remote agent works for {WORK_SECONDS:g} real seconds ({minutes:.1f} minutes of"
        " the callers' time shown).",
        "",
        f"Callers' GetTask calls: {sum(seen.values())}, "
        + ", ".join(f"{kind}: {count}" for kind, count in sorted(seen.items())),
        f"Calls that reached the remote agent: {sum(reached.values())} ("
        + ", ".join(f"{k}: {v}" for k, v in sorted(reached.items()))
        + ")",
        f"Task {task_id}: {state}",
        "",
        f"Audit story of {operation}:",
    ]
    return lines + ["  " + line for line in story(audit, operation)[-14:]]


async def _callers(
    url: str, token: str, clock: ShowClock, agents: int, every: float
) -> tuple[Counter[str], str, str, str]:
    headers = {"Authorization": f"Bearer {token}", "A2A-Version": "1.0"}
    message = {
        "messageId": "demo-show-1",
        "role": "ROLE_USER",
        "parts": [{"text": "summarise report.pdf"}],
    }
    params = {"message": message, "configuration": {"returnImmediately": True}}
    seen: Counter[str] = Counter()
    async with aiohttp.ClientSession(headers=headers) as http:
        async with http.post(url, json=_call("SendMessage", params, 1)) as answer:
            sent = await answer.json()
            operation = answer.headers.get("Statusgate-Operation", "")
        task = sent.get("result", {}).get("task")
        if not isinstance(task, dict):
            return seen, f"not started: {sent.get('error') or sent}", "", operation
        task_id, state = str(task.get("id")), str(task.get("status", {}).get("state"))
        for number in range(2, 2000):
            if state in TERMINAL:
                break
            await asyncio.sleep(REAL_PAUSE)
            clock.now += every / agents
            async with http.post(url, json=_call("GetTask", {"id": task_id}, number)) as got:
                answer_body = await got.json()
                operation = got.headers.get("Statusgate-Operation", operation)
            if "error" in answer_body:
                seen[f"error {answer_body['error'].get('code')}"] += 1
                continue
            seen["task" if got.headers.get("Age") is None else "task replayed"] += 1
            state = str(answer_body["result"].get("status", {}).get("state"))
    return seen, state, task_id, operation
