"""config/gateway.yaml -> frozen Settings with every policy loaded (SPEC section 2).

Owns the gateway config format, ${ENV} interpolation at load and relative-path resolution.
Agent and operator tokens exist here only as sha256 hex digests.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, TypeVar
from urllib.parse import urlsplit

import pydantic
from pydantic import BeforeValidator, Field, WithJsonSchema

from gateway import ConfigError
from gateway.settings.keeping import Target, default_target, parse_target, store_problem
from gateway.settings.loading import (
    Duration,
    Size,
    Strict,
    http_url,
    interpolate,
    load_env,
    read_yaml,
    validate_all,
)
from gateway.settings.policy import ProviderPolicy, read_policies
from gateway.settings.tls import ListenTls, listener_contexts

SHA256_HEX = re.compile(r"[0-9a-f]{64}")

DEFAULT_CACHE_BYTES = 64 * 1024 * 1024  # limits.cache_bytes unless configured
DEFAULT_MAX_IN_FLIGHT = 256  # limits.max_in_flight unless configured (its docstring: why)
DEFAULT_MAX_CONNECTIONS = 4096  # limits.max_connections unless configured (its docstring: why)
# limits.max_held and max_held_per_account unless configured: sized to a 512Mi pod
# (docs/reference.md, "Held calls", has the arithmetic)
DEFAULT_MAX_HELD = 8000
DEFAULT_MAX_HELD_PER_ACCOUNT = 2000


def secret_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret (``whsec_<base64>``); ValueError if the
    secret is not base64."""
    try:
        return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except binascii.Error:
        raise ValueError("must be a Standard Webhooks secret: whsec_ and base64") from None


def _hashes(value: object) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise ValueError("must be a sha256 hex digest or a list of them")
    for item in items:
        if not isinstance(item, str) or not SHA256_HEX.fullmatch(item):
            raise ValueError("must be a lowercase sha256 hex digest (statusgate token hash)")
    return items


_HASH_SCHEMA = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
TokenHashes = Annotated[
    list[str],
    BeforeValidator(_hashes),
    WithJsonSchema({"oneOf": [_HASH_SCHEMA, {"type": "array", "items": _HASH_SCHEMA}]}),
]


class Listen(Strict):
    host: str = "127.0.0.1"
    """The address to listen on."""
    port: Annotated[int, Field(ge=0, le=65535)] = 8080
    """The TCP port (0: any free port)."""
    tls: ListenTls | None = None
    """Serve HTTPS with these files (TLS 1.2 or later; client certificates with
    client_ca_file); unset: plain HTTP."""


class AuditSettings(Strict):
    path: str | None = None
    """The audit log file (JSON lines, hash-chained), relative to this file."""
    hmac_key_env: str | None = None
    """An environment variable holding an HMAC key for the chain."""
    fsync: Literal["always", "batch", "never"] = "batch"
    """When lines reach the disk: always, batch (within 200 ms) or never."""
    replica: str | None = None
    """This replica's name on its audit lines in a PostgreSQL store (the lines of every
    replica are kept there too); unset: the host name."""


MAX_QUOTA = 1_000_000_000  # a quota every store counts (PostgreSQL's sg_quota takes integers)


class Quotas(Strict):
    max_active_operations: Annotated[int, Field(ge=1, le=MAX_QUOTA)] | None = None
    """Pending operations at once (submissions in flight included); unset: no limit."""
    submits_per_hour: Annotated[int, Field(ge=1, le=MAX_QUOTA)] | None = None
    """Submissions forwarded in any sliding hour; unset: no limit."""

    @property
    def limited(self) -> bool:
        return self.max_active_operations is not None or self.submits_per_hour is not None


