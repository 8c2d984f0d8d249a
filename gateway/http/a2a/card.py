"""The remote agent's card, fetched through the policy's credential and kept ``card_ttl``
seconds, and the card agents see: every interface URL the gateway's (SPEC 24)."""

from __future__ import annotations

import copy
from typing import Any

import orjson

from gateway.core import a2a
from gateway.flow.runtime import Runtime
from gateway.provider.headers import to_provider
from gateway.provider.send import send_upstream
from gateway.settings.a2a import VERSION
from gateway.settings.policy import ProviderPolicy

CARD_PATH = "/.well-known/agent-card.json"
# (provider, upstream, credential) -> (fetched at, card): a reload that moves the agent
# or changes the credential fetches again
_CARDS: dict[tuple[str, str, str], tuple[float, dict[str, Any]]] = {}
MAX_CARDS = 256


async def remote_card(runtime: Runtime, policy: ProviderPolicy) -> dict[str, Any] | None:
    """The remote agent's card, or None when it cannot be had."""
    key = (policy.provider, policy.upstream, policy.credential_fingerprint)
    kept = _CARDS.get(key)
    now = runtime.clock()
    if kept is not None and now - kept[0] < a2a.settings(policy).card_ttl:
        return kept[1]
    headers = to_provider([("A2A-Version", VERSION)], policy)
    url = policy.upstream + CARD_PATH
    _, response = await send_upstream(
        runtime.channel(policy), policy, "card", "GET", url, headers, None
    )
    if response is None or response.status != 200:
        return None
    try:
        card = orjson.loads(response.body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(card, dict):
        return None
    if len(_CARDS) >= MAX_CARDS:
        _CARDS.clear()
    _CARDS[key] = (now, card)
    return card


def gateway_card(card: dict[str, Any], url: str) -> dict[str, Any]:
    """``card`` as agents see it: the gateway's JSON-RPC and HTTP+JSON interfaces at
    ``url`` (no other binding: the gateway serves these two), 0.3's ``url`` and
    ``additionalInterfaces`` too, no streaming, and no push notifications for callers
    (the gateway is the remote agent's push target itself)."""
    out = copy.deepcopy(card)
    out["supportedInterfaces"] = [
        {"url": url, "protocolBinding": binding, "protocolVersion": VERSION}
        for binding in ("JSONRPC", "HTTP+JSON")
    ]
    if "url" in out:
        out["url"] = url
        out["preferredTransport"] = "JSONRPC"
        out["additionalInterfaces"] = [
            {"url": url, "transport": t} for t in ("JSONRPC", "HTTP+JSON")
        ]
    capabilities = out.get("capabilities")
    capabilities = dict(capabilities) if isinstance(capabilities, dict) else {}
    capabilities["streaming"] = False
    capabilities["pushNotifications"] = False
    out["capabilities"] = capabilities
    return out
