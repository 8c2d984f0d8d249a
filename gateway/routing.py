"""Which declared route of a policy an agent's request is, if any (SPEC section 4).

Paths are matched still percent-encoded, so an encoded slash or dot can never smuggle a
different upstream path through the ``{job_id}`` segment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .policy import ProviderPolicy

KINDS = ("submit", "status", "result", "cancel")


@dataclass(frozen=True, slots=True)
class Match:
    kind: str  # submit, status, result or cancel
    job_id: str | None


@dataclass(frozen=True, slots=True)
class _Route:
    kind: str
    method: str
    pattern: re.Pattern[str]


class RouteTable:
    def __init__(self, policy: ProviderPolicy) -> None:
        self._routes: list[_Route] = []
        for kind in KINDS:
            route = getattr(policy.routes, kind)
            if route is not None:
                self._routes.append(_Route(kind, route.method, _compile(route.path)))

    def match(self, method: str, raw_path: str) -> Match | None:
        for route in self._routes:
            if route.method != method:
                continue
            found = route.pattern.fullmatch(raw_path)
            if found is not None:
                return Match(route.kind, found.groupdict().get("job_id"))
        return None


def _compile(template: str) -> re.Pattern[str]:
    before, marker, after = template.partition("{job_id}")
    if not marker:
        return re.compile(re.escape(template))
    return re.compile(f"{re.escape(before)}(?P<job_id>[^/?#]+){re.escape(after)}")


def fill(template: str, job_id: str) -> str:
    return template.replace("{job_id}", job_id)
