"""The agent listener's open connections, and the bound on them (``limits.max_connections``):
which are open, which of them are idle (no request in hand, no head begun) in the order they
became idle, the connection idle the longest closed to make room past the bound, and a
connection refused when none is idle (``Refused``: its 503 written, then closed without
destroying it). It never parses or answers a request.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

REFUSED_LINGER = 2.0  # seconds a connection refused 503 is read, and dropped, at most


class Evictable(Protocol):
    def evict(self) -> None: ...


class Connections:
    """The open connections; ``idle`` is kept by the connections themselves (a dict, in
    the order they became idle: the first is the one idle the longest)."""

    __slots__ = ("_open", "idle")

    def __init__(self) -> None:
        self._open: dict[Evictable, None] = {}
        self.idle: dict[Evictable, None] = {}

    @property
    def open(self) -> int:
        return len(self._open)

    def admit(self, lane: Evictable, bound: int | None) -> bool:
        """Count ``lane`` in (idle: it sent nothing yet), closing the connection idle the
        longest to make room past ``bound``; False when none is idle (``lane`` is then
        not counted)."""
        if bound is not None and len(self._open) >= bound:
            victim = next(iter(self.idle), None)
            if victim is None:
                return False
            self.forget(victim)
            victim.evict()
        self._open[lane] = None
        self.idle[lane] = None
        return True

    def forget(self, lane: Evictable) -> None:
        self._open.pop(lane, None)
        self.idle.pop(lane, None)


class Refused(asyncio.Protocol):
    """A connection past ``limits.max_connections`` once its 503 is written: the sending
    side is shut after it (a FIN, not a reset that could destroy the answer unread), what
    the client still sends is read and dropped, and the connection closes at the client's
    own FIN or after REFUSED_LINGER."""

    def __init__(self, transport: asyncio.Transport) -> None:
        transport.set_protocol(self)
        if transport.can_write_eof():
            transport.write_eof()
        self._timer = asyncio.get_running_loop().call_later(REFUSED_LINGER, transport.close)

    def data_received(self, data: bytes) -> None:
        pass

    def eof_received(self) -> bool | None:
        return None  # the transport closes

    def connection_lost(self, exc: BaseException | None) -> None:
        self._timer.cancel()
