"""What crosses the gateway in each direction: header scrubbing and URL rewriting (SPEC 11).

Pure functions. Agent credentials, cookies, proxy and hop-by-hop headers never reach a
provider; provider URLs reach agents only rewritten to the gateway, and URLs that point
anywhere but the policy's upstream are dropped, never followed.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote_plus, urljoin, urlsplit

from gateway.core.values import lookup
from gateway.observe import tracing
from gateway.settings.policy import ProviderPolicy

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Never forwarded to a provider, whatever the agent sends.
AGENT_ONLY = frozenset(
    {
        "authorization",
        "cookie",
        "host",
        "content-length",
        "accept-encoding",
        "idempotency-key",
        "prefer",
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
        "x-real-ip",
        "expect",
    }
)
# Never passed back to an agent: the gateway sets its own, or they are provider secrets.
PROVIDER_ONLY = frozenset(
    {
        "set-cookie",
        "set-cookie2",
        "server",
        "date",
        "content-length",
        "content-encoding",
        "retry-after",
        "www-authenticate",
        "proxy-authenticate",
        "link",
        "refresh",
        "alt-svc",
    }
)
URL_HEADERS = frozenset({"location", "content-location"})


def _connection_named(headers: Iterable[tuple[str, str]]) -> set[str]:
    named: set[str] = set()
    for name, value in headers:
        if name.lower() == "connection":
            named.update(token.strip().lower() for token in value.split(","))
    return named


def to_provider(
    headers: Iterable[tuple[str, str]],
    policy: ProviderPolicy,
    idempotency_key: str | None = None,
) -> dict[str, str]:
    """The agent's headers made fit to send upstream. The credential is not among them:
    credentials.py puts it on the request as it goes out (and removes anything an agent
    sent in its place)."""
    pairs = list(headers)
    drop = HOP_BY_HOP | AGENT_ONLY | tracing.replaced() | _connection_named(pairs)
    out: dict[str, str] = {}
    for name, value in pairs:
        lower = name.lower()
        if (
            lower in drop
            or lower.startswith(("proxy-", "statusgate-"))
            or "\r" in value
            or "\n" in value
        ):
            continue
        out[name] = value
    forward = policy.routes.submit.idempotency.forward_header
    if idempotency_key is not None and forward is not None:
        out[forward] = idempotency_key
    return out


class Rewriter:
    """Maps URLs at a policy's upstream onto the gateway's base URL for that provider."""

    def __init__(self, policy: ProviderPolicy, public_base_url: str) -> None:
        up = urlsplit(policy.upstream)
        self._upstream = policy.upstream
        self._origin = (up.scheme, up.hostname, up.port or _default_port(up.scheme))
        self._prefix = up.path.rstrip("/")
        self._gateway = f"{public_base_url}/p/{policy.provider}"

    def url(self, value: str) -> str | None:
        """The gateway URL for an upstream URL, or None when it points anywhere else."""
        if len(value) > 4096 or any(c in value for c in "\r\n\0"):
            return None
        target = urlsplit(urljoin(self._upstream + "/", value.strip()))
        origin = (target.scheme, target.hostname, target.port or _default_port(target.scheme))
        if origin != self._origin or target.username or target.password:
            return None
        path = target.path
        if not (path == self._prefix or path.startswith(self._prefix + "/")):
            return None
        rest = path[len(self._prefix) :]
        query = f"?{target.query}" if target.query else ""
        return f"{self._gateway}{rest}{query}"

    def response_headers(
        self, headers: Iterable[tuple[str, str]], policy: ProviderPolicy
    ) -> list[tuple[str, str]]:
        """Provider answer headers an agent may see, URL-bearing ones rewritten or dropped."""
        pairs = list(headers)
        drop = HOP_BY_HOP | PROVIDER_ONLY | _connection_named(pairs)
        url_headers = URL_HEADERS | {h.lower() for h in policy.routes.submit.status_url_headers}
        out: list[tuple[str, str]] = []
        for name, value in pairs:
            lower = name.lower()
            if lower in drop or lower.startswith("statusgate-"):
                continue
            if lower in url_headers:
                rewritten = self.url(value)
                if rewritten is not None:
                    out.append((name, rewritten))
                continue
            out.append((name, value))
        return out

    def body_fields(self, body: Any, fields: Iterable[str]) -> bool:
        """Rewrite the URL fields of a parsed JSON body in place; True if anything changed."""
        changed = False
        for dotted in fields:
            parent, _, leaf = dotted.rpartition(".")
            node = lookup(body, parent) if parent else body
            if isinstance(node, dict) and isinstance(node.get(leaf), str):
                node[leaf] = self.url(node[leaf])
                changed = True
        return changed


def agent_query(raw_query: str, allowed: Iterable[str]) -> str:
    """The parameters of an agent's raw query string that a route lets through (SPEC 16),
    still percent-encoded as sent; every other parameter is dropped."""
    names = set(allowed)
    if not raw_query or not names:
        return ""
    kept = [pair for pair in raw_query.split("&") if unquote_plus(pair.partition("=")[0]) in names]
    return "&".join(kept)


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


@functools.lru_cache(maxsize=1024)
def header_safe(text: str) -> str:
    cleaned = "".join(c if 0x20 <= ord(c) < 0x7F else "?" for c in text[:200])
    return cleaned
