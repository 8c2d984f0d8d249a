"""Too-early refusals of an operation counted in memory while it waits for one
``next_poll_at``, folded into its record and one audit line when the window closes (SPEC 8:
one line per window, not per refusal)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.models import OperationRecord


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
