"""Agent keys as requests meet them: a store lookup by the token's digest, remembered for
at most CACHE_SECONDS in this process (SPEC 25: a revoked key is refused on every replica
within 1 s).

Why a cache at all: without one, every agent request with an API-made key costs a store
read (a Redis or PostgreSQL round trip) before anything else; with one, a busy key costs one
read per CACHE_SECONDS per process. Why this short: a revocation reaches the other
replicas when their entry expires, so CACHE_SECONDS bounds how long a revoked key keeps
working there (this process forgets at once: ``forget``). docs/operators.md has the
measured costs. Unknown tokens are remembered too (as unknown), so a flood of bad tokens
costs one read each per CACHE_SECONDS; the table is bounded (MAX_CACHED, then emptied).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.core.keys import AgentKey
from gateway.settings.config import Account
from gateway.store.base import AgentKeys

CACHE_SECONDS = 0.5  # at most this old a lookup is used (the SPEC allows 1 s)
MAX_CACHED = 10_000  # digests remembered before the table starts over


class KeyBook:
    """The store's agent keys, looked up by token digest through a short cache."""

    def __init__(
        self,
        store: AgentKeys,
        *,
        ttl: float = CACHE_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._ttl = ttl
        self._monotonic = monotonic
        self._cache: dict[str, tuple[float, AgentKey | None, Account | None]] = {}

    async def account(self, digest: str, now: float) -> Account | None:
        """The Account the key with this token digest acts as, or None when there is no
        such key or it expired by ``now`` (refused like an unknown one)."""
        found = self._cache.get(digest)
        at = self._monotonic()
        if found is None or found[0] <= at:
            key = await self._store.key_for(digest)
            if len(self._cache) >= MAX_CACHED:
                self._cache.clear()
            found = (at + self._ttl, key, None if key is None else key.as_account())
            self._cache[digest] = found
        _, key, account = found
        return account if key is not None and key.live(now) else None

    def forget(self, digest: str) -> None:
        """Drop what this process remembers of ``digest`` (the key was revoked here)."""
        self._cache.pop(digest, None)
