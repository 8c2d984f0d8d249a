"""The webhook: one POST per event (``operation.escalated``, ``operation.decided``),
delivered off the request path, signed as the Standard Webhooks specification says when a
secret is configured.

A bounded queue feeds one worker; each delivery gets a few attempts with backoff and a
timeout. A dead or slow receiver never slows a status call: when the queue is full the
newest notice is dropped and counted. Outcomes are reported through ``on_outcome``.
Closing never loses a notice silently: ``close`` waits a grace period for the queue, then
hands back every notice not delivered (queued, or cut mid-delivery) for the caller to pass to
the next notifier (a reload) or to report as dropped (shutdown).

Signing: ``webhook-id`` (the same on every attempt of one event), ``webhook-timestamp``
(unix seconds of the attempt, wall time: the receiver checks it against its own clock) and
``webhook-signature: v1,<base64 HMAC-SHA256(key, "id.timestamp.body")>``, where the key is
the secret's base64 after an optional ``whsec_`` prefix.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from gateway.settings.config import secret_key

log = logging.getLogger("statusgate.webhook")
Outcome = Callable[[dict[str, Any], str], Awaitable[None]]


def signed_headers(key: bytes, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers of a Standard Webhooks delivery."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": f"v1,{digest}",
    }


class Notifier:
    def __init__(
        self,
        url: str,
        *,
        on_outcome: Outcome,
        attempts: int = 4,
        timeout: float = 5.0,
        backoff: float = 1.0,
        queue_size: int = 1000,
        key: bytes | None = None,
        wallclock: Callable[[], float] = time.time,
        on_drop: Callable[[], None] | None = None,
    ) -> None:
        self._on_drop = on_drop
        self._url = url
        self._key = key
        self._wallclock = wallclock
        self._on_outcome = on_outcome
        self._attempts = attempts
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._backoff = backoff
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(queue_size)
        self._worker: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._current: dict[str, Any] | None = None  # being delivered
        self.dropped = 0

    def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=self._timeout)
        self._worker = asyncio.create_task(self._run())

    async def close(self, grace: float = 0.0) -> list[dict[str, Any]]:
        """Stop after at most ``grace`` seconds of delivering what is queued; the notices
        not delivered (the one cut mid-delivery first, then the queue, in order)."""
        if self._worker is not None:
            if grace > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._queue.join(), grace)
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None
        left = [] if self._current is None else [self._current]
        self._current = None
        while not self._queue.empty():
            left.append(self._queue.get_nowait())
            self._queue.task_done()
        if self._session is not None:
            await self._session.close()
        return left

    def submit(self, notice: dict[str, Any]) -> None:
        """Queue one notice; never blocks, never raises."""
        try:
            self._queue.put_nowait(notice)
        except asyncio.QueueFull:
            self.dropped += 1
            if self._on_drop is not None:
                self._on_drop()
            log.warning("webhook queue full; notice dropped")

    async def drain(self) -> None:
        """Wait until every queued notice has been delivered or given up (tests, shutdown)."""
        await self._queue.join()

    async def _run(self) -> None:
        while True:
            notice = await self._queue.get()
            try:
                self._current = notice
                outcome = await self._deliver(notice)
                self._current = None
                await self._on_outcome(notice, outcome)
            except Exception:
                log.exception("escalation webhook worker failed on one notice")
            finally:
                self._queue.task_done()

    async def _deliver(self, notice: dict[str, Any]) -> str:
        assert self._session is not None
        problem = "not attempted"
        body = json.dumps(notice).encode()
        for attempt in range(1, self._attempts + 1):
            headers = {"Content-Type": "application/json"}
            if self._key is not None:
                now = int(self._wallclock())
                headers.update(signed_headers(self._key, notice["id"], now, body))
            try:
                async with self._session.post(
                    self._url, data=body, headers=headers, allow_redirects=False
                ) as response:  # a redirect is a failure: signed bodies go nowhere else
                    if response.status < 300:
                        return f"delivered (attempt {attempt}, HTTP {response.status})"
                    problem = f"HTTP {response.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                problem = type(exc).__name__
            if attempt < self._attempts:
                await asyncio.sleep(self._backoff * 2 ** (attempt - 1))
        return f"failed after {self._attempts} attempts ({problem})"


def notifier_for(
    url: str | None,
    *,
    attempts: int,
    timeout: float,
    backoff: float,
    secret: str | None,
    on_outcome: Outcome,
    on_drop: Callable[[], None],
) -> Notifier | None:
    """The webhook notifier a config asks for (started), or None without a webhook URL."""
    if url is None:
        return None
    notifier = Notifier(
        url,
        on_outcome=on_outcome,
        attempts=attempts,
        timeout=timeout,
        backoff=backoff,
        key=secret_key(secret) if secret else None,
        on_drop=on_drop,
    )
    notifier.start()
    return notifier
