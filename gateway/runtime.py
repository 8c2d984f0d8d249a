"""What every handler shares: settings, store, upstream, clock, random source, effects
(audit, metrics, webhook), and the table of polls in flight in this process.

Built once by app.create_app; handlers reach it through ``request.app[RUNTIME]``.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from .config import Account, Operator, Settings
from .effects import Effects
from .headers import Rewriter
from .models import Clock
from .routing import RouteTable
from .store.base import Store
from .upstream import Upstream, UpstreamResponse

if TYPE_CHECKING:
    from .decide import Decision


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
    inflight: dict[str, asyncio.Future[tuple[Decision, UpstreamResponse | None]]] = field(
        default_factory=dict
    )

    def __post_init__(self) -> None:
        base = self.settings.file.public_base_url
        self.routes = {name: RouteTable(p) for name, p in self.settings.policies.items()}
        self.rewriters = {name: Rewriter(p, base) for name, p in self.settings.policies.items()}

    def agent(self, authorization: str | None) -> Account | None:
        """The account whose agent bearer token this is; None if unknown."""
        digest = bearer_digest(authorization)
        return None if digest is None else self.settings.account_for(digest)

    def operator(self, authorization: str | None) -> Operator | None:
        """The operator whose bearer token this is; None if unknown."""
        digest = bearer_digest(authorization)
        return None if digest is None else self.settings.operator_for(digest)


def bearer_digest(authorization: str | None) -> str | None:
    """sha256 hex of a Bearer token, the only form in which tokens are compared."""
    if authorization is None:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return hashlib.sha256(token.encode()).hexdigest()


RUNTIME = web.AppKey("runtime", Runtime)
# What a handler learned about a request, for the metrics middleware.
PROVIDER = web.RequestKey("provider", str)
ROUTE = web.RequestKey("route", str)
OUTCOME = web.RequestKey("outcome", str)
