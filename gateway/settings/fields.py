"""Field types the policy models share, and the checks of a route's path forms.

Header names, route paths and their ``{...}`` placeholders (SPEC 3, 12), the digest that
fingerprints settings without revealing them, and (SPEC 22) the checks of the further path
forms a route is served at (``also``) and of AWS ARN job ids (``routes.job_ids: aws-arn``).
Below policy.py and credential.py: it reads routes through a Protocol, never the models.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Protocol

from pydantic import AfterValidator

HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
PLACEHOLDER_NAME = re.compile(r"job_id\*|[a-z_][a-z0-9_]*|final(\.[A-Za-z0-9_-]+)+")


def _header_name(value: str) -> str:
    if not HEADER_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not a valid HTTP header name")
    return value


def _route_path(value: str) -> str:
    path, _, query = value.partition("?")
    if not path.startswith("/") or "#" in value or "{" in query or "?" in query:
        raise ValueError(
            "must be a path starting with /, optionally with a fixed query, without fragment"
        )
    for name in PLACEHOLDER.findall(path):
        if not PLACEHOLDER_NAME.fullmatch(name):
            raise ValueError(
                f"placeholder {{{name}}} must be a name like {{job_id}} or {{file_id}}"
            )
    return value


HeaderName = Annotated[str, AfterValidator(_header_name)]
RoutePath = Annotated[str, AfterValidator(_route_path)]


def placeholders(path: str) -> list[str]:
    """The names of a route path's ``{...}`` placeholders, in order."""
    return PLACEHOLDER.findall(path.partition("?")[0])


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# -- path forms (SPEC 22) --------------------------------------------------------------------


class _Match(Protocol):
    @property
    def headers(self) -> Mapping[str, str]: ...


class _Route(Protocol):
    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def also(self) -> Sequence[str]: ...
    @property
    def match(self) -> _Match | None: ...


class _Routes(Protocol):
    @property
    def passthrough(self) -> Sequence[_Route]: ...
    @property
    def job_ids(self) -> str: ...


def form_problems(routes: _Routes) -> list[tuple[str, str]]:
    """Every problem of the policy's path forms, as (field path, message): a route's
    ``also`` forms name exactly the placeholders its ``path`` names (the provider path is
    filled from whichever form matched), carry no query, and match no request another form
    matches; an aws-arn policy's job ids live in one ``{job_id}`` segment, never
    ``{job_id*}``."""
    problems: list[tuple[str, str]] = []
    for where, route in _named(routes):
        names = sorted(placeholders(route.path))
        for i, form in enumerate(route.also):
            at = f"{where}.also[{i}]"
            if "?" in form:
                problems.append((at, "takes no query: the provider is sent the route's path"))
            elif sorted(placeholders(form)) != names:
                problems.append((at, f"must name the same placeholders as {where}.path"))
            elif form == route.path or form in route.also[:i]:
                problems.append((at, "repeats a path this route is already served at"))
    if routes.job_ids == "aws-arn":
        for where, route in _named(routes):
            if any("{job_id*}" in p for p in (route.path, *route.also)):
                problems.append((f"{where}.path", "aws-arn job ids take {job_id}, not {job_id*}"))
    return problems + _overlaps(routes)


def _named(routes: _Routes) -> Iterator[tuple[str, _Route]]:
    for kind in ("submit", "status", "result", "cancel"):
        route: _Route | None = getattr(routes, kind)
        if route is not None:
            yield f"routes.{kind}", route
    for i, passthrough in enumerate(routes.passthrough):
        yield f"routes.passthrough[{i}]", passthrough


def _overlaps(routes: _Routes) -> list[tuple[str, str]]:
    """An ``also`` form that matches the requests of another form (two primary paths are
    policy.py's own check)."""
    seen: dict[tuple[str, str, str], tuple[str, bool]] = {}
    problems: list[tuple[str, str]] = []
    forms: list[tuple[str, _Route, str, bool]] = []
    for where, route in _named(routes):
        forms.append((f"{where}.path", route, route.path, False))
        forms += [(f"{where}.also[{i}]", route, p, True) for i, p in enumerate(route.also)]
        more: Sequence[str] = getattr(route, "more_paths", ())  # a submit's other endpoints
        forms += [(f"{where}.more_paths[{i}]", route, p, True) for i, p in enumerate(more)]
    for where, route, path, extra in forms:
        headers = route.match.headers if route.match is not None else {}
        key = (
            route.method,
            PLACEHOLDER.sub("{}", path.partition("?")[0]),
            json.dumps(sorted((k.lower(), v) for k, v in headers.items())),
        )
        if key in seen and (extra or seen[key][1]):
            other, _ = seen[key]
            at, named = (where, other) if extra else (other, where)
            problems.append((at, f"matches the same requests as {named}"))
        seen.setdefault(key, (where, extra))
    return problems
