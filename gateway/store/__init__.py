"""Stores chosen by URL: ``memory://``, ``sqlite:///path``, ``redis://host:port/db``,
``redis+cluster://host:port,host:port``, ``postgresql://user@host/db`` (also ``postgres://``).

``store_from_url`` is the only constructor callers use; an unknown scheme is a clear error.
Settings that come from the gateway config rather than the URL (``limits.cache_bytes``)
travel in Tuning; a store ignores what does not concern it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from ..errors import ConfigError
from ..units import parse_duration
from .base import DEFAULT_CACHE_BYTES, Store
from .memory import MemoryStore
from .sqlite import SQLiteStore

__all__ = ["MemoryStore", "SQLiteStore", "Store", "Tuning", "store_from_url"]


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
    from .redis import from_url

    return from_url(url)


def _postgres(url: str, tuning: Tuning) -> Store:
    try:
        from .postgres import from_url
    except ImportError:
        raise ConfigError(
            [
                "store: a postgresql:// store needs psycopg 3 and psycopg-pool:"
                " pip install 'statusgate[postgres]'"
            ]
        ) from None
    return from_url(url)


SCHEMES: dict[str, Callable[[str, Tuning], Store]] = {
    "memory": _memory,
    "sqlite": _sqlite,
    "redis": _redis,
    "redis+cluster": _redis,
    "postgresql": _postgres,
    "postgres": _postgres,
}


def store_from_url(url: str, *, cache_bytes: int = DEFAULT_CACHE_BYTES) -> Store:
    scheme = urlsplit(url).scheme
    factory = SCHEMES.get(scheme)
    if factory is None:
        known = ", ".join(f"{name}://" for name in SCHEMES)
        raise ConfigError([f"store: scheme {scheme!r} is not supported (use {known})"])
    return factory(url, Tuning(cache_bytes=cache_bytes))
