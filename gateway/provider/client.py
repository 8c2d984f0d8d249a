"""The one place that talks to providers: ``Upstream``, over the lean HTTP/1.1 client of
wire.py (kept-alive connections per origin, one write and one llhttp parse per request).

Redirects are never followed, every request has a total timeout (waiting for a connection,
connecting, sending and reading the whole body), and bodies are read with a cap that applies
after decompression. Only UpstreamError subclasses leave this module.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

from multidict import CIMultiDict, CIMultiDictProxy

from gateway import UpstreamTimeout
from gateway.provider.wire import Pool

REDACTED = "[redacted]"


@dataclass(frozen=True, slots=True)
class UpstreamResponse:
    status: int
    headers: CIMultiDictProxy[str]  # without Content-Encoding, -Length, Transfer-Encoding
    body: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "")


class Upstream:
    """``ssl_context`` is for tests (a private CA); by default ssl.create_default_context():
    certificates verified, SNI sent."""

    def __init__(
        self,
        *,
        timeout: float,
        max_response_body: int,
        pool_size: int = 100,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._timeout = timeout
        self._max_body = max_response_body
        self._pool_size = pool_size
        self._ssl = ssl_context
        self._pool: Pool | None = None

    @property
    def timeout(self) -> float:
        """Seconds a request to a provider may take in all (limits.upstream_timeout)."""
        return self._timeout

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context given for tests (a private CA); None: the default one."""
        return self._ssl

    def configure(self, *, timeout: float, max_response_body: int) -> None:
        """New limits for the requests sent from now on (a live reload)."""
        self._timeout = timeout
        self._max_body = max_response_body

    async def start(self) -> None:
        if self._pool is None:
            self._pool = Pool(self._pool_size, self._ssl)

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    async def send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | None = None,
        *,
        secrets: tuple[str, ...] = (),
        retry: bool = True,
    ) -> UpstreamResponse:
        """One request, no redirects; raises only UpstreamError subclasses. ``retry=False``:
        never sent a second time once it may have gone out (wire.py: a reused connection
        closed before an answer), for requests that each count.

        Any of ``secrets`` that the provider echoes back (in its body or a header) is
        replaced by ``[redacted]`` before the answer leaves this module.
        """
        pool = self._pool or Pool(self._pool_size, self._ssl)
        self._pool = pool
        timeout = self._timeout
        try:
            async with asyncio.timeout(timeout):
                status, kept, data = await pool.request(
                    method, url, headers, body, self._max_body, retry=retry
                )
        except TimeoutError:
            raise UpstreamTimeout(f"no answer within {timeout}s") from None
        return _redacted(UpstreamResponse(status, kept, data), secrets)


def _redacted(response: UpstreamResponse, secrets: tuple[str, ...]) -> UpstreamResponse:
    body, headers = response.body, response.headers
    for secret in secrets:
        if secret.encode() in body:
            body = body.replace(secret.encode(), REDACTED.encode())
        if any(secret in value for value in headers.values()):
            copy = CIMultiDict(
                (name, value.replace(secret, REDACTED)) for name, value in headers.items()
            )
            headers = CIMultiDictProxy(copy)
    if body is response.body and headers is response.headers:
        return response
    return UpstreamResponse(response.status, headers, body)
