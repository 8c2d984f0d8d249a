"""Streamable HTTP for MCP on aiohttp: ``POST /mcp`` carries JSON-RPC in and JSON or SSE out,
``GET /mcp`` is 405 (no server-initiated stream is offered), ``DELETE /mcp`` ends a session.

Serves both eras on the one endpoint, told apart by ``MCP-Protocol-Version`` before anything
is read: the stateless revision (2026-07-28, checked in stateless.py: no session, the
routing headers before the body) and the handshake era (``initialize``, sessions).

Owns the transport's rules: the Origin check (403), the agent's token as on ``/p/`` routes
(401), the body read within ``limits.max_request_body`` and ``limits.body_timeout`` (413 and
408 as elsewhere), session ids (400 missing, 404 unknown or ended), ``MCP-Protocol-Version``
(400 when not the session's), ``Accept`` (JSON, or SSE for a client that takes only SSE; 406
for neither), 202 for notifications and responses, and batches only in a revision that has
them, bounded in messages (jsonrpc.MAX_BATCH) and in the size of their answers
(``limits.max_response_body``). Never answers 500 for any input, never echoes a token or a
header it was sent.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from gateway.flow.polls import gone
from gateway.flow.runtime import ROUTE, RUNTIME, Runtime
from gateway.http import auth
from gateway.http.bodies import read_limited
from gateway.http.mcp import methods, stateless
from gateway.http.mcp.caller import Caller
from gateway.http.mcp.jsonrpc import (
    HEADER_MISMATCH,
    INVALID_PARAMS,
    INVALID_REQUEST,
    TOO_LARGE,
    Message,
    Parsed,
    error,
    parse,
    result,
    status_of,
)
from gateway.http.mcp.sessions import BATCHING, MODERN, Ended, Session, read
from gateway.http.problems import problem
from gateway.observe.context import current_request_id, note_account
from gateway.settings.config import Account

SESSION = "Mcp-Session-Id"
VERSION = "MCP-Protocol-Version"
ENDED = web.AppKey("mcp_ended_sessions", Ended)
Payload = dict[str, Any] | list[dict[str, Any]]


def routes(app: web.Application) -> None:
    app[ENDED] = Ended()
    app.router.add_route("*", "/mcp", handle)


async def handle(request: web.Request) -> web.StreamResponse:
    request[ROUTE] = "mcp"  # the request-duration metric's route label
    if request.method not in ("POST", "DELETE"):
        answer = _rpc(405, INVALID_REQUEST, "Method Not Allowed: this server offers no SSE stream.")
        answer.headers["Allow"] = "POST, DELETE"
        return answer
    runtime = request.app[RUNTIME]
    if not _origin_allowed(runtime, request.headers.get("Origin")):
        return _rpc(403, INVALID_REQUEST, "Forbidden: the Origin is not this gateway's.")
    account, token = (
        await auth.agent_of(runtime, request.headers),
        auth.agent_token(request.headers),
    )
    if account is None or token is None:
        return problem("unauthenticated", "Send 'Authorization: Bearer <agent token>'.")
    note_account(account.id)
    modern = stateless.wanted(request.headers)
    if request.method == "DELETE":
        if modern:  # 2026-07-28 has no session to end
            return web.Response(status=405, headers={"Allow": "POST"})
        return _end(request, token)
    if modern:
        return await _stateless(request, runtime, account)
    return await _post(request, runtime, account, token)


def _origin_allowed(runtime: Runtime, origin: str | None) -> bool:
    """No Origin (not a browser), or the origin of ``public_base_url``. The Host header is
    not trusted for this: DNS rebinding makes it whatever the attacker's page says."""
    if origin is None:
        return True
    base = urlsplit(runtime.settings.file.public_base_url)
    return origin.strip().rstrip("/").lower() == f"{base.scheme}://{base.netloc}".lower()


def _rpc(status: int, code: int, message: str) -> web.Response:
    return web.json_response(error(None, code, message), status=status)


