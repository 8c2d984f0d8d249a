"""Agent keys made through the operator API (SPEC 25, "Keys through the API"): the stored
key, what a request to make one may say, and the Account a key stands for.

Pure: no token is made here (the operator handler draws it from ``secrets``) and no clock
is read (callers pass ``now``). A key is kept only as the sha256 of its token; nothing in
this module ever sees the token itself.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import pydantic

from gateway.core.schedule import parse_instant
from gateway.settings.config import Account, Quotas

KEY_FIELDS = ("account", "providers", "expires_at", "quotas")
MAX_NAME = 200  # characters of an account or provider name
NO_QUOTAS = Quotas()


@dataclass(frozen=True, slots=True)
class QuotaRefusal:
    """A submission refused ``429 quota-exceeded`` (SPEC 25), as its audit line names it:
    the key by id (None for a config account's token), never its token."""

    account: str
    key_id: str | None
    provider: str
    quota: str  # max_active_operations | submits_per_hour (``reached``)
    limit: int
    retry_after: int  # seconds, as the answer's Retry-After said


@dataclass(frozen=True, slots=True)
class AgentKey:
    """A key as the store keeps it: never the token, only its sha256 hex digest."""

    id: str
    account: str
    providers: tuple[str, ...]
    token_sha256: str
    created_at: float
    expires_at: float | None = None
    quotas: Quotas = NO_QUOTAS
    created_by: str = ""  # the operator who made it
    quota_id: str = ""  # the key id its quotas count under: its own (""), or, rotated, its first's

    @property
    def holder(self) -> str:
        """Whose quota counts this key's submissions go to (store/base.py, claim_quota):
        a rotated key shares its predecessor's, so rotating never resets a count."""
        return f"key:{self.quota_id or self.id}"

    def successor(self, key_id: str, token_sha256: str, created_at: float, by: str) -> AgentKey:
        """The key that replaces this one at rotation: a new id and token, the same account,
        providers, expiry and quotas, counting under the same holder."""
        return AgentKey(
            id=key_id,
            account=self.account,
            providers=self.providers,
            token_sha256=token_sha256,
            created_at=created_at,
            expires_at=self.expires_at,
            quotas=self.quotas,
            created_by=by,
            quota_id=self.quota_id or self.id,
        )

    def live(self, now: float) -> bool:
        """Whether the key is still good at ``now``: an expired key is no key."""
        return self.expires_at is None or now < self.expires_at

    def as_account(self) -> Account:
        """The Account a request with this key acts as: the key's account name (records,
        metrics and audit lines carry it), its providers and quotas."""
        account = Account(
            id=self.account,
            token_sha256=[self.token_sha256],
            providers=list(self.providers),
            quotas=self.quotas,
        )
        account._key_id = self.id
        account._holder = self.holder
        return account

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "account": self.account,
            "providers": list(self.providers),
            "token_sha256": self.token_sha256,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "quotas": self.quotas.model_dump(),
            "created_by": self.created_by,
            "quota_id": self.quota_id or self.id,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AgentKey:
        return cls(
            id=str(data["id"]),
            account=str(data["account"]),
            providers=tuple(str(p) for p in data["providers"]),
            token_sha256=str(data["token_sha256"]),
            created_at=float(data["created_at"]),
            expires_at=None if data.get("expires_at") is None else float(data["expires_at"]),
            quotas=Quotas(**data.get("quotas") or {}),
            created_by=str(data.get("created_by", "")),
            quota_id=_own_or(str(data.get("quota_id") or ""), str(data["id"])),
        )


def _own_or(quota_id: str, key_id: str) -> str:
    """ "" for a key counting under its own id (as keys stored before rotation shared
    counts were), so a key read back equals the key stored."""
    return "" if quota_id == key_id else quota_id


@dataclass(frozen=True, slots=True)
class KeyRequest:
    """What ``POST /admin/keys`` asked for, checked."""

    account: str
    providers: tuple[str, ...]
    expires_at: float | None
    quotas: Quotas


def key_request(body: Mapping[str, Any], providers: Collection[str], now: float) -> KeyRequest:
    """The body of ``POST /admin/keys`` checked against the loaded ``providers``;
    ValueError says what is wrong, naming the member."""
    unknown = sorted(set(body) - set(KEY_FIELDS))
    if unknown:
        raise ValueError(f"unknown member {unknown[0]!r} (members: {', '.join(KEY_FIELDS)})")
    account = body.get("account")
    if not isinstance(account, str) or not account.strip() or len(account) > MAX_NAME:
        raise ValueError(f"account must be a non-empty string of at most {MAX_NAME} characters")
    return KeyRequest(
        account=account.strip(),
        providers=_providers(body.get("providers"), providers),
        expires_at=_expiry(body.get("expires_at"), now),
        quotas=quotas_of(body.get("quotas")),
    )


def _providers(value: object, known: Collection[str]) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ValueError('providers must be a non-empty list of provider names, or ["*"]')
    names: list[str] = []
    for name in value:
        if not isinstance(name, str) or not name or len(name) > MAX_NAME:
            raise ValueError("providers must hold provider names (strings)")
        if name != "*" and name not in known:
            raise ValueError(f"providers: no policy is loaded for {name!r}")
        if name not in names:
            names.append(name)
    return tuple(names)


def _expiry(value: object, now: float) -> float | None:
    if value is None:
        return None
    instant = parse_instant(value)
    if instant is None:
        raise ValueError(
            "expires_at must be an RFC 3339 instant with an offset, e.g. 2026-12-31T23:59:59Z"
        )
    if instant <= now:
        raise ValueError("expires_at is in the past")
    return instant


def quotas_of(value: object) -> Quotas:
    """A quotas object (``max_active_operations``, ``submits_per_hour``); ValueError else."""
    if value is None:
        return Quotas()
    if not isinstance(value, dict):
        raise ValueError("quotas must be an object")
    try:
        return Quotas(**value)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ValueError(f"quotas.{where}: {first['msg']}") from None
    except TypeError:
        raise ValueError("quotas must be an object") from None


HOUR = 3600.0  # the window of submits_per_hour, sliding
ACTIVE_RETRY = 30.0  # Retry-After when max_active_operations is reached: an operation must end


def quota_wait(quotas: Quotas, active: int, recent: Collection[float], now: float) -> float:
    """0 when a submission may go now under ``quotas``, given ``active`` pending (or in
    flight) operations and the instants of ``recent`` forwarded submissions; else the
    seconds until it may (ACTIVE_RETRY for the active limit, which waits on an operation
    ending, not on time). The rule every store applies atomically (memory and SQLite in
    Python, Redis in quota.lua, PostgreSQL in sg_quota)."""
    wait = 0.0
    if quotas.max_active_operations is not None and active >= quotas.max_active_operations:
        wait = ACTIVE_RETRY
    if quotas.submits_per_hour is not None:
        window = sorted(at for at in recent if at > now - HOUR)
        if len(window) >= quotas.submits_per_hour:
            oldest = window[len(window) - quotas.submits_per_hour]
            wait = max(wait, oldest + HOUR - now)
    return wait


def reached(quotas: Quotas, wait: float) -> tuple[str, int]:
    """The quota a refused submission met and its limit, told from the wait the store's
    claim answered (``quota_wait``, the rule of every store): the active limit always
    waits exactly ACTIVE_RETRY, the hourly one until its oldest counted submission is an
    hour old, and the longer wait wins. So a wait of ACTIVE_RETRY is the active limit's
    (when the key has one), any other the hourly quota's; with both reached, the one named
    is the one that set Retry-After. ``quotas`` must limit something (a refusal did)."""
    active, hourly = quotas.max_active_operations, quotas.submits_per_hour
    if active is not None and (hourly is None or wait == ACTIVE_RETRY):
        return "max_active_operations", active
    assert hourly is not None, "a refusal needs a quota"
    return "submits_per_hour", hourly
