"""The sender of ``operation.completed`` events (SPEC 23): what the store's outbox owes,
posted to ``escalation.webhook_url``, signed as every other event is.

Exactly once across replicas and restarts, as far as a webhook can be: the record's own
write put the event in the outbox (the store's contract), so no crash loses it; a sender
takes the event's lease (``completion:<id>``) and asks the store again whether it is
still owed before it posts, and marks it sent before it gives the lease back, so two
replicas never both post it. A failed post keeps the lease for the retry delay (doubling,
jittered by the runtime's random source, from ``escalation.webhook_backoff``): nobody
posts it before then. Only a crash between a receiver's 2xx and the mark sends it again,
with the same ``webhook-id``, which receivers use to drop the repeat.

One loop a process, started with the gateway; it never decides anything an operation
does, and never dies of a failure (logged, tried again).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from gateway import StoreError
from gateway.core import completion, effects, results
from gateway.flow.runtime import Runtime
from gateway.observe.notify import signed_headers
from gateway.settings.config import secret_key

log = logging.getLogger("statusgate.webhook")
SEND_SECONDS = 1.0  # between looks at the outbox
BATCH = 100  # owed events read at one look
LEASE_MARGIN = 30.0  # seconds a post's lease outlives the post's own timeout
COMPLETION_GIVE_UP = 7 * 86400.0  # seconds from ended_at after which an owed event is given up
GIVEN_UP = "given up after 7 days"
DROPPED = "dropped: no webhook configured"


@dataclass
class Sender:
    """One process's sender: its failure counts and its HTTP session."""

    runtime: Runtime
    wallclock: Callable[[], float] = time.time  # the signature's timestamp: wall time
    failures: dict[str, int] = field(default_factory=dict)
    session: aiohttp.ClientSession | None = None

    async def send_owed(self) -> int:
        """One look at the outbox: every owed event this sender may post now is posted;
        how many were delivered. Without a webhook URL, owed events are dropped (marked
        sent unposted), so their records can be purged."""
        delivered = 0
        # past the events this sender is backing off: those alone never fill a look
        limit = BATCH + len(self.failures)
        owed = await self.runtime.store.owed_completions(limit)
        if len(owed) < limit:  # every owed event: one backed off and no longer owed was purged
            still = set(owed)
            self.failures = {i: n for i, n in self.failures.items() if i in still}
        for operation_id in owed:
            if self.runtime.stopping.is_set():
                break  # shutting down: take no new event (an unsent one stays owed)
            delivered += await self._one(operation_id)
        return delivered

    async def _one(self, operation_id: str) -> int:
        store, hook = self.runtime.store, self.runtime.settings.file.escalation
        lease = f"completion:{operation_id}"
        ttl = hook.webhook_timeout + LEASE_MARGIN
        token = secrets.token_hex(12)  # an attempt's own: a failed one's lease stops us too
        if not await store.acquire_lease(lease, token, self.runtime.clock(), ttl):
            return 0  # another replica is posting it, or its retry time has not come
        record = await store.get(operation_id)
        if record is None or not await store.completion_owed(operation_id):
            await store.release_lease(lease, token)  # sent meanwhile, or purged
            self.failures.pop(operation_id, None)
            return 0
        now = self.runtime.clock()
        unposted = self._unposted(record.ended_at, now)
        if unposted is not None:  # marked sent unposted: the record may be purged now
            await store.completion_sent(operation_id)
            await store.release_lease(lease, token)
            self.failures.pop(operation_id, None)
            await self.runtime.effects.carry_out(effects.of_completion(record, unposted, now))
            return 0
        policy = self.runtime.settings.policies.get(record.provider)
        if policy is not None and results.awaits_copy(policy, record, now):
            await store.release_lease(lease, token)  # the kept copy is being made: next look
            return 0
        path = None if policy is None else results.kept_result_path(policy, record)
        url = None if path is None else f"{self.runtime.settings.file.public_base_url}{path}"
        body = completion.event_body(record, effects.iso(record.ended_at), url)
        problem = await self._post(body)
        now = self.runtime.clock()
        if problem is None:
            await store.completion_sent(operation_id)
            await store.release_lease(lease, token)
            self.failures.pop(operation_id, None)
            outcome = "delivered"
        else:
            failed = self.failures[operation_id] = self.failures.get(operation_id, 0) + 1
            delay = completion.retry_delay(failed, hook.webhook_backoff, self.runtime.rng.random())
            await store.acquire_lease(lease, token, now, delay)  # nobody before then
            outcome = f"failed (attempt {failed}, {problem}); next in {delay:.1f} s"
        await self.runtime.effects.carry_out(effects.of_completion(record, outcome, now))
        return 1 if problem is None else 0

    def _unposted(self, ended_at: float | None, now: float) -> str | None:
        """Why an owed event is to be marked sent without a post, or None to post it: no
        webhook any more, or owed longer than COMPLETION_GIVE_UP (docs/completions.md)."""
        if self.runtime.settings.file.escalation.webhook_url is None:
            return DROPPED
        if ended_at is not None and now - ended_at > COMPLETION_GIVE_UP:
            return GIVEN_UP
        return None

    async def _post(self, body: dict[str, object]) -> str | None:
        """None when the receiver answered 2xx; else what went wrong, in a few words."""
        settings = self.runtime.settings
        hook = settings.file.escalation
        assert hook.webhook_url is not None
        if self.session is None:
            self.session = aiohttp.ClientSession()
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if settings.webhook_secret:
            key = secret_key(settings.webhook_secret)
            message_id = completion.message_id(str(body["operation_id"]))
            headers.update(signed_headers(key, message_id, int(self.wallclock()), data))
        timeout = aiohttp.ClientTimeout(total=hook.webhook_timeout)
        try:
            async with self.session.post(
                hook.webhook_url, data=data, headers=headers, timeout=timeout, allow_redirects=False
            ) as response:  # a redirect is a failure: signed bodies go nowhere else
                return None if response.status < 300 else f"HTTP {response.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            return type(exc).__name__

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None


async def run(runtime: Runtime, interval: float = SEND_SECONDS) -> None:
    """Look at the outbox every ``interval`` seconds while the gateway runs."""
    sender = Sender(runtime)
    try:
        while not runtime.stopping.is_set():
            try:
                await sender.send_owed()
            except StoreError:
                pass  # counted where it happened; tried again at the next look
            except Exception:
                log.exception("completion events: a look at the outbox failed; trying again")
            await asyncio.sleep(interval)
    finally:
        await sender.close()
