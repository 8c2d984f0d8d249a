"""policies/NAME.yaml -> a frozen ProviderPolicy, strictly validated (SPEC section 3).

Owns the policy format and its cross-field rules. Never contacts a provider.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

import pydantic
from pydantic import AfterValidator, BeforeValidator, Field

from .errors import ConfigError
from .loading import Strict, http_url, interpolate, read_yaml, validate
from .units import parse_duration

Duration = Annotated[float, BeforeValidator(parse_duration)]
PROVIDER_NAME = re.compile(r"[a-z0-9-]+")
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
Method = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]
PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
PLACEHOLDER_NAME = re.compile(r"[a-z_][a-z0-9_]*|final(\.[A-Za-z0-9_-]+)+")


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
PositiveInt = Annotated[int, Field(ge=1)]


class Credential(Strict):
    header: HeaderName
    value: str = Field(repr=False)


class JobIdSource(Strict):
    source: Literal["body", "location"] = Field(alias="from")
    path: str | None = None


class Idempotency(Strict):
    required: bool = False
    forward_header: HeaderName | None = None
    retention: Duration = 86400.0


class SubmitRoute(Strict):
    method: Method = "POST"
    path: RoutePath
    job_id: JobIdSource
    status_url_fields: list[str] = []
    status_url_headers: list[HeaderName] = []
    idempotency: Idempotency = Idempotency()


class Route(Strict):
    method: Method = "GET"
    path: RoutePath
    query_params: list[str] = []  # agent query parameters forwarded; all others are dropped


class Passthrough(Strict):
    """A provider endpoint around a job (upload, listing, download): forwarded, not tracked."""

    method: Method = "GET"
    path: RoutePath


class Routes(Strict):
    submit: SubmitRoute
    status: Route
    result: Route | None = None
    cancel: Route | None = None
    passthrough: list[Passthrough] = []


class RequiredField(Strict):
    path: str
    allow_null: bool = False


class States(Strict):
    field: str
    pending: list[str]
    success: list[str]
    failure: list[str] = []
    cancelled: list[str] = []
    expired: list[str] = []
    success_requires: list[str | RequiredField] = []
    error_field: str | None = None
    expires_at_field: str | None = None

    def required(self) -> list[RequiredField]:
        """``success_requires`` with plain strings read as ``{path: P}`` (null not allowed)."""
        return [
            RequiredField(path=item) if isinstance(item, str) else item
            for item in self.success_requires
        ]


class Hints(Strict):
    poll_after_seconds: str | None = None
    next_check_at: str | None = None


class Jitter(Strict):
    min: Annotated[float, Field(ge=0, le=1)] = 0.5
    max: Annotated[float, Field(ge=0, le=1)] = 1.0


def _rate(value: object) -> float | None:
    if value is None:
        return None
    match = RATE.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        raise ValueError('must be a rate like "20/s" or "600/m"')
    per = {"s": 1.0, "m": 60.0, "h": 3600.0}[match.group(2)]
    rate = float(match.group(1)) / per
    if rate <= 0:
        raise ValueError("must be more than 0")
    return rate


RATE = re.compile(r"(\d+(?:\.\d+)?)/(s|m|h)")
Rate = Annotated[float | None, BeforeValidator(_rate)]


class Polling(Strict):
    base_delay: Duration = 5.0
    max_delay: Duration = 120.0
    jitter: Jitter = Jitter()
    deadline: Duration = 2400.0
    max_status_requests: PositiveInt = 12
    max_transport_failures: Annotated[int, Field(ge=0)] = 3
    max_rate_limited: Annotated[int, Field(ge=0)] = 3
    rate_limited_multiplier: Annotated[float, Field(ge=1)] = 4.0
    not_found_grace: Duration = 30.0
    final_poll_margin: Duration = 1.0
    max_hold: Duration = 60.0
    provider_rate: Rate = None  # status calls per second to this provider, all replicas
    early_calls: Literal["refuse", "hold"] = "refuse"  # too-early calls: 429, or held
    max_result_fetches: Annotated[int, Field(ge=0)] = 10


class Extension(Strict):
    time: Duration = 1800.0
    requests: Annotated[int, Field(ge=0)] = 8


class EscalationPolicy(Strict):
    max_extension: Extension = Extension()
    cancel_checks: PositiveInt = 5  # status requests granted after the provider accepts a cancel


class ProviderPolicy(Strict):
    provider: str
    upstream: str
    credential: Credential
    routes: Routes
    states: States
    hints: Hints = Hints()
    polling: Polling = Polling()
    escalation: EscalationPolicy = EscalationPolicy()
    retention: Duration = 86400.0

    @pydantic.field_validator("provider")
    @classmethod
    def _provider_name(cls, value: str) -> str:
        if not PROVIDER_NAME.fullmatch(value):
            raise ValueError("must match [a-z0-9-]+")
        return value

    @pydantic.field_validator("upstream")
    @classmethod
    def _upstream(cls, value: str) -> str:
        return http_url(value)

    def state_class(self, state: str) -> str | None:
        """Which class of the state table ``state`` belongs to, or None when unknown."""
        for name, states in self._classes():
            if state in states:
                return name
        return None

    def _classes(self) -> list[tuple[str, list[str]]]:
        s = self.states
        return [
            ("pending", s.pending),
            ("success", s.success),
            ("failure", s.failure),
            ("cancelled", s.cancelled),
            ("expired", s.expired),
        ]

    @property
    def fingerprint(self) -> str:
        """Changes whenever the policy's rules change; the credential is left out."""
        data = self.model_dump(mode="json", by_alias=True, exclude={"credential"})
        return _digest(json.dumps(data, sort_keys=True))

    @property
    def secrets(self) -> tuple[str, ...]:
        """Strings that must never reach an agent: the credential and its token part."""
        value = self.credential.value
        scheme, _, token = value.partition(" ")
        parts = (value, token) if token and scheme.isalpha() else (value,)
        return tuple(p for p in parts if len(p) >= 6)

    @property
    def credential_fingerprint(self) -> str:
        """Changes whenever the credential changes, without revealing it."""
        return _digest(f"{self.credential.header}\n{self.credential.value}")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cross_check(policy: ProviderPolicy) -> list[tuple[str, str]]:
    """Rules that span fields, as (field path, message) pairs."""
    problems: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    for name, states in policy._classes():
        for i, state in enumerate(states):
            if state in seen:
                problems.append(
                    (f"states.{name}[{i}]", f"{state!r} is also listed in states.{seen[state]}")
                )
            seen.setdefault(state, name)
    p = policy.polling
    if p.base_delay > p.max_delay:
        problems.append(("polling.base_delay", "must not be greater than polling.max_delay"))
    if p.jitter.min > p.jitter.max:
        problems.append(("polling.jitter.min", "must not be greater than polling.jitter.max"))
    if p.base_delay <= 0:
        problems.append(("polling.base_delay", "must be greater than 0"))
    if not math.isfinite(p.rate_limited_multiplier):
        problems.append(("polling.rate_limited_multiplier", "must be a finite number"))
    problems.extend(_route_problems(policy.routes))
    job_id = policy.routes.submit.job_id
    if job_id.source == "body" and not job_id.path:
        problems.append(("routes.submit.job_id.path", "is required when from is body"))
    return problems


