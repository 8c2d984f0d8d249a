"""``Prefer: wait=N`` (RFC 7240): how long an agent asks a call to be held."""

from __future__ import annotations

import re
from collections.abc import Iterable

_WAIT = re.compile(r"wait\s*=\s*\"?(\d{1,9})\"?\s*$", re.IGNORECASE)
_BARE = re.compile(r"wait\s*$", re.IGNORECASE)


def prefer_wait(values: Iterable[str], bare: float | None = None) -> float | None:
    """Seconds asked for with ``Prefer: wait=N`` (RFC 7240), or None; the first one wins.
    A bare ``wait`` (no value: Replicate's SDK sends it, meaning "as long as you hold")
    gives ``bare``, which callers set to their longest hold; None by default."""
    for value in values:
        for preference in value.split(","):
            token = preference.split(";", 1)[0].strip()
            match = _WAIT.fullmatch(token)
            if match is not None:
                return float(match.group(1))
            if bare is not None and _BARE.fullmatch(token):
                return bare
    return None


def format_wait(seconds: float) -> str:
    return str(int(seconds)) if seconds == int(seconds) else f"{seconds:g}"