class Account(Strict):
    id: str
    """The account's name in records, logs and metrics."""
    token_sha256: TokenHashes
    """sha256 hex digests of the account's agent tokens (statusgate token hash)."""
    providers: list[str] = ["*"]
    """Providers this account may use, or "*" for all."""
    quotas: Quotas = Quotas()
    """Limits on this account's submissions (429 quota-exceeded past one)."""
    # set only on the Account an agent key made through the operator API stands for
    _key_id: str | None = pydantic.PrivateAttr(default=None)
    _holder: str | None = pydantic.PrivateAttr(default=None)  # a rotated key's shared counts

    def allows(self, provider: str) -> bool:
        return "*" in self.providers or provider in self.providers

    @property
    def key_id(self) -> str | None:
        """The id of the API-made key this caller used; None for a config account."""
        return self._key_id

    @property
    def holder(self) -> str:
        """Whose quotas a submission counts against: the key's (a rotated key's first's,
        core/keys.py AgentKey.holder), else the account's."""
        if self._holder is not None:
            return self._holder
        return f"key:{self._key_id}" if self._key_id is not None else f"account:{self.id}"


Role = Literal["viewer", "decider", "admin"]
ROLES: tuple[Role, ...] = ("viewer", "decider", "admin")  # each may do all the earlier may


class Operator(Strict):
    id: str
    """The operator's name in audit lines."""
    token_sha256: TokenHashes
    """sha256 hex digests of the operator's tokens."""
    role: Role = "admin"
    """viewer (reads operations, escalations, stories), decider (also decides escalations:
    extend, cancel, abandon, resume) or admin (also reload and keys)."""


class Limits(Strict):
    max_request_body: Size = 1024 * 1024
    """The largest agent request body ("1MiB")."""
    max_response_body: Size = 8 * 1024 * 1024
    """The largest provider answer body ("8MiB")."""
    upstream_timeout: Duration = 30.0
    """How long one provider call may take."""
    body_timeout: Annotated[Duration, Field(gt=0)] = 30.0
    """How long a whole request body may take to arrive."""
    cache_bytes: Size = DEFAULT_CACHE_BYTES
    """The SQLite store's record cache."""
    max_in_flight: Annotated[int, Field(ge=1)] | None = DEFAULT_MAX_IN_FLIGHT
    """Agent requests (/p/..., /mcp) one process works on at once; past it a new one is
    answered 503 overloaded at once. Held calls waiting between polls are not counted;
    null: no bound. 256: at ~1 ms of event loop per forwarded poll, a caller waits at most
    ~0.25 s behind the others, and providers answering within 250 ms still fill the loop."""
    header_timeout: Annotated[Duration, Field(gt=0)] = 10.0
    """How long an agent connection may take to send a request's head (line and header
    fields), counted from the connection's start or from the answer before; past it the
    connection closes (408 request-timeout when part of the head came)."""
    keepalive_timeout: Annotated[Duration, Field(gt=0)] = 75.0
    """How long a connection is kept open without a request after its last answer."""
    max_connections: Annotated[int, Field(ge=1)] | None = DEFAULT_MAX_CONNECTIONS
    """Connections the agent listener keeps open at once. Past it the connection idle the
    longest is closed to make room, or, none being idle, the new one is answered 503
    overloaded and closed. null: no bound (but the open-files limit's). 4096: 16 times
    max_in_flight, room for a few dozen agent processes' pools of keep-alive connections;
    a connection holds about 10 KB of the process's memory once it made a request (5.5 KB
    before) and 4 KB of the kernel's, 56 MiB for 4096; and hosts' hard open-files limits
    (the soft one is raised to it at start) are commonly 524288 or more."""
    max_held: Annotated[int, Field(ge=0)] | None = DEFAULT_MAX_HELD
    """Status calls one process holds at once (Prefer: wait, early_calls: hold, MCP
    waits), ~17 KB each; past it a call is answered at once as without a hold. null: no
    bound."""
    max_held_per_account: Annotated[int, Field(ge=0)] | None = DEFAULT_MAX_HELD_PER_ACCOUNT
    """Of those, held for one account at once, so one account cannot take them all."""


