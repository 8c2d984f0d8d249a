"""Reading YAML files into validated settings: ${ENV} interpolation and file:field errors.

Shared by config.py and policy.py. Every problem a user can cause becomes one line
``file: field.path: message``; no traceback and no secret value ever reaches that line.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

import pydantic
import yaml
from pydantic import BeforeValidator, WithJsonSchema

from gateway import ConfigError
from gateway.settings.units import parse_duration, parse_size

# ${NAME}, ${NAME:-default}, ${file:/path}, $$ (a literal $) and, to be reported, a bare $NAME
_VAR = re.compile(
    r"\$\$|\$\{file:(?P<file>[^}]+)\}"
    r"|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::-(?P<default>[^}]*))?\}"
    r"|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)"
)
MAX_SECRET_FILE = 64 * 1024  # a mounted secret is a token or a key, never a large file
M = TypeVar("M", bound=pydantic.BaseModel)


# Durations and sizes are written as strings ("5s", "8MiB") and held as numbers; the JSON
# Schema (statusgate schema) describes what is written.
DURATION_PATTERN = r"^\d+(\.\d+)?(ms|s|m|h|d)$"
SIZE_PATTERN = r"^\d+(B|KiB|MiB|GiB|KB|MB|GB)$"
Duration = Annotated[
    float,
    BeforeValidator(parse_duration),
    WithJsonSchema({"type": "string", "pattern": DURATION_PATTERN}),
]
Size = Annotated[
    int,
    BeforeValidator(parse_size),
    WithJsonSchema({"type": "string", "pattern": SIZE_PATTERN}),
]


class Strict(pydantic.BaseModel):
    """Base for every settings model: frozen, unknown keys rejected, no silent coercion."""

    model_config = pydantic.ConfigDict(
        extra="forbid", frozen=True, strict=True, use_attribute_docstrings=True
    )


def read_yaml(path: Path, shown: str) -> dict[str, Any]:
    """The mapping in ``path``; ``shown`` is how the file is named in messages."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{shown}: cannot read file ({exc.strerror})"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([yaml_problem(exc, text, shown)]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{shown}: (top): must be a mapping of keys"])
    return data


def yaml_problem(exc: yaml.YAMLError, text: str, shown: str) -> str:
    """``file: line L, column C: problem`` and, below it, the line with a caret under C."""
    problem = getattr(exc, "problem", None) or "invalid YAML"
    lines = text.splitlines()
    for mark in (getattr(exc, "problem_mark", None), getattr(exc, "context_mark", None)):
        if mark is not None and mark.line < len(lines):
            source = lines[mark.line].expandtabs(1)
            column = min(mark.column, len(source))
            where = f"line {mark.line + 1}, column {column + 1}"
            return f"{shown}: {where}: {problem}\n    {source}\n    {' ' * column}^"
    mark = getattr(exc, "problem_mark", None)
    where = "end of file" if mark is not None else "document"
    return f"{shown}: {where}: {problem}"


def interpolate(
    tree: Any,
    shown: str,
    env: Mapping[str, str],
    path: str = "",
    folder: Path | None = None,
) -> tuple[Any, list[str]]:
    """Replace ``${NAME}`` (or ``${NAME:-default}``: the default when NAME is unset or
    empty) and ``${file:/path}`` (a mounted secret, relative paths from ``folder``) in every
    string; ``$$`` is a literal ``$``. A missing or empty variable, an unreadable file and a
    bare ``$NAME`` (which would be sent as written) are problems naming the variable or the
    file, never a value."""
    problems: list[str] = []

    def visit(node: Any, where: str) -> Any:
        if isinstance(node, str):

            def sub(match: re.Match[str]) -> str:
                found = _substitute(match, env, folder)
                if isinstance(found, Problem):
                    problems.append(f"{shown}: {where}: {found.message}")
                    return ""
                return found

            return _VAR.sub(sub, node)
        if isinstance(node, dict):
            return {k: visit(v, f"{where}.{k}" if where else str(k)) for k, v in node.items()}
        if isinstance(node, list):
            return [visit(v, f"{where}[{i}]") for i, v in enumerate(node)]
        return node

    return visit(tree, path), problems


class Problem:
    """What went wrong with one substitution (a message without any value)."""

    def __init__(self, message: str) -> None:
        self.message = message


def _substitute(match: re.Match[str], env: Mapping[str, str], folder: Path | None) -> str | Problem:
    if match.group(0) == "$$":
        return "$"
    if match.group("file") is not None:
        return read_secret_file(match.group("file"), folder)
    bare = match.group("bare")
    if bare is not None:
        return Problem(
            f"${bare} is sent as written: write ${{{bare}}} (or $${bare} for a literal $)"
        )
    name, default = match.group("name"), match.group("default")
    if default is not None:
        return env.get(name) or default
    if name not in env:
        return Problem(f"environment variable {name} is not set")
    if not env[name]:
        return Problem(f"environment variable {name} is empty (${{{name}:-}} if empty is meant)")
    return env[name]


def read_secret_file(written: str, folder: Path | None) -> str | Problem:
    """The text of a mounted secret file without its final newline; read again at every
    load, so a reload picks up a rotated secret."""
    path = Path(written.strip())
    if not path.is_absolute() and folder is not None:
        path = folder / path
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_SECRET_FILE + 1)
    except OSError as exc:
        return Problem(f"secret file {written.strip()}: cannot read ({exc.strerror})")
    if len(data) > MAX_SECRET_FILE:
        return Problem(f"secret file {written.strip()}: larger than {MAX_SECRET_FILE} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return Problem(f"secret file {written.strip()}: is not UTF-8 text")
    text = text.removesuffix("\n").removesuffix("\r")
    if not text:
        return Problem(f"secret file {written.strip()}: is empty")
    return text


def validate(model: type[M], data: dict[str, Any], shown: str) -> M:
    """``data`` as ``model``, or ConfigError with one line per problem."""
    found, problems = validate_all(model, data, shown)
    if found is None or problems:
        raise ConfigError(problems)
    return found


def validate_all(model: type[M], data: dict[str, Any], shown: str) -> tuple[M | None, list[str]]:
    """Every validation problem of ``data``, and a model to cross-check when one can be made.

    Pydantic reports every field problem at once, but a model only exists when there are
    none; so the fields in error are dropped (falling back to their defaults) and the rest
    validated again, which gives the cross-field rules (``check``'s next phase) a model to
    look at. Their findings about dropped fields are the caller's to discard (``pruned``).
    """
    try:
        return model.model_validate(data), []
    except pydantic.ValidationError as exc:
        errors = exc.errors()
    problems = [_line(shown, err) for err in errors]
    pruned = copy.deepcopy(data)
    for _ in range(5):  # each round drops what failed, then what a dropped field leaves short
        if not _prune(pruned, [_failed(err) for err in errors]):
            return None, problems
        try:
            return model.model_validate(pruned), problems
        except pydantic.ValidationError as exc:
            errors = exc.errors()
    return None, problems


def _failed(err: Any) -> tuple[Any, ...]:
    """What to drop for one error: the field, or for a required field that is missing the
    object that needs it (an account without its token is left out; a file without a
    required top-level key cannot be cross-checked: the empty location drops nothing)."""
    loc: tuple[Any, ...] = tuple(err["loc"])
    return loc[:-1] if err["type"] == "missing" else loc


def _prune(data: Any, locations: list[tuple[Any, ...]]) -> bool:
    """Remove the deepest existing node of each location; True if anything was removed."""
    targets: list[tuple[Any, Any]] = []
    for loc in locations:
        if not loc:
            continue
        parent, key, node = None, None, data
        for part in loc:
            if not _holds(node, part):  # a union member's name, or not there: drop the holder
                break
            parent, key, node = node, part, node[part]
        if parent is not None:
            targets.append((parent, key))
    # list items from the highest index down, so earlier removals do not shift later ones
    targets.sort(key=lambda t: t[1] if isinstance(t[1], int) else -1, reverse=True)
    removed = False
    seen: set[tuple[int, Any]] = set()
    for parent, key in targets:
        if (id(parent), key) in seen:
            continue
        seen.add((id(parent), key))
        del parent[key]
        removed = True
    return removed


def _holds(node: Any, part: Any) -> bool:
    if isinstance(node, dict):
        return part in node
    return isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)


def field_of(problem: str, shown: str) -> str:
    """The field path of a ``file: field: message`` line."""
    return problem.removeprefix(f"{shown}: ").partition(": ")[0]


def related(one: str, other: str) -> bool:
    """True when one field path is the other or lies within it."""
    return any(a == b or a.startswith((b + ".", b + "[")) for a, b in ((one, other), (other, one)))


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
