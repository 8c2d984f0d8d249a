"""OTLP/HTTP protobuf encoding of ended spans: an ``ExportTraceServiceRequest`` written field
by field from opentelemetry/proto/trace/v1/trace.proto.

Why not the SDK's encoder: it takes ~38 us per span (it walks generic SDK span objects and
builds protobuf messages), which made tracing cost a quarter of a forwarded poll; this one
takes a few microseconds, because a gateway's spans have one shape. tests/test_otlp.py
checks its output against the generated classes of ``opentelemetry-proto``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

AttributeValue = str | bool | int | float | Sequence[str | bool | int | float]
Event = tuple[int, str, Mapping[str, AttributeValue]]
"""A span event: when (ns since the epoch), its name, its attributes."""
_FIXED64 = struct.Struct("<Q")
_DOUBLE = struct.Struct("<d")
_FIXED32 = struct.Struct("<I")
_KEYS: dict[str, bytes] = {}


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field: tag byte (field number << 3 | 2), length, payload."""
    n = len(payload)
    if n < 0x80:
        return b"".join((_BYTE[tag], _BYTE[n], payload))
    if n < 0x4000:
        return b"".join((_BYTE[tag], _BYTE[(n & 0x7F) | 0x80], _BYTE[n >> 7], payload))
    return bytes((tag,)) + _varint(n) + payload


def _value(value: AttributeValue) -> bytes:
    """An AnyValue message's body."""
    if isinstance(value, str):
        return _field(0x0A, value.encode())
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise OverflowError("an int attribute must fit 64 bits")
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)  # int64: two's complement
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    items = b"".join(_field(0x0A, _value(item)) for item in value)  # ArrayValue.values
    return _field(0x2A, items)


def _attribute(key: str, value: AttributeValue) -> bytes:
    """A KeyValue message's body."""
    return (_KEYS.get(key) or _key(key)) + _field(0x12, _value(value))


def attributes(items: Mapping[str, AttributeValue]) -> bytes:
    """Attributes as the KeyValue fields of a Span (the caller keeps what repeats)."""
    return b"".join([_pair(key, value) for key, value in items.items()])


def repeating_attributes(items: Mapping[str, str | int]) -> bytes:
    """attributes() for values that repeat from span to span (method, route, status,
    provider): each combination is encoded once and kept, up to BLOCKS combinations. The
    values must be exact str or int: True == 1 == 1.0, and a kept block must never be
    given for another type's value."""
    shape = tuple(items.items())
    kept = _BLOCKS.get(shape)
    if kept is None:
        kept = attributes(items)
        if len(_BLOCKS) >= BLOCKS:
            _BLOCKS.clear()
        _BLOCKS[shape] = kept
    return kept


BLOCKS = 4096
_BLOCKS: dict[tuple[tuple[str, str | int], ...], bytes] = {}


def _pair(key: str, value: AttributeValue) -> bytes:
    """One attribute as a KeyValue field of a Span; a short string (a path, an id: the
    common case) is written in one go."""
    inner = _KEYS.get(key) or _key(key)
    if type(value) is str:
        encoded = value.encode()
        n = len(encoded)
        size = len(inner) + n + 4
        if size < 0x80:  # every length fits one byte
            return b"".join((_J, _BYTE[size], inner, _S, _BYTE[n + 2], _A, _BYTE[n], encoded))
    return _field(0x4A, inner + _field(0x12, _value(value)))


_BYTE = [bytes((n,)) for n in range(256)]
_J, _S, _A = b"\x4a", b"\x12", b"\x0a"  # Span.attributes, KeyValue.value, AnyValue.string


def _key(key: str) -> bytes:
    _KEYS[key] = encoded = _field(0x0A, key.encode())
    return encoded


_HEAD = struct.Struct(">HQQHQ")  # trace_id (as two halves) and span_id, with their tags
_PARENT = struct.Struct(">HQ")
_TIMES = struct.Struct("<BQBQ")  # start and end, fixed64 with their tags
_FLAGS = {  # SpanFlags: sampled, and whether the parent is remote (HAS_IS_REMOTE/IS_REMOTE)
    False: b"\x85\x01" + _FIXED32.pack(0x101),
    True: b"\x85\x01" + _FIXED32.pack(0x301),
}
_NAMES: dict[tuple[str, int], bytes] = {}


def span(
    trace_id: int,
    span_id: int,
    parent_id: int | None,
    remote: bool,
    state: str | None,
    name: str,
    kind: int,
    start: int,
    end: int,
    attrs: bytes,
    error: str | None,
    events: Sequence[Event] | None = None,
) -> bytes:
    """One sampled span (a Span message, with its tag and length); ``attrs`` as from
    attributes()."""
    parts = [_HEAD.pack(0x0A10, trace_id >> 64, trace_id & _LOW64, 0x1208, span_id)]
    if state:
        parts.append(_field(0x1A, state.encode()))
    if parent_id is not None:
        parts.append(_PARENT.pack(0x2208, parent_id))
    named = _NAMES.get((name, kind))
    if named is None:
        named = _field(0x2A, name.encode()) + bytes((0x30, kind))
        if len(_NAMES) < 1024:
            _NAMES[(name, kind)] = named
    parts += (named, _TIMES.pack(0x39, start, 0x41, end), attrs)
    for at, event_name, event_attrs in events or ():
        encoded = b"".join(_field(0x1A, _attribute(k, v)) for k, v in event_attrs.items())
        event = b"\x09" + _FIXED64.pack(at) + _field(0x12, event_name.encode()) + encoded
        parts.append(_field(0x5A, event))
    if error is not None:
        parts.append(_field(0x7A, _field(0x12, error.encode()) + b"\x18\x02"))  # ERROR
    parts.append(_FLAGS[remote])
    return _field(0x12, b"".join(parts))


_LOW64 = (1 << 64) - 1


def request(resource: bytes, scope: bytes, spans: Iterable[bytes]) -> bytes:
    """An ExportTraceServiceRequest holding ``spans`` (from span()) of one resource and
    scope; ``resource`` and ``scope`` as from resource_and_scope()."""
    scope_spans = _field(0x12, scope + b"".join(spans))
    return _field(0x0A, resource + scope_spans)


def resource_and_scope(resource: Mapping[str, Any], name: str, version: str) -> tuple[bytes, bytes]:
    """The Resource field of ResourceSpans and the InstrumentationScope field of ScopeSpans,
    encoded once."""
    scope = _field(0x0A, _field(0x0A, name.encode()) + _field(0x12, version.encode()))
    encoded = b"".join(_field(0x0A, _attribute(k, v)) for k, v in resource.items())
    return _field(0x0A, encoded), scope
