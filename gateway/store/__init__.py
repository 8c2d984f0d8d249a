"""Stores chosen by URL: ``memory://``, ``sqlite:///path``, ``redis://host:port/db``,
``redis+cluster://host:port,host:port``, ``postgresql://user@host/db`` (also ``postgres://``).

``store_from_url`` is the only constructor callers use; an unknown scheme is a clear error.
Settings that come from the gateway config rather than the URL (``limits.cache_bytes``)
travel in Tuning; a store ignores what does not concern it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from urllib.parse import parse_qs, urlsplit

from gateway.errors import ConfigError
from gateway.settings.config import DEFAULT_CACHE_BYTES
from gateway.settings.units import parse_duration
from gateway.store.base import Store
from gateway.store.memory import MemoryStore
from gateway.store.sqlite import SQLiteStore

__all__ = ["MemoryStore", "SQLiteStore", "Store", "Tuning", "store_from_url", "store_kind"]


@dataclass(frozen=True)
class Tuning:
    cache_bytes: int = DEFAULT_CACHE_BYTES  # the SQLite store's record cache, in bytes


def _memory(url: str, tuning: Tuning) -> Store:
    return MemoryStore()


def _sqlite(url: str, tuning: Tuning) -> Store:
    # As in SQLAlchemy: sqlite:///relative/file.db and sqlite:////absolute/file.db
    parts = urlsplit(url)
    path = url.removeprefix("sqlite:///").split("?", 1)[0]
    if not url.startswith("sqlite:///") or not path or path.endswith("/"):
        raise ConfigError([f"store: {url!r} names no database file (sqlite:///path/file.db)"])
    options = parse_qs(parts.query)
    synchronous = options.get("synchronous", ["full"])[0].lower()
    if synchronous not in ("full", "normal"):
        raise ConfigError(["store: synchronous must be full or normal"])
    try:
        busy = parse_duration(options.get("busy_timeout", ["2s"])[0])
    except ValueError as exc:
        raise ConfigError([f"store: busy_timeout {exc}"]) from None
    return SQLiteStore(
        path, synchronous=synchronous, busy_timeout=busy, cache_bytes=tuning.cache_bytes
    )


def _redis(url: str, tuning: Tuning) -> Store:
    from gateway.store.redis import from_url

    return from_url(url)


def _redis_kind() -> type[Store]:
    from gateway.store.redis import RedisStore

    return RedisStore


def _postgres(url: str, tuning: Tuning) -> Store:
    store: Store = _postgres_module().from_url(url)
    return store


def _postgres_kind() -> type[Store]:
    kind: type[Store] = _postgres_module().PostgresStore
    return kind


def _postgres_module() -> ModuleType:
    """The optional driver's store: without psycopg, a clear error naming the extra."""
    try:
        from gateway.store import postgres
    except ImportError:
        raise ConfigError(
            [
                "store: a postgresql:// store needs psycopg 3 and psycopg-pool:"
                " pip install 'statusgate[postgres]'"
            ]
        ) from None
    return postgres


@dataclass(frozen=True)
class Backend:
    """A scheme's store: its class (capabilities such as ``shared``, without connecting or
    building anything) and how a URL becomes one."""

    kind: Callable[[], type[Store]]
    build: Callable[[str, Tuning], Store]


SCHEMES: dict[str, Backend] = {
    "memory": Backend(lambda: MemoryStore, _memory),
    "sqlite": Backend(lambda: SQLiteStore, _sqlite),
    "redis": Backend(_redis_kind, _redis),
    "redis+cluster": Backend(_redis_kind, _redis),
    "postgresql": Backend(_postgres_kind, _postgres),
    "postgres": Backend(_postgres_kind, _postgres),
}


def _backend(url: str) -> Backend:
    scheme = urlsplit(url).scheme
    backend = SCHEMES.get(scheme)
    if backend is None:
        known = ", ".join(f"{name}://" for name in SCHEMES)
        raise ConfigError([f"store: scheme {scheme!r} is not supported (use {known})"])
    return backend


def store_from_url(url: str, *, cache_bytes: int = DEFAULT_CACHE_BYTES) -> Store:
    return _backend(url).build(url, Tuning(cache_bytes=cache_bytes))


def store_kind(url: str) -> type[Store]:
    """The class of the store ``url`` names, nothing built: what it can do (``shared``)."""
    return _backend(url).kind()
