"""The process's share of kept results (SPEC 23): the result store, opened on first use,
the HTTP session copies are streamed through, and the copies under way in this process (one
task per operation, which every caller about it awaits). State only: the workflows are in
gateway/flow/keeping.py."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field

import aiohttp

from gateway.settings.keeping import Target
from gateway.store.results import ResultStore, result_store


@dataclass
class Keeper:
    target: Target | None  # None: a temporary folder of this process's own (memory://)
    copying: dict[str, asyncio.Task[bool]] = field(default_factory=dict)
    unkeepable: set[str] = field(default_factory=set)  # operations logged as not keepable
    _store: ResultStore | None = None
    _session: aiohttp.ClientSession | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def opened(self) -> bool:
        return self._store is not None

    async def store(self) -> ResultStore:
        """The result store, opened once (a folder made, credentials read)."""
        async with self._lock:
            if self._store is None:
                store = result_store(self.target)
                await store.open()
                self._store = store
            return self._store

    def session(self, timeout: float, context: ssl.SSLContext | None) -> aiohttp.ClientSession:
        """The session results are fetched through: no total timeout (a large result takes
        its time), but connecting and each read bounded by ``timeout``."""
        if self._session is None or self._session.closed:
            bounds = aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
            connector = aiohttp.TCPConnector(ssl=context) if context is not None else None
            self._session = aiohttp.ClientSession(
                timeout=bounds, connector=connector, auto_decompress=True
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._store is not None:
            await self._store.close()
            self._store = None
