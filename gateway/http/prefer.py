"""``Prefer: wait=N`` (RFC 7240): how long an agent asks a status call to be held."""

from __future__ import annotations

import re
from collections.abc import Iterable

_WAIT = re.compile(r"wait\s*=\s*\"?(\d{1,9})\"?\s*$", re.IGNORECASE)


def prefer_wait(values: Iterable[str]) -> float | None:
    """Seconds asked for with ``Prefer: wait=N`` (RFC 7240), or None; the first one wins."""
    for value in values:
        for preference in value.split(","):
            match = _WAIT.fullmatch(preference.split(";", 1)[0].strip())
            if match is not None:
                return float(match.group(1))
    return None


def format_wait(seconds: float) -> str:
    return str(int(seconds)) if seconds == int(seconds) else f"{seconds:g}"
