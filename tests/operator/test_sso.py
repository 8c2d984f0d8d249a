"""Operators' single sign-on (SPEC 25) against a real OpenID Connect provider on loopback
(oidc-provider-mock, a Flask app built on Authlib, in a thread of this process): the
operator API takes its ID tokens beside the static tokens, checked against its JWKS, and
maps the roles claim to a role.

The gateway checks exp against its own (fake) clock: each test sets it to the real time
before the provider issues a token.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import aiohttp
import pytest
from joserfc import jwt
from joserfc.jwk import OctKey, RSAKey

from gateway.operator import oidc

from conftest import OPERATOR_TOKEN, PROVIDER_ENV, FakeClock, Harness, free_port

# The provider is built on Authlib, whose own deprecation notices are not ours to act on.
pytestmark = pytest.mark.filterwarnings("ignore:get_jwt_config")
with warnings.catch_warnings():
    pytest.importorskip("authlib.deprecate")  # it sets "always" for its notices when imported
    warnings.filterwarnings("ignore", "authlib.jose module is deprecated")
    mock = pytest.importorskip("oidc_provider_mock", reason="the dev extra is missing")

CLIENT_ID = "statusgate-console"
CLIENT_SECRET = "console-secret-7c1e"
REDIRECT = "http://127.0.0.1:9/console"  # never visited: the code is read off the redirect
DECIDERS, ADMINS = "statusgate-deciders", "statusgate-admins"


class Provider:
    """oidc-provider-mock served by werkzeug on 127.0.0.1, counting requests by path."""

    def __init__(self, users: dict[str, dict[str, Any]]) -> None:
        from werkzeug.serving import make_server

        users_of = [mock.User(sub=sub, claims=claims) for sub, claims in users.items()]
        flask_app = mock.app(user_claims=users_of)
        self.requests: Counter[str] = Counter()
        inner = flask_app.wsgi_app

        def counted(environ: dict[str, Any], start: Callable[..., Any]) -> Any:
            self.requests[environ["PATH_INFO"]] += 1
            return inner(environ, start)

        flask_app.wsgi_app = counted  # type: ignore[method-assign]
        self.server = make_server("127.0.0.1", 0, flask_app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,))

    def __enter__(self) -> Provider:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.thread.join(5)
        self.server.server_close()

    async def code(self, sub: str, *, client_id: str = CLIENT_ID, nonce: str = "n") -> str:
        """Sign ``sub`` in through the provider's own authorization page, as a browser
        would: the code it sends back to the redirect URI."""
        query = {
            "response_type": "code",
            "client_id": client_id,
            "redirect_uri": REDIRECT,
            "scope": "openid profile email",
            "state": "s",
            "nonce": nonce,
        }
        authorize = f"{self.url}/oauth2/authorize?{urlencode(query)}"
        async with (
            aiohttp.ClientSession() as http,
            http.post(authorize, data={"sub": sub}, allow_redirects=False) as back,
        ):
            assert back.status == 302, await back.text()
            return parse_qs(urlsplit(back.headers["Location"]).query)["code"][0]

    async def id_token(
        self, sub: str, *, client_id: str = CLIENT_ID, host: str | None = None
    ) -> str:
        """``sub``'s ID token, redeemed as a client would (``host`` names the issuer the
        provider writes in ``iss``)."""
        code = await self.code(sub, client_id=client_id)
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT}
        form |= {"client_id": client_id, "client_secret": "any"}
        headers = {"Host": host} if host else {}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{self.url}/oauth2/token", data=form, headers=headers) as got,
        ):
            assert got.status == 200, await got.text()
            return str((await got.json())["id_token"])


USERS = {
    "dana": {"preferred_username": "dana", "groups": [DECIDERS]},
    "ada": {"preferred_username": "ada", "groups": ["staff", ADMINS]},
    "val": {"preferred_username": "val", "groups": "staff"},
}


def oidc_config(url: str, **changes: Any) -> dict[str, Any]:
    return {
        "oidc": {
            "issuer": url,
            "client_id": CLIENT_ID,
            "client_secret": CLIENT_SECRET,  # the provider takes none without PKCE checks
            "roles_claim": "groups",
            "roles": {"decider": [DECIDERS], "admin": [ADMINS]},
            **changes,
        }
    }


@pytest.fixture
def provider(clock: FakeClock) -> Iterator[Provider]:
    clock.now = time.time()  # the provider stamps tokens with the real time
    with Provider(USERS) as running:
        yield running


@pytest.fixture
async def sso(make_harness: Any, provider: Provider) -> Harness:
    harness: Harness = await make_harness(config_changes=oidc_config(provider.url))
    return harness


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def escalate(harness: Harness, key: str = "k1") -> str:
    response = await harness.submit([{"state": "running"}], key=key)
    job, operation = (await response.json())["id"], response.headers["Statusgate-Operation"]
    harness.clock.advance(601)
    assert (await harness.poll(job)).status == 409
    return str(operation)


async def refused(response: Any) -> str:
    """The detail of a 401 unauthenticated answer."""
    assert response.status == 401, await response.text()
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    body = await response.json()
    assert body["type"] == "/problems/unauthenticated"
    return str(body["detail"])


# -- roles from the issuer's tokens -----------------------------------------------------------


async def test_a_deciders_id_token_decides_and_the_audit_line_names_them(
    sso: Harness, provider: Provider
) -> None:
    """An ID token whose groups claim holds the decider group extends an escalation through
    the API; /admin/me says who and what role; the audit line's actor is the person."""
    operation = await escalate(sso)
    token = await provider.id_token("dana")
    me = await sso.client.get("/admin/me", headers=bearer(token))
    assert me.status == 200
    found = await me.json()
    assert (found["id"], found["role"], found["via"]) == ("dana", "decider", "oidc")
    assert found["may"] == {"read": True, "decide": True, "reload": False, "keys": False}
    assert found["expires_at"].endswith("Z")
    done = await sso.client.post(
        f"/admin/operations/{operation}/extend",
        json={"time": "5m", "requests": 2, "reason": "signed in"},
        headers=bearer(token),
    )
    assert done.status == 200, await done.text()
    line = next(x for x in sso.audit_lines() if x["event"] == "extended")
    assert line["actor"] == "dana"
    assert token not in sso.audit_path.read_text()
    reload = await sso.client.post("/admin/reload", headers=bearer(token))
    assert reload.status == 403
    assert (await reload.json())["required_role"] == "admin"


