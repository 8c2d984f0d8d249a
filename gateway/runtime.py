"""What every handler shares: settings, store, upstream, clock, random source, effects
(audit, metrics, webhook), and the table of polls in flight in this process.

Built once by app.create_app; handlers reach it through ``request.app[RUNTIME]``.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from .config import Account, Operator, Settings
from .credentials import Applier, applier_for
from .effects import Effects
from .headers import Rewriter
from .models import Clock
from .pacing import Spacer
from .policy import ProviderPolicy
from .routing import RouteTable
from .store.base import Store
from .upstream import Upstream, UpstreamResponse

if TYPE_CHECKING:
    from .decide import Decision

PollTask = asyncio.Task[tuple["Decision", UpstreamResponse | None]]


@dataclass
class Runtime:
    settings: Settings
    store: Store
    upstream: Upstream
    clock: Clock
    rng: random.Random
    effects: Effects
    routes: dict[str, RouteTable] = field(init=False)
    rewriters: dict[str, Rewriter] = field(init=False)
    credentials: dict[str, Applier] = field(init=False)
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    inflight: dict[str, PollTask] = field(default_factory=dict)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    holding: int = 0  # status calls held for Prefer: wait right now
    spacer: Spacer = field(default_factory=Spacer)  # sends spaced under a provider's ceiling
    admin_port: int | None = None  # the admin listener's bound port, once serving

    def __post_init__(self) -> None:
        self.credentials = {}
        self.apply(self.settings)

    def apply(self, settings: Settings) -> None:
        """Make ``settings`` the running set, all at once (no await in between, so no
        request sees half of it). A credential that did not change keeps its applier (and
        an OAuth2 token already fetched)."""
        base = settings.file.public_base_url
        policies = settings.policies
        credentials = {
            name: self.credentials[name]
            if name in self.credentials
            and self.settings.policies.get(name) is not None
            and self.settings.policies[name].credential == policy.credential
            else applier_for(policy, upstream=self.upstream, clock=self.clock)
            for name, policy in policies.items()
        }
        routes = {name: RouteTable(p) for name, p in policies.items()}
        rewriters = {name: Rewriter(p, base) for name, p in policies.items()}
        self.settings, self.routes, self.rewriters, self.credentials = (
            settings,
            routes,
            rewriters,
            credentials,
        )
        limits = settings.file.limits
        self.upstream.configure(
            timeout=limits.upstream_timeout, max_response_body=limits.max_response_body
        )

    def applier(self, policy: ProviderPolicy) -> Applier:
        """The credential applier for ``policy``: the running one, or, for a call that
        began before a reload changed or removed the policy, one of its own (never the new
        credential sent to the old origin)."""
        if self.settings.policies.get(policy.provider) is policy:
            return self.credentials[policy.provider]
        return applier_for(policy, upstream=self.upstream, clock=self.clock)

    def rewriter(self, policy: ProviderPolicy) -> Rewriter:
        """The URL rewriter for ``policy``, as ``applier`` chooses appliers."""
        if self.settings.policies.get(policy.provider) is policy:
            return self.rewriters[policy.provider]
        return Rewriter(policy, self.settings.file.public_base_url)

    def route_table(self, policy: ProviderPolicy) -> RouteTable:
        """The route table for ``policy``, as ``applier`` chooses appliers."""
        if self.settings.policies.get(policy.provider) is policy:
            return self.routes[policy.provider]
        return RouteTable(policy)

    async def pause(self, seconds: float) -> bool:
        """Wait ``seconds`` on the injected sleeper; False at once if the gateway stops."""
        if self.stopping.is_set():
            return False
        sleeper = asyncio.ensure_future(self.sleep(seconds))
        stopper = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            stopper.cancel()
        return not self.stopping.is_set()

    async def space_sends(self, provider: str, rate: float) -> None:
        """Wait until a status call to ``provider`` may leave this process (pacing.Spacer)."""
        await self.spacer.wait(provider, rate, self.clock, self.sleep)

    def agent(self, headers: Mapping[str, str]) -> Account | None:
        """The account whose agent token the request carries; None if unknown.

        ``Statusgate-Token: <token>`` first (for SDKs that own ``Authorization``), then
        ``Authorization: Bearer <token>``, then a SigV4 ``Authorization`` whose access key
        id is the token (SPEC 12). None of these is ever forwarded."""
        token = agent_token(headers)
        if token is None:
            return None
        return self.settings.account_for(hashlib.sha256(token.encode()).hexdigest())

    def operator(self, authorization: str | None) -> Operator | None:
        """The operator whose bearer token this is; None if unknown."""
        digest = bearer_digest(authorization)
        return None if digest is None else self.settings.operator_for(digest)


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


RUNTIME = web.AppKey("runtime", Runtime)
# What a handler learned about a request, for the metrics middleware.
PROVIDER = web.RequestKey("provider", str)
ROUTE = web.RequestKey("route", str)
OUTCOME = web.RequestKey("outcome", str)
