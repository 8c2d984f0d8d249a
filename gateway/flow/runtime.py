"""What every handler shares: settings, store, upstream, clock, random source, effects
(audit, metrics, webhook), and the table of polls in flight in this process.

Built once by app.create_app; handlers reach it through ``request.app[RUNTIME]``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gateway.core.models import Clock
from gateway.core.pacing import PauseNotes, Spacer
from gateway.core.routing import RouteTable
from gateway.flow.holds import Holds
from gateway.flow.keeper import Keeper
from gateway.flow.keys import KeyBook
from gateway.flow.leases import Releases
from gateway.flow.refusals import QuotaWindows, RefusalWindows
from gateway.observe.effects import Effects
from gateway.provider.client import Upstream, UpstreamResponse
from gateway.provider.credentials import Applier, applier_for
from gateway.provider.headers import Rewriter
from gateway.provider.send import Channel
from gateway.settings.config import Settings
from gateway.settings.policy import ProviderPolicy
from gateway.store.base import Coordination, Records, Store

if TYPE_CHECKING:
    from gateway.core.decide import Decision

# A poll in flight: its task, or the future a poll run in its caller's own task resolves
PollTask = asyncio.Future[tuple["Decision", UpstreamResponse | None]]


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
    holds: Holds = field(default_factory=Holds)  # status calls held right now (flow/holds)
    in_flight: int = 0  # agent requests (/p/..., /mcp) being answered (middleware.guarded)
    parked: int = 0  # of those, waiting on a timer only (park): not held to max_in_flight
    max_in_flight: int | None = field(init=False)  # limits.max_in_flight of the running set
    spacer: Spacer = field(default_factory=Spacer)  # sends spaced under a provider's ceiling
    pauses: PauseNotes = field(default_factory=PauseNotes)  # clamped pauses already logged
    admin_port: int | None = None  # the admin listener's bound port, once serving
    traced: bool = False  # tracing on: the gate opens a server span per request
    refusals: RefusalWindows = field(default_factory=RefusalWindows)  # too-early, by operation
    quota_refusals: QuotaWindows = field(default_factory=QuotaWindows)  # 429s, by key and quota
    releases: Releases = field(default_factory=Releases)  # leases given back in the background
    background: set[asyncio.Task[Any]] = field(default_factory=set)  # cancelled at stop
    keeper: Keeper = field(init=False)  # kept results: their store, copies under way
    keys: KeyBook = field(init=False)  # agent keys made through the operator API

    def __post_init__(self) -> None:
        self.credentials = {}
        self.keeper = Keeper(self.settings.results_target)
        self.keys = KeyBook(self.store)
        self.apply(self.settings)

    @property
    def holding(self) -> int:
        """Status calls held right now (Prefer: wait, early_calls: hold, MCP waits)."""
        return self.holds.total

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
        self.max_in_flight = limits.max_in_flight
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

    @property
    def announces(self) -> bool:
        """Operations that end now owe an ``operation.completed`` event (SPEC 23): a
        webhook is configured."""
        return self.settings.file.escalation.webhook_url is not None

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background, kept until it ends or the gateway stops."""
        task = asyncio.create_task(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

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

    async def park(self, seconds: float) -> bool:
        """``pause`` for an agent's request that only waits (a held call between two looks
        at its operation): it costs a timer, not work, so while parked it is not counted
        against ``limits.max_in_flight``."""
        self.parked += 1
        try:
            return await self.pause(seconds)
        finally:
            self.parked -= 1

    async def space_sends(self, provider: str, rate: float) -> None:
        """Wait until a status call to ``provider`` may leave this process (pacing.Spacer)."""
        await self.spacer.wait(provider, rate, self.clock, self.sleep)

    @property
    def records(self) -> Records:
        """The store as handlers use it: operations and idempotency entries."""
        return self.store

    @property
    def coordination(self) -> Coordination:
        """The store as a lock service: leases, the pacing window, tightening."""
        return self.store

    def channel(self, policy: ProviderPolicy) -> Channel:
        """What sending to ``policy``'s provider needs (provider/send.py)."""
        return Channel(self.upstream, self.applier(policy), self.effects.metrics)


RUNTIME = web.AppKey("runtime", Runtime)
# What a handler learned about a request, for the metrics middleware.
PROVIDER = web.RequestKey("provider", str)
ROUTE = web.RequestKey("route", str)
OUTCOME = web.RequestKey("outcome", str)
