"""A demo A2A agent built with a2a-sdk's server (both bindings, A2A 1.0 and 0.3): a task
works for ``work_seconds`` then completes with an artifact; a message that starts with
"ask" first stops at INPUT_REQUIRED until the caller replies. It counts the requests it
serves by path and keeps their headers, so tests can count the polls that reached it.
A shipped fake, not runtime code (needs ``a2a-sdk[http-server]`` and uvicorn)."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Part,
    Task,
    TaskState,
    TaskStatus,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send


class DemoExecutor(AgentExecutor):
    """Works, asks when told to, completes with an artifact; cancels at once."""

    def __init__(self, work_seconds: float) -> None:
        self.work_seconds = work_seconds

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None and context.context_id is not None
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        text = context.get_user_input()
        first = context.current_task is None
        if first:
            task = Task(
                id=context.task_id,
                context_id=context.context_id,
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                history=[context.message] if context.message is not None else [],
            )
            await event_queue.enqueue_event(task)
        await updater.start_work()
        if text.startswith("ask") and first:
            question = updater.new_agent_message([Part(text="Which city?")])
            await updater.requires_input(question)
            return
        await asyncio.sleep(self.work_seconds)
        await updater.add_artifact([Part(text=f"done: {text}")], name="answer")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None and context.context_id is not None
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


class Counting:
    """ASGI middleware: counts requests by method and path, keeps their headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.calls: Counter[str] = Counter()
        self.headers: list[dict[str, str]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            request = Request(scope)
            self.calls[f"{request.method} {request.url.path}"] += 1
            self.headers.append(dict(request.headers))
        await self.app(scope, receive, send)


def card(url: str, *, push: bool = False) -> AgentCard:
    return AgentCard(
        name="Statusgate demo agent",
        description="Works for a while, then answers; asks first when told to.",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0"),
            AgentInterface(url=url, protocol_binding="HTTP+JSON", protocol_version="1.0"),
        ],
        capabilities=AgentCapabilities(streaming=False, push_notifications=push),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="work", name="work", description="works", tags=["demo"])],
    )


def app(url: str, work_seconds: float = 3.0, **handler: Any) -> Counting:
    """The agent as an ASGI app at ``url`` (JSON-RPC at /, HTTP+JSON beside it)."""
    the_card = card(url, push="push_sender" in handler)
    requests = DefaultRequestHandler(
        DemoExecutor(work_seconds), InMemoryTaskStore(), the_card, **handler
    )
    routes = [
        *create_agent_card_routes(the_card),
        *create_jsonrpc_routes(requests, rpc_url="/", enable_v0_3_compat=True),
        *create_rest_routes(requests),
    ]
    return Counting(Starlette(routes=routes))
