"""The push signature schemes of SPEC 23, each against requests signed as its provider
signs them; ed25519-jwks fetches its keys from a real JWKS server on loopback."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from multidict import CIMultiDict

from gateway.provider.client import Upstream
from gateway.provider.pushes import Keys, verify
from gateway.settings.push import Verify

NOW = 1_800_000_000.0
BODY = b'{"request_id": "req_1", "status": "OK"}'
KEY = Ed25519PrivateKey.generate()


@pytest.fixture
async def jwks() -> AsyncIterator[str]:
    raw = KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    x = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    other = {"kty": "RSA", "n": "x", "e": "AQAB"}  # a key of another kind is skipped

    async def serve(request: web.Request) -> web.Response:
        return web.json_response({"keys": [other, {"kty": "OKP", "crv": "Ed25519", "x": x}]})

    app = web.Application()
    app.router.add_get("/.well-known/jwks.json", serve)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield str(server.make_url("/.well-known/jwks.json"))
    await server.close()


def fal_headers(at: float, body: bytes = BODY, key: Ed25519PrivateKey = KEY) -> CIMultiDict[str]:
    stamp = str(int(at))
    message = "\n".join(["req_1", "user_1", stamp, hashlib.sha256(body).hexdigest()]).encode()
    return CIMultiDict(
        {
            "X-Fal-Webhook-Request-Id": "req_1",
            "X-Fal-Webhook-User-Id": "user_1",
            "X-Fal-Webhook-Timestamp": stamp,
            "X-Fal-Webhook-Signature": key.sign(message).hex(),
        }
    )


async def test_ed25519_jwks_verifies_fal_signatures(jwks: str) -> None:
    """A fal push signed by a key of the JWKS verifies and is named by its request id; one
    signed by another key, with a changed body or an old timestamp is refused."""
    rule = Verify(scheme="ed25519-jwks", jwks_url=jwks)
    upstream, keys = Upstream(timeout=5, max_response_body=65536), Keys()
    try:
        good = await verify(rule, fal_headers(NOW), BODY, NOW, upstream=upstream, keys=keys)
        assert good.refused is None and good.delivery == "req_1"
        stranger = fal_headers(NOW, key=Ed25519PrivateKey.generate())
        assert (await verify(rule, stranger, BODY, NOW, upstream=upstream, keys=keys)).refused
        changed = await verify(
            rule, fal_headers(NOW), BODY + b" ", NOW, upstream=upstream, keys=keys
        )
        assert changed.refused
        old = await verify(rule, fal_headers(NOW - 600), BODY, NOW, upstream=upstream, keys=keys)
        assert old.refused == "the timestamp is outside the tolerance"
    finally:
        await upstream.close()


async def test_hmac_sha256_with_timestamp_and_prefix() -> None:
    """hmac-sha256 checks the signature over ``timestamp.body`` in either encoding, with its
    prefix, and refuses a wrong one or a stale timestamp."""
    rule = Verify(
        scheme="hmac-sha256",
        secret="s3cret",
        header="X-Signature",
        prefix="sha256=",
        timestamp_header="X-Timestamp",
        id_header="X-Delivery",
    )
    stamp = str(int(NOW))
    digest = hmac.new(b"s3cret", stamp.encode() + b"." + BODY, hashlib.sha256).hexdigest()
    headers = CIMultiDict(
        {"X-Signature": f"sha256={digest.upper()}", "X-Timestamp": stamp, "X-Delivery": "d1"}
    )
    upstream = Upstream(timeout=5, max_response_body=65536)
    ok = await verify(rule, headers, BODY, NOW, upstream=upstream, keys=Keys())
    assert ok.refused is None and ok.delivery.startswith("sha256:")
    # the id header is not signed: a captured push sent again under another id is the
    # same delivery (a replay), not a new one
    again = CIMultiDict({**headers, "X-Delivery": "d2"})
    assert (await verify(rule, again, BODY, NOW, upstream=upstream, keys=Keys())).delivery == (
        ok.delivery
    )
    bad = CIMultiDict({**headers, "X-Signature": "sha256=" + "0" * 64})
    assert (await verify(rule, bad, BODY, NOW, upstream=upstream, keys=Keys())).refused
    late = await verify(rule, headers, BODY, NOW + 3600, upstream=upstream, keys=Keys())
    assert late.refused == "the timestamp is outside the tolerance"


async def test_header_secret_compares_the_header() -> None:
    """header-secret (AssemblyAI) accepts exactly the configured value, case-insensitive in
    the header name, and names the delivery by its body."""
    rule = Verify(scheme="header-secret", header="X-Statusgate-Push-Secret", secret="abc")
    upstream = Upstream(timeout=5, max_response_body=65536)
    ok = await verify(
        rule,
        CIMultiDict({"x-statusgate-push-secret": "abc"}),
        BODY,
        NOW,
        upstream=upstream,
        keys=Keys(),
    )
    assert ok.refused is None and ok.delivery.startswith("sha256:")
    for given in ({"X-Statusgate-Push-Secret": "abd"}, {}):
        found = await verify(rule, CIMultiDict(given), BODY, NOW, upstream=upstream, keys=Keys())
        assert found.refused == "the secret header is missing or wrong"


async def test_a_header_that_is_not_ascii_is_refused_not_a_crash() -> None:
    """Header bytes aiohttp hands over as lone surrogates (not UTF-8) are a refusal with a
    reason, for every scheme, never an encoding error."""
    upstream = Upstream(timeout=5, max_response_body=65536)
    rules = [
        Verify(scheme="header-secret", header="X-Secret", secret="abc"),
        Verify(scheme="hmac-sha256", secret="s3cret", header="X-Signature"),
        Verify(scheme="standard-webhooks", secret="whsec_" + "A" * 32),
    ]
    for rule in rules:
        headers = CIMultiDict(
            {
                "X-Secret": "\udcff\udcfe",
                "X-Signature": "\udcff",
                "webhook-id": "\udcff",
                "webhook-timestamp": str(int(NOW)),
                "webhook-signature": "v1,\udcff",
            }
        )
        found = await verify(rule, headers, BODY, NOW, upstream=upstream, keys=Keys())
        assert found.refused == "a header holds bytes that are not ASCII", rule.scheme
