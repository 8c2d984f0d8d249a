"""Reading a request body whole, within a size cap and a time limit (SPEC 11 and 16).

Owns the two ways a body is refused while it arrives: too large (BodyTooLarge, answered 413
``request-too-large``) and too slow (BodyTimeout, answered 408 ``request-timeout``); the
``errors`` middleware (http/middleware.py) turns both into problem+json. A client that
stalls its body holds a connection for ``limits.body_timeout`` at most, not for ever. Never
logs a body.
"""

from __future__ import annotations

import asyncio

from gateway import StatusgateError
from gateway.flow.requests import AgentRequest

CHUNK = 64 * 1024


class BodyTooLarge(StatusgateError):
    """The body is larger than ``cap`` bytes (declared or as it arrived)."""

    def __init__(self, cap: int) -> None:
        super().__init__(f"The body is larger than {cap} bytes.")
        self.cap = cap


class BodyTimeout(StatusgateError):
    """The whole body did not arrive within ``timeout`` seconds."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"The request body did not arrive within {timeout:g} s.")
        self.timeout = timeout


async def read_limited(request: AgentRequest, cap: int, timeout: float) -> bytes:
    """The whole body: at most ``cap`` bytes, all of it within ``timeout`` seconds."""
    if request.content_length is not None and request.content_length > cap:
        raise BodyTooLarge(cap)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.content.iter_chunked(CHUNK):
                size += len(chunk)
                if size > cap:
                    raise BodyTooLarge(cap)
                chunks.append(chunk)
    except TimeoutError:
        raise BodyTimeout(timeout) from None
    return b"".join(chunks)
