"""The OpenID Connect issuer operators sign in at (SPEC 25): its discovery document, its
signing keys, checking its JWTs, and redeeming the console's authorization code.

Owns every request to the issuer: discovery is fetched at start (and again only after a
failure, at most every ``RETRY`` seconds); the JWKS is cached and fetched again when a
token names a key id it does not hold, at most every ``REFETCH`` seconds. Signatures and
claims are checked by joserfc; nothing here does cryptography by hand. It must never log
or answer with a token, a code, a verifier or the client secret.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote_plus

import aiohttp
from joserfc import jws, jwt
from joserfc.errors import (
    BadSignatureError,
    ClaimError,
    ExpiredTokenError,
    InvalidKeyIdError,
    JoseError,
    MissingClaimError,
)
from joserfc.jwk import KeySet

from gateway.settings.config import OidcSettings

log = logging.getLogger("statusgate")
LEEWAY = 60  # seconds of clock skew allowed on exp, nbf and iat
RETRY = 30.0  # seconds between discovery attempts after a failure
REFETCH = 60.0  # seconds: the JWKS is fetched again for an unknown kid at most this often
TIMEOUT = 10.0  # seconds one request to the issuer may take
MAX_BODY = 1024 * 1024  # bytes an issuer's answer may have
# Asymmetric algorithms only: a JWKS holds public keys, and an HMAC "signed" with one
# of them would be a forgery anyone could make.
ALGORITHMS = (
    "RS256",
    "RS384",
    "RS512",
    "PS256",
    "PS384",
    "PS512",
    "ES256",
    "ES384",
    "ES512",
    "EdDSA",
    "Ed25519",
)
REGISTRY = jws.JWSRegistry(algorithms=list(ALGORITHMS))


class Rejected(Exception):
    """A token or a code the issuer's rules refuse; the message says why, for the caller."""


class Unreachable(Rejected):
    """The issuer did not answer as an OpenID Connect issuer must."""


@dataclass(frozen=True)
class Discovery:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    basic_auth: bool  # the token endpoint takes client_secret_basic


