"""Kept results (SPEC 23): a policy's ``results:`` section and the gateway's
``results_store:`` URL. Frozen settings and pure URL parsing only; never opens a file or
contacts a store (gateway/store/results/ does).

``results_store`` is ``file://<dir>`` or ``s3://<bucket>/<prefix>?endpoint=<url>&region=<r>``.
Unset, kept copies go to a folder beside the SQLite file; with a shared store (Redis,
PostgreSQL) that folder is one replica's own, so ``check`` refuses the combination while a
policy keeps results.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from gateway.settings.loading import Duration, Size, Strict, http_url

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_TTL = 7 * 86400.0
SHARED_SCHEMES = ("redis://", "rediss://", "redis+cluster://", "postgresql://", "postgres://")
S3_OPTIONS = frozenset({"endpoint", "region"})


class Results(Strict):
    """What the gateway keeps of a succeeded job's result."""

    keep: bool = False
    """Fetch the result once after success and answer the result route from that copy."""
    max_bytes: Size = DEFAULT_MAX_BYTES
    """A larger result is not kept (logged once) and is served through as before."""
    ttl: Duration = DEFAULT_TTL
    """How long a kept copy is kept after it was fetched ("7d")."""

    def problems(self) -> list[tuple[str, str]]:
        """Cross-field rules of the section, as (field path, message) pairs."""
        found = []
        if self.max_bytes <= 0:
            found.append(("results.max_bytes", "must be greater than 0"))
        if self.ttl <= 0:
            found.append(("results.ttl", "must be greater than 0"))
        return found


@dataclass(frozen=True, slots=True)
class FileTarget:
    """Kept copies as files in ``folder``."""

    folder: Path


@dataclass(frozen=True, slots=True)
class S3Target:
    """Kept copies as objects in ``bucket`` under ``prefix`` at ``endpoint``."""

    bucket: str
    prefix: str
    endpoint: str
    region: str


Target = FileTarget | S3Target


def parse_target(url: str, base_dir: Path) -> Target:
    """``results_store`` as a target; ValueError with a message fit for ``check``. A
    relative ``file://`` folder is read against the config file's folder."""
    if url.startswith("file://"):
        rest = unquote(url.removeprefix("file://"))
        if not rest or "?" in rest:
            raise ValueError("file:// must name a folder (file:///var/statusgate/results)")
        return FileTarget((base_dir / rest).resolve())
    if url.startswith("s3://"):
        return _s3_target(url)
    raise ValueError("must be file://<folder> or s3://<bucket>/<prefix>?endpoint=<url>")


def _s3_target(url: str) -> S3Target:
    parts = urlsplit(url)
    bucket = parts.netloc
    if not bucket or "@" in bucket or not all(c.isalnum() or c in ".-_" for c in bucket):
        raise ValueError("s3:// must name a bucket (s3://bucket/prefix?endpoint=...)")
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    unknown = sorted(set(options) - S3_OPTIONS)
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)} (endpoint, region)")
    region = options.get("region") or "us-east-1"
    endpoint = options.get("endpoint") or f"https://s3.{region}.amazonaws.com"
    try:
        http_url(endpoint)
    except ValueError as exc:
        raise ValueError(f"endpoint {exc}") from None
    prefix = parts.path.strip("/")
    return S3Target(bucket, prefix + "/" if prefix else "", endpoint.rstrip("/"), region)


def default_target(store_url: str) -> str | None:
    """Where kept copies go when ``results_store`` is unset: beside the SQLite file; with
    memory:// a folder of its own; None for a shared store (no folder every replica sees)."""
    if store_url.startswith("sqlite:///"):
        path = Path(store_url.removeprefix("sqlite:///").split("?", 1)[0])
        return "file://" + str(path.parent / f"{path.name}.results")
    if store_url.startswith(SHARED_SCHEMES):
        return None
    return ""  # memory://: a temporary folder, as short-lived as the records


def store_problem(
    results_store: str | None, store_url: str, policies: Mapping[str, Results]
) -> str | None:
    """Why the config cannot keep results, or None: a shared store with no results_store
    while a policy keeps results."""
    keeping = sorted(name for name, results in policies.items() if results.keep)
    if results_store is not None or not keeping or default_target(store_url) is not None:
        return None
    return (
        "results_store: must be set when the store is shared by replicas (Redis, PostgreSQL)"
        f" and a policy keeps results ({', '.join(keeping)}): write file://<folder on a shared"
        " volume> or s3://<bucket>/<prefix>?endpoint=<url>&region=<region>"
    )
