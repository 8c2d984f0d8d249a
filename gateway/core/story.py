"""An operation's audit lines told as a story, one line per event (``statusgate audit story``).

Pure: audit line dicts in, text lines out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

GUIDED = {"provider_retry_after", "provider_poll_hint"}


def _clock(stamp: str | None) -> str:
    """``2026-11-30T10:20:05.123Z`` -> ``10:20:05``."""
    return stamp[11:19] if stamp and len(stamp) >= 19 else "--:--:--"


def _next(line: dict[str, Any]) -> str:
    if line.get("next_poll_at") is None:
        return ""
    source = line.get("delay_source") or "local_backoff"
    told = "provider guidance" if source in GUIDED else source
    return f", next poll {_clock(line['next_poll_at'])} from {told}"


def _answer(line: dict[str, Any]) -> str:
    status = line.get("http_status")
    detail = line.get("detail") or ""
    if status is not None and 200 <= status < 300:
        return f"polled, state {line.get('provider_state')}" + (f", {detail}" if detail else "")
    what = f"received {status}" if status is not None else f"received {detail or 'no answer'}"
    if status is not None and detail:
        what += f", {detail}"
    return what


def tell(line: dict[str, Any]) -> str:
    at = _clock(line.get("at"))
    event = line.get("event")
    detail = line.get("detail")
    if event == "submitted":
        text = f"submitted, state {line.get('provider_state')}{_next(line)}"
    elif event == "polled":
        text = _answer(line) + _next(line)
    elif event == "finished":
        text = f"{_answer(line)}, finished: {line.get('decision')}"
    elif event == "refused":
        text = (
            f"refused {line.get('count', 1)} early calls before {_clock(line.get('next_poll_at'))}"
        )
    elif event == "escalated":
        polled = line.get("actor") == "gateway" and line.get("http_status") is not None
        cause = f"{_answer(line)}; " if polled else ""
        text = f"{cause}escalated: {line.get('reason')} ({detail})"
    elif event == "notified":
        text = f"escalation webhook {detail}"
    else:
        by = f" by {line.get('actor')}" if line.get("actor") else ""
        text = f"{event}{by}" + (f": {detail}" if detail else "") + _next(line)
    return f"{at} {text}"


def story(lines: Iterable[dict[str, Any]], operation_id: str) -> list[str]:
    return [tell(line) for line in lines if line.get("operation_id") == operation_id]