class Issuer:
    """One configured issuer; replaced whole when a reload changes ``oidc``."""

    def __init__(self, settings: OidcSettings, session: aiohttp.ClientSession) -> None:
        self.settings = settings
        self.session = session
        self.discovery: Discovery | None = None
        self.keys: KeySet | None = None
        self._failed_at: float | None = None
        self._keys_at: float | None = None
        self._lock = asyncio.Lock()

    @property
    def url(self) -> str:
        return self.settings.issuer.rstrip("/") + "/.well-known/openid-configuration"

    async def discover(self, now: float) -> Discovery:
        """The discovery document (cached once read); Unreachable if it cannot be had."""
        if self.discovery is not None:
            return self.discovery
        async with self._lock:
            if self.discovery is not None:
                return self.discovery
            if self._failed_at is not None and now - self._failed_at < RETRY:
                raise Unreachable("the identity provider could not be reached; try again soon")
            try:
                self.discovery = _discovery(await self._get(self.url), self.settings.issuer)
            except Unreachable as exc:
                self._failed_at = now
                log.warning("oidc: discovery at %s failed: %s", self.url, exc)
                raise
            self._failed_at = None
            return self.discovery

    async def prefetch(self, now: float) -> None:
        """Discovery and the keys, read ahead of the first token."""
        await self._keys(await self.discover(now), None, now)

    async def verify(self, token: str, now: float) -> dict[str, Any]:
        """The claims of ``token`` if the issuer signed it for this client and it is in
        date (exp, nbf and iat with ``LEEWAY``); Rejected saying why otherwise."""
        found = await self.discover(now)
        kid, alg = _header(token)
        if alg not in ALGORITHMS:
            raise Rejected(f"the token's algorithm {alg!r} is not accepted")
        keys = await self._keys(found, kid, now)
        try:
            claims = jwt.decode(token, keys, algorithms=list(ALGORITHMS), registry=REGISTRY).claims
        except InvalidKeyIdError:
            raise Rejected(
                "the token is signed by a key the identity provider does not publish"
            ) from None
        except BadSignatureError:
            raise Rejected("the token's signature does not verify") from None
        except (JoseError, ValueError):
            raise Rejected("the token is not a signed JWT") from None
        check_claims(claims, found.issuer, self.settings.client_id, now)
        return claims

    async def _keys(self, found: Discovery, kid: str | None, now: float) -> KeySet:
        """The issuer's keys, fetched again (bounded) when none has ``kid``."""
        if self.keys is not None and _holds(self.keys, kid):
            return self.keys
        async with self._lock:
            if self.keys is not None and _holds(self.keys, kid):
                return self.keys
            if self._keys_at is not None and now - self._keys_at < REFETCH:
                if self.keys is None:
                    raise Unreachable("the identity provider's keys could not be read just now")
                return self.keys  # the same unknown kid again: no new request to the issuer
            self._keys_at = now
            self.keys = _key_set(await self._get(found.jwks_uri))
            return self.keys

    async def redeem(
        self, code: str, verifier: str, redirect_uri: str, nonce: str, now: float
    ) -> tuple[str, dict[str, Any]]:
        """Exchange an authorization code (with its PKCE verifier) at the token endpoint:
        the ID token and its checked claims, whose nonce must be this sign-in's."""
        found = await self.discover(now)
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "code_verifier": verifier,
        }
        headers = {"Accept": "application/json"}
        secret = self.settings.client_secret
        if secret is None:
            form["client_id"] = self.settings.client_id
        elif found.basic_auth:  # RFC 6749 2.3.1: each part form-encoded, then base64
            pair = f"{quote_plus(self.settings.client_id)}:{quote_plus(secret.get_secret_value())}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        else:
            form |= {
                "client_id": self.settings.client_id,
                "client_secret": secret.get_secret_value(),
            }
        answer = await self._post(found.token_endpoint, form, headers)
        token = answer.get("id_token")
        if not isinstance(token, str):
            raise Rejected("the identity provider's answer has no id_token (is openid in scope?)")
        claims = await self.verify(token, now)
        if claims.get("nonce") != nonce:
            raise Rejected("the ID token was not issued for this sign-in (nonce differs)")
        return token, claims

    async def _get(self, url: str) -> dict[str, Any]:
        try:
            async with self.session.get(url, headers={"Accept": "application/json"}) as answer:
                if answer.status != 200:
                    raise Unreachable(f"{url} answered HTTP {answer.status}")
                return _json(await answer.content.read(MAX_BODY + 1), url)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise Unreachable(f"{url} could not be reached ({type(exc).__name__})") from None

    async def _post(self, url: str, form: dict[str, str], headers: dict[str, str]) -> Any:
        try:
            async with self.session.post(url, data=form, headers=headers) as answer:
                body = await answer.content.read(MAX_BODY + 1)
                if answer.status != 200:
                    raise Rejected(_token_error(answer.status, body))
                return _json(body, url)
        except (TimeoutError, aiohttp.ClientError) as exc:
            kind = type(exc).__name__
            raise Unreachable(f"the token endpoint could not be reached ({kind})") from None


def _json(body: bytes, url: str) -> dict[str, Any]:
    if len(body) > MAX_BODY:
        raise Unreachable(f"{url} answered more than {MAX_BODY} bytes")
    try:
        data = json.loads(body)
    except ValueError:
        raise Unreachable(f"{url} did not answer JSON") from None
    if not isinstance(data, dict):
        raise Unreachable(f"{url} did not answer a JSON object")
    return data


