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
from urllib.parse import urlsplit

from gateway import ConfigError
from gateway.settings.config import DEFAULT_CACHE_BYTES
from gateway.store import urls
from gateway.store.base import Store
from gateway.store.memory import MemoryStore
from gateway.store.sqlite.store import SQLiteStore

__all__ = ["MemoryStore", "SQLiteStore", "Store", "Tuning", "store_from_url", "store_kind"]


@dataclass(frozen=True)
class Tuning:
    cache_bytes: int = DEFAULT_CACHE_BYTES  # the SQLite store's record cache, in bytes


def _memory(url: str, tuning: Tuning) -> Store:
    return MemoryStore()


def _sqlite(url: str, tuning: Tuning) -> Store:
    return urls.sqlite(url, tuning.cache_bytes)


def _redis(url: str, tuning: Tuning) -> Store:
    return urls.redis(url)


def _redis_kind() -> type[Store]:
    from gateway.store.redis.store import RedisStore

    return RedisStore


def _postgres(url: str, tuning: Tuning) -> Store:
    _postgres_module()  # the driver is there, or a clear error
    return urls.postgres(url)


def _postgres_kind() -> type[Store]:
    kind: type[Store] = _postgres_module().PostgresStore
    return kind


def _postgres_module() -> ModuleType:
    """The optional driver's store: without psycopg, a clear error naming the extra."""
    try:
        from gateway.store.postgres import store as postgres
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
