"""The console's single sign-on (SPEC 25): the authorization-code flow with PKCE, the
browser's half in console.js and the gateway's half here.

``GET /console/oidc/config`` tells the page whether ``oidc`` is configured and where the
issuer's authorization endpoint is; ``POST /console/oidc/token`` redeems the code the
issuer sent back (with the page's PKCE verifier, and the client secret, which never leaves
the gateway) and hands the page the ID token, which it keeps in sessionStorage like a
static token. No cookie is set, so there is nothing to forge across sites. This module must
never log or echo a code, a verifier, a token or the secret.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from gateway.core.roles import capabilities, person, role_from_claims
from gateway.flow.runtime import ROUTE, RUNTIME
from gateway.http.bodies import read_limited
from gateway.http.problems import problem
from gateway.operator.access import IDENTITY
from gateway.operator.oidc import Identity, Rejected
from gateway.settings.units import rfc3339

NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}  # RFC 6749 5.1
MAX_BODY = 16 * 1024
# RFC 7636 4.1: 43 to 128 unreserved characters
VERIFIER = re.compile(r"[A-Za-z0-9._~-]{43,128}")


def routes(app: web.Application) -> None:
    app[IDENTITY] = Identity()
    app.router.add_get("/console/oidc/config", config)
    app.router.add_post("/console/oidc/token", token)
    app.on_startup.append(_start)
    app.on_cleanup.append(_stop)


async def _start(app: web.Application) -> None:
    runtime = app[RUNTIME]
    await app[IDENTITY].start(runtime.settings.file.oidc, runtime.clock())


async def _stop(app: web.Application) -> None:
    await app[IDENTITY].close()


async def config(request: web.Request) -> web.Response:
    """What the page needs to send a person to the issuer; ``enabled: false`` without
    ``oidc``. Public: it is what the issuer's own discovery document says."""
    request[ROUTE] = "admin"
    runtime = request.app[RUNTIME]
    issuer = request.app[IDENTITY].current(runtime.settings.file.oidc)
    if issuer is None:
        return web.json_response({"enabled": False}, headers=NO_STORE)
    try:
        found = await issuer.discover(runtime.clock())
    except Rejected as exc:
        body = {"enabled": True, "error": f"Single sign-on is unavailable: {exc}."}
        return web.json_response(body, headers=NO_STORE)
    body = {
        "enabled": True,
        "authorization_endpoint": found.authorization_endpoint,
        "client_id": issuer.settings.client_id,
        "scope": issuer.settings.scope,
    }
    return web.json_response(body, headers=NO_STORE)


async def token(request: web.Request) -> web.Response:
    """Redeem ``{code, code_verifier, redirect_uri, nonce}`` at the issuer: the ID token
    and who it names, or ``401 unauthenticated`` saying why not."""
    request[ROUTE] = "admin"
    runtime = request.app[RUNTIME]
    issuer = request.app[IDENTITY].current(runtime.settings.file.oidc)
    if issuer is None:
        return problem("route-not-allowed", "Single sign-on is not configured (oidc).")
    try:
        asked = await _asked(request)
    except ValueError as exc:
        return problem("invalid-request", f"Bad sign-in request: {exc}.")
    try:
        jwt, claims = await issuer.redeem(*asked, runtime.clock())
    except Rejected as exc:
        return problem("unauthenticated", f"Single sign-on failed: {exc}.")
    name = person(claims)
    if name is None:
        return problem("unauthenticated", "Single sign-on failed: the token names nobody.")
    role = role_from_claims(claims, issuer.settings)
    exp = claims.get("exp")
    body = {
        "token": jwt,
        "operator": {"id": name, "role": role, "may": capabilities(role)},
        "expires_at": rfc3339(float(exp)) if isinstance(exp, (int, float)) else None,
    }
    return web.json_response(body, headers=NO_STORE)


async def _asked(request: web.Request) -> tuple[str, str, str, str]:
    limits = request.app[RUNTIME].settings.file.limits
    raw = await read_limited(request, min(MAX_BODY, limits.max_request_body), limits.body_timeout)
    try:
        data: Any = json.loads(raw)
    except (ValueError, RecursionError):
        raise ValueError("not JSON") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    values = []
    for name in ("code", "code_verifier", "redirect_uri", "nonce"):
        value = data.get(name)
        if not isinstance(value, str) or not value or len(value) > 4096:
            raise ValueError(f"{name} must be a non-empty string")
        values.append(value)
    code, verifier, redirect_uri, nonce = values
    if not VERIFIER.fullmatch(verifier):
        raise ValueError("code_verifier must be 43 to 128 unreserved characters (RFC 7636)")
    parts = urlsplit(redirect_uri)
    if parts.scheme not in ("http", "https") or parts.path != "/console" or parts.query:
        raise ValueError("redirect_uri must be this console's URL, ending in /console")
    return code, verifier, redirect_uri, nonce
