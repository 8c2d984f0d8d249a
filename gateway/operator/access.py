"""Who is calling the operator API and whether their role may (SPEC 6, 25).

Every operator handler opens with ``await require(request, role)``: it names the caller
(an operator's static token, or a JWT of the configured OpenID Connect issuer) or answers
``401 unauthenticated`` / ``403 forbidden`` (an agent token), and answers
``403 forbidden-role`` when the caller's role is below ``role``. A new operator route (the
keys API, say) needs nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from aiohttp import web

from gateway import StoreError
from gateway.core.roles import allows, person, role_from_claims
from gateway.flow.runtime import ROUTE, RUNTIME, Runtime
from gateway.http import auth
from gateway.http.problems import problem
from gateway.operator.oidc import Identity, Rejected
from gateway.settings.config import Role

IDENTITY = web.AppKey("identity", Identity)


@dataclass(frozen=True)
class Caller:
    id: str  # the name audit lines carry
    role: Role
    via: Literal["token", "oidc"]
    expires_at: float | None = None  # a JWT's exp


async def require(request: web.Request, role: Role) -> Caller | web.Response:
    """The caller if their role is ``role`` or above; else the problem to answer."""
    found = await caller(request)
    if isinstance(found, web.Response) or allows(found.role, role):
        return found
    return forbidden_role(found, role)


def forbidden_role(found: Caller, needed: Role) -> web.Response:
    detail = (
        f"Operator {found.id!r} has the role {found.role}; this needs {needed} or above "
        f"(roles: viewer < decider < admin)."
    )
    return problem("forbidden-role", detail, extra={"required_role": needed, "role": found.role})


async def caller(request: web.Request) -> Caller | web.Response:
    """Whoever the request's bearer token names, whatever their role."""
    runtime = request.app[RUNTIME]
    request[ROUTE] = "admin"
    settings = runtime.settings
    header = request.headers.get("Authorization")
    operator = auth.operator(settings, header)
    if operator is not None:
        return Caller(id=operator.id, role=operator.role, via="token")
    if await _agent(runtime, request.headers):
        return problem("forbidden", "Agent tokens cannot use the operator API.")
    issuer = request.app[IDENTITY].current(settings.file.oidc)
    token = _bearer(header)
    if issuer is None or token is None or token.count(".") != 2:
        return problem("unauthenticated", "Send 'Authorization: Bearer <operator token>'.")
    try:
        claims = await issuer.verify(token, runtime.clock())
    except Rejected as exc:
        return problem("unauthenticated", f"Single sign-on token refused: {exc}.")
    name = person(claims)
    if name is None:
        return problem("unauthenticated", "The token names nobody (no sub claim).")
    exp = claims.get("exp")
    return Caller(
        id=name,
        role=role_from_claims(claims, issuer.settings),
        via="oidc",
        expires_at=float(exp) if isinstance(exp, (int, float)) else None,
    )


async def _agent(runtime: Runtime, headers: Mapping[str, str]) -> bool:
    """Whether the token is an agent's (a config account's or a stored key's), only to say
    so; a store that does not answer makes it no agent's here, so an operator signed in
    with single sign-on keeps the calls that need no store (``/admin/me``, a reload)."""
    try:
        return await auth.agent_of(runtime, headers) is not None
    except StoreError:  # raised only after the config accounts were checked
        return False


def _bearer(header: str | None) -> str | None:
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token.isascii() or not token.isprintable():
        return None
    return token