def _token_error(status: int, body: bytes) -> str:
    """The token endpoint's refusal as its RFC 6749 error code (never its echo of input)."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    code = error if isinstance(error, str) and error.isascii() and len(error) < 80 else None
    return f"the identity provider refused the code (HTTP {status}{', ' + code if code else ''})"


def _discovery(data: Mapping[str, Any], issuer: str) -> Discovery:
    """The fields the gateway needs; the document's issuer must be the configured one
    (OpenID Connect Discovery 4.3), or tokens could name any issuer."""
    if data.get("issuer") != issuer:
        raise Unreachable(f"the discovery document names issuer {data.get('issuer')!r}")
    fields = {}
    for name in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
        value = data.get(name)
        if not isinstance(value, str) or not value.startswith(("https://", "http://")):
            raise Unreachable(f"the discovery document has no usable {name}")
        fields[name] = value
    methods = data.get("token_endpoint_auth_methods_supported", ["client_secret_basic"])
    basic = isinstance(methods, list) and "client_secret_basic" in methods
    return Discovery(issuer=issuer, basic_auth=basic, **fields)


def _key_set(data: Mapping[str, Any]) -> KeySet:
    keys = [k for k in data.get("keys", []) if isinstance(k, dict) and k.get("use") != "enc"]
    try:
        return KeySet.import_key_set({"keys": keys})
    except (JoseError, ValueError, TypeError, KeyError):
        raise Unreachable("the identity provider's JWKS holds no usable signing key") from None


def _holds(keys: KeySet, kid: str | None) -> bool:
    return (kid is None and len(keys.keys) == 1) or any(k.kid == kid for k in keys.keys)


def _header(token: str) -> tuple[str | None, str | None]:
    """The kid and alg a compact JWS names, read before any key is chosen."""
    parts = token.split(".")
    if len(parts) != 3:
        raise Rejected("the token is not a signed JWT")
    try:
        padded = parts[0] + "=" * (-len(parts[0]) % 4)
        header = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (ValueError, UnicodeError):
        raise Rejected("the token is not a signed JWT") from None
    if not isinstance(header, dict):
        raise Rejected("the token is not a signed JWT")
    kid, alg = header.get("kid"), header.get("alg")
    return (kid if isinstance(kid, str) else None), (alg if isinstance(alg, str) else None)


def check_claims(claims: dict[str, Any], issuer: str, audience: str, now: float) -> None:
    registry = jwt.JWTClaimsRegistry(
        now=int(now),
        leeway=LEEWAY,
        iss={"essential": True, "value": issuer},
        aud={"essential": True, "value": audience},
        exp={"essential": True},
    )
    try:
        registry.validate(claims)
    except ExpiredTokenError:
        raise Rejected("the token has expired") from None
    except MissingClaimError as exc:
        raise Rejected(f"the token lacks the {exc.claim} claim") from None
    except ClaimError as exc:
        raise Rejected(_why(exc.claim)) from None


def _why(name: str) -> str:
    return {
        "iss": "the token is from another issuer",
        "aud": "the token is for another audience (aud is not this gateway's client_id)",
        "nbf": "the token is not valid yet (nbf)",
        "iat": "the token is issued in the future (iat)",
    }.get(name, f"the token's {name} claim is invalid")


class Identity:
    """The issuer of the running settings, made again when a reload changes ``oidc``, and
    the one HTTP session every issuer uses (opened at start, closed at stop)."""

    def __init__(self) -> None:
        self.issuer: Issuer | None = None
        self._session: aiohttp.ClientSession | None = None

    def current(self, settings: OidcSettings | None) -> Issuer | None:
        if settings is None:
            return None
        if self.issuer is None or self.issuer.settings != settings:
            if self._session is None:
                timeout = aiohttp.ClientTimeout(total=TIMEOUT)
                self._session = aiohttp.ClientSession(timeout=timeout)
            self.issuer = Issuer(settings, self._session)
        return self.issuer

    async def start(self, settings: OidcSettings | None, now: float) -> None:
        """Read the issuer's discovery document and keys now, so the first sign-in does
        not wait; a failure is logged and tried again on demand."""
        issuer = self.current(settings)
        if issuer is None:
            return
        try:
            await issuer.prefetch(now)
        except Rejected as exc:
            log.warning("oidc: %s; static operator tokens still work", exc)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
