"""Kept results (SPEC 23): a succeeded job's result fetched once through the result route
and kept in the result store, so the route answers from the copy with no provider call.

Exactly once across replicas and restarts: a copy is made only under the operation's poll
lease (renewed on a timer for as long as the copy is under way, so a provider slow to
answer or between chunks never loses it; a renewal that finds it lost abandons the copy),
counted in the result budget before it is sent (the gateway's own tries bounded and backed
off so they never starve the agent's budget), streamed chunk by chunk into a partial copy
that becomes visible only when complete, and recorded on the operation only after that. A
crash mid-copy leaves a partial copy nobody reads and a record that still owes one: the
sweeper (or the first agent call) fetches it again. Within a process, every caller about
one operation awaits the one copy under way. Never the whole result in memory; never a
redirect followed.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp

from gateway import StoreError
from gateway.core import effects, results
from gateway.core.models import (
    Event,
    KeptResult,
    OperationFilter,
    OperationRecord,
    Outcome,
    poll_lease,
)
from gateway.core.routing import Finals, fill
from gateway.flow.leases import Lease, new_token
from gateway.flow.runtime import Runtime
from gateway.observe.metrics import status_class
from gateway.provider.credentials import Outgoing
from gateway.provider.headers import to_provider
from gateway.settings.policy import ProviderPolicy
from gateway.store.base import LeaseLost
from gateway.store.results import CHUNK, CopyWriter

log = logging.getLogger("statusgate")
_T = TypeVar("_T")
KEEP_LEASE = 30.0  # seconds a copy's lease lasts at most (limits.upstream_timeout if shorter)
WAIT_STEP = 0.25  # seconds between looks while another replica makes the copy
OWED_BATCH = 100  # succeeded operations looked at per provider per sweep
MAX_COPYING = 8  # copies the sweeper keeps under way in one process
PARTIAL_AGE = 86400.0  # a partial copy this old was left by a process that died


def lease_seconds(runtime: Runtime) -> float:
    """How long a copy's lease lasts: renewed every third of it for as long as the copy is
    under way, it is only what another replica waits after this one died."""
    return max(1.0, min(KEEP_LEASE, runtime.settings.file.limits.upstream_timeout))


def after_success(runtime: Runtime, policy: ProviderPolicy, record: OperationRecord) -> None:
    """A poll (or push) recorded ``record``: start its copy if one is owed."""
    if results.owes_copy(policy, record, runtime.clock()):
        start(runtime, policy, record.operation_id)


def start(runtime: Runtime, policy: ProviderPolicy, operation_id: str) -> asyncio.Task[bool]:
    """The copy of ``operation_id`` under way in this process, started if none is."""
    keeper = runtime.keeper
    task = keeper.copying.get(operation_id)
    if task is None:
        task = asyncio.create_task(copy_once(runtime, policy, operation_id))
        keeper.copying[operation_id] = task
        runtime.background.add(task)

        def done(finished: asyncio.Task[bool]) -> None:
            keeper.copying.pop(operation_id, None)
            runtime.background.discard(finished)

        task.add_done_callback(done)
    return task


async def settled(
    runtime: Runtime, policy: ProviderPolicy, record: OperationRecord
) -> OperationRecord:
    """``record`` once it owes no copy, or no copy can be made now (this process tried, or
    another replica's took longer than a provider call may): what the result route then
    answers from. Callers about one operation share the one copy under way; a try already
    made (its backoff not over) is waited for while one may still be under way: the poll
    lease held elsewhere, or this process's own copy task."""
    loop = asyncio.get_running_loop()
    until = loop.time() + 2 * runtime.settings.file.limits.upstream_timeout + lease_seconds(runtime)
    while results.owes_copy(policy, record, runtime.clock()) or results.copy_tried(policy, record):
        tried = await asyncio.shield(start(runtime, policy, record.operation_id))
        fresh = await runtime.records.get(record.operation_id)
        record = fresh if fresh is not None else record
        if tried or fresh is None or loop.time() >= until:
            return record
        if not await runtime.pause(WAIT_STEP):
            return record
    return record


async def copy_once(runtime: Runtime, policy: ProviderPolicy, operation_id: str) -> bool:
    """Make the copy under the operation's lease; False when another holds the lease."""
    lease, seconds = Lease(poll_lease(operation_id), new_token()), lease_seconds(runtime)
    coordination = runtime.coordination
    if not await coordination.acquire_lease(lease.name, lease.token, runtime.clock(), seconds):
        return False
    try:
        record = await runtime.records.get(operation_id)
        if record is not None and results.owes_copy(policy, record, runtime.clock()):
            await _copy(runtime, policy, record, _Hold(runtime, lease, seconds))
    except StoreError as exc:
        log.warning("keeping the result of %s failed: %s; tried again later", operation_id, exc)
    except Exception:
        log.exception("keeping the result of %s failed; tried again later", operation_id)
    finally:
        try:
            await coordination.release_lease(lease.name, lease.token)
        except StoreError:
            runtime.releases.later(coordination, lease, seconds)
    return True


async def _copy(
    runtime: Runtime, policy: ProviderPolicy, record: OperationRecord, hold: _Hold
) -> None:
    """Count one result fetch (one of the gateway's tries), stream the answer into the
    result store, record the copy; a try that failed is recorded so the next one backs off."""
    values = results.provider_values(policy, record, {})
    if isinstance(values, results.Refusal):
        if record.operation_id not in runtime.keeper.unkeepable:
            runtime.keeper.unkeepable.add(record.operation_id)
            log.warning("result of %s not kept: %s", record.operation_id, values.detail)
        return
    now = runtime.clock()
    fetched = await runtime.records.mutate(
        record.operation_id, lambda current: results.copy_fetch(policy, current, now)
    )
    if isinstance(fetched, results.Refusal):
        return
    try:
        status, kept = await hold.run(_fetch(runtime, policy, fetched, values, hold))
    except LeaseLost:
        raise  # no failure recorded: the lease's new holder makes the copy
    except Exception:
        await _failed(runtime, policy, fetched, None)
        raise
    if kept is None:
        await _failed(runtime, policy, fetched, status)
        return
    await _record(runtime, fetched, kept, status or 200)


async def _fetch(
    runtime: Runtime,
    policy: ProviderPolicy,
    record: OperationRecord,
    values: Finals,
    hold: _Hold,
) -> tuple[int | None, KeptResult | None]:
    """The result route's answer streamed into a copy: its status, and the copy (None when
    there was no answer, or not a 2xx one)."""
    route = policy.routes.result
    assert route is not None
    fixed = route.match.headers.items() if route.match is not None else []
    url = policy.upstream + fill(route.path, values.values, values.query)
    applier = runtime.applier(policy)
    out = await applier.apply(Outgoing(route.method, url, to_provider(fixed, policy), None))
    store = await runtime.keeper.store()
    copy = _Copy(runtime, policy, record, hold, applier.secrets())
    started, status, kept = time.perf_counter(), None, None
    session = runtime.keeper.session(runtime.upstream.timeout, runtime.upstream.ssl_context)
    try:
        async with session.request(
            out.method, out.url, headers=out.headers, data=out.body, allow_redirects=False
        ) as response:
            status = response.status
            if 200 <= status < 300:
                kept = await copy.stream(response, store.writer)
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("fetching the result of %s to keep failed: %s", record.operation_id, exc)
    metrics = runtime.effects.metrics
    metrics.histogram("upstream_duration", policy.provider, "result").observe(
        time.perf_counter() - started
    )
    metrics.counter("upstream_requests", policy.provider, "result", status_class(status)).inc()
    return status, kept


async def _failed(
    runtime: Runtime, policy: ProviderPolicy, record: OperationRecord, status: int | None
) -> None:
    """A try that kept nothing: its backoff recorded on the operation (so every replica
    waits it out), its audit line, and a warning once the gateway gives up."""
    now = runtime.clock()
    await runtime.records.mutate(
        record.operation_id, lambda current: results.copy_failed(current, now)
    )
    detail = "fetched to keep: not kept" + ("" if status else " (no answer)")
    line = effects.of_call(
        now,
        provider=policy.provider,
        account=record.account,
        event=Event.RESULT_FETCHED,
        http_status=status,
        detail=detail,
        operation=record,
    )
    await runtime.effects.carry_out(line)
    if record.copy_attempts >= results.COPY_TRIES:
        log.warning(
            "result of %s not kept: %d tries failed; the result route forwards as before",
            record.operation_id,
            record.copy_attempts,
        )


async def _record(runtime: Runtime, record: OperationRecord, kept: KeptResult, status: int) -> None:
    """Record the copy on the operation (the first one recorded counts; a copy that lost is
    deleted), then its audit line."""
    stored = await runtime.records.mutate(
        record.operation_id, lambda current: results.record_copy(current, kept)
    )
    if stored.kept_result != kept:
        if kept.kept:
            store = await runtime.keeper.store()
            await store.delete(kept.name)
        return
    if not kept.kept:
        log.warning(
            "result of %s not kept: larger than results.max_bytes; served through as before",
            record.operation_id,
        )
    await runtime.effects.carry_out(results.kept_line(stored, kept, runtime.clock(), status))


@dataclass
class _Hold:
    """The copy's lease held on for as long as the copy is under way: renewed every third of
    its length on the event loop's own timer, whether or not the provider sends anything
    (slow headers, long pauses between chunks). A renewal that finds the lease gone (or
    cannot tell: the store failed) abandons the copy: no byte more written, nothing
    committed, nothing recorded."""

    runtime: Runtime
    lease: Lease
    seconds: float
    lost: bool = False

    async def run(self, work: Coroutine[Any, Any, _T]) -> _T:
        """``work`` under the lease; LeaseLost when a renewal found it gone."""
        task = asyncio.ensure_future(work)
        renewer = asyncio.create_task(self._renew(task))
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self.lost and (current is None or not current.cancelling()):
                raise LeaseLost(self.detail()) from None
            raise
        finally:
            renewer.cancel()
            await asyncio.wait({renewer})

    def check(self) -> None:
        """Raise LeaseLost once a renewal found the lease gone."""
        if self.lost:
            raise LeaseLost(self.detail())

    def detail(self) -> str:
        return f"the lease of {self.lease.name} went to another holder; the copy was abandoned"

    async def _renew(self, work: asyncio.Future[Any]) -> None:
        coordination, lease = self.runtime.coordination, self.lease
        while not work.done():
            await asyncio.sleep(self.seconds / 3)
            try:
                held = await coordination.acquire_lease(
                    lease.name, lease.token, self.runtime.clock(), self.seconds
                )
            except StoreError:
                held = False
            if not held:
                self.lost = True
                work.cancel()
                return


@dataclass
class _Copy:
    """One answer streamed into the result store, its size and sha256 counted, abandoned
    once its lease is lost."""

    runtime: Runtime
    policy: ProviderPolicy
    record: OperationRecord
    hold: _Hold
    secrets: tuple[str, ...]

    async def stream(
        self, response: aiohttp.ClientResponse, writer_for: Callable[[str], CopyWriter]
    ) -> KeptResult:
        """The answer's body into a new copy, committed when whole; a body over
        ``results.max_bytes`` (as declared, or once read past it) is not kept."""
        keeping = self.policy.results
        now = self.runtime.clock()
        expires = now + keeping.ttl
        content_type = response.headers.get("Content-Type", "")
        declared = response.content_length
        if declared is not None and declared > keeping.max_bytes:
            return KeptResult("", declared, "", content_type, now, expires)
        name = results.copy_name(self.record.operation_id, expires)
        writer = writer_for(name)
        digest, size, redactor = hashlib.sha256(), 0, Redactor(self.secrets)
        try:
            chunks = response.content.iter_chunked(CHUNK)
            while (raw := await anext(chunks, None)) is not None or redactor.pending:
                chunk = redactor.feed(raw) if raw is not None else redactor.end()
                size += len(chunk)
                if size > keeping.max_bytes:
                    await writer.abort()
                    return KeptResult("", size, "", content_type, now, expires)
                digest.update(chunk)
                self.hold.check()
                await writer.write(chunk)
            self.hold.check()
            await writer.commit()
        except BaseException:
            await writer.abort()
            raise
        return KeptResult(name, size, digest.hexdigest(), content_type, now, expires)


class Redactor:
    """The credential's secrets replaced by ``[redacted]`` in a stream of chunks, as the
    upstream client does in a body read whole: the last bytes of each chunk (fewer than the
    longest secret) wait for the next, so a secret split between chunks is found too."""

    def __init__(self, secrets: tuple[str, ...]) -> None:
        self._secrets = [s.encode() for s in secrets if s]
        self._keep = max((len(s) for s in self._secrets), default=1) - 1
        self._tail = b""

    def feed(self, chunk: bytes) -> bytes:
        if not self._secrets:
            return chunk
        data = self._tail + chunk
        for secret in self._secrets:
            data = data.replace(secret, b"[redacted]")
        cut = max(0, len(data) - self._keep)
        self._tail = data[cut:]
        return data[:cut]

    @property
    def pending(self) -> bool:
        """Bytes wait for the next chunk (``end`` gives them)."""
        return bool(self._tail)

    def end(self) -> bytes:
        tail, self._tail = self._tail, b""
        return tail


# -- the sweeper's part ----------------------------------------------------------------


async def keep_owed(runtime: Runtime) -> int:
    """Start the copies owed by recently succeeded operations (a copy a crash cut short, a
    success recorded by a push); how many were started."""
    started = 0
    for policy in list(runtime.settings.policies.values()):
        if not policy.results.keep:
            continue
        where = OperationFilter(Outcome.SUCCEEDED, policy.provider, limit=OWED_BATCH)
        for record in await runtime.records.list(where):
            if len(runtime.keeper.copying) >= MAX_COPYING:
                return started
            if record.operation_id in runtime.keeper.copying:
                continue
            if results.owes_copy(policy, record, runtime.clock()):
                start(runtime, policy, record.operation_id)
                started += 1
    return started


async def delete_expired(runtime: Runtime) -> int:
    """Delete the kept copies past their ttl (named by their expiry) and the partial copies
    a process that died left; how many copies were deleted."""
    keeping = any(p.results.keep for p in runtime.settings.policies.values())
    if not keeping and not runtime.keeper.opened:
        return 0
    store = await runtime.keeper.store()
    now = runtime.clock()
    deleted = 0
    for name in await store.names():
        expiry = results.copy_expiry(name)
        if expiry is not None and expiry <= now:
            await store.delete(name)
            deleted += 1
    await store.forget_partial(now - PARTIAL_AGE)
    if deleted:
        log.info("deleted %d kept results past their ttl", deleted)
    return deleted