def _end(request: web.Request, token: str) -> web.StreamResponse:
    session = _session(request, token, check_version=False)
    if isinstance(session, web.Response):
        return session
    request.app[ENDED].add(session.id)
    return web.Response(status=204)


def _session(
    request: web.Request, token: str, *, check_version: bool = True
) -> Session | web.Response:
    header = request.headers.get(SESSION)
    if header is None:
        return _rpc(400, INVALID_REQUEST, f"Bad Request: send initialize first, then {SESSION}.")
    session = read(header, token)
    if session is None or session.id in request.app[ENDED]:
        return _rpc(404, INVALID_REQUEST, "Session not found: send initialize again.")
    version = request.headers.get(VERSION)
    if check_version and version is not None and version.strip() != session.version:
        return _rpc(400, INVALID_REQUEST, f"Bad Request: {VERSION} is not this session's.")
    return session


async def _post(
    request: web.Request, runtime: Runtime, account: Account, token: str
) -> web.StreamResponse:
    limits = runtime.settings.file.limits
    body = await read_limited(request, limits.max_request_body, limits.body_timeout)
    sse = _wants_sse(request.headers.getall("Accept", []))
    if sse is None:
        detail = "Not Acceptable: accept application/json or text/event-stream."
        return _rpc(406, INVALID_REQUEST, detail)
    parsed = parse(body)
    if isinstance(parsed, dict):
        return web.json_response(parsed, status=400)
    first = parsed.messages[0]
    if not parsed.batch and isinstance(first, Message) and first.method == "initialize":
        return await _initialize(request, first, token, sse)
    session = _session(request, token)
    if isinstance(session, web.Response):
        return session
    if parsed.batch and session.version not in BATCHING:
        detail = f"Invalid Request: revision {session.version} has no JSON-RPC batches."
        return web.json_response(error(None, INVALID_REQUEST, detail), status=400)
    if not parsed.batch and isinstance(first, Message):
        named = _name_disagrees(request, first)
        if named is not None:
            return web.json_response(named, status=400)
    if not any(_answered(m) for m in parsed.messages):
        return web.Response(status=202)
    caller = Caller(
        runtime, account, session.version, session.extension, lambda: gone(request), request
    )
    budget = limits.max_response_body
    return await _reply(request, sse, lambda: _answers(caller, parsed, budget))


def _name_disagrees(request: web.Request, message: Message) -> dict[str, Any] | None:
    """In the handshake era the routing headers are optional; an Mcp-Name that is sent and
    disagrees with the body is refused as in 2026-07-28 (400)."""
    sent = request.headers.get(stateless.NAME)
    key = stateless.NAMED.get(message.method or "")
    if sent is None or key is None or not isinstance(message.params, dict):
        return None
    if stateless.decode(sent) == message.params.get(key):
        return None
    detail = f"Header mismatch: the Mcp-Name header does not match the body's {key!r}."
    return error(message.id, HEADER_MISMATCH, detail)


async def _stateless(
    request: web.Request, runtime: Runtime, account: Account
) -> web.StreamResponse:
    """One POST of the stateless revision: headers, then the body, then the method."""
    early = stateless.before_body(request.headers.items(), request.headers, methods.SERVED_MODERN)
    if early is not None:
        return web.json_response(early, status=status_of(early))
    limits = runtime.settings.file.limits
    body = await read_limited(request, limits.max_request_body, limits.body_timeout)
    sse = _wants_sse(request.headers.getall("Accept", []))
    if sse is None:
        detail = "Not Acceptable: accept application/json or text/event-stream."
        return _rpc(406, INVALID_REQUEST, detail)
    parsed = parse(body)
    if isinstance(parsed, dict):
        return web.json_response(parsed, status=status_of(parsed))
    message = parsed.messages[0]
    if parsed.batch or isinstance(message, dict):
        refused = message if isinstance(message, dict) else stateless.not_one_message()
        return web.json_response(refused, status=400)
    if not message.request:
        if message.method is None:  # clients send no responses in this revision
            return web.json_response(stateless.not_one_message(message.id), status=400)
        return web.Response(status=202)  # a notification: accepted, nothing to act on
    mismatch = stateless.against_body(request.headers, message)
    if mismatch is not None:
        return web.json_response(mismatch, status=status_of(mismatch))
    meta = message.params["_meta"]
    declared = methods.declares_extension(meta.get(stateless.CLIENT_CAPABILITIES))
    caller = Caller(runtime, account, MODERN[0], declared, lambda: gone(request), request)
    if sse:  # a client that takes only SSE: the stream opens at once, as in the other era
        return await _reply(request, True, lambda: methods.answer(caller, message))
    answer = await methods.answer(caller, message)
    assert answer is not None  # a request always has one
    return web.json_response(answer, status=status_of(answer))