class EscalationSettings(Strict):
    webhook_url: str | None = None
    """POSTed on every escalation and decision (optional)."""
    webhook_secret_env: str | None = None
    """An environment variable with a whsec_ secret to sign deliveries."""
    webhook_timeout: Duration = 5.0
    """How long one delivery attempt may take."""
    webhook_attempts: Annotated[int, Field(ge=1, le=10)] = 4
    """Delivery attempts before a notice is given up."""
    webhook_backoff: Duration = 1.0
    """The first wait between attempts (doubling)."""

    @pydantic.field_validator("webhook_url")
    @classmethod
    def _webhook(cls, value: str | None) -> str | None:
        return None if value is None else http_url(value, query=True)


class LoggingSettings(Strict):
    format: Literal["json", "text"] = "json"
    """json (one object per line) or text, on stderr."""
    level: Literal["debug", "info", "warning", "error"] = "info"
    """The least severe level logged."""


class OidcRoles(Strict):
    decider: list[str] = []
    """Values of the roles claim that make a signed-in person a decider."""
    admin: list[str] = []
    """Values of the roles claim that make a signed-in person an admin (over decider)."""


LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


class OidcSettings(Strict):
    issuer: str
    """The OpenID Connect issuer URL, exactly as its tokens' iss claim writes it; its
    <issuer>/.well-known/openid-configuration is read at start. https (http only on
    loopback, for trials)."""
    client_id: str
    """The console's client id at the issuer; tokens must name it in their aud claim."""
    client_secret: pydantic.SecretStr | None = None
    """The client secret, for a confidential client (write it as ${ENV} or ${file:...})."""
    roles_claim: str = "roles"
    """The claim holding a person's roles or groups (a list or a string); a dotted path
    such as realm_access.roles reaches into an object."""
    roles: OidcRoles = OidcRoles()
    """Which claim values make a decider or an admin; anyone else signed in is a viewer."""
    scope: str = "openid profile email"
    """The scopes the console asks for when it signs in."""

    @pydantic.field_validator("issuer")
    @classmethod
    def _issuer(cls, value: str) -> str:
        http_url(value)
        parts = urlsplit(value)
        if parts.scheme != "https" and parts.hostname not in LOOPBACK_HOSTS:
            raise ValueError("must be an https:// URL (http:// only on a loopback host)")
        return value

    @pydantic.field_validator("client_id")
    @classmethod
    def _client_id(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value


class GatewayFile(Strict):
    listen: Listen = Listen()
    """Where agents connect (/p/..., /mcp)."""
    admin_listen: Listen | None = None
    """If set, /admin, /console and /metrics are served only here."""
    logging: LoggingSettings = LoggingSettings()
    """Log format and level."""
    public_base_url: str = "http://127.0.0.1:8080"
    """The gateway's URL as agents see it, for rewritten provider URLs."""
    store: str = "sqlite:///var/statusgate.db"
    """sqlite:///path, memory://, redis://host:6379/0 or redis+cluster://h1,h2."""
    results_store: str | None = None
    """Where kept results go (SPEC 23): file://<folder> or
    s3://<bucket>/<prefix>?endpoint=<url>&region=<region>. Unset: beside the SQLite file."""
    policies_dir: str = "policies"
    """The folder of policy files, relative to this file."""
    audit: AuditSettings = AuditSettings()
    """The audit log."""
    accounts: list[Account] = []
    """The tenants whose agents may call the gateway."""
    operators: list[Operator] = []
    """The people who may decide escalations."""
    limits: Limits = Limits()
    """Sizes and timeouts."""
    escalation: EscalationSettings = EscalationSettings()
    """Webhooks for escalations and decisions."""
    oidc: OidcSettings | None = None
    """Single sign-on for operators (OpenID Connect): the console signs in at the issuer,
    and the operator API takes the issuer's JWTs beside the operators' static tokens."""
    upstreams: dict[str, str] = {}
    """Send providers' calls elsewhere than their policies' upstream: by provider name, or
    "*" for every provider not named; "{provider}" in a URL stands for the provider's name.
    For a staging endpoint, a recording proxy, or the demo provider (which serves each
    shipped policy's API under /<provider>)."""

    @pydantic.field_validator("upstreams")
    @classmethod
    def _upstreams(cls, value: dict[str, str]) -> dict[str, str]:
        for name, url in value.items():
            try:
                http_url(url.replace("{provider}", "provider"))
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
        return {name: url.rstrip("/") for name, url in value.items()}

    @pydantic.field_validator("public_base_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        return http_url(value)

    @pydantic.field_validator("results_store")
    @classmethod
    def _results_store(cls, value: str | None) -> str | None:
        if value is not None:
            parse_target(value, Path("."))
        return value


def tls_warnings(gateway: GatewayFile) -> list[tuple[str, str]]:
    """What ``check`` warns about in a valid config's TLS: an agent listener speaking TLS
    whose public_base_url hands agents http:// URLs."""
    if gateway.listen.tls is not None and gateway.public_base_url.startswith("http://"):
        return [
            (
                "public_base_url",
                "listen.tls is set but this URL is http://: the status URLs and Locations"
                " agents are handed would not reach the TLS listener (write https://)",
            )
        ]
    return []


H = TypeVar("H", Account, Operator)


@dataclass(frozen=True)
class Settings:
    """Everything the gateway needs at start, resolved and validated."""

    file: GatewayFile
    base_dir: Path
    policies: Mapping[str, ProviderPolicy]
    audit_key: bytes | None = field(default=None, repr=False)
    webhook_secret: str | None = field(default=None, repr=False)
    path: Path | None = None  # the config file, for reloads
    # the listeners' TLS contexts, by config key (listen, admin_listen), read at load: a
    # reload makes new ones from the files as they are then
    tls: Mapping[str, ssl.SSLContext] = field(default_factory=dict, repr=False, compare=False)

    @property
    def audit_path(self) -> Path | None:
        return audit_path(self.file, self.base_dir)

    @property
    def store_url(self) -> str:
        """The store URL with a relative sqlite path resolved against the config folder."""
        return resolved_store_url(self.file.store, self.base_dir)

    @property
    def results_target(self) -> Target | None:
        """Where kept results go; None for memory:// without ``results_store`` (a
        temporary folder of the process's own)."""
        url = self.file.results_store or default_target(self.store_url)
        return parse_target(url, self.base_dir) if url else None

    def account_for(self, token_hash: str) -> Account | None:
        return _match(self.file.accounts, token_hash)

    def operator_for(self, token_hash: str) -> Operator | None:
        return _match(self.file.operators, token_hash)


def _match(holders: list[H], token_hash: str) -> H | None:
    """Constant-time over every stored hash: timing tells nothing about which one matched."""
    found: H | None = None
    for holder in holders:
        for stored in holder.token_sha256:
            if hmac.compare_digest(stored, token_hash) and found is None:
                found = holder
    return found


def resolved_store_url(url: str, base_dir: Path) -> str:
    """A relative sqlite path resolved against the config folder; other URLs as written."""
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        return "sqlite:///" + str(base_dir / url.removeprefix("sqlite:///"))
    return url


def written_store_url(path: Path, env: Mapping[str, str] | None = None) -> str | None:
    """The store URL of a config file that may have other problems (for ``check``)."""
    gateway, problems = _read_gateway_file(path, load_env() if env is None else env)
    if gateway is None or any(": store: " in line for line in problems):
        return None
    return resolved_store_url(gateway.store, path.parent.resolve())


def audit_path(gateway: GatewayFile, base_dir: Path) -> Path | None:
    """The audit file, resolved against the config file's folder; None if not configured."""
    path = gateway.audit.path
    return None if path is None else (base_dir / path).resolve()


def load_gateway_file(path: Path, env: Mapping[str, str] | None = None) -> GatewayFile:
    """The gateway config alone, without its policies (enough for the audit tools)."""
    gateway, problems = _read_gateway_file(path, load_env() if env is None else env)
    if gateway is None or problems:
        raise ConfigError(problems)
    return gateway


def _read_gateway_file(path: Path, env: Mapping[str, str]) -> tuple[GatewayFile | None, list[str]]:
    """The gateway config (with invalid fields at their defaults, so the later checks can
    run) and every problem found in it."""
    shown = str(path)
    try:
        raw = read_yaml(path, shown)
    except ConfigError as exc:
        return None, exc.problems
    data, problems = interpolate(raw, shown, env, folder=path.parent)
    gateway, invalid = validate_all(GatewayFile, data, shown)
    return gateway, problems + invalid


def load_settings(path: Path, env: Mapping[str, str] | None = None) -> Settings:
    """Read the gateway config and every policy; ConfigError lists all problems found."""
    env = load_env() if env is None else env
    shown = str(path)
    gateway, problems = _read_gateway_file(path, env)
    # keep going whatever was found: the policies are checked all the same
    folder = gateway.policies_dir if gateway is not None and not problems else None
    folder = folder or _raw_policies_dir(path)
    base_dir = path.parent.resolve()
    policies_dir = (base_dir / folder).resolve()
    shown_dir = os.path.normpath(Path(path.parent, folder))
    policies, claimed, invalid = read_policies(policies_dir, shown_dir, env)
    problems += invalid
    if gateway is None:
        raise ConfigError(problems)
    problems += _account_problems(gateway, {*policies, *claimed}, shown)
    problems += _upstream_problems(gateway, {*policies, *claimed}, shown)
    keeping = {name: policy.results for name, policy in policies.items()}
    refused = store_problem(gateway.results_store, gateway.store, keeping)
    if refused is not None:
        problems.append(f"{shown}: {refused}")
    policies = redirected(policies, gateway.upstreams)
    listeners = {"listen": gateway.listen.tls}
    if gateway.admin_listen is not None:
        listeners["admin_listen"] = gateway.admin_listen.tls
    contexts, invalid = listener_contexts(listeners, base_dir, shown)
    problems += invalid
    key_env = gateway.audit.hmac_key_env
    if key_env is not None and not env.get(key_env):
        problems.append(f"{shown}: audit.hmac_key_env: environment variable {key_env} is not set")
    secret_env = gateway.escalation.webhook_secret_env
    if secret_env is not None and not env.get(secret_env):
        problems.append(
            f"{shown}: escalation.webhook_secret_env: environment variable {secret_env} is not set"
        )
    elif secret_env is not None:
        try:
            secret_key(env[secret_env])
        except ValueError as exc:
            problems.append(f"{shown}: escalation.webhook_secret_env: {secret_env} {exc}")
    if problems:
        raise ConfigError(problems)
    return Settings(
        file=gateway,
        base_dir=base_dir,
        policies=policies,
        audit_key=env[key_env].encode() if key_env is not None else None,
        webhook_secret=env[secret_env] if secret_env is not None else None,
        path=path,
        tls=contexts,
    )


def _raw_policies_dir(path: Path) -> str:
    """``policies_dir`` as written, for checking policies when the config file is invalid."""
    try:
        raw = read_yaml(path, str(path))
    except ConfigError:
        return "policies"
    value = raw.get("policies_dir")
    return value if isinstance(value, str) and "${" not in value else "policies"


def redirected(
    policies: Mapping[str, ProviderPolicy], upstreams: Mapping[str, str]
) -> dict[str, ProviderPolicy]:
    """The policies with ``upstreams`` applied: a provider's own entry, else "*"."""
    out = dict(policies)
    for name, policy in policies.items():
        url = upstreams.get(name, upstreams.get("*"))
        if url is not None:
            out[name] = policy.model_copy(update={"upstream": url.replace("{provider}", name)})
    return out


def _upstream_problems(gateway: GatewayFile, policies: set[str], shown: str) -> list[str]:
    return [
        f"{shown}: upstreams.{name}: no policy for {name!r}"
        for name in gateway.upstreams
        if name != "*" and name not in policies
    ]


def _account_problems(gateway: GatewayFile, policies: set[str], shown: str) -> list[str]:
    problems = []
    for i, account in enumerate(gateway.accounts):
        for j, name in enumerate(account.providers):
            if name != "*" and name not in policies:
                problems.append(f"{shown}: accounts[{i}].providers[{j}]: no policy for {name!r}")
    return problems
