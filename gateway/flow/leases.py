"""Poll leases a failed store call may have left held, given back in the background.

A stalled Redis runs the queued command that took a lease when it wakes, maybe after a first
release, so the release is tried again (0.5 s, doubling up to 8 s) until it goes through once
the store answers again, or the lease has expired by itself: the operation is blocked for
about a second after recovery, not for the lease's time. One loop per lease name, whatever
the number of failed polls: it gives back each of their tokens (only the holder's matches).
The state lives in the runtime (one ``Releases`` per process), never in module globals.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
from dataclasses import dataclass, field

from gateway import StoreError
from gateway.store.base import Coordination

RELEASE_RETRY = 0.5  # the first wait between release attempts, doubled up to RELEASE_CAP
RELEASE_CAP = 8.0
RELEASE_TOKENS = 16  # tokens kept per lease name; the oldest go first


# Lease tokens tell holders apart; they never leave the gateway and its store, so they come
# from a generator seeded from the OS once per process (again after a fork), not from an
# os.urandom system call per poll.
_tokens = random.Random(secrets.randbits(128))
os.register_at_fork(after_in_child=lambda: _tokens.seed(secrets.randbits(128)))


def new_token() -> str:
    """A fresh lease token (32 hex digits, as ``secrets.token_hex(16)`` gives)."""
    return f"{_tokens.getrandbits(128):032x}"


@dataclass(frozen=True, slots=True)
class Lease:
    name: str
    token: str


@dataclass
class Releases:
    """The background release loops of one process, by lease name."""

    tokens: dict[str, list[str]] = field(default_factory=dict)
    loops: set[asyncio.Task[None]] = field(default_factory=set)

    def later(self, store: Coordination, lease: Lease, ttl: float) -> None:
        """Give ``lease`` back in the background (the answer, a 503, does not wait)."""
        tokens = self.tokens.get(lease.name)
        if tokens is not None:  # a loop is running for this lease: it takes this token too
            tokens.append(lease.token)
            del tokens[:-RELEASE_TOKENS]
            return
        tokens = self.tokens[lease.name] = [lease.token]
        task = asyncio.create_task(self._release(store, lease.name, tokens, ttl))
        self.loops.add(task)
        task.add_done_callback(self.loops.discard)

    async def _release(self, store: Coordination, name: str, tokens: list[str], ttl: float) -> None:
        loop = asyncio.get_running_loop()
        until, wait = loop.time() + ttl, RELEASE_RETRY
        try:
            while tokens:
                try:
                    await store.release_lease(name, tokens[0])
                    tokens.pop(0)
                    continue
                except StoreError:
                    if loop.time() >= until:
                        return
                await asyncio.sleep(wait)
                wait = min(wait * 2, RELEASE_CAP)
        finally:
            self.tokens.pop(name, None)
