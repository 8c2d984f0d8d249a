"""Putting a policy's credential on a provider request (SPEC sections 3 and 12).

One class per credential kind, chosen from a table by ``Credential.kind``: a header, a query
parameter, an AWS Signature Version 4 (signed with botocore's signer over the exact request
that is sent), or an OAuth2 client-credentials bearer token (fetched from the policy's token
URL, cached until shortly before it expires, renewed once when the provider answers 401;
one fetch in flight at a time, callers waiting for it at most the upstream timeout).
Agents never hold any of it; whatever an agent sent in the credential's place is removed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote, unquote_plus, urlencode, urlsplit, urlunsplit

from gateway import UpstreamUnavailable
from gateway.core.models import Clock
from gateway.provider.client import Upstream
from gateway.settings.policy import Credential, ProviderPolicy

# botocore logs canonical requests at debug level; nothing of a signature belongs in logs.
logging.getLogger("botocore").setLevel(logging.WARNING)

AWS_HEADERS = ("authorization", "x-amz-date", "x-amz-security-token", "x-amz-content-sha256")
TOKEN_MARGIN = 60.0  # renew an OAuth2 token this long before it expires (at most)
# An expires_in under this is taken as this: a token endpoint answering 0.001 must not turn
# every provider call into a token fetch (a token that really is gone gets a 401: renewed).
MIN_TOKEN_LIFETIME = 30.0


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One provider request as it will be sent."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes | None


class Applier(Protocol):
    async def apply(self, request: Outgoing) -> Outgoing: ...

    def renew(self) -> bool:
        """After a 401: forget what may be stale; True if sending again can help."""
        ...

    def secrets(self) -> tuple[str, ...]:
        """Every secret string this credential uses now (for redaction)."""
        ...


def _without(headers: dict[str, str], names: tuple[str, ...]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in names}


class HeaderCredential:
    def __init__(self, credential: Credential, **_: object) -> None:
        assert credential.header is not None and credential.value is not None
        self._name, self._value = credential.header, credential.value
        self._static = credential.secrets

    async def apply(self, request: Outgoing) -> Outgoing:
        headers = _without(request.headers, (self._name.lower(),))
        headers[self._name] = self._value
        return Outgoing(request.method, request.url, headers, request.body)

    def renew(self) -> bool:
        return False

    def secrets(self) -> tuple[str, ...]:
        return self._static


class QueryCredential:
    """An API key in the query (Google's ``key=``): any agent value of that name is dropped."""

    def __init__(self, credential: Credential, **_: object) -> None:
        assert credential.query is not None and credential.value is not None
        self._name, self._value = credential.query, credential.value
        self._static = credential.secrets

    async def apply(self, request: Outgoing) -> Outgoing:
        parts = urlsplit(request.url)
        kept = [
            pair
            for pair in parts.query.split("&")
            if pair and unquote_plus(pair.partition("=")[0]) != self._name
        ]
        kept.append(urlencode({self._name: self._value}, quote_via=quote))
        url = urlunsplit(parts._replace(query="&".join(kept)))
        return Outgoing(request.method, url, request.headers, request.body)

    def renew(self) -> bool:
        return False

    def secrets(self) -> tuple[str, ...]:
        return self._static


class SigV4Credential:
    """Signs the exact request sent with botocore's SigV4 signer."""

    def __init__(self, credential: Credential, **_: object) -> None:
        from botocore.credentials import Credentials

        aws = credential.aws_sigv4
        assert aws is not None
        self._keys = Credentials(aws.access_key_id, aws.secret_access_key, aws.session_token)
        self._service, self._region = aws.service, aws.region
        self._static = credential.secrets

    async def apply(self, request: Outgoing) -> Outgoing:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        headers = _without(request.headers, AWS_HEADERS)
        aws = AWSRequest(
            method=request.method, url=request.url, data=request.body or b"", headers=headers
        )
        SigV4Auth(self._keys, self._service, self._region).add_auth(aws)
        signed = {name: str(value) for name, value in aws.headers.items()}
        return Outgoing(request.method, request.url, signed, request.body)

    def renew(self) -> bool:
        return False

    def secrets(self) -> tuple[str, ...]:
        return self._static


class OAuth2Credential:
    """RFC 6749 section 4.4: a bearer token for the client's own credentials."""

    def __init__(self, credential: Credential, *, upstream: Upstream, clock: Clock) -> None:
        oauth = credential.oauth2_client_credentials
        assert oauth is not None
        self._oauth = oauth
        self._header = credential.header or "Authorization"
        self._upstream, self._clock = upstream, clock
        self._token: str | None = None
        self._expires_at = 0.0
        self._fetching: asyncio.Future[str] | None = None
        self._static = credential.secrets

    async def apply(self, request: Outgoing) -> Outgoing:
        token = await self._current()
        headers = _without(request.headers, (self._header.lower(),))
        headers[self._header] = f"Bearer {token}"
        return Outgoing(request.method, request.url, headers, request.body)

    async def _current(self) -> str:
        """The cached token, or the one being fetched: one fetch in flight whatever the
        number of callers, each of them waiting for it at most the upstream timeout (a
        token endpoint that hangs must not queue every submit behind it, one by one)."""
        if self._token is not None and self._clock() < self._expires_at:
            return self._token
        if self._fetching is None:
            self._fetching = asyncio.ensure_future(self._renewed())
            self._fetching.add_done_callback(self._fetched)
        timeout = self._upstream.timeout
        try:
            return await asyncio.wait_for(asyncio.shield(self._fetching), timeout)
        except TimeoutError:
            raise UpstreamUnavailable(
                f"token endpoint: no token within {timeout:g}s", sent=False
            ) from None

    async def _renewed(self) -> str:
        token, lifetime = await self._fetch()
        margin = min(TOKEN_MARGIN, lifetime / 10)
        self._token, self._expires_at = token, self._clock() + lifetime - margin
        return token

    def _fetched(self, fetch: asyncio.Future[str]) -> None:
        self._fetching = None
        if not fetch.cancelled():
            fetch.exception()  # each waiter got it; a fetch nobody waits for any more is quiet

    async def _fetch(self) -> tuple[str, float]:
        """A new token, or UpstreamUnavailable (nothing was sent to the provider)."""
        oauth = self._oauth
        basic = base64.b64encode(
            f"{quote(oauth.client_id, safe='')}:{quote(oauth.client_secret, safe='')}".encode()
        ).decode()
        form = {"grant_type": "client_credentials"}
        if oauth.scope:
            form["scope"] = oauth.scope
        headers = {
            "Authorization": f"Basic {basic}",
            "Content-Type": "application/x-www-form-urlencoded",
            "Accept": "application/json",
        }
        try:
            answer = await self._upstream.send(
                "POST", oauth.token_url, headers, urlencode(form).encode(), secrets=self._static
            )
        except UpstreamUnavailable:
            raise
        except Exception as exc:  # UpstreamTimeout, UpstreamBodyTooLarge
            raise UpstreamUnavailable(f"token endpoint: {type(exc).__name__}", sent=False) from None
        return _token_from(answer.status, answer.body)

    def renew(self) -> bool:
        self._token = None
        return True

    def secrets(self) -> tuple[str, ...]:
        return (*self._static, self._token) if self._token else self._static


def _token_from(status: int, body: bytes) -> tuple[str, float]:
    """``access_token`` and its lifetime from a token endpoint's answer (RFC 6749 5.1)."""
    if status != 200:
        raise UpstreamUnavailable(f"token endpoint answered {status}", sent=False)
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        data = None
    token = data.get("access_token") if isinstance(data, dict) else None
    if not isinstance(token, str) or not token or any(c in token for c in "\r\n"):
        raise UpstreamUnavailable("token endpoint answered without an access_token", sent=False)
    lifetime = data.get("expires_in", 3600) if isinstance(data, dict) else 3600
    if isinstance(lifetime, bool) or not isinstance(lifetime, int | float) or lifetime <= 0:
        lifetime = 3600
    return token, float(min(max(lifetime, MIN_TOKEN_LIFETIME), 86400))


KINDS: dict[str, Callable[..., Applier]] = {
    "header": HeaderCredential,
    "query": QueryCredential,
    "aws_sigv4": SigV4Credential,
    "oauth2_client_credentials": OAuth2Credential,
}


def applier_for(policy: ProviderPolicy, *, upstream: Upstream, clock: Clock) -> Applier:
    return KINDS[policy.credential.kind](policy.credential, upstream=upstream, clock=clock)
