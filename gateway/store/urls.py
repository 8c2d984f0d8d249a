"""Store URLs: each scheme's options read and checked (every problem named in one
``ConfigError``), and the store built from them. The stores themselves take plain
arguments; nothing else parses their URLs."""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit, urlunsplit

from gateway import ConfigError
from gateway.settings.units import parse_duration
from gateway.store.sqlite.store import MAX_GROUP_COMMIT, SQLiteStore

if TYPE_CHECKING:
    from gateway.store.postgres.store import PostgresStore
    from gateway.store.redis.store import RedisStore


def sqlite(url: str, cache_bytes: int) -> SQLiteStore:
    # As in SQLAlchemy: sqlite:///relative/file.db and sqlite:////absolute/file.db
    parts = urlsplit(url)
    path = url.removeprefix("sqlite:///").split("?", 1)[0]
    if not url.startswith("sqlite:///") or not path or path.endswith("/"):
        raise ConfigError([f"store: {url!r} names no database file (sqlite:///path/file.db)"])
    options = parse_qs(parts.query)
    synchronous = options.get("synchronous", ["full"])[0].lower()
    if synchronous not in ("full", "normal"):
        raise ConfigError(["store: synchronous must be full or normal"])
    return SQLiteStore(
        path,
        synchronous=synchronous,
        busy_timeout=_duration(options, "busy_timeout", "2s"),
        cache_bytes=cache_bytes,
        group_commit=_duration(options, "group_commit", "0.5ms", most=MAX_GROUP_COMMIT),
    )


def _duration(
    options: dict[str, list[str]], name: str, default: str, most: float | None = None
) -> float:
    """The URL option ``name`` as seconds (``default`` when absent), at most ``most``."""
    try:
        seconds = parse_duration(options.get(name, [default])[0])
    except ValueError as exc:
        raise ConfigError([f"store: {name} {exc}"]) from None
    if most is not None and seconds > most:
        raise ConfigError([f"store: {name} must be at most {round(most * 1000)}ms"])
    return seconds


def redis(url: str) -> RedisStore:
    """``redis://host:port/db`` or ``redis+cluster://host:port,host:port``, with the options
    ``prefix``, ``max_connections`` (50), ``timeout`` (300ms), ``wait_replicas`` (0, one
    Redis only) and ``shards`` (64, a cluster only; fixed for the life of the data)."""
    from gateway.store.redis.store import RedisStore

    parts = urlsplit(url)
    options = parse_qs(parts.query)
    prefix = options.pop("prefix", ["statusgate"])[0]
    if not prefix or any(c in prefix for c in "{}: "):
        raise ConfigError(["store: prefix must be non-empty, without braces, colons or spaces"])
    cluster = parts.scheme == "redis+cluster"
    try:
        connections = int(options.pop("max_connections", ["50"])[0])
        timeout = parse_duration(options.pop("timeout", ["300ms"])[0])
        wait_replicas = int(options.pop("wait_replicas", ["0"])[0])
        shards = int(options.pop("shards", ["64"])[0]) if cluster else 1
    except ValueError as exc:
        raise ConfigError([f"store: {exc}"]) from None
    if options:
        raise ConfigError([f"store: unknown option(s) {', '.join(sorted(options))}"])
    if not cluster:
        plain = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
        return RedisStore(
            plain,
            prefix=prefix,
            max_connections=connections,
            timeout=timeout,
            wait_replicas=wait_replicas,
        )
    problems = []
    if wait_replicas:
        problems.append("store: wait_replicas is for one Redis; not on redis+cluster://")
    if not 1 <= shards <= 16384:
        problems.append("store: shards must be between 1 and 16384")
    if parts.path not in ("", "/", "/0"):
        problems.append("store: a Redis Cluster has no database number (redis+cluster://h:p,h:p)")
    nodes = _nodes(parts.netloc)
    if not nodes:
        problems.append("store: redis+cluster:// names no node (redis+cluster://host:port,...)")
    if problems:
        raise ConfigError(problems)
    return RedisStore(
        "",
        prefix=prefix,
        max_connections=connections,
        timeout=timeout,
        cluster=nodes,
        shards=shards,
    )


def _nodes(netloc: str) -> list[tuple[str, int]]:
    """``host:port,host:port`` (port 6379 when left out); [] when any part is not one."""
    nodes = []
    for part in netloc.split(","):
        host, _, port = part.strip().rpartition(":") if ":" in part else (part.strip(), "", "")
        if not host or (port and not port.isdigit()):
            return []
        nodes.append((host, int(port or 6379)))
    return nodes


OPTIONS = ("pool", "pipelines", "schema", "prepare", "timeout")
PASSED = frozenset(
    {
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslkey",
        "sslcrl",
        "sslpassword",
        "application_name",
        "connect_timeout",
        "target_session_attrs",
        "passfile",
        "options",
        "channel_binding",
        "gssencmode",
    }
)


def postgres(url: str) -> PostgresStore:
    """``postgresql://`` or ``postgres://`` with the options ``pool`` (16 connections per
    process in all, SPEC 18), ``pipelines`` (how many of them carry the poll path's
    pipelines: half, at most 8; the rest are pooled for everything else), ``schema`` (public),
    ``prepare=off`` (PgBouncer in transaction mode), ``timeout`` (1s, each store call) and
    libpq's ``sslmode`` and friends passed through."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from gateway.store.postgres.statements import describe
    from gateway.store.postgres.store import PostgresStore

    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    options = {key: value for key, value in query if key in OPTIONS}
    unknown = sorted({key for key, _ in query if key not in OPTIONS and key not in PASSED})
    if unknown:
        raise ConfigError([f"store: unknown option(s) {', '.join(unknown)}"])
    passed = urlencode([(key, value) for key, value in query if key in PASSED])
    try:
        params = conninfo_to_dict(urlunsplit(parts._replace(query=passed)))
    except psycopg.Error as exc:
        raise ConfigError([f"store: {describe(exc)}"]) from None
    problems = []
    try:
        pool = int(options.get("pool", "16"))
        pipelines = int(options.get("pipelines", str(min(8, pool // 2))))
        timeout = parse_duration(options.get("timeout", "1s"))
    except ValueError as exc:
        raise ConfigError([f"store: {exc}"]) from None
    if not 2 <= pool <= 1000:
        problems.append("store: pool must be between 2 and 1000 connections")
    elif not 1 <= pipelines <= min(64, pool - 1):
        limit = min(64, pool - 1)
        problems.append(
            f"store: pipelines must be between 1 and {limit} connections (of pool={pool}:"
            " at least one stays pooled)"
        )
    schema = options.get("schema", "public")
    if not schema or len(schema) > 63:
        problems.append("store: schema must be a name of 1 to 63 characters")
    prepare = options.get("prepare", "on").lower()
    if prepare not in ("on", "off"):
        problems.append("store: prepare must be on or off")
    if problems:
        raise ConfigError(problems)
    return PostgresStore(
        make_conninfo("", **params),
        schema=schema,
        pool=pool - pipelines,  # pool=N is every connection of the process (SPEC 18)
        pipelines=pipelines,
        prepare=prepare == "on",
        timeout=timeout,
    )
