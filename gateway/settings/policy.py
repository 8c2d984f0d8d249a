"""policies/NAME.yaml -> a frozen ProviderPolicy, strictly validated (SPEC section 3).

Owns the policy format and its cross-field rules (the routes section's in settings/routes.py).
Never contacts a provider.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BeforeValidator, Field, WithJsonSchema

from gateway import ConfigError
from gateway.settings.a2a import A2ASettings, Protocol
from gateway.settings.credential import (  # re-exported: the policy's credential
    AwsSigV4,
    Credential,
    CredentialKind,
    OAuth2ClientCredentials,
)
from gateway.settings.fields import (
    PLACEHOLDER,
    PLACEHOLDER_NAME,
    HeaderName,
    digest,
    form_problems,
    placeholders,
)
from gateway.settings.keeping import Results
from gateway.settings.loading import (
    DURATION_PATTERN,
    Duration,
    Strict,
    field_of,
    http_url,
    interpolate,
    read_yaml,
    related,
    validate_all,
)
from gateway.settings.push import Push
from gateway.settings.routes import (
    CancelRoute,
    Idempotency,
    JobIdSource,
    Passthrough,
    Route,
    RouteMatch,
    Routes,
    SubmitRoute,
    route_problems,
)
from gateway.settings.shapes import ShapeName, with_shape
from gateway.settings.units import parse_duration

__all__ = [
    "PLACEHOLDER",
    "PLACEHOLDER_NAME",
    "AwsSigV4",
    "CancelRoute",
    "Credential",
    "CredentialKind",
    "Idempotency",
    "JobIdSource",
    "OAuth2ClientCredentials",
    "Passthrough",
    "ProviderPolicy",
    "Route",
    "RouteMatch",
    "Routes",
    "SubmitRoute",
    "placeholders",
]
PROVIDER_NAME = re.compile(r"[a-z0-9-]+")
USAGE_KIND = re.compile(r"[a-z][a-z0-9_]{0,62}")  # a metric label value, a JSON key
PositiveInt = Annotated[int, Field(ge=1)]


class RequiredField(Strict):
    path: str
    """A dotted path in the success answer."""
    allow_null: bool = False
    """Present is enough; null is allowed."""


StateValue = str | bool | int | float | None  # JSON scalars; None: the field is absent


class States(Strict):
    field: str
    """The dotted path of the state in the status JSON."""
    pending: list[StateValue]
    """Values that mean the job is still running."""
    success: list[StateValue]
    """Values that mean the job succeeded."""
    failure: list[StateValue] = []
    """Values that mean the job failed."""
    cancelled: list[StateValue] = []
    """Values that mean the job was cancelled."""
    expired: list[StateValue] = []
    """Values that mean the job expired; any value in no class escalates unknown_state."""
    success_requires: list[str | RequiredField] = []
    """Dotted paths that must be present and non-null on success."""
    failure_if_present: list[str] = []
    """A success answer carrying any of these paths failed."""
    error_field: str | None = None
    """The dotted path of the error kept on failure."""
    expires_at_field: str | None = None
    """The dotted path of an expiry instant; pending after it is a contradiction."""

    def required(self) -> list[RequiredField]:
        """``success_requires`` with plain strings read as ``{path: P}`` (null not allowed)."""
        return [
            RequiredField(path=item) if isinstance(item, str) else item
            for item in self.success_requires
        ]


class Hints(Strict):
    poll_after_seconds: str | None = None
    """The dotted path of the provider's "poll again in N seconds" hint."""
    next_check_at: str | None = None
    """The dotted path of the provider's "poll again at T" hint."""


class Answers(Strict):
    """What agents' answers carry besides the contract's own headers (a client's dialect)."""

    poll_after_ms_header: HeaderName | None = None
    """A header giving, on pending answers and replays, the whole milliseconds until the
    next permitted poll (openai-poll-after-ms, which the openai SDK's poll helpers obey)."""


