"""Which declared route of a policy an agent's request is, if any (SPEC sections 4 and 12),
and the provider path a route is sent to.

Paths are matched still percent-encoded, so an encoded slash or dot can never smuggle a
different upstream path through a placeholder segment. Every placeholder matches one segment
that must look like a job id. A route's fixed query (``?terminate=true``) is not matched; it
is sent as written. The agent's path of a result route whose provider path takes a field of
the final answer (``{final.output_file_id}``) carries the job id in that segment.

A route's ``also`` forms (SPEC 22) are matched like its path and fill the provider path the
same way. Under ``routes.job_ids: aws-arn`` the ``{job_id}`` segment is decoded once
(gateway/core/arns.py): the match carries the ARN (or plain id) itself, checked as such.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from gateway.core import arns
from gateway.core.models import OperationRecord
from gateway.core.values import lookup, parse_json
from gateway.settings.policy import (
    PLACEHOLDER,
    Passthrough,
    ProviderPolicy,
    Route,
    RouteMatch,
    SubmitRoute,
    placeholders,
)

KINDS = ("submit", "status", "result", "cancel")


JOB_ID = re.compile(r"[A-Za-z0-9._~-]{1,200}")
MAX_SEGMENTS = 8


def valid_job_id(job_id: str) -> bool:
    """One segment of ``[A-Za-z0-9._~-]{1,200}``, not ``.`` or ``..`` (SPEC 11)."""
    return JOB_ID.fullmatch(job_id) is not None and job_id not in (".", "..")


def valid_job_path(job_id: str) -> bool:
    """A ``{job_id*}`` resource name: 1 to 8 valid segments joined by ``/`` (SPEC 12)."""
    segments = job_id.split("/")
    return len(segments) <= MAX_SEGMENTS and all(valid_job_id(s) for s in segments)


@dataclass(frozen=True, slots=True)
class Match:
    kind: str  # submit, status, result, cancel or passthrough
    job_id: str | None
    params: Mapping[str, str] = field(default_factory=dict)  # every placeholder's segment
    arn_ids: bool = False  # {job_id} holds a decoded ARN or plain id (aws-arn)
    sent: str | None = None  # the provider path of the form that matched, when not the route's

    @property
    def valid(self) -> bool:
        """Every segment a placeholder matched looks like a job id (SPEC 11); a
        ``{job_id*}`` match is checked segment by segment (SPEC 12); an aws-arn
        ``{job_id}`` is an ARN or a plain id (SPEC 22)."""
        return all(_valid_param(name, value, self.arn_ids) for name, value in self.params.items())


def _valid_param(name: str, value: str, arn_ids: bool) -> bool:
    if name == "job_id*":
        return valid_job_path(value)
    if name == "job_id" and arn_ids:
        return arns.valid(value)
    return valid_job_id(value)


@dataclass(frozen=True, slots=True)
class _Route:
    kind: str
    method: str
    pattern: re.Pattern[str]
    names: tuple[str, ...]
    match: RouteMatch | None
    sent: str | None = None  # a submit's more_paths form: sent as it is written


class RouteTable:
    def __init__(self, policy: ProviderPolicy) -> None:
        self._routes: list[_Route] = []
        self._arn_ids = policy.routes.job_ids == "aws-arn"
        for kind in KINDS:
            route = getattr(policy.routes, kind)
            if route is not None:
                self._routes += _compile(kind, route)
        for route in policy.routes.passthrough:
            self._routes += _compile("passthrough", route)
        # routes with a header match are tried first: they are the more specific ones
        self._routes.sort(key=lambda r: r.match is None)

    def match(
        self, method: str, raw_path: str, headers: Mapping[str, str] | None = None
    ) -> Match | None:
        """The first declared route for ``method``, ``raw_path`` and (for routes with a
        ``match``) ``headers``, or None. Callers check ``valid`` before using segments."""
        for route in self._routes:
            if route.method != method:
                continue
            if route.match is not None and (headers is None or not route.match.accepts(headers)):
                continue
            found = route.pattern.fullmatch(raw_path)
            if found is None:
                continue
            params = dict(zip(route.names, found.groups(), strict=True))
            if self._arn_ids and "job_id" in params:
                params["job_id"] = arns.decoded(params["job_id"])
            job_id = params.get("job_id") or params.get("job_id*")
            if job_id is None and route.kind == "result":
                job_id = next(iter(params.values()), None)
            return Match(route.kind, job_id, params, self._arn_ids, route.sent)
        return None


def _compile(kind: str, route: Route | SubmitRoute | Passthrough) -> list[_Route]:
    """The route's path and each of its ``also`` forms, as patterns of one kind."""
    compiled = []
    more = tuple(route.more_paths) if isinstance(route, SubmitRoute) else ()
    for form in (route.path, *route.also, *more):
        path = form.partition("?")[0]
        names = tuple(placeholders(path))
        parts = PLACEHOLDER.split(path)  # literal, name, literal, name, ..., literal
        regex = "".join(
            re.escape(part) if i % 2 == 0 else ("([^?#]+)" if part == "job_id*" else "([^/?#]+)")
            for i, part in enumerate(parts)
        )
        sent = form if form in more else None
        compiled.append(_Route(kind, route.method, re.compile(regex), names, route.match, sent))
    return compiled