def placeholders(path: str) -> list[str]:
    """The names of a route path's ``{...}`` placeholders, in order."""
    return PLACEHOLDER.findall(path.partition("?")[0])


def _route_problems(routes: Routes) -> list[tuple[str, str]]:
    """Which placeholders each kind of route may use: status and cancel exactly one
    {job_id}; result one {job_id} or {final.*} fields; submit and passthrough any names."""
    problems: list[tuple[str, str]] = []
    for name in ("status", "result", "cancel"):
        route = getattr(routes, name)
        if route is None:
            continue
        names = placeholders(route.path)
        finals = [n for n in names if n.startswith("final.")]
        if name == "result" and finals and "job_id" not in names:
            if len(finals) != len(names) or len(finals) != 1:
                problems.append(
                    ("routes.result.path", "may hold one {final.<field>} and no other placeholder")
                )
            continue
        if names != ["job_id"]:
            problems.append((f"routes.{name}.path", "must contain {job_id} exactly once"))
    for where, path in [
        ("routes.submit.path", routes.submit.path),
        *((f"routes.passthrough[{i}].path", r.path) for i, r in enumerate(routes.passthrough)),
    ]:
        names = placeholders(path)
        if any(n.startswith("final.") for n in names):
            problems.append((where, "{final.*} is only for the result route"))
        if len(set(names)) != len(names):
            problems.append((where, "names a placeholder twice"))
    return problems


def load_policy(path: Path, shown: str, env: Mapping[str, str]) -> ProviderPolicy:
    """Read, interpolate and validate one policy file."""
    raw = read_yaml(path, shown)
    data, problems = interpolate(raw, shown, env)
    if problems:
        raise ConfigError(problems)
    policy = validate(ProviderPolicy, data, shown)
    problems = [f"{shown}: {where}: {message}" for where, message in cross_check(policy)]
    if problems:
        raise ConfigError(problems)
    return policy


def load_policies(
    folder: Path, shown_folder: str, env: Mapping[str, str]
) -> dict[str, ProviderPolicy]:
    """Every ``*.yaml`` in ``folder`` by provider name; all problems of all files at once."""
    policies: dict[str, ProviderPolicy] = {}
    problems: list[str] = []
    if not folder.is_dir():
        raise ConfigError([f"{shown_folder}: policies_dir: is not a folder"])
    for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
        shown = f"{shown_folder}/{path.name}"
        try:
            policy = load_policy(path, shown, env)
        except ConfigError as exc:
            problems.extend(exc.problems)
            continue
        if policy.provider in policies:
            problems.append(f"{shown}: provider: {policy.provider!r} is defined twice")
        policies[policy.provider] = policy
    if problems:
        raise ConfigError(problems)
    return policies