class Jitter(Strict):
    min: Annotated[float, Field(ge=0, le=1)] = 0.5
    """The smallest fraction of the raw delay used (0-1)."""
    max: Annotated[float, Field(ge=0, le=1)] = 1.0
    """The largest fraction of the raw delay used (0-1)."""


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
Rate = Annotated[
    float | None,
    BeforeValidator(_rate),
    WithJsonSchema({"type": ["string", "null"], "pattern": r"^\d+(\.\d+)?/(s|m|h)$"}),
]


OptionalDuration = Annotated[
    float | None,
    BeforeValidator(lambda value: None if value is None else parse_duration(value)),
    WithJsonSchema({"type": ["string", "null"], "pattern": DURATION_PATTERN}),
]


class Polling(Strict):
    base_delay: Duration = 5.0
    """The first delay of the backoff, a duration ("5s")."""
    max_delay: Duration = 120.0
    """The longest delay between polls."""
    jitter: Jitter = Jitter()
    """The random fraction of each delay."""
    deadline: Duration = 2400.0
    """How long an operation may wait in all before it escalates."""
    max_status_requests: PositiveInt = 12
    """Status requests forwarded per operation before it escalates."""
    max_transport_failures: Annotated[int, Field(ge=0)] = 3
    """5xx answers, connection errors and timeouts before it escalates."""
    max_rate_limited: Annotated[int, Field(ge=0)] = 3
    """Provider 429 answers before it escalates."""
    rate_limited_multiplier: Annotated[float, Field(ge=1)] = 4.0
    """A 429 without Retry-After multiplies the delay by this."""
    not_found_grace: Duration = 30.0
    """A 404 this soon after submit means "not visible yet"."""
    final_poll_margin: Duration = 1.0
    """The last poll is placed this long before the deadline."""
    max_hold: Duration = 60.0
    """The longest Prefer: wait (or early_calls: hold) the gateway honours."""
    provider_rate: Rate = None
    """A ceiling on status calls to this provider across all replicas ("20/s")."""
    early_calls: Literal["refuse", "hold", "replay"] = "refuse"
    """A call that comes too early: refuse (429), hold it for the next poll, or replay the
    provider's last answer (SPEC 20)."""
    max_result_fetches: Annotated[int, Field(ge=0)] = 10
    """Result calls forwarded per operation."""
    max_provider_pause: OptionalDuration = None
    """The longest a provider's 429 or RateLimit reset may pause (or slow) every status call
    to it; longer asks are clamped. Unset: max_delay."""

    @property
    def provider_pause_cap(self) -> float:
        """Seconds a provider-wide pause may last at most (SPEC 16)."""
        return self.max_delay if self.max_provider_pause is None else self.max_provider_pause


class Extension(Strict):
    time: Duration = 1800.0
    """The most time operators may add over an operation's life."""
    requests: Annotated[int, Field(ge=0)] = 8
    """The most status requests operators may add over an operation's life."""


class EscalationPolicy(Strict):
    max_extension: Extension = Extension()
    """What extend may add, in all, over an operation's life."""
    cancel_checks: PositiveInt = 5
    """Status requests granted after the provider accepts a cancel."""


