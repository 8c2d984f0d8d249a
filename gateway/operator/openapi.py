"""``GET /openapi.json``: an OpenAPI 3.1 document of the gateway's own surface (SPEC 15).

The operator API, health, readiness, metrics, the problem types and the headers agents see on
``/p/{provider}/...``, with the security schemes. Written from the models the handlers use:
the outcome, reason and delay-source enums, the operation record's fields, the problem
table. Pure apart from ``serve``; the document never names a host, a path on disk or a
secret, so it is served open.
"""

from __future__ import annotations

import functools
from typing import Any

from aiohttp import web

from gateway import __version__
from gateway.core.models import (
    Outcome,
)
from gateway.core.problems import PROBLEMS
from gateway.core.roles import NEEDS
from gateway.operator.schemas import (
    ACTIONS,
    INSTANT,
    STRING,
    STRINGS,
    answer_schemas,
    key_schemas,
    model_schemas,
    obj,
    ref,
)

# -- headers ----------------------------------------------------------------------------------


def _header(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": description, "schema": schema or {"type": "string"}}


def headers() -> dict[str, Any]:
    outcomes = {"type": "string", "enum": [o.value for o in Outcome]}
    seconds = {"type": "string", "pattern": "^[0-9]+$"}
    return {
        "Statusgate-Operation": _header("The operation's id."),
        "Statusgate-Outcome": _header("Where the operation stands.", outcomes),
        "Statusgate-Provider-State": _header("The provider's last raw state, when known."),
        "Statusgate-Requests-Remaining": _header("Status requests left.", seconds),
        "Statusgate-Deadline": _header("The operation's deadline (RFC 3339 UTC).", INSTANT),
        "Statusgate-Next-Poll-At": _header("While pending: the next permitted poll.", INSTANT),
        "Retry-After": _header("Seconds until the next permitted request.", seconds),
        "Retry-After-Ms": _header("The same in milliseconds, exact.", seconds),
        "X-Should-Retry": _header(
            "Whether retrying the same request can change the answer.",
            {"type": "string", "enum": ["true", "false"]},
        ),
        "X-Request-Id": _header("The request's id (kept from the caller when well-formed)."),
        "WWW-Authenticate": _header("The scheme to authenticate with."),
        "Preference-Applied": _header("The Prefer: wait honoured (capped at max_hold)."),
    }


def _refs(*names: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Response headers: the components' header objects, marked required where the gateway
    always sends them (a Reference Object cannot carry ``required`` in OpenAPI 3.1)."""
    described = headers()
    return {
        name: {**described[name], "required": True} if name in required else described[name]
        for name in names
    }


# -- responses and paths ----------------------------------------------------------------------


def _problem_response(description: str, *extra: str) -> dict[str, Any]:
    names = ("X-Request-Id", "X-Should-Retry", *extra)
    return {
        "description": description,
        "headers": _refs(*names, required=("X-Request-Id", "X-Should-Retry", *extra)),
        "content": {"application/problem+json": {"schema": ref("Problem")}},
    }


def responses() -> dict[str, Any]:
    return {
        "Invalid": _problem_response("invalid-request: malformed input."),
        "Unauthenticated": _problem_response(
            "unauthenticated: no token, or one the gateway does not know.", "WWW-Authenticate"
        ),
        "Forbidden": _problem_response(
            "forbidden: an agent token on the operator API; forbidden-role: the operator's "
            "role is below the one this needs (members required_role and role)."
        ),
        "NotFound": _problem_response("unknown-operation, unknown-key, or route-not-allowed."),
        "Conflict": _problem_response("action-not-permitted: refused by the escalation's rules."),
        "ConfigRejected": _problem_response("config-rejected: nothing changed; see problems."),
        "StoreUnavailable": _problem_response(
            "store-unavailable: the gateway fails closed.", "Retry-After", "Retry-After-Ms"
        ),
        "TooLarge": _problem_response("request-too-large: body over limits.max_request_body."),
    }


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "description": description,
        "headers": _refs("X-Request-Id", required=("X-Request-Id",)),
        "content": {"application/json": {"schema": schema}},
    }


def _answers(ok: dict[str, Any], *errors: tuple[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {"200": ok}
    for status, name in (("401", "Unauthenticated"), ("403", "Forbidden"), *errors):
        out[status] = {"$ref": f"#/components/responses/{name}"}
    out["503"] = {"$ref": "#/components/responses/StoreUnavailable"}
    return out


OPERATOR: list[dict[str, list[str]]] = [{"operatorBearer": []}]


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": description,
    }


def _operator(
    summary: str, need: str, answers: dict[str, Any], *params: dict[str, Any]
) -> dict[str, Any]:
    role = NEEDS[need]
    operation = {
        "tags": ["operator"],
        "summary": summary,
        "description": f"Needs the role {role} or above (else 403 forbidden-role).",
        "x-required-role": role,
        "security": OPERATOR,
    }
    return {**operation, "parameters": list(params), "responses": answers}


LIMIT = {"type": "integer", "minimum": 1, "maximum": 500, "default": 100}
OPERATION_ID = {"name": "operation_id", "in": "path", "required": True, "schema": STRING}


def operator_paths() -> dict[str, Any]:
    return {
        "/admin/me": {"get": _me()},
        "/admin/operations": {"get": _list()},
        "/admin/escalations": {"get": _escalations()},
        "/admin/operations/{operation_id}": {"get": _show()},
        "/admin/operations/{operation_id}/{action}": {"post": _act()},
        "/admin/reload": {"post": _reload()},
        **_key_paths(),
    }


def _me() -> dict[str, Any]:
    found = _json(ref("Caller"), "The caller, their role and what it may do.")
    return _operator("Who the token names and what their role may do", "read", _answers(found))


def _list() -> dict[str, Any]:
    page = _json(ref("OperationList"), "A page of operations.")
    return _operator(
        "List operations, newest first, a page at a time",
        "read",
        _answers(page, ("400", "Invalid")),
        _query("outcome", ref("Outcome"), "Only operations with this outcome."),
        _query("provider", STRING, "Only this provider's."),
        _query("account", STRING, "Only this account's."),
        _query("limit", LIMIT, "Page size."),
        _query("cursor", STRING, "next_cursor of the previous page (opaque)."),
    )


def _escalations() -> dict[str, Any]:
    queue = _json(ref("EscalationQueue"), "Escalated operations waiting on a person.")
    return _operator(
        "The escalation queue, oldest first",
        "read",
        _answers(queue, ("400", "Invalid")),
        _query("limit", LIMIT, "At most this many."),
    )


def _show() -> dict[str, Any]:
    shown = _json(ref("OperationDetail"), "The operation.")
    return _operator(
        "One operation: record, escalation, message and audit story",
        "read",
        _answers(shown, ("404", "NotFound")),
        OPERATION_ID,
    )


def _act() -> dict[str, Any]:
    done = _json(ref("ActionResult"), "Done: the record as it now is.")
    action = {"name": "action", "in": "path", "required": True, "schema": {"enum": ACTIONS}}
    body = {"required": False, "content": {"application/json": {"schema": ref("ActionRequest")}}}
    errors = (("400", "Invalid"), ("404", "NotFound"), ("409", "Conflict"), ("413", "TooLarge"))
    return {
        **_operator(
            "Decide an escalation: extend, cancel at the provider, abandon, resume",
            "decide",
            _answers(done, *errors),
            OPERATION_ID,
            action,
        ),
        "requestBody": body,
    }


def _reload() -> dict[str, Any]:
    done = _json(ref("ReloadResult"), "The new set is in force.")
    return _operator(
        "Re-read the config and every policy (as SIGHUP does)",
        "reload",
        _answers(done, ("422", "ConfigRejected")),
    )


KEY_ID = {"name": "key_id", "in": "path", "required": True, "schema": STRING}


def _key_paths() -> dict[str, Any]:
    made = _json(ref("NewAgentKey"), "The key, with its token shown this once.")
    gone = {"description": "Revoked.", "headers": _refs("X-Request-Id")}
    body = {"required": True, "content": {"application/json": {"schema": ref("KeyRequest")}}}
    create = _answers(made, ("400", "Invalid"), ("413", "TooLarge"))
    create["201"] = create.pop("200")
    rotated = _answers(made, ("404", "NotFound"))
    rotated["201"] = rotated.pop("200")
    revoked = _answers(gone, ("404", "NotFound"))
    revoked["204"] = revoked.pop("200")
    listed = _json(ref("KeyList"), "Every key, without tokens.")
    return {
        "/admin/keys": {
            "get": _operator("List agent keys (never their tokens)", "keys", _answers(listed)),
            "post": {
                **_operator("Make an agent key; its token is shown once", "keys", create),
                "requestBody": body,
            },
        },
        "/admin/keys/{key_id}": {
            "delete": _operator(
                "Revoke a key: refused everywhere within 1 s", "keys", revoked, KEY_ID
            )
        },
        "/admin/keys/{key_id}/rotate": {
            "post": _operator(
                "A new key like this one (new token); this one revoked", "keys", rotated, KEY_ID
            )
        },
    }


def _plain(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "headers": _refs("X-Request-Id", required=("X-Request-Id",)),
        "content": {"text/plain": {"schema": STRING}},
    }


def _open(summary: str, answers: dict[str, Any]) -> dict[str, Any]:
    return {"tags": ["open"], "summary": summary, "security": [], "responses": answers}


def open_paths() -> dict[str, Any]:
    alive = obj({"status": STRING}, ["status"])
    ready = obj(
        {"status": {"enum": ["ready", "not ready"]}, "policies": STRINGS, "store": STRING},
        ["status"],
    )
    readiness = {"200": _json(ready, "Ready."), "503": _json(ready, "Not ready.")}
    return {
        "/healthz": {"get": _open("The process is alive", {"200": _json(alive, "Alive.")})},
        "/readyz": {"get": _open("The store is reachable, policies are loaded", readiness)},
        "/metrics": {"get": _open("Prometheus metrics (text format)", {"200": _plain("Metrics.")})},
        "/problems/{slug}": {"get": _explain()},
        "/openapi.json": {
            "get": _open("This document", {"200": _json({"type": "object"}, "OpenAPI 3.1.")})
        },
    }


def _explain() -> dict[str, Any]:
    slug = {
        "name": "slug",
        "in": "path",
        "required": True,
        "schema": STRING,
        "description": "One of: " + ", ".join(sorted(PROBLEMS)),
    }
    answers = {"200": _plain("The explanation."), "400": {"$ref": "#/components/responses/Invalid"}}
    return {**_open("A short explanation of a problem type", answers), "parameters": [slug]}


AGENT_SECURITY: list[dict[str, list[str]]] = [{"agentBearer": []}, {"agentToken": []}]
OPERATION_HEADERS = (
    "Statusgate-Operation",
    "Statusgate-Outcome",
    "Statusgate-Provider-State",
    "Statusgate-Requests-Remaining",
    "Statusgate-Deadline",
    "Statusgate-Next-Poll-At",
    "Retry-After",
    "Retry-After-Ms",
    "X-Should-Retry",
    "X-Request-Id",
    "Preference-Applied",
)


def agent_paths() -> dict[str, Any]:
    return {
        "/p/{provider}/{path}": {"get": _provider_route()},
        "/mcp": {"post": _mcp()},
        **_a2a_paths(),
    }


def _a2a_paths() -> dict[str, Any]:
    """SPEC 24: an A2A agent behind the gateway (docs/a2a.md)."""
    provider = {"name": "provider", "in": "path", "required": True, "schema": STRING}
    task = {"name": "task", "in": "path", "required": True, "schema": STRING}
    problem = {"application/problem+json": {"schema": ref("Problem")}}
    a2a_json = {"application/json": {"schema": {"type": "object"}}}

    def route(summary: str, *params: dict[str, Any], secured: bool = True) -> dict[str, Any]:
        return {
            "tags": ["agent"],
            "summary": summary,
            **({"security": AGENT_SECURITY} if secured else {}),
            "parameters": [provider, *params],
            "responses": {
                "200": {
                    "description": "A2A 1.0 JSON (a Task, a SendMessageResponse, a card).",
                    "content": a2a_json,
                },
                "default": {"description": "A problem.", "content": problem},
            },
        }

    return {
        "/a2a/{provider}/.well-known/agent-card.json": {
            "get": route("The remote agent's card, interfaces at the gateway", secured=False)
        },
        "/a2a/{provider}": {
            "post": route(
                "A2A JSON-RPC: SendMessage, GetTask, CancelTask (and the 0.3 names); "
                "errors carry a google.rpc.ErrorInfo and the problem in data"
            )
        },
        "/a2a/{provider}/message:send": {"post": route("A2A HTTP+JSON SendMessage")},
        "/a2a/{provider}/tasks/{task}": {
            "get": route("A2A HTTP+JSON GetTask (paced; ``{task}:cancel`` by POST cancels)", task)
        },
    }


def _provider_route() -> dict[str, Any]:
    described = _refs(*OPERATION_HEADERS)
    problem = {"application/problem+json": {"schema": ref("Problem")}}
    parameters = [
        {"name": "provider", "in": "path", "required": True, "schema": STRING},
        {"name": "path", "in": "path", "required": True, "schema": STRING},
        {"name": "Prefer", "in": "header", "schema": {**STRING, "examples": ["wait=30"]}},
    ]
    return {
        "tags": ["agent"],
        "summary": "A declared provider route through the gateway; the rest of the path is "
        "the provider's own (a status call is shown; every operation answer has these headers)",
        "security": AGENT_SECURITY,
        "parameters": parameters,
        "responses": {
            "200": {"description": "The provider's answer.", "headers": described},
            "default": {"description": "A problem.", "headers": described, "content": problem},
        },
    }


def _mcp() -> dict[str, Any]:
    message = {"type": ["object", "array"], "description": "JSON-RPC 2.0 (see docs/mcp.md)"}
    routing = [
        ("MCP-Protocol-Version", "2026-07-28 for the stateless revision; else a session's."),
        ("Mcp-Method", "2026-07-28: the JSON-RPC method, checked before the body is read."),
        ("Mcp-Name", "2026-07-28: the tool name (tools/call) or task id (tasks/*)."),
        ("Mcp-Session-Id", "The handshake era's session, issued by initialize."),
    ]
    return {
        "tags": ["agent"],
        "summary": "Model Context Protocol over Streamable HTTP (2026-07-28 and handshake era)",
        "security": AGENT_SECURITY,
        "parameters": [
            {"name": name, "in": "header", "required": False, "schema": {"type": "string"}}
            | {"description": text}
            for name, text in routing
        ],
        "requestBody": {"required": True, "content": {"application/json": {"schema": message}}},
        "responses": {
            "200": {"description": "The JSON-RPC answer (application/json or SSE)."},
            "202": {"description": "Notifications or responses accepted."},
            "400": {"description": "A JSON-RPC error: malformed, header mismatch, no session."},
            "404": {"description": "2026-07-28: method not found; else an unknown session."},
        },
    }


@functools.cache
def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Statusgate",
            "version": __version__,
            "summary": "A policy gateway between AI agents and asynchronous provider jobs.",
        },
        "tags": [
            {"name": "operator", "description": "The operator API (operator token)."},
            {"name": "open", "description": "Health, readiness, metrics, problem types."},
            {"name": "agent", "description": "What agents call (agent token)."},
        ],
        "paths": {**operator_paths(), **open_paths(), **agent_paths()},
        "components": {
            "schemas": {**model_schemas(), **answer_schemas(), **key_schemas()},
            "headers": headers(),
            "responses": responses(),
            "securitySchemes": {
                "operatorBearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An operator's static token, or a JWT of the issuer "
                    "configured under oidc (aud: its client_id).",
                },
                "agentBearer": {"type": "http", "scheme": "bearer", "description": "Agent token."},
                "agentToken": {"type": "apiKey", "in": "header", "name": "Statusgate-Token"},
            },
        },
    }


async def serve(request: web.Request) -> web.Response:
    """GET /openapi.json, open."""
    return web.json_response(document())
