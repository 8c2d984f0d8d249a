"""The ``routes`` section of a policy (SPEC section 3): the submit, status, result and
cancel routes and the passthroughs, and the rules that span its fields: which placeholders
each kind of route may use, where each finds its job id, and that no two routes could match
the same request. Re-exported by gateway.settings.policy."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Literal

from pydantic import Field

from gateway.settings.fields import PLACEHOLDER, HeaderName, RoutePath, placeholders
from gateway.settings.loading import Duration, Strict

Method = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]


class JobIdSource(Strict):
    source: Literal["body", "location", "header", "request"] = Field(alias="from")
    """Where the provider's job id is: body, location, header or request."""
    path: str | None = None
    """body and request: a dotted path in the JSON body (id, data.job.id)."""
    name: HeaderName | None = None
    """header: the answer header that carries the id."""


class Idempotency(Strict):
    required: bool = False
    """Refuse submits without an Idempotency-Key header."""
    forward_header: HeaderName | None = None
    """Send a per-account derived key to the provider in this header."""
    retention: Duration = 86400.0
    """How long a key is remembered, as a duration ("24h")."""
    from_body: str | None = None
    """The request body field holding the key when there is no header."""


class RouteMatch(Strict):
    """What else than method and path a request must carry to be this route."""

    headers: dict[str, str] = {}
    """Headers a request must carry, with exactly these values."""

    def accepts(self, headers: Mapping[str, str]) -> bool:
        """Every listed header present with exactly this value (names case-insensitive)."""
        return all(headers.get(name) == value for name, value in self.headers.items())


class SubmitRoute(Strict):
    method: Method = "POST"
    """The HTTP method of the submit call."""
    path: RoutePath
    """The provider path agents call to submit (/v1/extractions)."""
    job_id: JobIdSource
    """Where the job id is in the provider's answer."""
    status_url_fields: list[str] = []
    """JSON body fields whose URLs are rewritten to the gateway."""
    status_url_headers: list[HeaderName] = []
    """Answer headers rewritten like Location (Operation-Location)."""
    idempotency: Idempotency = Idempotency()
    """Idempotency keys of submits."""
    match: RouteMatch | None = None
    """More than method and path that a request must carry to be this route."""
    also: list[RoutePath] = []
    """Further path forms agents may send for this route (another API version); the
    provider is always sent ``path``."""
    more_paths: list[RoutePath] = []
    """The provider's further create endpoints for the same kind of job (Runway's
    per-model ones, fal's apps with a sub-path): each is sent as the agent called it."""


class Route(Strict):
    method: Method = "GET"
    """The HTTP method of the call."""
    path: RoutePath
    """The provider path, with {job_id} (or {job_id*}, or {final.<field>} on result)."""
    query_params: list[str] = []
    """Agent query parameters forwarded; all others are dropped."""
    match: RouteMatch | None = None
    """More than method and path that a request must carry to be this route."""
    job_id: JobIdSource | None = None
    """{from: request, path: P}: the job id is in the request's JSON body."""
    also: list[RoutePath] = []
    """Further path forms agents may send for this route (another API version); the
    provider is always sent ``path``."""


class CancelRoute(Route):
    by: Literal["operator", "agent"] = "operator"
    """Who may cancel: an operator through the operator API, or also an agent of the
    operation's own account through this route (SPEC 20a)."""


class Passthrough(Strict):
    """A provider endpoint around a job (upload, listing, download): forwarded, not tracked."""

    method: Method = "GET"
    """The HTTP method of the call."""
    path: RoutePath
    """The provider path; placeholders match one segment each."""
    match: RouteMatch | None = None
    """More than method and path that a request must carry to be this route."""
    also: list[RoutePath] = []
    """Further path forms agents may send; each is forwarded as the agent sent it."""
    public: bool = False
    """A GET of data every account may read (Replicate's model versions): forwarded with
    the credential like any passthrough, without check's warning about reads by id."""


class Routes(Strict):
    submit: SubmitRoute
    """The call that starts a job."""
    status: Route
    """The status call agents poll; the gateway paces it."""
    result: Route | None = None
    """An optional result call, counted against polling.max_result_fetches."""
    cancel: CancelRoute | None = None
    """An optional cancel call: an operator's decision, or with by: agent also the agent's."""
    passthrough: list[Passthrough] = []
    """Calls around a job (uploads, downloads): forwarded and audited, not tracked."""
    job_ids: Literal["plain", "aws-arn"] = "plain"
    """How job ids appear in paths: plain segments (SPEC 11), or aws-arn: an AWS ARN
    percent-encoded in one {job_id} segment as boto3 sends it (its trailing id reaches the
    same operation)."""


JOB_PLACEHOLDERS = ("job_id", "job_id*")


