"""Who is calling: the agent account or operator a request's token names (SPEC 4, 6, 12).

Tokens are compared only as sha256 digests; none of them is ever forwarded.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from gateway.settings.config import Account, Operator, Settings


def agent(settings: Settings, headers: Mapping[str, str]) -> Account | None:
    """The account whose agent token the request carries; None if unknown.

    ``Statusgate-Token: <token>`` first (for SDKs that own ``Authorization``), then
    ``Authorization: Bearer <token>``, then a SigV4 ``Authorization`` whose access key
    id is the token (SPEC 12). None of these is ever forwarded."""
    token = agent_token(headers)
    if token is None:
        return None
    return settings.account_for(hashlib.sha256(token.encode()).hexdigest())


def operator(settings: Settings, authorization: str | None) -> Operator | None:
    """The operator whose bearer token this is; None if unknown."""
    digest = bearer_digest(authorization)
    return None if digest is None else settings.operator_for(digest)


_SIGV4 = re.compile(r"AWS4-HMAC-SHA256\s+Credential=([^/,\s]+)/")


def agent_token(headers: Mapping[str, str]) -> str | None:
    """The agent token a request carries, in any of the three places agents may put it."""
    explicit = headers.get("Statusgate-Token", "").strip()
    if explicit:
        return explicit if _printable(explicit) else None
    authorization = headers.get("Authorization")
    if authorization is None:
        return None
    signed = _SIGV4.match(authorization.strip())
    if signed is not None:
        return signed.group(1) if _printable(signed.group(1)) else None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and _printable(token) else None


def _printable(token: str) -> bool:
    """Tokens are visible ASCII: anything else (bytes that were not UTF-8 arrive as
    surrogates) is no token at all, answered 401, never a crash."""
    return bool(token) and token.isascii() and token.isprintable()


def bearer_digest(authorization: str | None) -> str | None:
    """sha256 hex of a Bearer token, the only form in which tokens are compared."""
    if authorization is None:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not _printable(token):
        return None
    return hashlib.sha256(token.encode()).hexdigest()