async def test_a_viewer_is_refused_a_decision_with_forbidden_role(
    sso: Harness, provider: Provider
) -> None:
    """A token whose roles claim (here a single string) matches no configured role is a
    viewer: it reads operations, and a decision is 403 forbidden-role naming both roles,
    not retryable; nothing changes."""
    operation = await escalate(sso)
    token = await provider.id_token("val")
    shown = await sso.client.get(f"/admin/operations/{operation}", headers=bearer(token))
    assert shown.status == 200
    for action in ("extend", "cancel", "abandon", "resume"):
        answer = await sso.client.post(
            f"/admin/operations/{operation}/{action}", json={"reason": "x"}, headers=bearer(token)
        )
        assert answer.status == 403
        assert answer.headers["X-Should-Retry"] == "false"
        assert answer.content_type == "application/problem+json"
        body = await answer.json()
        assert body["type"] == "/problems/forbidden-role"
        assert (body["required_role"], body["role"]) == ("decider", "viewer")
        assert "'val'" in body["detail"]
    record = await (
        await sso.client.get(f"/admin/operations/{operation}", headers=bearer(token))
    ).json()
    assert record["record"]["outcome"] == "escalated"


async def test_an_admin_group_anywhere_in_the_list_makes_an_admin(
    sso: Harness, provider: Provider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The admin mapping wins over the decider one, whatever else the claim lists; an
    admin may reload. Static operator tokens keep working beside single sign-on."""
    for name, value in PROVIDER_ENV.items():
        monkeypatch.setenv(name, value)
    token = await provider.id_token("ada")
    reload = await sso.client.post("/admin/reload", headers=bearer(token))
    assert reload.status == 200, await reload.text()
    assert (await reload.json())["actor"] == "ada"
    static = await sso.client.get("/admin/me", headers=bearer(OPERATOR_TOKEN))
    assert (await static.json())["via"] == "token"


# -- tokens the gateway must refuse -------------------------------------------------------------


async def test_an_expired_token_is_401(sso: Harness, provider: Provider) -> None:
    """A token past its exp (beyond the small leeway) is refused 401, saying it expired."""
    token = await provider.id_token("dana")
    assert (await sso.client.get("/admin/me", headers=bearer(token))).status == 200
    sso.clock.advance(3600 + oidc.LEEWAY + 1)  # the provider's tokens last an hour
    detail = await refused(await sso.client.get("/admin/me", headers=bearer(token)))
    assert "expired" in detail


async def test_a_token_for_another_audience_is_401(sso: Harness, provider: Provider) -> None:
    """The same issuer's token for another client id is refused 401 (aud)."""
    token = await provider.id_token("ada", client_id="some-other-app")
    detail = await refused(await sso.client.get("/admin/me", headers=bearer(token)))
    assert "another audience" in detail


async def test_a_token_from_another_issuer_is_401(sso: Harness, provider: Provider) -> None:
    """A token signed by the same key but naming another issuer in iss is refused 401."""
    port = urlsplit(provider.url).port
    token = await provider.id_token("ada", host=f"localhost:{port}")
    assert claims_of(token)["iss"] == f"http://localhost:{port}"
    detail = await refused(await sso.client.get("/admin/me", headers=bearer(token)))
    assert "another issuer" in detail


def part(token: str, index: int) -> dict[str, Any]:
    """One part of a compact JWT, decoded without any check (to look, never to trust)."""
    text = token.split(".")[index]
    found: dict[str, Any] = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    return found


def claims_of(token: str) -> dict[str, Any]:
    return part(token, 1)


def forged(provider: Provider, kid: str | None, **claims: Any) -> str:
    """A token with every claim right, signed by a key of the test's own."""
    return forged_for(provider.url, kid, **claims)


def forged_for(issuer: str, kid: str | None, **claims: Any) -> str:
    now = int(time.time())
    body = {"iss": issuer, "aud": CLIENT_ID, "sub": "mallory", "iat": now, "exp": now + 600}
    body |= {"groups": [ADMINS], **claims}
    key = RSAKey.generate_key(2048)
    header = {"alg": "RS256", **({"kid": kid} if kid else {})}
    return jwt.encode(header, body, key)


async def test_a_token_signed_by_another_key_is_401_and_the_jwks_refetch_is_bounded(
    sso: Harness, provider: Provider
) -> None:
    """A token signed by a key the issuer does not publish is refused 401; an unknown kid
    makes the gateway fetch the JWKS again, but at most once a minute; a token claiming
    the issuer's own kid with another key fails its signature."""
    good = await provider.id_token("dana")
    assert (await sso.client.get("/admin/me", headers=bearer(good))).status == 200
    fetched = provider.requests["/jwks"]  # at start
    await refused(await sso.client.get("/admin/me", headers=bearer(forged(provider, "k9"))))
    assert provider.requests["/jwks"] == fetched  # fetched under a minute ago: not again
    sso.clock.advance(oidc.REFETCH + 1)
    for _ in range(3):
        detail = await refused(
            await sso.client.get("/admin/me", headers=bearer(forged(provider, "k9")))
        )
        assert "does not publish" in detail
    assert provider.requests["/jwks"] == fetched + 1  # one refetch for three unknown kids
    sso.clock.advance(oidc.REFETCH + 1)
    await refused(await sso.client.get("/admin/me", headers=bearer(forged(provider, "k9"))))
    assert provider.requests["/jwks"] == fetched + 2
    real_kid = part(good, 0).get("kid")  # none here: the JWKS has one key
    detail = await refused(
        await sso.client.get("/admin/me", headers=bearer(forged(provider, real_kid)))
    )
    assert "signature" in detail


# -- the console's code exchange ------------------------------------------------------------

VERIFIER = "v" * 43


async def test_the_console_exchange_redeems_a_code_once_for_this_sign_in(
    sso: Harness, provider: Provider
) -> None:
    """POST /console/oidc/token redeems a code for its ID token (never cached, never
    carrying the client secret) and who it names; a nonce of another sign-in, a code
    already used, a verifier or redirect URI out of shape are refused, saying why."""
    config = await (await sso.client.get("/console/oidc/config")).json()
    assert config["enabled"] is True and config["client_id"] == CLIENT_ID
    assert config["authorization_endpoint"] == f"{provider.url}/oauth2/authorize"
    asked = {"code_verifier": VERIFIER, "redirect_uri": REDIRECT, "nonce": "n"}
    other = await sso.client.post(
        "/console/oidc/token", json={**asked, "code": await provider.code("dana"), "nonce": "x"}
    )
    assert "nonce differs" in await refused(other)
    code = await provider.code("dana")
    got = await sso.client.post("/console/oidc/token", json={**asked, "code": code})
    assert got.status == 200, await got.text()
    assert got.headers["Cache-Control"] == "no-store"
    text = await got.text()
    assert CLIENT_SECRET not in text
    body = json.loads(text)
    assert body["operator"] == {
        "id": "dana",
        "role": "decider",
        "may": {"read": True, "decide": True, "reload": False, "keys": False},
    }
    assert CLIENT_ID in claims_of(body["token"])["aud"]
    again = await sso.client.post("/console/oidc/token", json={**asked, "code": code})
    assert "refused the code (HTTP 400, invalid_grant)" in await refused(again)
    for bad, why in (
        ({"code_verifier": "short"}, "43 to 128"),
        ({"redirect_uri": "https://evil.example/steal"}, "ending in /console"),
        ({"nonce": 7}, "nonce must be"),
    ):
        answer = await sso.client.post("/console/oidc/token", json={**asked, "code": "c", **bad})
        assert answer.status == 400
        assert why in (await answer.json())["detail"]


async def test_without_oidc_there_is_no_sign_in_at_an_issuer(harness: Harness) -> None:
    """With no oidc section the console is told single sign-on is off, the exchange is a
    404, and a JWT-shaped bearer is just an unknown token."""
    config = await (await harness.client.get("/console/oidc/config")).json()
    assert config == {"enabled": False}
    exchange = await harness.client.post("/console/oidc/token", json={"code": "c"})
    assert exchange.status == 404
    detail = await refused(await harness.client.get("/admin/me", headers=bearer("a.b.c")))
    assert "operator token" in detail


async def test_an_unreachable_issuer_fails_closed_and_static_tokens_still_work(
    make_harness: Any, clock: FakeClock
) -> None:
    """The gateway starts while the issuer is down; JWTs are refused 401 saying it could
    not be reached, the console is told so, and static operator tokens work meanwhile."""
    clock.now = time.time()
    harness: Harness = await make_harness(
        config_changes=oidc_config(f"http://127.0.0.1:{free_port()}")
    )
    token = forged_for(f"http://127.0.0.1:{free_port()}", None)
    detail = await refused(await harness.client.get("/admin/me", headers=bearer(token)))
    assert "could not be reached" in detail
    config = await (await harness.client.get("/console/oidc/config")).json()
    assert config["enabled"] is True and "unavailable" in config["error"]
    static = await harness.client.get("/admin/me", headers=bearer(OPERATOR_TOKEN))
    assert static.status == 200


def test_claims_are_checked_with_a_small_leeway_on_the_gateways_clock() -> None:
    """exp, nbf and iat are judged by the clock the gateway is given, with LEEWAY seconds
    either way; a token without exp, or for another audience in a list, is refused."""
    now = 1_800_000_000.0
    good = {"iss": "https://idp.test", "aud": ["a", CLIENT_ID], "sub": "s", "exp": now + 10}
    oidc.check_claims(good, "https://idp.test", CLIENT_ID, now)
    oidc.check_claims({**good, "exp": now - oidc.LEEWAY + 1}, "https://idp.test", CLIENT_ID, now)
    oidc.check_claims({**good, "nbf": now + oidc.LEEWAY}, "https://idp.test", CLIENT_ID, now)
    refusals = {
        "has expired": {**good, "exp": now - oidc.LEEWAY},
        "not valid yet": {**good, "nbf": now + oidc.LEEWAY + 1},
        "issued in the future": {**good, "iat": now + oidc.LEEWAY + 1},
        "lacks the exp claim": {k: v for k, v in good.items() if k != "exp"},
        "another audience": {**good, "aud": ["a", "b"]},
        "another issuer": {**good, "iss": "https://idp.test/"},
    }
    for why, claims in refusals.items():
        with pytest.raises(oidc.Rejected, match=why):
            oidc.check_claims(claims, "https://idp.test", CLIENT_ID, now)


async def test_symmetric_and_unsigned_tokens_are_refused(sso: Harness, provider: Provider) -> None:
    """A token "signed" with HS256 (with the issuer's public key as the secret, say) or
    with alg none is refused 401 before any key is tried."""
    now = int(time.time())
    claims = {"iss": provider.url, "aud": CLIENT_ID, "sub": "m", "exp": now + 600}
    hs256 = jwt.encode({"alg": "HS256"}, claims, OctKey.import_key("k" * 32))
    detail = await refused(await sso.client.get("/admin/me", headers=bearer(hs256)))
    assert "algorithm 'HS256' is not accepted" in detail
    head = base64.urlsafe_b64encode(b'{"alg":"none"}').decode().rstrip("=")
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    detail = await refused(await sso.client.get("/admin/me", headers=bearer(f"{head}.{body}.")))
    assert "algorithm 'none' is not accepted" in detail
