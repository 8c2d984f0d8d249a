"""Who is calling: the agent account (a config account, or an agent key the store keeps) or
operator a request's token names (SPEC 4, 6, 12, 22, 25).

Tokens are compared only as sha256 digests; none of them is ever forwarded: the agent-only
headers are never sent on, and a token in the policy credential's own header is replaced by
the credential as the request goes out (gateway/provider/credentials.py).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from gateway.flow.runtime import Runtime
from gateway.settings.config import Account, Operator, Settings
from gateway.settings.policy import ProviderPolicy


async def agent_of(
    runtime: Runtime, headers: Mapping[str, str], policy: ProviderPolicy | None = None
) -> Account | None:
    """The account whose agent token the request carries; None if unknown.

    ``Statusgate-Token: <token>`` first (for SDKs that own ``Authorization``), then
    ``Authorization: Bearer <token>``, then a SigV4 ``Authorization`` whose access key
    id is the token (SPEC 12), then (SPEC 22) the token where ``policy``'s SDK puts its
    key: the credential's header, with the credential's scheme word if it has one
    (``x-api-key: <token>``, ``Authorization: Key <token>``, a bare ``Authorization:
    <token>``). None of these is ever forwarded.

    A config account's token is found first, with no store read; else the agent key made
    through the operator API with this token's digest (SPEC 25: an Account limited to the
    key's providers, with its quotas), unless it expired. A StoreError goes up: the
    gateway fails closed."""
    token = agent_token(headers)
    if token is None and policy is not None:
        token = sdk_token(headers, policy)
    if token is None:
        return None
    digest = hashlib.sha256(token.encode()).hexdigest()
    account = runtime.settings.account_for(digest)
    if account is not None:
        return account
    return await runtime.keys.account(digest, runtime.clock())


def key_form(policy: ProviderPolicy) -> tuple[str, str] | None:
    """Where ``policy``'s SDK puts its API key: the credential's header and its scheme word
    ("" when the value is the bare key); None for credentials that are not one header."""
    credential = policy.credential
    if credential.kind != "header" or credential.header is None or credential.value is None:
        return None
    scheme, space, rest = credential.value.partition(" ")
    if space and rest.strip() and scheme.isascii() and scheme.isalpha():
        return credential.header, scheme
    return credential.header, ""


def sdk_token(headers: Mapping[str, str], policy: ProviderPolicy) -> str | None:
    """The agent token in the header ``policy``'s credential sets, in the same form."""
    form = key_form(policy)
    if form is None:
        return None
    name, scheme = form
    value = headers.get(name, "").strip()
    if scheme:
        written, _, value = value.partition(" ")
        if written.lower() != scheme.lower():
            return None
        value = value.strip()
    return value if _printable(value) else None


def hint(policy: ProviderPolicy | None) -> str:
    """How an agent may present its token, for the 401 answer's detail."""
    form = key_form(policy) if policy is not None else None
    usual = "Send 'Authorization: Bearer <agent token>'"
    if form is None or (form[0].lower() == "authorization" and form[1].lower() == "bearer"):
        return usual + "."
    name, scheme = form
    return f"{usual}, or '{name}: {scheme + ' ' if scheme else ''}<agent token>'."


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
