"""Refusals counted in memory, so that a caller asking again and again costs one audit line
a window, not one a call: too-early refusals of an operation while it waits for one
``next_poll_at``, folded into its record and one line when the window closes (SPEC 8); and
quota refusals of submissions (SPEC 25), whose first refusal gets its line at once and the
ones after it one line when the window closes (flow/quotas.py writes them)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.keys import QuotaRefusal
from gateway.core.models import OperationRecord

QUOTA_WINDOW = 60.0  # seconds at most between quota_exceeded lines of one key, provider, quota


@dataclass
class Window:
    """Too-early refusals of one operation while it waited for one next_poll_at."""

    count: int
    first_at: float
    ends_at: float


class RefusalWindows:
    def __init__(self) -> None:
        self._open: dict[str, Window] = {}

    def note(self, record: OperationRecord, now: float) -> None:
        window = self._open.get(record.operation_id)
        if window is None or window.ends_at != record.next_poll_at:
            if window is not None:  # the schedule moved under us: keep counting, new end
                window.ends_at = record.next_poll_at
            else:
                self._open[record.operation_id] = Window(0, now, record.next_poll_at)
            window = self._open[record.operation_id]
        window.count += 1

    def close(self, operation_id: str) -> Window | None:
        return self._open.pop(operation_id, None)

    def reopen(self, operation_id: str, window: Window | None) -> None:
        """Put back a window closed for a write that did not happen (counts kept)."""
        if window is None:
            return
        current = self._open.get(operation_id)
        if current is None:
            self._open[operation_id] = window
        else:
            current.count += window.count
            current.first_at = min(current.first_at, window.first_at)

    def ended(self, now: float) -> list[str]:
        return [op for op, window in self._open.items() if window.ends_at <= now]

    def all(self) -> list[str]:
        return list(self._open)


@dataclass
class QuotaWindow:
    """Submissions refused by one quota of one key (or config account) to one provider
    after the first, whose line was written when it opened the window."""

    first_at: float
    ends_at: float
    last: QuotaRefusal  # the latest refusal: its retry_after is the one the line says
    count: int = 0  # refused after the first (not yet in any line)


QuotaKey = tuple[str, str | None, str, str]  # account, key id, provider, quota


class QuotaWindows:
    """Open windows of quota refusals. A window ends ``QUOTA_WINDOW`` seconds after its
    first refusal, or sooner when that refusal's Retry-After does; at most one per key (or
    config account), provider and quota, so the number open is bounded by the keys."""

    def __init__(self) -> None:
        self._open: dict[QuotaKey, QuotaWindow] = {}

    def note(self, refused: QuotaRefusal, now: float) -> tuple[QuotaWindow | None, bool]:
        """Count ``refused``: the window it ended (to write, when it counted any), and
        whether it opened a new one (its own line is written now)."""
        key = (refused.account, refused.key_id, refused.provider, refused.quota)
        ended = None
        window = self._open.get(key)
        if window is not None and window.ends_at <= now:
            ended, window = self._open.pop(key), None
        if window is None:
            ends = now + min(QUOTA_WINDOW, max(float(refused.retry_after), 1.0))
            self._open[key] = QuotaWindow(now, ends, refused)
            return ended, True
        window.count += 1
        window.last = refused
        return ended, False

    def close(self, now: float | None = None) -> list[QuotaWindow]:
        """The windows ended by ``now`` (every one when None), removed."""
        done = [k for k, w in self._open.items() if now is None or w.ends_at <= now]
        return [self._open.pop(key) for key in done]
