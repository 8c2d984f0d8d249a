"""An operation's audit lines told as a story, one line per event (``statusgate audit story``),
and the lines of several replicas merged into one story, each line naming its replica.

Pure: audit line dicts in, text lines out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

GUIDED = {"provider_retry_after", "provider_poll_hint"}


def _clock(stamp: object) -> str:
    """``2026-11-30T10:20:05.123Z`` -> ``10:20:05``."""
    return stamp[11:19] if isinstance(stamp, str) and len(stamp) >= 19 else "--:--:--"


def readable(line: object) -> bool:
    """Whether an audit line read back (from a file or a store, so possibly tampered with)
    can be told: a JSON object with a whole-number ``seq``, and ``at`` and ``event`` as
    text. Its other members are told whatever their type."""
    if not isinstance(line, dict):
        return False
    seq = line.get("seq")
    return (
        isinstance(seq, int)
        and not isinstance(seq, bool)
        and isinstance(line.get("at"), str)
        and isinstance(line.get("event"), str)
    )


def unreadable_note(count: int) -> str | None:
    """What a story says of the lines it left out as unreadable; None when there were none."""
    if count == 0:
        return None
    return f"{count} line{'' if count == 1 else 's'} unreadable (left out)"


def _next(line: dict[str, Any]) -> str:
    if line.get("next_poll_at") is None:
        return ""
    source = line.get("delay_source") or "local_backoff"
    told = "provider guidance" if source in GUIDED else source
    return f", next poll {_clock(line['next_poll_at'])} from {told}"


def _answer(line: dict[str, Any]) -> str:
    status = line.get("http_status")
    detail = line.get("detail") or ""
    if isinstance(status, int) and 200 <= status < 300:
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
            f"refused {_many(line.get('count', 1), 'early call')} before "
            f"{_clock(line.get('next_poll_at'))}"
        )
    elif event == "escalated":
        polled = line.get("actor") == "gateway" and line.get("http_status") is not None
        cause = f"{_answer(line)}; " if polled else ""
        text = f"{cause}escalated: {line.get('reason')} ({detail})"
    elif event == "message_sent":  # an A2A caller's follow-up: the task it came back with
        said = f": {detail}" if detail else ""
        text = f"message_sent{said}, state {line.get('provider_state')}{_next(line)}"
    elif event == "notified":
        text = f"escalation webhook {detail}"
    else:
        by = f" by {line.get('actor')}" if line.get("actor") else ""
        text = f"{event}{by}" + (f": {detail}" if detail else "") + _next(line)
    return f"{at} {text}"


def story(lines: Iterable[dict[str, Any]], operation_id: str) -> list[str]:
    return [tell(line) for line in lines if line.get("operation_id") == operation_id]


@dataclass(frozen=True, slots=True)
class Entry:
    """One audit line and where it came from: the replica (or file) that wrote it and its
    chain, so the lines of several replicas are told together and each named."""

    replica: str
    chain: str
    seq: int
    line: dict[str, Any]


def merged(entries: Iterable[Entry]) -> list[Entry]:
    """Every replica's lines in time order (``at`` is RFC 3339 UTC with milliseconds, so
    its text sorts as the instants do; ties by replica, then seq), a line seen twice (in a
    replica's file and in the store's copy of it) once."""
    seen: dict[tuple[str, int], Entry] = {}
    for entry in entries:
        seen.setdefault((entry.chain, entry.seq), entry)
    return sorted(seen.values(), key=lambda e: (str(e.line.get("at") or ""), e.replica, e.seq))


def labels(entries: Iterable[Entry]) -> dict[str, str]:
    """The name each chain is told by: its replica's, with the chain's first digits when two
    chains share one (two processes on one host, or a replica whose file started over)."""
    names: dict[str, str] = {}
    for entry in entries:
        names.setdefault(entry.chain, entry.replica)
    shared = {name for name in names.values() if list(names.values()).count(name) > 1}
    return {
        chain: f"{name}/{chain[:8]}" if name in shared else name for chain, name in names.items()
    }


def told(entries: list[Entry], *, named: bool) -> list[str]:
    """The story of merged entries, each line naming its replica when ``named``."""
    if not named:
        return [tell(entry.line) for entry in entries]
    names = labels(entries)
    return [f"{tell(entry.line)} (replica {names[entry.chain]})" for entry in entries]


def _many(count: Any, noun: str) -> str:
    """``1 early call``, ``2 early calls``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
