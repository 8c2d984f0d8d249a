"""Provider values as the gateway keeps them: bounded.

A provider can answer anything. What of its answer enters a record, an audit line, an
escalation, a header or the console (an unknown state, a detail) is at most ``MAX_VALUE``
bytes of UTF-8; a longer value keeps its first ``KEPT`` bytes and a marker with its size
and SHA-256, so it can still be matched against the provider's own logs. Pure.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson

MAX_VALUE = 256  # bytes of a provider value kept whole
KEPT = 96  # bytes of a longer value kept before the marker


def bounded(text: str) -> str:
    """``text`` as valid UTF-8 of at most MAX_VALUE bytes: itself when it fits, else its
    start and ``…[truncated: N bytes, sha256 HEX]``. Bounding a bounded value changes
    nothing."""
    raw = text.encode("utf-8", "replace")  # a JSON string may hold lone surrogates: "?"
    if len(raw) <= MAX_VALUE:
        return raw.decode("utf-8")
    start = raw[:KEPT].decode("utf-8", "ignore")  # never half a character
    digest = hashlib.sha256(raw).hexdigest()
    return f"{start}…[truncated: {len(raw)} bytes, sha256 {digest}]"


def parse_json(body: bytes) -> Any:
    """A provider's or agent's JSON body, or None when it is not JSON. orjson first (several
    times faster; every answer is parsed on the hot path), then the json module for what
    orjson refuses and json reads (integers past 64 bits, UTF-16 bodies), so what parses
    does not depend on which parser ran."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def lookup(data: Any, dotted: str | None) -> Any:
    """The value at a dotted path in parsed JSON, or None when any step is missing."""
    if dotted is None:
        return None
    node = data
    for part in dotted.split("."):
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.isascii() and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
