"""The one place that talks to providers: one shared aiohttp ClientSession.

Redirects are never followed, every request has a total timeout, and bodies are read with a
cap that applies after decompression (we decompress ourselves, in bounded steps, so a gzip
bomb cannot inflate past the cap). aiohttp exceptions end here, translated into UpstreamError.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy

from gateway.errors import UpstreamBodyTooLarge, UpstreamTimeout, UpstreamUnavailable

CHUNK = 64 * 1024
REDACTED = "[redacted]"


@dataclass(frozen=True, slots=True)
class UpstreamResponse:
    status: int
    headers: CIMultiDictProxy[str]
    body: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("Content-Type", "")


class Upstream:
    def __init__(self, *, timeout: float, max_response_body: int, pool_size: int = 100) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._max_body = max_response_body
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None

    @property
    def timeout(self) -> float:
        """Seconds a request to a provider may take in all (limits.upstream_timeout)."""
        return float(self._timeout.total or 0.0)

    def configure(self, *, timeout: float, max_response_body: int) -> None:
        """New limits for the requests sent from now on (a live reload)."""
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._max_body = max_response_body

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._pool_size, ttl_dns_cache=60)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self._timeout,
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=("User-Agent",),
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | None = None,
        *,
        secrets: tuple[str, ...] = (),
    ) -> UpstreamResponse:
        """One request, no redirects; raises only UpstreamError subclasses.

        Any of ``secrets`` that the provider echoes back (in its body or a header) is
        replaced by ``[redacted]`` before the answer leaves this module.
        """
        await self.start()
        assert self._session is not None
        headers = {**headers, "Accept-Encoding": "gzip, deflate"}
        try:
            async with self._session.request(
                method,
                url,
                headers=headers,
                data=body,
                allow_redirects=False,
                timeout=self._timeout,
            ) as response:
                data = await self._read(response)
                kept = _without_encoding(response.headers)
                return _redacted(UpstreamResponse(response.status, kept, data), secrets)
        except TimeoutError:
            raise UpstreamTimeout(f"no answer within {self._timeout.total}s") from None
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamUnavailable(f"cannot connect: {exc.os_error}", sent=False) from None
        except (aiohttp.ClientError, zlib.error, asyncio.IncompleteReadError) as exc:
            raise UpstreamUnavailable(type(exc).__name__, sent=True) from None

    async def _read(self, response: aiohttp.ClientResponse) -> bytes:
        encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
        decoder = _decoder(encoding)
        length = response.content_length
        if decoder is None and length is not None and length > self._max_body:
            raise UpstreamBodyTooLarge(f"Content-Length {length} over the cap")
        parts: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_chunked(CHUNK):
            pieces = [chunk] if decoder is None else _inflate(decoder, chunk, self._max_body)
            for piece in pieces:
                size += len(piece)
                if size > self._max_body:
                    raise UpstreamBodyTooLarge(f"body over {self._max_body} bytes")
                parts.append(piece)
        if decoder is not None:
            tail = decoder.flush()
            size += len(tail)
            if size > self._max_body:
                raise UpstreamBodyTooLarge(f"body over {self._max_body} bytes")
            parts.append(tail)
        return b"".join(parts)


def _decoder(encoding: str) -> zlib._Decompress | None:
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(wbits=31)
    if encoding == "deflate":
        return zlib.decompressobj(wbits=15)
    if encoding in ("identity", ""):
        return None
    raise UpstreamUnavailable(f"unsupported Content-Encoding {encoding!r}", sent=True)


def _inflate(decoder: zlib._Decompress, chunk: bytes, cap: int) -> list[bytes]:
    """Decompress ``chunk`` in steps of at most ``cap + 1`` bytes of output."""
    out = []
    data = chunk
    produced = 0
    while data:
        piece = decoder.decompress(data, cap + 1)
        out.append(piece)
        produced += len(piece)
        if produced > cap:
            break
        data = decoder.unconsumed_tail
    return out


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


def _without_encoding(headers: CIMultiDictProxy[str]) -> CIMultiDictProxy[str]:
    copy = CIMultiDict(headers)
    for name in ("Content-Encoding", "Content-Length", "Transfer-Encoding"):
        copy.popall(name, None)
    return CIMultiDictProxy(copy)
