"""A poll, step by step, for whoever asks: an agent's status call, a held call, an MCP
wait, crash recovery (SPEC 4 steps 7-9 and SPEC 16).

Owns the order of the steps: one poll per operation per process at a time (shared by every
caller), the poll lease and the provider's pacing window, the reservation written before the
send, exactly one provider request, the answer classified and written under the same lease,
and the effects (audit line, metrics, webhook) before anyone is answered. Every rule comes
from decide.py; nothing here answers HTTP (proxy.py and mcp/ do).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aiohttp import web

from gateway.core import decide
from gateway.core.decide import Decision
from gateway.core.models import OperationFilter, OperationRecord, Outcome, ProviderAnswer
from gateway.core.pacing import GUARD
from gateway.core.routing import body_with_job_id, fill
from gateway.core.schedule import provider_limit
from gateway.errors import NotAdmissible, StoreError
from gateway.flow.pausing import tighten
from gateway.flow.runtime import OUTCOME, PollTask, Runtime
from gateway.observe.effects import Window
from gateway.provider.client import UpstreamResponse
from gateway.provider.headers import header_safe, to_provider
from gateway.provider.send import send_upstream
from gateway.settings.config import Account
from gateway.settings.policy import ProviderPolicy

LEASE_MARGIN = 1.0  # a poll lease outlives the longest poll by this much
MIN_HOLD_STEP = 0.005  # a held call never wakes more often than this


@dataclass(frozen=True, slots=True)
class Asker:
    """Whom a poll is made for: the provider job, what of the asker's own request goes to
    the provider with it, and how to tell that the asker went away. An agent's status call
    forwards its headers, allowed query parameters and body; a wait the gateway makes for
    an account (MCP) forwards nothing of an agent's."""

    runtime: Runtime
    policy: ProviderPolicy
    job_id: str
    headers: Mapping[str, str]  # ready for the provider (headers.to_provider)
    query: str = ""  # the agent's query parameters the status route lets through
    body: bytes | None = None
    gone: Callable[[], bool] = lambda: False
    request: web.Request | None = None  # an agent's HTTP call, told when it joins a poll


def record_asker(
    runtime: Runtime,
    policy: ProviderPolicy,
    record: OperationRecord,
    gone: Callable[[], bool] | None = None,
) -> Asker:
    """A poll the gateway makes for the record's account with nothing of an agent's request:
    the status route's match headers, and the job id in a JSON body where the route reads it
    there (as an operator's cancel is sent)."""
    route = policy.routes.status
    headers = to_provider(route.match.headers.items() if route.match else [], policy)
    body = None
    if route.job_id is not None and route.job_id.path is not None:
        body = body_with_job_id(route.job_id.path, record.provider_job_id)
        headers.setdefault("Content-Type", "application/json")
    return Asker(runtime, policy, record.provider_job_id, headers, body=body, gone=gone or _never)


def _never() -> bool:
    return False


async def wait_for(
    runtime: Runtime,
    account: Account,
    policy: ProviderPolicy,
    record: OperationRecord,
    seconds: float,
    *,
    gone: Callable[[], bool] | None = None,
) -> tuple[Decision, UpstreamResponse | None]:
    """``Prefer: wait`` without an HTTP status call (MCP): hold for ``account``'s operation
    up to ``seconds`` (capped at the policy's ``max_hold``, never past the deadline), polling
    only as the schedule permits. ``seconds`` 0 is one look: the answer from the record, or
    the one poll that is due. Forwards nothing of an agent's request."""
    if record.account != account.id or record.provider != policy.provider:
        raise ValueError("an operation is waited for by its own account, under its own policy")
    limit = min(max(0.0, seconds), policy.polling.max_hold)
    asker = record_asker(runtime, policy, record, gone)
    return await held(asker, record, limit, early=False)


async def held(
    asker: Asker, record: OperationRecord, wait: float, *, early: bool
) -> tuple[Decision, UpstreamResponse | None]:
    """Wait for the next permitted poll, poll for the asker, and keep waiting through
    pending answers until the job ends, waiting must end, ``wait`` seconds pass, the
    deadline comes, the asker goes away or the gateway stops. Costs only timers.

    ``early``: wait for the next permitted poll only (up to ``max_hold``) and answer that
    poll, pending or not."""
    runtime = asker.runtime
    limit = asker.policy.polling.max_hold if early else wait
    end = min(runtime.clock() + limit, record.deadline_at)
    runtime.holding += 1
    try:
        decision, response = await _step(asker, record)
        while decision.record.outcome is Outcome.PENDING and decision.retry_after is not None:
            if early and response is not None:
                break  # the one poll an early call waited for
            now = runtime.clock()
            wake = now + max(decision.retry_after, MIN_HOLD_STEP)
            if wake > end or asker.gone() or not await runtime.pause(wake - now):
                break
            current = await runtime.store.get(record.operation_id)
            assert current is not None
            decision, response = await _step(asker, current)
            if early:
                break
    finally:
        runtime.holding -= 1
    return decision, response


