"""How much of its time the event loop's thread spends on the CPU, measured from two clocks
the caller reads: the loop's and the thread's CPU time. Pure arithmetic, no clock of its
own, so a test feeds it numbers.

The SQLite store spaces its fsyncs only while the loop is busy: then an fsync less frees
CPU the queue is waiting for; at low load it would only add the wait."""

from __future__ import annotations

WINDOW = 0.05  # seconds of loop time one measure spans at least
SHARE = 0.75  # the thread's CPU share of a window from which the loop counts as busy


class LoopShare:
    """The loop thread's CPU share over the last window that ended (``busy`` from SHARE
    on). ``seen`` is told both clocks now and then (the store: at each fsync's end); a
    window ends at the first call WINDOW or more after it began. Idle until told twice."""

    __slots__ = ("_cpu", "_wall", "busy")

    def __init__(self) -> None:
        self._wall: float | None = None
        self._cpu = 0.0
        self.busy = False

    def seen(self, wall: float, cpu: float) -> None:
        if self._wall is None:
            self._wall, self._cpu = wall, cpu
            return
        span = wall - self._wall
        if span < WINDOW:
            return
        self.busy = (cpu - self._cpu) >= SHARE * span
        self._wall, self._cpu = wall, cpu