class ProviderPolicy(Strict):
    provider: str
    """The provider's name, [a-z0-9-]+: the URL segment agents use (/p/NAME)."""
    shape: ShapeName | None = None
    """A family whose defaults fill what this file leaves out (docs/policies.md, Shapes)."""
    upstream: str
    """The only origin contacted for this provider (https://api.acme.example)."""
    credential: Credential
    """The credential the gateway adds to every provider request."""
    routes: Routes
    """The provider calls agents may make through the gateway."""
    states: States
    """The state table that classifies status answers."""
    hints: Hints = Hints()
    """Where the provider's own timing hints are."""
    polling: Polling = Polling()
    """The schedule and budgets of status calls."""
    escalation: EscalationPolicy = EscalationPolicy()
    """What operators may grant when waiting has ended."""
    retention: Duration = 86400.0
    """How long finished and escalated records are kept."""
    answers: Answers = Answers()
    """Extra pacing headers for a client's own poll helper."""
    protocol: Protocol = "http"
    """``a2a``: the upstream is a remote A2A agent, reached at /a2a/NAME (docs/a2a.md)."""
    a2a: A2ASettings | None = None
    """An A2A policy's own settings (``protocol: a2a`` only)."""
    push: Push | None = None
    """The provider's webhooks accepted at /hooks/NAME (SPEC 23); on when its secret is set."""
    results: Results = Results()
    """Keep each succeeded job's result and serve the result route from it (SPEC 23)."""
    usage: dict[str, str] = {}
    """Numbers the final answer reports, kind -> dotted path (SPEC 23): recorded on the
    operation, counted in statusgate_usage_total and sent in operation.completed."""

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

    @pydantic.field_validator("usage")
    @classmethod
    def _usage(cls, value: dict[str, str]) -> dict[str, str]:
        problems = []
        for kind, path in value.items():
            if not USAGE_KIND.fullmatch(kind):
                problems.append(f"usage kind {kind!r} must match [a-z][a-z0-9_]{{0,62}}")
            if not path or any(not part for part in path.split(".")):
                problems.append(
                    f"usage.{kind}: {path!r} is not a dotted path (such as usage.input_tokens)"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return value

    def state_class(self, state: Any) -> str | None:
        """Which class of the state table ``state`` (a JSON value, None when absent)
        belongs to, or None when unknown. Values compare as JSON: false is not "false"."""
        kept = _TABLES.get(id(self.states))
        if kept is None or kept[0] is not self.states:
            table: dict[tuple[str, Any], str] = {}
            for name, states in _state_classes(self.states):
                for known in states:
                    table.setdefault(json_key(known), name)  # the first class listing it
            if len(_TABLES) >= MAX_TABLES:
                _TABLES.clear()
            kept = _TABLES[id(self.states)] = (self.states, table)
        return kept[1].get(json_key(state))

    @property
    def fingerprint(self) -> str:
        """Changes whenever the policy's rules change; the credential is left out."""
        # the shape only fills fields (compared as filled); answers' headers change no rule
        # a push section that is off (no secret) changes no rule either
        left_out = {"credential", "shape", "answers", "usage"} | (
            {"push"} if self.pushes is None else set()
        )
        data = self.model_dump(mode="json", by_alias=True, exclude=left_out)
        return digest(json.dumps(unset_as_before(data), sort_keys=True))

    @property
    def secrets(self) -> tuple[str, ...]:
        """Strings that must never reach an agent: the credential and its token part, and
        the push secret."""
        secret = self.push.verify.secret if self.push is not None else None
        return self.credential.secrets + ((secret,) if secret else ())

    @property
    def credential_fingerprint(self) -> str:
        """Changes whenever the credential changes, without revealing it."""
        return self.credential.fingerprint

    @property
    def pushes(self) -> Push | None:
        """The push section when pushes are on (its secret is set), else None."""
        return self.push if self.push is not None and self.push.on else None

    @property
    def multi_segment(self) -> bool:
        """Job ids are resource names of several segments (``{job_id*}``)."""
        return "{job_id*}" in self.routes.status.path


# Each state table as a lookup by JSON key, made once per table (every status answer is
# classified); keyed by the table object, which is kept with it so its id stays its own.
_TABLES: dict[int, tuple[States, dict[tuple[str, Any], str]]] = {}
MAX_TABLES = 256


def json_key(value: Any) -> tuple[str, Any]:
    """A value as JSON compares it: booleans apart from numbers, 1 equal to 1.0."""
    if value is None or isinstance(value, bool | str):
        return (type(value).__name__, value)
    if isinstance(value, int | float):
        return ("number", float(value))
    return ("other", json.dumps(value, sort_keys=True))


def _state_classes(s: States) -> list[tuple[str, list[StateValue]]]:
    return [
        ("pending", s.pending),
        ("success", s.success),
        ("failure", s.failure),
        ("cancelled", s.cancelled),
        ("expired", s.expired),
    ]


def unset_as_before(data: dict[str, Any]) -> dict[str, Any]:
    """A policy's dump without the fields added since records were first written, where
    they are unset: a policy that does not use them keeps its fingerprint."""
    if data["polling"]["max_provider_pause"] is None:
        del data["polling"]["max_provider_pause"]
    routes = data["routes"]
    if routes["job_ids"] == "plain":
        del routes["job_ids"]
    for route in [routes[k] for k in ("submit", "status", "result", "cancel")] + routes[
        "passthrough"
    ]:
        if route is not None and not route["also"]:
            del route["also"]
    if not routes["submit"]["more_paths"]:
        del routes["submit"]["more_paths"]
    for route in routes["passthrough"]:
        if not route["public"]:
            del route["public"]
    if routes["cancel"] is not None and routes["cancel"]["by"] == "operator":
        del routes["cancel"]["by"]
    if data.get("protocol") == "http" and data.get("a2a") is None:  # added with SPEC 24
        del data["protocol"], data["a2a"]
    if data.get("results") == Results().model_dump(mode="json"):  # added with SPEC 23
        del data["results"]
    return data


def cross_check(policy: ProviderPolicy) -> list[tuple[str, str]]:
    """Rules that span fields, as (field path, message) pairs."""
    found = [
        found
        for name, _, rule in SECTION_RULES
        if getattr(policy, name) is not None
        for found in rule(getattr(policy, name))
    ]
    if policy.a2a is not None and policy.protocol != "a2a":
        found.append(("a2a", "is only for policies with protocol: a2a"))
    if policy.results.keep and policy.routes.result is None:
        found.append(("results.keep", "needs a result route (routes.result) to fetch from"))
    return found


def _state_problems(states: States) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    seen: dict[tuple[str, Any], str] = {}
    for name, values in _state_classes(states):
        for i, state in enumerate(values):
            key = json_key(state)
            if key in seen:
                shown = json.dumps(state)
                problems.append(
                    (f"states.{name}[{i}]", f"{shown} is also listed in states.{seen[key]}")
                )
            seen.setdefault(key, name)
    return problems


def _polling_problems(p: Polling) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if p.base_delay > p.max_delay:
        problems.append(("polling.base_delay", "must not be greater than polling.max_delay"))
    if p.jitter.min > p.jitter.max:
        problems.append(("polling.jitter.min", "must not be greater than polling.jitter.max"))
    if p.base_delay <= 0:
        problems.append(("polling.base_delay", "must be greater than 0"))
    if p.max_provider_pause is not None and p.max_provider_pause <= 0:
        problems.append(("polling.max_provider_pause", "must be greater than 0"))
    if not math.isfinite(p.rate_limited_multiplier):
        problems.append(("polling.rate_limited_multiplier", "must be a finite number"))
    return problems


def _sections_alone(data: Mapping[str, Any], shown: str) -> list[tuple[str, str]]:
    """The cross-field rules of each section validated on its own, for a file whose policy
    cannot be made as a whole (an invalid upstream or provider, a missing section), so one
    run reports every problem (SPEC 20a)."""
    found: list[tuple[str, str]] = []
    for name, model, rule in SECTION_RULES:
        raw = data.get(name)
        if isinstance(raw, dict):
            section, _ = validate_all(model, raw, shown)  # its field errors are reported already
            if section is not None:
                found += rule(section)
    return found


def warnings(policy: ProviderPolicy) -> list[tuple[str, str]]:
    """What is valid but unsafe (SPEC 20), as (field path, message) pairs: a passthrough
    GET that reads provider objects by id, or lists the jobs, under the one shared
    credential serves every account's objects to any account. ``check`` adds the state
    table's lints (gateway/settings/lints.py, SPEC 22)."""
    found: list[tuple[str, str]] = []
    listing = policy.routes.submit.path.partition("?")[0]
    for i, route in enumerate(policy.routes.passthrough):
        if route.method != "GET" or route.public:
            continue
        where, path = f"routes.passthrough[{i}]", route.path.partition("?")[0]
        if placeholders(path):
            found.append(
                (
                    where,
                    f"GET {path} reads provider objects by id under the shared credential: "
                    "any account can read any other account's; serve outputs through the "
                    "result route ({final.<field>}) instead",
                )
            )
        elif path == listing:
            found.append(
                (where, f"GET {path} lists the jobs of every account under the shared credential")
            )
    return found


def _all_route_problems(routes: Routes) -> list[tuple[str, str]]:
    return route_problems(routes) + form_problems(routes)


# The sections the cross-field rules look at, each on its own: (key, model, rules).
SECTION_RULES: tuple[tuple[str, type[Strict], Callable[[Any], list[tuple[str, str]]]], ...] = (
    ("states", States, _state_problems),
    ("credential", Credential, Credential.problems),
    ("polling", Polling, _polling_problems),
    ("routes", Routes, _all_route_problems),
    ("push", Push, Push.problems),
    ("results", Results, Results.problems),
)


def load_policy(path: Path, shown: str, env: Mapping[str, str]) -> ProviderPolicy:
    """Read, interpolate and validate one policy file."""
    raw = with_shape(read_yaml(path, shown))
    data, problems = interpolate(raw, shown, env, folder=path.parent)
    policy, invalid = validate_all(ProviderPolicy, data, shown)
    problems += invalid
    # the cross-field rules too, except about fields already reported
    found = cross_check(policy) if policy is not None else _sections_alone(data, shown)
    reported = [field_of(line, shown) for line in invalid]
    problems += [
        f"{shown}: {where}: {message}"
        for where, message in found
        if not any(related(where, field) for field in reported)
    ]
    if problems or policy is None:
        raise ConfigError(problems)
    return policy


def load_policies(
    folder: Path, shown_folder: str, env: Mapping[str, str]
) -> dict[str, ProviderPolicy]:
    """Every ``*.yaml`` in ``folder`` by provider name; all problems of all files at once."""
    policies, _, problems = read_policies(folder, shown_folder, env)
    if problems:
        raise ConfigError(problems)
    return policies


def read_policies(
    folder: Path, shown_folder: str, env: Mapping[str, str]
) -> tuple[dict[str, ProviderPolicy], set[str], list[str]]:
    """The valid policies, the provider names the invalid ones claim, and every problem."""
    policies: dict[str, ProviderPolicy] = {}
    claimed: set[str] = set()
    problems: list[str] = []
    try:  # a listing that fails says so: glob would hide an unreadable folder as an empty one
        paths = sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml"))
    except (FileNotFoundError, NotADirectoryError):
        return {}, set(), [f"{shown_folder}: policies_dir: is not a folder"]
    except OSError as exc:
        return {}, set(), [f"{shown_folder}: policies_dir: cannot be read ({exc.strerror})"]
    for path in paths:
        shown = f"{shown_folder}/{path.name}"
        try:
            policy = load_policy(path, shown, env)
        except ConfigError as exc:
            problems.extend(exc.problems)
            claimed.add(_claimed_name(path))
            continue
        if policy.provider in policies:
            problems.append(f"{shown}: provider: {policy.provider!r} is defined twice")
        policies[policy.provider] = policy
    return policies, claimed, problems


def _claimed_name(path: Path) -> str:
    """The ``provider`` an invalid file names, so accounts naming it are not reported too."""
    try:
        raw = read_yaml(path, str(path))
    except ConfigError:
        return path.stem
    name = raw.get("provider")
    return name if isinstance(name, str) else path.stem
