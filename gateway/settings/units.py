"""Durations ("500ms", "5s", "40m", "24h") and sizes ("512KiB", "8MiB") as written in YAML.

Pure parsing; raises ValueError with a message fit to follow "file: field: ".
"""

from __future__ import annotations

import functools
import math
import re
import time

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE = re.compile(r"(\d+)(B|KiB|MiB|GiB|KB|MB|GB)")
_SIZE_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "KB": 1000, "MB": 1000**2}
_SIZE_UNITS["GB"] = 1000**3
MAX_DURATION = 366 * 86400.0


def parse_duration(text: object) -> float:
    """Seconds in a duration string; at most a year, so arithmetic stays finite."""
    match = _DURATION.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError('must be a duration like "5s" (units ms, s, m, h, d)')
    seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if not math.isfinite(seconds) or seconds > MAX_DURATION:
        raise ValueError("must be a duration of at most 366d")
    return seconds


def parse_size(text: object) -> int:
    """Bytes in a size string."""
    match = _SIZE.fullmatch(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError('must be a size like "8MiB" (units B, KiB, MiB, GiB, KB, MB, GB)')
    return int(match.group(1)) * _SIZE_UNITS[match.group(2)]


def format_duration(seconds: float) -> str:
    """The shortest exact spelling of ``seconds`` in the units parse_duration reads."""
    for unit in ("d", "h", "m", "s"):
        count = seconds / _DURATION_UNITS[unit]
        if count >= 1 and count == int(count):
            return f"{int(count)}{unit}"
    return f"{round(seconds * 1000)}ms"


def format_size(size: int) -> str:
    """The shortest exact spelling of ``size`` bytes in binary units parse_size reads."""
    for unit in ("GiB", "MiB", "KiB"):
        count = size / _SIZE_UNITS[unit]
        if count >= 1 and count == int(count):
            return f"{int(count)}{unit}"
    return f"{size}B"


def rfc3339(instant: float, *, millis: bool = False) -> str:
    """An instant as RFC 3339 UTC with a ``Z``; milliseconds when asked. The whole seconds
    are formatted once (cached): the same deadlines and next-poll times come back for every
    refusal of an operation, and audit lines of one second share theirs."""
    whole = math.floor(instant)
    if millis:
        return f"{_seconds(whole)}.{min(999, round((instant - whole) * 1000)):03d}Z"
    return _seconds(whole) + "Z"


@functools.lru_cache(maxsize=4096)
def _seconds(whole: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