def fill(template: str, values: Mapping[str, str], agent_query: str = "") -> str:
    """The provider path (and query) of a route: placeholders filled from ``values``
    (``{job_id*}`` from ``job_id``), the route's fixed query kept, then ``agent_query``
    (already filtered) appended. A ``{job_id}`` is percent-encoded as one segment, as
    boto3 sends an ARN (a SPEC 11 id is left as it is)."""

    def value(found: re.Match[str]) -> str:
        name = found.group(1)
        if name == "job_id":
            return arns.encoded(values[name])
        return values[name] if name in values else values[name.rstrip("*")]

    path = PLACEHOLDER.sub(value, template)
    if agent_query:
        path += ("&" if "?" in path else "?") + agent_query
    return path


def kept_values(params: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """A submit match's named segments besides the job (fal's owner and app), kept on the
    operation as (name, value) pairs: its status and cancel routes are filled from them."""
    return tuple(sorted((k, v) for k, v in params.items() if k not in ("job_id", "job_id*")))


def job_values(record: OperationRecord) -> dict[str, str]:
    """What a tracked route of the record's job is filled from: the job id and the values
    its submit was sent to."""
    return {**dict(record.route_values), "job_id": record.provider_job_id}


FINAL_SEGMENT = re.compile(r"[A-Za-z0-9._~:-]{1,200}")  # a job id's, and ":" (files/a:download)
FINAL_QUERY = re.compile(r"[A-Za-z0-9._~-]+=[A-Za-z0-9._~-]*(&[A-Za-z0-9._~-]+=[A-Za-z0-9._~-]*)*")


@dataclass(frozen=True, slots=True)
class Finals:
    """The ``{final.<field>}`` values of a result path, and the query their URLs carried."""

    values: dict[str, str]
    query: str = ""


def final_values(template: str, final_body: Any, upstream: str) -> Finals | str:
    """Values of the template's ``{final.<field>}`` placeholders read from the stored final
    answer, or why one cannot be used (it is missing, or unsafe).

    A value may be one segment, a resource name of up to 8 (``files/abc``,
    ``accounts/a/datasets/d``), or a URL on the policy's ``upstream`` origin and under its
    path (Veo's video ``uri``), which gives its path below the upstream and its query.
    Every segment is checked as a job id's (plus ``:``): never empty, ``.`` or ``..``, no
    ``%``, ``?``, ``#`` or ``\\``, so no value can climb out of the route's path, smuggle a
    query, or reach another host."""
    values: dict[str, str] = {}
    queries: list[str] = []
    for name in placeholders(template):
        if not name.startswith("final."):
            continue
        field = name.removeprefix("final.")
        value = lookup(final_body, field)
        if isinstance(value, bool) or not isinstance(value, str | int):
            return f"its final answer has no usable {field!r}"
        found = _final_path(str(value), upstream)
        if isinstance(found, str):
            return f"{field!r} is {found}"
        values[name], query = found
        if query:
            queries.append(query)
    return Finals(values, "&".join(queries))


def _final_path(value: str, upstream: str) -> tuple[str, str] | str:
    """(path, query) of one final value, or what is wrong with it."""
    query = ""
    if value.lower().startswith(("http://", "https://")):
        try:
            url, base = urlsplit(value), urlsplit(upstream)
            origin = f"{url.scheme}://{url.netloc}".lower()
            same = origin == f"{base.scheme}://{base.netloc}".lower() and url.port == base.port
        except ValueError:
            return "not a valid URL"
        if not same:
            return f"a URL on another origin ({origin}), which the gateway never contacts"
        prefix = base.path.rstrip("/") + "/"
        if not url.path.startswith(prefix) or url.fragment:
            return f"a URL outside the provider's API ({prefix})"
        value, query = url.path.removeprefix(prefix), url.query
        if query and FINAL_QUERY.fullmatch(query) is None:
            return "a URL whose query the gateway does not forward"
    segments = value.split("/")
    if len(segments) > MAX_SEGMENTS or not all(
        FINAL_SEGMENT.fullmatch(s) and s not in (".", "..") for s in segments
    ):
        return "not a safe path (1 to 8 segments of [A-Za-z0-9._~:-], no . or ..)"
    return value, query


def job_id_value(value: Any) -> str | None:
    """A job id as found in JSON: strings as they are, whole numbers as text, else None."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    return str(value)


def valid_job(policy: ProviderPolicy, job_id: str) -> bool:
    """A job id this policy's routes can carry: one segment, several for ``{job_id*}``, or
    an ARN (``routes.job_ids: aws-arn``)."""
    if policy.routes.job_ids == "aws-arn":
        return arns.valid(job_id)
    return valid_job_path(job_id) if policy.multi_segment else valid_job_id(job_id)


def job_id_from_body(body: bytes, path: str) -> str | None:
    """The job id at ``path`` in a JSON request body (``{from: request, path: P}``)."""
    return job_id_value(lookup(parse_json(body) if body else None, path))


def body_with_job_id(path: str, job_id: str) -> bytes:
    """The JSON body the gateway sends itself when a route reads the job id from the body
    (an operator's cancel): ``{"a": {"b": id}}`` for path ``a.b``."""
    node: Any = job_id
    for part in reversed(path.split(".")):
        node = {part: node}
    return json.dumps(node).encode()