def route_problems(routes: Routes) -> list[tuple[str, str]]:
    """Which placeholders each kind of route may use, where each finds its job id, and that
    no two routes could match the same request."""
    problems: list[tuple[str, str]] = []
    job_forms: set[str] = set()
    submitted = set(placeholders(routes.submit.path)).intersection(
        *(placeholders(p) for p in routes.submit.more_paths)
    )
    for name in ("status", "result", "cancel"):
        route = getattr(routes, name)
        if route is not None:
            problems += _tracked_route_problems(name, route, job_forms, submitted)
    if len(job_forms) > 1:
        problems.append(("routes", "use {job_id} or {job_id*} in every route, not both"))
    submit = routes.submit
    job_id = submit.job_id
    if job_id.source in ("body", "request") and not job_id.path:
        problems.append(("routes.submit.job_id.path", f"is required when from is {job_id.source}"))
    if job_id.source == "header" and not job_id.name:
        problems.append(("routes.submit.job_id.name", "is required when from is header"))
    for where, path in [
        ("routes.submit.path", submit.path),
        *((f"routes.submit.more_paths[{i}]", p) for i, p in enumerate(submit.more_paths)),
        *((f"routes.passthrough[{i}].path", r.path) for i, r in enumerate(routes.passthrough)),
    ]:
        names = placeholders(path)
        if any(n.startswith("final.") or n == "job_id*" for n in names):
            problems.append((where, "{final.*} and {job_id*} are only for tracked routes"))
        if len(set(names)) != len(names):
            problems.append((where, "names a placeholder twice"))
    problems += [
        (f"routes.passthrough[{i}].public", "only a GET may be public")
        for i, r in enumerate(routes.passthrough)
        if r.public and r.method != "GET"
    ]
    return problems + _overlap_problems(routes)


def _tracked_route_problems(
    name: str, route: Route, job_forms: set[str], submitted: set[str]
) -> list[tuple[str, str]]:
    """A tracked route names its job once (or reads it from the body); besides, it may
    name further segments (fal's ``{owner}/{app}``), matched like ids but not identifying
    the job. On status and cancel routes those must be the submit path's too: the gateway
    polls and cancels on its own with the values the submit was sent to. A result route's
    may be the agent's alone (ElevenLabs' ``{language_code}``)."""
    where = f"routes.{name}"
    names = placeholders(route.path)
    jobs = [n for n in names if n in JOB_PLACEHOLDERS]
    job_forms.update(jobs)
    finals = [n for n in names if n.startswith("final.")]
    extras = [n for n in names if n not in JOB_PLACEHOLDERS and n not in finals]
    source = route.job_id
    if source is not None:
        if source.source != "request" or not source.path:
            return [(f"{where}.job_id", "must be {from: request, path: P} on this route")]
        if names:
            return [(f"{where}.path", "takes no placeholder when the job id is in the body")]
        if route.method == "GET":
            return [(f"{where}.method", "a job id in the request body needs POST, PUT or PATCH")]
        return []
    if name == "result" and finals and not jobs:
        if len(names) != 1:
            return [(f"{where}.path", "may hold one {final.<field>} and no other placeholder")]
        return []
    if len(jobs) != 1 or finals:
        return [
            (
                f"{where}.path",
                "must contain {job_id} or {job_id*} exactly once, or the route must read "
                "the job id from the request body (job_id: {from: request, path: P})",
            )
        ]
    if len(set(names)) != len(names):
        return [(f"{where}.path", "names a placeholder twice")]
    return [
        (
            f"{where}.path",
            f"{{{extra}}} must also be in routes.submit.path: the gateway polls the job "
            "with the values its submit was sent to",
        )
        for extra in extras
        if name != "result" and extra not in submitted
    ]


def _overlap_problems(routes: Routes) -> list[tuple[str, str]]:
    """Two routes of one policy may share a method and path only when their match differs."""
    seen: dict[tuple[str, str, str], str] = {}
    problems: list[tuple[str, str]] = []
    named: list[tuple[str, Route | SubmitRoute | Passthrough | None]] = [
        (f"routes.{kind}", getattr(routes, kind))
        for kind in ("submit", "status", "result", "cancel")
    ]
    named += [(f"routes.passthrough[{i}]", r) for i, r in enumerate(routes.passthrough)]
    for where, route in named:
        if route is None:
            continue
        shape = PLACEHOLDER.sub("{}", route.path.partition("?")[0])
        headers = route.match.headers if route.match is not None else {}
        key = (route.method, shape, json.dumps(sorted((k.lower(), v) for k, v in headers.items())))
        if key in seen:
            problems.append((where, f"matches the same requests as {seen[key]}; add a match"))
        seen.setdefault(key, where)
    return problems
