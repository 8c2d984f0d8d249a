"""Which declared route of a policy an agent's request is, if any (SPEC sections 4 and 12),
and the provider path a route is sent to.

Paths are matched still percent-encoded, so an encoded slash or dot can never smuggle a
different upstream path through a placeholder segment. Every placeholder matches one segment
that must look like a job id. A route's fixed query (``?terminate=true``) is not matched; it
is sent as written. The agent's path of a result route whose provider path takes a field of
the final answer (``{final.output_file_id}``) carries the job id in that segment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .decide import lookup
from .headers import valid_job_id
from .policy import PLACEHOLDER, ProviderPolicy, placeholders

KINDS = ("submit", "status", "result", "cancel")


@dataclass(frozen=True, slots=True)
class Match:
    kind: str  # submit, status, result, cancel or passthrough
    job_id: str | None
    params: Mapping[str, str] = field(default_factory=dict)  # every placeholder's segment

    @property
    def valid(self) -> bool:
        """Every segment a placeholder matched looks like a job id (SPEC 11)."""
        return all(valid_job_id(value) for value in self.params.values())


@dataclass(frozen=True, slots=True)
class _Route:
    kind: str
    method: str
    pattern: re.Pattern[str]
    names: tuple[str, ...]


class RouteTable:
    def __init__(self, policy: ProviderPolicy) -> None:
        self._routes: list[_Route] = []
        for kind in KINDS:
            route = getattr(policy.routes, kind)
            if route is not None:
                self._routes.append(_compile(kind, route.method, route.path))
        for route in policy.routes.passthrough:
            self._routes.append(_compile("passthrough", route.method, route.path))

    def match(self, method: str, raw_path: str) -> Match | None:
        """The first declared route for ``method`` and ``raw_path``, or None. Callers check
        ``valid`` before using the segments."""
        for route in self._routes:
            if route.method != method:
                continue
            found = route.pattern.fullmatch(raw_path)
            if found is None:
                continue
            params = dict(zip(route.names, found.groups(), strict=True))
            job_id = params.get("job_id")
            if job_id is None and route.kind == "result":
                job_id = next(iter(params.values()), None)
            return Match(route.kind, job_id, params)
        return None


def _compile(kind: str, method: str, template: str) -> _Route:
    path = template.partition("?")[0]
    names = tuple(placeholders(path))
    parts = PLACEHOLDER.split(path)  # literal, name, literal, name, ..., literal
    regex = "".join(re.escape(part) if i % 2 == 0 else "([^/?#]+)" for i, part in enumerate(parts))
    return _Route(kind, method, re.compile(regex), names)


def fill(template: str, values: Mapping[str, str], agent_query: str = "") -> str:
    """The provider path (and query) of a route: placeholders filled from ``values``, the
    route's fixed query kept, then ``agent_query`` (already filtered) appended."""
    path = PLACEHOLDER.sub(lambda m: values[m.group(1)], template)
    if agent_query:
        path += ("&" if "?" in path else "?") + agent_query
    return path


def final_values(template: str, final_body: Any) -> dict[str, str] | str:
    """Values of the template's ``{final.<field>}`` placeholders read from the stored final
    answer, or the name of the first one that is missing (or not a valid id)."""
    values: dict[str, str] = {}
    for name in placeholders(template):
        if not name.startswith("final."):
            continue
        value = lookup(final_body, name.removeprefix("final."))
        if isinstance(value, bool) or not isinstance(value, str | int):
            return name.removeprefix("final.")
        if not valid_job_id(str(value)):
            return name.removeprefix("final.")
        values[name] = str(value)
    return values
