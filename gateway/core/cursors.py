"""Opaque page cursors over operations listed newest first (the operator API, MCP tasks).

A cursor is the position after the last operation shown, ``(started_at, operation_id)``,
base64url-encoded JSON: stable while new operations arrive. Pure; anything a cursor decodes
to that this module did not write is refused with ValueError.
"""

from __future__ import annotations

import base64
import json
import math

from gateway.core.models import OperationRecord

MAX_CURSOR = 512  # characters: a cursor holds one start time and one operation id


def cursor_after(record: OperationRecord) -> str:
    """The position after ``record`` in list order."""
    raw = json.dumps([record.started_at, record.operation_id], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def position(cursor: object) -> tuple[float, str]:
    """A cursor back to its position; ValueError for anything not handed out here."""
    bad = ValueError("the cursor is not one this API handed out (use it as given)")
    if not isinstance(cursor, str) or len(cursor) > MAX_CURSOR:
        raise bad
    try:
        started, operation_id = json.loads(
            base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        )
    except (ValueError, TypeError, RecursionError):
        raise bad from None
    if isinstance(started, bool) or not isinstance(started, int | float):
        raise bad
    if not isinstance(operation_id, str) or not math.isfinite(started):
        raise bad
    return float(started), operation_id
