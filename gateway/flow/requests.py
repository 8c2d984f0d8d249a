"""What the agent handlers, the middleware and the poll workflow read of an agent's HTTP
request (``AgentRequest``): a Protocol that aiohttp's ``web.Request`` and the agent lane's
``LaneRequest`` (gateway/http/lane/) both satisfy, so mypy checks both sides of the seam
between the lane and the handlers it calls.

It names only what they read: anything more a handler wants of a request must be added
here, and then to the lane's request, or mypy says where it is missing. Never a class a
request must inherit from: aiohttp's is not ours to change.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol, TypeVar, overload

from aiohttp import web
from multidict import CIMultiDictProxy
from yarl import URL

_T = TypeVar("_T")


class BodyReader(Protocol):
    """A request body as it arrives (aiohttp's ``StreamReader``, the lane's ``Body``)."""

    def iter_chunked(self, n: int) -> AsyncIterator[bytes]: ...


class AgentRequest(Protocol):
    """An agent's request as the handlers read it; its own keys (``request[PROVIDER]``)
    set and read with ``web.RequestKey``s."""

    @property
    def app(self) -> web.Application: ...

    @property
    def method(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def rel_url(self) -> URL: ...

    @property
    def headers(self) -> CIMultiDictProxy[str]: ...

    @property
    def match_info(self) -> Mapping[str, str]: ...

    @property
    def transport(self) -> asyncio.Transport | None: ...

    @property
    def content_length(self) -> int | None: ...

    @property
    def content(self) -> BodyReader: ...

    def __setitem__(self, key: web.RequestKey[_T], value: _T, /) -> None: ...

    @overload
    def get(self, key: web.RequestKey[Any], /) -> Any: ...

    @overload
    def get(self, key: web.RequestKey[Any], default: Any, /) -> Any: ...

    def get(self, key: web.RequestKey[Any], default: Any = None, /) -> Any: ...