async def _step(asker: Asker, record: OperationRecord) -> tuple[Decision, UpstreamResponse | None]:
    """One look at the operation: the answer from the record, or one shared poll."""
    decision = decide.admit(asker.policy, record, asker.runtime.clock())
    if not decision.forward and not decision.changed:
        return decision, None
    return await shared_poll(asker, record, pace=decision.forward)


def gone(request: web.Request) -> bool:
    """The client of ``request`` went away (a held call stops waiting for it)."""
    transport = request.transport
    return transport is None or transport.is_closing()


class StaleCopy(Exception):
    """A poll started from this process's copy of the record (``Store.known``) found that
    the stored record had moved and is not due, or is gone: the caller starts over from
    ``record`` (the stored one, None when gone) as if it had read it, so refusals and answers
    always come from the stored record."""

    def __init__(self, record: OperationRecord | None) -> None:
        super().__init__("the copy of the record was stale")
        self.record = record


async def shared_poll(
    asker: Asker, record: OperationRecord, *, pace: bool, from_copy: bool = False
) -> tuple[Decision, UpstreamResponse | None]:
    """Step 7: one poll per operation in this process at a time; every caller gets its
    answer. The poll is a task of its own, so a caller that goes away never cuts it short.
    ``from_copy``: ``record`` is ``Store.known``'s copy; StaleCopy when it was stale."""
    runtime, operation_id = asker.runtime, record.operation_id
    task = runtime.inflight.get(operation_id)
    if task is None:
        task = asyncio.create_task(_poll(asker, record, pace=pace, from_copy=from_copy))
        runtime.inflight[operation_id] = task
        task.add_done_callback(lambda done: _forget(runtime, operation_id, done))
    elif asker.request is not None:
        asker.request[OUTCOME] = "cached"
    try:
        return await asyncio.shield(task)
    except StaleCopy:
        if from_copy:
            raise
        return await shared_poll(asker, record, pace=pace)  # joined a poll from a stale copy


def _forget(runtime: Runtime, operation_id: str, task: PollTask) -> None:
    if runtime.inflight.get(operation_id) is task:
        del runtime.inflight[operation_id]
    if not task.cancelled():
        task.exception()  # retrieved here, raised to every caller still waiting


def _persisting(decision: Decision) -> tuple[OperationRecord | None, Decision]:
    """``decide.as_write`` for a decision that is never None."""
    record, _ = decide.as_write(decision)
    return record, decision


def lease_ttl(runtime: Runtime, policy: ProviderPolicy) -> float:
    """How long a poll may hold its lease: an OAuth2 token fetch and the request itself
    (each bounded by upstream_timeout), the pacing space before the send, and a margin, so
    a live poll never loses its lease to another replica."""
    spacing = GUARD / policy.polling.provider_rate if policy.polling.provider_rate else 0.0
    return 2 * runtime.settings.file.limits.upstream_timeout + spacing + LEASE_MARGIN


@dataclass(frozen=True, slots=True)
class _Lease:
    name: str
    token: str


async def _poll(
    asker: Asker, record: OperationRecord, *, pace: bool, from_copy: bool = False
) -> tuple[Decision, UpstreamResponse | None]:
    """Steps 8 and 9: lease, pacing window and the reservation (one round trip on shared
    stores, computed from the record in hand), exactly one request sent, the answer written
    with the lease released. Every write happens under the lease. ``from_copy``: a record
    that moved meanwhile is polled from only while it is still due (StaleCopy otherwise;
    the place taken in the pacing window then goes unused)."""
    runtime, policy, operation_id = asker.runtime, asker.policy, record.operation_id
    lease = _Lease(f"poll:{operation_id}", secrets.token_hex(16))
    windows = runtime.effects.refusals
    window = windows.close(operation_id)
    refusals = window.count if window is not None else 0
    first = decide.take(policy, record, runtime.clock(), refusals)
    try:
        wait, written, moved = await _start(asker, lease, first if first.forward else None, pace)
    except NotAdmissible as exc:  # by the store's clock not due: the lease is ours, give it up
        await runtime.store.release_lease(lease.name, lease.token)
        return await _come_back(runtime, operation_id, 1.0, str(exc)), None
    except StoreError:  # the lease may be ours already: never leave it held
        windows.reopen(operation_id, window)
        _release_later(runtime, lease, lease_ttl(runtime, asker.policy))
        raise
    if wait is None:
        windows.reopen(operation_id, window)
        detail = "A status request for this operation is already in flight."
        return await _come_back(runtime, operation_id, 1.0, detail), None
    released = False
    try:
        if pace and wait > 0:
            windows.reopen(operation_id, window)
            return await _paused(asker, record, runtime.clock(), wait), None
        if written:
            decision = first
            await _reserved(asker, decision, window)
        else:
            if from_copy and (moved is None or not _due(policy, moved, runtime.clock())):
                windows.reopen(operation_id, window)
                raise StaleCopy(moved)
            decision = await _reserve(asker, moved or record, window)
        if not decision.forward:
            return decision, None
        answer, response = await _send(asker, operation_id)
        released = True  # the answer's write releases the lease with it
        return await _record(asker, decision.record, answer, lease), response
    finally:
        if not released:
            try:
                await runtime.store.release_lease(lease.name, lease.token)
            except StoreError:
                _release_later(runtime, lease, lease_ttl(runtime, policy))
                raise


