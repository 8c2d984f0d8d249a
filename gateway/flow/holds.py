"""The bound on status calls held at once (``limits.max_held``, ``max_held_per_account``).

A held call (``Prefer: wait``, ``early_calls: hold``, an MCP wait) costs ~17 KB while it
waits (its connection, request, task and timer); unbounded, one account's agents could fill
a pod's memory. Owns the counts, per account and in all, for this process. Never waits or
answers: a caller that finds no room answers as it would without the hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from gateway.settings.config import Limits


class Holds:
    """Status calls held right now in this process, in all and by account."""

    def __init__(self) -> None:
        self.total = 0
        self.by_account: dict[str, int] = {}

    def full(self, account: str, limits: Limits) -> str | None:
        """The bound a new hold for ``account`` would pass (``account`` or ``total``), or
        None when there is room."""
        mine = limits.max_held_per_account
        if mine is not None and self.by_account.get(account, 0) >= mine:
            return "account"
        if limits.max_held is not None and self.total >= limits.max_held:
            return "total"
        return None

    @contextmanager
    def holding(self, account: str) -> Iterator[None]:
        """Count one held call of ``account`` while the block runs."""
        self.total += 1
        self.by_account[account] = self.by_account.get(account, 0) + 1
        try:
            yield
        finally:
            self.total -= 1
            left = self.by_account[account] - 1
            if left:
                self.by_account[account] = left
            else:
                del self.by_account[account]
