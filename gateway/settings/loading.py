"""Reading YAML files into validated settings: ${ENV} interpolation and file:field errors.

Shared by config.py and policy.py. Every problem a user can cause becomes one line
``file: field.path: message``; no traceback and no secret value ever reaches that line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

import pydantic
import yaml
from pydantic import BeforeValidator, WithJsonSchema

from gateway.errors import ConfigError
from gateway.settings.units import parse_duration, parse_size

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
M = TypeVar("M", bound=pydantic.BaseModel)


# Durations and sizes are written as strings ("5s", "8MiB") and held as numbers; the JSON
# Schema (statusgate schema) describes what is written.
Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    WithJsonSchema({"type": "string", "pattern": r"^\d+(\.\d+)?(ms|s|m|h|d)$"}),
]
Size = Annotated[
    int,
    BeforeValidator(parse_size),
    WithJsonSchema({"type": "string", "pattern": r"^\d+(B|KiB|MiB|GiB|KB|MB|GB)$"}),
]


class Strict(pydantic.BaseModel):
    """Base for every settings model: frozen, unknown keys rejected, no silent coercion."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, strict=True)


def read_yaml(path: Path, shown: str) -> dict[str, Any]:
    """The mapping in ``path``; ``shown`` is how the file is named in messages."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{shown}: cannot read file ({exc.strerror})"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "document"
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError([f"{shown}: {where}: {problem}"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{shown}: (top): must be a mapping of keys"])
    return data


def interpolate(
    tree: Any, shown: str, env: Mapping[str, str], path: str = ""
) -> tuple[Any, list[str]]:
    """Replace ``${NAME}`` (or ``${NAME:-default}``: the default when NAME is unset or
    empty) in every string; missing variables are named, never their values."""
    problems: list[str] = []

    def visit(node: Any, where: str) -> Any:
        if isinstance(node, str):

            def sub(match: re.Match[str]) -> str:
                name, default = match.group(1), match.group(2)
                if default is not None:
                    return env.get(name) or default
                if name not in env:
                    problems.append(f"{shown}: {where}: environment variable {name} is not set")
                    return ""
                return env[name]

            return _VAR.sub(sub, node)
        if isinstance(node, dict):
            return {k: visit(v, f"{where}.{k}" if where else str(k)) for k, v in node.items()}
        if isinstance(node, list):
            return [visit(v, f"{where}[{i}]") for i, v in enumerate(node)]
        return node

    return visit(tree, path), problems


def validate(model: type[M], data: dict[str, Any], shown: str) -> M:
    """``data`` as ``model``, or ConfigError with one line per problem."""
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ConfigError([_line(shown, err) for err in exc.errors()]) from None


def _line(shown: str, err: Any) -> str:
    where = ""
    for part in err["loc"]:
        if isinstance(part, int):
            where += f"[{part}]"
        elif not str(part).startswith("function-"):
            where += f".{part}" if where else str(part)
    kind = err["type"]
    if kind == "extra_forbidden":
        message = "unknown key"
    elif kind == "missing":
        message = "is required"
    else:
        message = str(err["msg"]).removeprefix("Value error, ")
        message = message[:1].lower() + message[1:]
    return f"{shown}: {where or '(top)'}: {message}"


def http_url(value: str, *, query: bool = False) -> str:
    """``value`` if it is an absolute http(s) URL with a host, without a trailing slash."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    if (parts.query and not query) or parts.fragment or parts.username or parts.password:
        raise ValueError("must not carry a query, fragment or user info")
    return value if query else value.rstrip("/")


def load_env() -> dict[str, str]:
    return dict(os.environ)
