"""What ``statusgate policy show`` prints and what ``statusgate schema policy`` relaxes for
shapes (SPEC 22).

``show``: the effective policy (its shape's defaults merged under the file, validated,
every default spelled out) as YAML that ``check`` reads back to the same policy. Durations,
sizes and rates are written as the file would write them. A secret is never printed: it is
shown as the ``${...}`` source it was written with (``Bearer ${OPENAI_API_KEY}``), or as
``<redacted>`` when the file holds it literally.

Pure: a validated policy and its raw (uninterpolated) tree in, text out.
"""

from __future__ import annotations

import re
import types
import typing
from typing import Any

import pydantic
import yaml
from pydantic import WithJsonSchema
from pydantic.fields import FieldInfo

from gateway.settings.loading import DURATION_PATTERN, SIZE_PATTERN
from gateway.settings.policy import RATE, ProviderPolicy
from gateway.settings.shapes import filled_paths
from gateway.settings.units import format_duration, format_size

REDACTED = "<redacted>"
# a written secret that is all variables, with at most a scheme word before them
_SOURCE = re.compile(r"(?:[A-Za-z]+ )?(?:\$\{[^{}]+\})+")


def show(policy: ProviderPolicy, raw: dict[str, Any]) -> str:
    """The effective ``policy`` as YAML; ``raw`` is its file with the shape merged under it,
    before ``${...}`` interpolation (where secrets' sources are read)."""
    tree = written(policy, raw)
    return yaml.safe_dump(tree, sort_keys=False, allow_unicode=True, width=100)


def written(value: Any, raw: Any) -> Any:
    """``value`` (a settings model, list or scalar) as its YAML would write it."""
    if isinstance(value, pydantic.BaseModel):
        out: dict[str, Any] = {}
        for name, info in type(value).model_fields.items():
            key = info.alias or name
            item = getattr(value, name)
            source = raw.get(key) if isinstance(raw, dict) else None
            out[key] = _field(info, item, source)
        return out
    if isinstance(value, list):
        sources = raw if isinstance(raw, list) and len(raw) == len(value) else [None] * len(value)
        return [written(item, source) for item, source in zip(value, sources, strict=True)]
    if isinstance(value, dict):
        return {
            k: written(v, raw.get(k) if isinstance(raw, dict) else None) for k, v in value.items()
        }
    return value


def _field(info: FieldInfo, item: Any, source: Any) -> Any:
    if item is None:
        return None
    if info.repr is False:  # a secret: its source, never its value
        return source if isinstance(source, str) and _SOURCE.fullmatch(source) else REDACTED
    pattern = _pattern(info)
    if pattern == DURATION_PATTERN and isinstance(item, int | float):
        return format_duration(float(item))
    if pattern == SIZE_PATTERN and isinstance(item, int):
        return format_size(item)
    if pattern is not None and pattern.startswith("^\\d+(\\.\\d+)?/") and isinstance(item, float):
        return _rate(item)
    return written(item, source)


def _pattern(info: FieldInfo) -> str | None:
    for meta in info.metadata:
        if isinstance(meta, WithJsonSchema) and isinstance(meta.json_schema, dict):
            pattern = meta.json_schema.get("pattern")
            return pattern if isinstance(pattern, str) else None
    return None


def _rate(per_second: float) -> str:
    """A rate in the largest unit that keeps it whole ("20/s", "600/m"), read back exactly."""
    for unit, seconds in (("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        count = per_second * seconds
        if abs(count - round(count)) < 1e-9:
            text = f"{round(count)}/{unit}"
            if RATE.fullmatch(text):
                return text
    return f"{per_second * 3600.0!r}/h"


# -- the JSON Schema of a policy file, which may leave to its shape what a shape fills ----


def relaxed(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` (the policy schema) with every field some shape fills no longer
    required, so editors accept a shaped file; ``check`` still requires the effective
    policy to have them."""
    defs = document.get("$defs", {})
    for path in filled_paths():
        model: type[pydantic.BaseModel] | None = ProviderPolicy
        for part in path[:-1]:
            model = _model_of(model, part) if model is not None else None
        if model is None:
            continue
        node = document if model is ProviderPolicy else defs.get(model.__name__, {})
        required = node.get("required")
        if isinstance(required, list) and path[-1] in required:
            required.remove(path[-1])
            if not required:
                del node["required"]
    return document


def _model_of(model: type[pydantic.BaseModel], name: str) -> type[pydantic.BaseModel] | None:
    """The settings model a field of ``model`` holds (through ``X | None``), if any."""
    info = model.model_fields.get(name)
    if info is None:
        return None
    annotation = info.annotation
    candidates = (
        typing.get_args(annotation)
        if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union
        else (annotation,)
    )
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, pydantic.BaseModel):
            return candidate
    return None