def _due(policy: ProviderPolicy, record: OperationRecord, now: float) -> bool:
    return decide.admit(policy, record, now).forward


_RELEASING: dict[str, list[str]] = {}  # lease name -> tokens its release loop gives back
RELEASE_RETRY = 0.5  # the first wait between release attempts, doubled up to RELEASE_CAP
RELEASE_CAP = 8.0
RELEASE_TOKENS = 16  # tokens kept per lease name; the oldest go first
_LOOPS: set[asyncio.Task[None]] = set()


def _release_later(runtime: Runtime, lease: _Lease, ttl: float) -> None:
    """Give back a lease that a failed store call may have taken, in the background: the
    answer (503) does not wait for a store in trouble. A stalled Redis runs the queued
    command that took the lease when it wakes, maybe after a first release, so the release
    is tried again (0.5 s, doubling up to 8 s) until it goes through once the store answers
    again, or the lease has expired by itself: the operation is blocked for about a second
    after recovery, not for the lease's time. One loop per lease name, whatever the number
    of failed polls: it gives back each of their tokens (only the holder's matches)."""
    tokens = _RELEASING.get(lease.name)
    if tokens is not None:  # a loop is running for this lease: it takes this token too
        tokens.append(lease.token)
        del tokens[:-RELEASE_TOKENS]
        return
    tokens = _RELEASING[lease.name] = [lease.token]

    async def release() -> None:
        loop = asyncio.get_running_loop()
        until, wait = loop.time() + ttl, RELEASE_RETRY
        try:
            while tokens:
                try:
                    await runtime.store.release_lease(lease.name, tokens[0])
                    tokens.pop(0)
                    continue
                except StoreError:
                    if loop.time() >= until:
                        return
                await asyncio.sleep(wait)
                wait = min(wait * 2, RELEASE_CAP)
        finally:
            _RELEASING.pop(lease.name, None)

    task = asyncio.create_task(release())
    _LOOPS.add(task)
    task.add_done_callback(_LOOPS.discard)


async def _start(
    asker: Asker, lease: _Lease, first: Decision | None, pace: bool
) -> tuple[float | None, bool, OperationRecord | None]:
    """The lease and the pacing window, with ``first``'s reservation written in the same
    step when there is one: (wait, written, the stored record when it had moved and the
    store says so)."""
    runtime, policy = asker.runtime, asker.policy
    store, now, ttl = runtime.store, runtime.clock(), lease_ttl(runtime, policy)
    rate = policy.polling.provider_rate if pace else None
    if first is None:
        wait = await store.start_poll(lease.name, lease.token, now, ttl, policy.provider, rate)
        return wait, False, None
    return await store.start_and_reserve(
        lease.name, lease.token, now, ttl, policy.provider, rate, first.record
    )


async def _reserve(asker: Asker, record: OperationRecord, window: Window | None) -> Decision:
    """Re-check under the lease and spend one status request (or escalate, or refuse),
    folding in the refusals counted meanwhile, from the stored record: the step taken when
    the record in hand had moved."""
    runtime, policy = asker.runtime, asker.policy
    now = runtime.clock()
    refusals = window.count if window is not None else 0
    try:
        decision = await runtime.store.mutate(
            record.operation_id,
            lambda current: _persisting(decide.take(policy, current, now, refusals)),
            known=record,
        )
    except NotAdmissible as exc:
        return await _come_back(runtime, record.operation_id, 1.0, str(exc))
    await _reserved(asker, decision, window)
    return decision


async def _reserved(asker: Asker, decision: Decision, window: Window | None) -> None:
    """The effects of a written reservation (or of the escalation written instead): the
    refusals folded in, a cut request found, the decision's own line."""
    effects = asker.runtime.effects
    if window is not None:
        await effects.refused(decision.record, window)
    if decision.cut_at is not None:
        await effects.interrupted(decision.record, decision.cut_at)
    if not decision.forward:
        await effects.decided(asker.policy, decision)


