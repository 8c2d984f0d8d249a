"""Agent keys through the operator API (SPEC 25, "Keys through the API"):

- ``POST /admin/keys {account, providers, expires_at?, quotas?}``: 201 ``{id, token,
  account, providers, expires_at, quotas, ...}``; the token is in this answer only (the
  store keeps its sha256).
- ``GET /admin/keys``: every key, without token or digest.
- ``DELETE /admin/keys/{id}``: 204, revoked at once here and within 1 s on every replica
  (flow/keys.py caches a lookup for at most CACHE_SECONDS).
- ``POST /admin/keys/{id}/rotate``: 201, a new key (new id and token) with the old one's
  account, providers, expiry and quotas; the old one revoked once the new one is stored.
  The new key counts under the old one's quota holder (``AgentKey.holder``), so its
  pending operations and the hour's submissions still count: rotating resets no quota.

Only the admin role manages keys (``NEEDS["keys"]``; ``403 forbidden-role`` below it).
Made and revoked keys are audited ``key_created`` / ``key_revoked`` before the answer, by
id and account, never with the token.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from aiohttp import web

from gateway.core import effects
from gateway.core.keys import AgentKey, KeyRequest, key_request
from gateway.core.models import Event
from gateway.core.roles import NEEDS
from gateway.flow.runtime import RUNTIME, Runtime
from gateway.http.problems import problem
from gateway.operator import access
from gateway.operator.admin import json_body
from gateway.settings.units import rfc3339

TOKEN_PREFIX = "sgk_"  # noqa: S105 - an agent key's token: recognisable in a secret scanner's rules


def routes(app: web.Application) -> None:
    app.router.add_post("/admin/keys", create_key)
    app.router.add_get("/admin/keys", list_keys)
    app.router.add_delete("/admin/keys/{key_id}", revoke_key)
    app.router.add_post("/admin/keys/{key_id}/rotate", rotate_key)


def view(key: AgentKey, now: float) -> dict[str, Any]:
    """A key as operators read it: no token, no digest."""
    return {
        "id": key.id,
        "account": key.account,
        "providers": list(key.providers),
        "expires_at": None if key.expires_at is None else rfc3339(key.expires_at),
        "quotas": key.quotas.model_dump(),
        "created_at": rfc3339(key.created_at),
        "created_by": key.created_by,
        "expired": not key.live(now),
    }


def _drawn() -> tuple[str, str, str]:
    """A new key id, token and the token's sha256 hex digest."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return f"key_{secrets.token_hex(8)}", token, hashlib.sha256(token.encode()).hexdigest()


async def _stored(
    runtime: Runtime, key: AgentKey, token: str, actor: str, detail: str
) -> dict[str, Any]:
    """A new key stored and audited: its view with the token, the one time it is shown."""
    await runtime.store.put_key(key)
    now = runtime.clock()
    await runtime.effects.carry_out(
        effects.of_key(Event.KEY_CREATED, key, now, actor=actor, detail=detail)
    )
    return {**view(key, now), "token": token}


async def _made(runtime: Runtime, asked: KeyRequest, actor: str, detail: str) -> dict[str, Any]:
    key_id, token, digest = _drawn()
    key = AgentKey(
        id=key_id,
        account=asked.account,
        providers=asked.providers,
        token_sha256=digest,
        created_at=runtime.clock(),
        expires_at=asked.expires_at,
        quotas=asked.quotas,
        created_by=actor,
    )
    return await _stored(runtime, key, token, actor, detail)


async def create_key(request: web.Request) -> web.StreamResponse:
    operator = await access.require(request, NEEDS["keys"])
    if isinstance(operator, web.Response):
        return operator
    runtime = request.app[RUNTIME]
    try:
        body = await json_body(request)
        asked = key_request(body, runtime.settings.policies, runtime.clock())
    except ValueError as exc:
        return problem("invalid-request", f"Bad request body: {exc}.")
    shown = ", ".join(asked.providers)
    made = await _made(runtime, asked, operator.id, f"providers: {shown}")
    return web.json_response(made, status=201, headers={"Cache-Control": "no-store"})


async def list_keys(request: web.Request) -> web.StreamResponse:
    operator = await access.require(request, NEEDS["keys"])
    if isinstance(operator, web.Response):
        return operator
    runtime = request.app[RUNTIME]
    now = runtime.clock()
    keys = await runtime.store.agent_keys()
    return web.json_response({"keys": [view(key, now) for key in keys], "now": rfc3339(now)})


async def _revoke(runtime: Runtime, key_id: str, actor: str, detail: str) -> AgentKey | None:
    """Drop the key, forget it here at once, and audit it; None when there was none."""
    key = await runtime.store.drop_key(key_id)
    if key is None:
        return None
    runtime.keys.forget(key.token_sha256)
    await runtime.effects.carry_out(
        effects.of_key(Event.KEY_REVOKED, key, runtime.clock(), actor=actor, detail=detail)
    )
    return key


async def revoke_key(request: web.Request) -> web.StreamResponse:
    operator = await access.require(request, NEEDS["keys"])
    if isinstance(operator, web.Response):
        return operator
    key_id = request.match_info["key_id"]
    if await _revoke(request.app[RUNTIME], key_id, operator.id, "revoked") is None:
        return problem("unknown-key", f"No agent key {key_id[:100]!r}.")
    return web.Response(status=204)


async def rotate_key(request: web.Request) -> web.StreamResponse:
    """A new key like the old one, then the old one revoked: never a moment with neither."""
    operator = await access.require(request, NEEDS["keys"])
    if isinstance(operator, web.Response):
        return operator
    runtime = request.app[RUNTIME]
    key_id = request.match_info["key_id"]
    old = next((k for k in await runtime.store.agent_keys() if k.id == key_id), None)
    if old is None:
        return problem("unknown-key", f"No agent key {key_id[:100]!r}.")
    key_id, token, digest = _drawn()
    new = old.successor(key_id, digest, runtime.clock(), operator.id)
    made = await _stored(runtime, new, token, operator.id, f"rotated from {old.id}")
    await _revoke(runtime, old.id, operator.id, f"rotated to {made['id']}")
    return web.json_response(made, status=201, headers={"Cache-Control": "no-store"})