def _wants_sse(accept: list[str]) -> bool | None:
    """False for JSON (also when Accept is absent or a wildcard), True for a client that
    takes only SSE, None for one that takes neither."""
    kinds = {part.split(";")[0].strip().lower() for value in accept for part in value.split(",")}
    if not accept or kinds & {"application/json", "application/*", "*/*"}:
        return False
    if kinds & {"text/event-stream", "text/*"}:
        return True
    return None


def _answered(message: Message | dict[str, Any]) -> bool:
    """Whether a message gets an answer: requests and invalid messages do."""
    return isinstance(message, dict) or message.request


async def _answers(caller: Caller, parsed: Parsed, budget: int) -> Payload | None:
    """The answers to a POST's messages. A batch's answers (at most MAX_BATCH of them) are
    kept while their total size stays within ``budget`` (``limits.max_response_body``);
    each past it is replaced by a short error saying so, so one batch can never make an
    answer larger than the limit and a little more."""

    async def one(message: Message | dict[str, Any]) -> dict[str, Any] | None:
        if isinstance(message, dict):
            return message
        return await methods.answer(caller, message)

    found = await asyncio.gather(*(one(m) for m in parsed.messages))
    answers = [a for a in found if a is not None]
    if not answers:
        return None
    if not parsed.batch:
        return answers[0]
    kept, used = [], 0
    for answer in answers:
        size = len(json.dumps(answer))
        if used + size > budget:
            detail = (
                "The answers of this batch exceed limits.max_response_body "
                f"({budget} bytes): send this request on its own."
            )
            answer = error(answer.get("id"), TOO_LARGE, detail, {"limit_bytes": budget})
            size = len(json.dumps(answer))
        used += size
        kept.append(answer)
    return kept


async def _initialize(
    request: web.Request, message: Message, token: str, sse: bool
) -> web.StreamResponse:
    if not message.request or not isinstance(message.params, dict):
        detail = "Invalid params: initialize is a request with an object of params."
        return web.json_response(error(message.id, INVALID_PARAMS, detail), status=400)
    session, value = methods.initialize(message.params, token)

    async def answer() -> Payload:
        return result(message.id, value)

    return await _reply(request, sse, answer, {SESSION: session.id})


async def _reply(
    request: web.Request,
    sse: bool,
    compute: Callable[[], Awaitable[Payload | None]],
    headers: dict[str, str] | None = None,
) -> web.StreamResponse:
    """JSON, or an SSE stream opened at once (so a long hold keeps the connection alive)
    carrying one ``message`` event per answer."""
    if not sse:
        payload = await compute()
        if payload is None:
            return web.Response(status=202, headers=headers)
        return web.json_response(payload, headers=headers)
    stream = web.StreamResponse(headers=headers)
    stream.content_type = "text/event-stream"
    stream.headers["Cache-Control"] = "no-cache"
    stream.headers["X-Request-Id"] = current_request_id() or ""
    await stream.prepare(request)
    payload = await compute()
    events = payload if isinstance(payload, list) else [payload] if payload else []
    try:
        for event in events:
            await stream.write(b"event: message\ndata: " + json.dumps(event).encode() + b"\n\n")
        await stream.write_eof()
    except ConnectionError:
        pass  # the client went away; nothing is left to tell it
    return stream
