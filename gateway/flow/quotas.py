"""Quota refusals of submissions in the audit log (SPEC 25): the first refusal of a key's
(or config account's) quota to a provider gets its ``quota_exceeded`` line before the agent
hears 429, and those that follow within the window one line with their count when it
closes (the next refusal after it, the sweeper, shutdown). An agent hammering a full quota
so costs at most two lines a window (flow/refusals.py, QuotaWindows), never one a call.
Never decides a refusal: http/submit.py does, with the store's claim."""

from __future__ import annotations

from gateway.core import effects
from gateway.core.keys import QuotaRefusal
from gateway.flow.refusals import QuotaWindow
from gateway.flow.runtime import Runtime


async def refused(runtime: Runtime, refusal: QuotaRefusal) -> None:
    """Count ``refusal``; write its line when it opens a window (and the line of the
    window it closed, first)."""
    now = runtime.clock()
    ended, opened = runtime.quota_refusals.note(refusal, now)
    found = _closed(ended, now) if ended is not None else effects.NONE
    if opened:
        found += effects.of_quota_refusal(refusal, now)
    await runtime.effects.carry_out(found)


async def close_windows(runtime: Runtime, *, every: bool = False) -> None:
    """Write the lines of the windows that ended (``every``: of all, at shutdown)."""
    now = runtime.clock()
    found = effects.NONE
    for window in runtime.quota_refusals.close(None if every else now):
        found += _closed(window, now)
    await runtime.effects.carry_out(found)


def _closed(window: QuotaWindow, now: float) -> effects.Effects:
    if window.count == 0:  # the first refusal's own line said it all
        return effects.NONE
    return effects.of_quota_refusal(window.last, now, count=window.count, since=window.first_at)
