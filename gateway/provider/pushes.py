"""Verifying a provider's push (SPEC 23): is it signed by the provider, recent enough, and
which delivery is it (for replay protection). The clock is passed in; the only I/O is the
fetch of a JWKS (ed25519-jwks), through the one upstream client, cached.

Never reads what a push says about a job (core/pushes.py does) and never logs a secret or a
signature: a refusal says which check failed, nothing more.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from standardwebhooks import Webhook
from standardwebhooks.webhooks import EmptyWebhookSecretError

from gateway import UpstreamError
from gateway.provider.client import Upstream
from gateway.settings.push import Verify

JWKS_TTL = 3600.0  # seconds a fetched key set is used before it is fetched again


@dataclass(frozen=True, slots=True)
class Verdict:
    """A push's check: ``refused`` says why it failed (None: verified); ``delivery`` names
    the delivery for replay protection (the same on a provider's retry)."""

    refused: str | None
    delivery: str = ""


class Keys:
    """JWKS key sets by URL, fetched through the upstream client and kept ``JWKS_TTL``."""

    def __init__(self) -> None:
        self._sets: dict[str, tuple[float, list[Ed25519PublicKey]]] = {}

    async def get(self, upstream: Upstream, url: str, now: float) -> list[Ed25519PublicKey]:
        kept = self._sets.get(url)
        if kept is not None and now - kept[0] < JWKS_TTL:
            return kept[1]
        try:
            response = await upstream.send("GET", url, {"Accept": "application/json"})
        except UpstreamError:
            return kept[1] if kept is not None else []
        keys = _ed25519_keys(response.body) if response.status == 200 else []
        if keys:
            self._sets[url] = (now, keys)
        return keys or (kept[1] if kept is not None else [])


def _ed25519_keys(body: bytes) -> list[Ed25519PublicKey]:
    try:
        data = json.loads(body)
    except ValueError:
        return []
    found = []
    for key in data.get("keys", []) if isinstance(data, dict) else []:
        if isinstance(key, dict) and key.get("kty") == "OKP" and key.get("crv") == "Ed25519":
            try:
                raw = base64.urlsafe_b64decode(str(key.get("x", "")) + "==")
                found.append(Ed25519PublicKey.from_public_bytes(raw))
            except (ValueError, binascii.Error):
                continue
    return found


async def verify(
    rule: Verify,
    headers: Mapping[str, str],
    body: bytes,
    now: float,
    *,
    upstream: Upstream,
    keys: Keys,
) -> Verdict:
    """Whether the push is the provider's, by ``rule``'s scheme."""
    if not all(value.isascii() for value in headers.values()):
        return Verdict("a header holds bytes that are not ASCII")
    if rule.scheme == "standard-webhooks":
        return _standard(rule, headers, body, now)
    if rule.scheme == "hmac-sha256":
        return _hmac(rule, headers, body, now)
    if rule.scheme == "header-secret":
        assert rule.header is not None and rule.secret is not None
        given = headers.get(rule.header, "")
        if not hmac.compare_digest(given.encode(), rule.secret.encode()):
            return Verdict("the secret header is missing or wrong")
        return Verdict(None, _body_id(body))
    return await _ed25519(rule, headers, body, now, upstream, keys)


def _standard(rule: Verify, headers: Mapping[str, str], body: bytes, now: float) -> Verdict:
    """Standard Webhooks: HMAC-SHA256 over ``id.timestamp.body``, signed by the
    ``standardwebhooks`` package; the timestamp checked against ``tolerance`` here (the
    package's own check reads the wall clock with a fixed five minutes)."""
    msg_id = headers.get(rule.id_header or "webhook-id", "")
    stamp, signatures = headers.get("webhook-timestamp", ""), headers.get("webhook-signature", "")
    if not (msg_id and stamp and signatures):
        return Verdict("webhook-id, webhook-timestamp or webhook-signature is missing")
    late = _late(stamp, now, rule.tolerance)
    if late is not None:
        return Verdict(late)
    assert rule.secret is not None
    try:
        signer = Webhook(rule.secret)
    except (EmptyWebhookSecretError, ValueError, binascii.Error):
        return Verdict("the configured secret is not a Standard Webhooks secret")
    at = datetime.fromtimestamp(int(float(stamp)), tz=UTC)
    expected = signer.sign(msg_id, at, body).encode()
    if not any(hmac.compare_digest(expected, given.encode()) for given in signatures.split()):
        return Verdict("no signature matches")
    return Verdict(None, msg_id)


def _hmac(rule: Verify, headers: Mapping[str, str], body: bytes, now: float) -> Verdict:
    assert rule.header is not None and rule.secret is not None
    given = headers.get(rule.header, "").strip()
    if rule.prefix and given.startswith(rule.prefix):
        given = given[len(rule.prefix) :]
    signed = body
    if rule.timestamp_header is not None:
        stamp = headers.get(rule.timestamp_header, "")
        late = _late(stamp, now, rule.tolerance)
        if late is not None:
            return Verdict(late)
        signed = stamp.encode() + b"." + body
    digest = hmac.new(rule.secret.encode(), signed, hashlib.sha256).digest()
    expected = digest.hex() if rule.encoding == "hex" else base64.b64encode(digest).decode()
    if rule.encoding == "hex":  # hex digits in either case
        expected, given = expected.lower(), given.lower()
    if not given or not hmac.compare_digest(expected.encode(), given.encode()):
        return Verdict("the signature does not match")
    # the delivery is what the signature covers: an id header it does not cover could be
    # changed on a captured push to replay it as a new delivery
    return Verdict(None, _body_id(signed))


async def _ed25519(
    rule: Verify,
    headers: Mapping[str, str],
    body: bytes,
    now: float,
    upstream: Upstream,
    keys: Keys,
) -> Verdict:
    """fal's scheme: an Ed25519 signature (hex) over ``request_id \\n user_id \\n timestamp
    \\n sha256(body) hex``, by any key of the provider's JWKS."""
    names = ("request-id", "user-id", "timestamp", "signature")
    values = [headers.get(f"X-Fal-Webhook-{name}", "") for name in names]
    request_id, user_id, stamp, signature = values
    if not all(values):
        return Verdict("an X-Fal-Webhook-* header is missing")
    late = _late(stamp, now, rule.tolerance)
    if late is not None:
        return Verdict(late)
    try:
        raw = bytes.fromhex(signature)
    except ValueError:
        return Verdict("the signature is not hex")
    message = "\n".join([request_id, user_id, stamp, hashlib.sha256(body).hexdigest()]).encode()
    assert rule.jwks_url is not None
    for key in await keys.get(upstream, rule.jwks_url, now):
        try:
            key.verify(raw, message)
        except InvalidSignature:
            continue
        return Verdict(None, request_id)  # signed, unlike any other header
    return Verdict("no key of the provider's JWKS verifies the signature")


def _late(stamp: str, now: float, tolerance: float) -> str | None:
    """Why a push's Unix timestamp is refused (not a number, outside ``tolerance``)."""
    try:
        at = float(stamp)
    except ValueError:
        return "the timestamp is not a number"
    if at != at or abs(now - at) > tolerance:
        return "the timestamp is outside the tolerance"
    return None


def _body_id(body: bytes) -> str:
    """A delivery named by its content, for schemes without a delivery id header."""
    return "sha256:" + hashlib.sha256(body).hexdigest()