async def _send(asker: Asker, operation_id: str) -> tuple[ProviderAnswer, UpstreamResponse | None]:
    """The one status request, spaced under the provider's ceiling; a 429 or RateLimit
    answer tightens the ceiling for everyone."""
    runtime, policy = asker.runtime, asker.policy
    route = policy.routes.status
    url = policy.upstream + fill(route.path, {"job_id": asker.job_id}, asker.query)
    if policy.polling.provider_rate is not None:
        await runtime.space_sends(policy.provider, policy.polling.provider_rate)
    answer, response = await send_upstream(
        runtime.channel(policy),
        policy,
        "status",
        route.method,
        url,
        dict(asker.headers),
        asker.body,
        operation_id=operation_id,
    )
    limit = provider_limit(answer.status, response.headers if response else {}, runtime.clock())
    if limit is not None:
        await tighten(runtime, policy, *limit)
    return answer, response


async def _record(
    asker: Asker, reserved: OperationRecord, answer: ProviderAnswer, lease: _Lease
) -> Decision:
    """Classify the answer into the record (unless a later poll superseded this one), write
    it releasing the lease, and carry out its effects."""
    runtime, policy = asker.runtime, asker.policy
    done, u = runtime.clock(), runtime.rng.random()
    decided = await runtime.store.finish_poll(
        reserved.operation_id,
        lambda current: _persisting(
            decide.classify(policy, current, answer, done, u)
            if decide.still_ours(reserved, current)
            else decide.superseded(current, done)
        ),
        known=reserved.evolve(version=reserved.version + 1),
        lease=lease.name,
        token=lease.token,
    )
    detail = _answer_detail(answer, decided)
    await runtime.effects.decided(policy, decided, http_status=answer.status, detail=detail)
    return decided


async def _paused(asker: Asker, record: OperationRecord, now: float, wait: float) -> Decision:
    """The provider is paused or at its ceiling: too-early, or (SPEC 16) escalated when the
    pause outlasts the operation's deadline. Runs under the lease."""
    policy, runtime = asker.policy, asker.runtime
    decision = await runtime.store.mutate(
        record.operation_id,
        lambda current: _persisting(decide.paused(policy, current, now, wait)),
        known=record,
    )
    await runtime.effects.decided(policy, decision)
    return decision


async def _come_back(runtime: Runtime, operation_id: str, wait: float, detail: str) -> Decision:
    """too-early with ``Retry-After: wait``, on the record as it stands now."""
    record = await runtime.store.get(operation_id)
    assert record is not None
    return decide.come_back(record, wait, detail)


def _answer_detail(answer: ProviderAnswer, decision: Decision) -> str | None:
    """What the audit line says about the answer besides its status: for the story."""
    parts = []
    if answer.failure is not None:
        parts.append(answer.failure.value)
    if answer.retry_after is not None:
        parts.append(f"Retry-After {header_safe(answer.retry_after[:40])}")
    if decision.plan is not None and decision.plan.hint_rejected:
        parts.append("hint rejected")
    return ", ".join(parts) or None


async def close_refusal_windows(runtime: Runtime, operation_ids: list[str]) -> None:
    """Fold the refusals counted in memory into their records and the audit log."""
    effects = runtime.effects
    for operation_id in operation_ids:
        window = effects.refusals.close(operation_id)
        if window is None:
            continue

        def fold(
            current: OperationRecord, count: int = window.count
        ) -> tuple[OperationRecord | None, OperationRecord]:
            folded = current.evolve(early_refusals=current.early_refusals + count)
            return folded, folded

        record = await runtime.store.mutate(operation_id, fold)
        await effects.refused(record, window)


async def recover_cut_polls(runtime: Runtime, limit: int = 10_000) -> int:
    """At start (SPEC 16): every status request cut short by a crash gets its audit line.

    A pending record whose reservation has no recorded answer, and whose poll lease nobody
    holds, was being polled by a process that died. How many were found."""
    found = 0
    where = OperationFilter(outcome=Outcome.PENDING, limit=limit)
    for record in await runtime.store.list(where):
        if record.inflight_at is None:
            continue
        lease, token = f"poll:{record.operation_id}", secrets.token_hex(16)
        ttl = runtime.settings.file.limits.upstream_timeout + LEASE_MARGIN  # one write
        if not await runtime.store.acquire_lease(lease, token, runtime.clock(), ttl):
            continue  # a live process is polling it now
        try:
            decision = await runtime.store.mutate(
                record.operation_id, lambda current: decide.as_write(decide.recover(current))
            )
        finally:
            await runtime.store.release_lease(lease, token)
        if decision is not None and decision.cut_at is not None:
            await runtime.effects.interrupted(decision.record, decision.cut_at)
            found += 1
    return found
