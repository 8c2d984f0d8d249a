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
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass

from gateway import NotAdmissible, StoreError
from gateway.core import decide, effects
from gateway.core.decide import Decision
from gateway.core.effects import Effects
from gateway.core.models import (
    OperationFilter,
    OperationRecord,
    Outcome,
    ProviderAnswer,
    poll_lease,
)
from gateway.core.pacing import GUARD
from gateway.core.routing import body_with_job_id, fill
from gateway.core.schedule import provider_limit
from gateway.flow import keeping
from gateway.flow.leases import Lease, new_token
from gateway.flow.pausing import tighten
from gateway.flow.refusals import Window
from gateway.flow.requests import AgentRequest
from gateway.flow.runtime import OUTCOME, PollTask, Runtime
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
    an account (MCP) forwards nothing of an agent's.

    ``uncancelled``: entered, the asker's task is not cancelled for its client going away
    or a stop's grace ending until it is left (the agent lane defers those cancels): the
    poll then runs in the asker's own task, not one of its own."""

    runtime: Runtime
    policy: ProviderPolicy
    job_id: str
    headers: Mapping[str, str]  # ready for the provider (headers.to_provider)
    query: str = ""  # the agent's query parameters the status route lets through
    body: bytes | None = None
    gone: Callable[[], bool] = lambda: False
    request: AgentRequest | None = None  # an agent's HTTP call, told when it joins a poll
    uncancelled: AbstractContextManager[None] | None = None


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
    if limit and not await may_hold(runtime, account.id, policy):
        limit = 0.0  # past limits.max_held: one look, as without a wait
    asker = record_asker(runtime, policy, record, gone)
    return await held(asker, record, limit, early=False)


async def may_hold(runtime: Runtime, account: str, policy: ProviderPolicy) -> bool:
    """Whether a call of ``account`` may be held now (``limits.max_held`` and
    ``max_held_per_account``); a call that may not is counted, and its caller answers it
    as it would without the hold. True without a pause: the hold that follows is counted
    before anything else runs."""
    bound = runtime.holds.full(account, runtime.settings.file.limits)
    if bound is None:
        return True
    await runtime.effects.carry_out(effects.of_hold_declined(policy.provider, bound))
    return False


async def held(
    asker: Asker, record: OperationRecord, wait: float, *, early: bool
) -> tuple[Decision, UpstreamResponse | None]:
    """Wait for the next permitted poll, poll for the asker, and keep waiting through
    pending answers until the job ends, waiting must end, ``wait`` seconds pass, the
    deadline comes, the asker goes away or the gateway stops. Between looks it is parked
    (``Runtime.park``): a timer, not counted against ``limits.max_in_flight``.

    ``early``: wait for the next permitted poll only (up to ``max_hold``) and answer that
    poll, pending or not.

    A wake-up before the poll is due (a timer or clock a few milliseconds early, a loop
    busy under load) is not an answer: the hold waits again for what is left, never past
    ``end``, so a hold granted for a poll ends in that poll's answer."""
    runtime = asker.runtime
    limit = asker.policy.polling.max_hold if early else wait
    end = min(runtime.clock() + limit, record.deadline_at)
    with runtime.holds.holding(record.account):
        decision, response = await _step(asker, record)
        while decision.record.outcome is Outcome.PENDING and decision.retry_after is not None:
            if early and response is not None:
                break  # the one poll an early call waited for
            now = runtime.clock()
            due = now + decision.retry_after
            if due > end or asker.gone():
                break
            wake = min(max(due, now + MIN_HOLD_STEP), end)
            if not await runtime.park(wake - now):
                break
            current = await runtime.records.get(record.operation_id)
            assert current is not None
            decision, response = await _step(asker, current)
    return decision, response


async def _step(asker: Asker, record: OperationRecord) -> tuple[Decision, UpstreamResponse | None]:
    """One look at the operation: the answer from the record, or one shared poll."""
    decision = decide.admit(asker.policy, record, asker.runtime.clock())
    if not decision.forward and not decision.changed:
        return decision, None
    return await shared_poll(asker, record, pace=decision.forward)


async def after_decision(runtime: Runtime, policy: ProviderPolicy, operation_id: str) -> None:
    """SPEC 20: after an operator's ``extend`` or ``resume``, one poll at the next permitted
    instant, made by the gateway for the record's account (so an agent last told 409 learns
    the new state on its next call), its effects as for any poll; then, when a webhook is
    configured, an ``operation.updated`` notice with the state it found (an answer that
    escalates again sends ``operation.escalated`` instead). Waits through pacing and pauses,
    never past the deadline or the gateway's stop; a store failure leaves it to the agent."""
    try:
        while (record := await runtime.records.get(operation_id)) is not None:
            if record.outcome is not Outcome.PENDING:
                return
            decision, _ = await _step(record_asker(runtime, policy, record), record)
            polled = decision.record.status_requests_used > record.status_requests_used
            if polled or decision.retry_after is None:
                break
            if not await runtime.pause(max(decision.retry_after, MIN_HOLD_STEP)):
                return
        else:
            return
        if decision.record.outcome is not Outcome.ESCALATED:
            notice = effects.of_update(policy, decision.record, "gateway poll after decision")
            await runtime.effects.carry_out(notice)
    except StoreError:
        return  # counted where it failed; the agent's next call polls as usual


def gone(request: AgentRequest) -> bool:
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
    answer. A caller that goes away never cuts the poll short: it runs in a task of its
    own, or in the caller's task when nothing may cancel that meanwhile (``uncancelled``),
    which saves the loop a turn at the poll's start and one at its end.
    ``from_copy``: ``record`` is ``Store.known``'s copy; StaleCopy when it was stale."""
    runtime, operation_id = asker.runtime, record.operation_id
    task = runtime.inflight.get(operation_id)
    if task is None:
        runtime.effects.check_audit()  # a hold or an MCP wait the disk filled under
        if asker.uncancelled is not None:
            return await _poll_here(asker, record, pace=pace, from_copy=from_copy)
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
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if task.cancelled() and current is not None and not current.cancelling():
            # the poll joined was cancelled, not this caller: start over, as from the start
            return await shared_poll(asker, record, pace=pace, from_copy=from_copy)
        raise


async def _poll_here(
    asker: Asker, record: OperationRecord, *, pace: bool, from_copy: bool
) -> tuple[Decision, UpstreamResponse | None]:
    """The poll in the asker's own task, uncancelled throughout; callers that come meanwhile
    wait for the future it resolves, as for a poll's task."""
    runtime, operation_id = asker.runtime, record.operation_id
    assert asker.uncancelled is not None
    done: PollTask = asyncio.get_running_loop().create_future()
    runtime.inflight[operation_id] = done
    try:
        with asker.uncancelled:
            result = await _poll(asker, record, pace=pace, from_copy=from_copy)
    except asyncio.CancelledError:  # only a cancel the lane does not defer (loop shutdown)
        done.cancel()  # those waiting start over (shared_poll)
        raise
    except BaseException as exc:
        done.set_exception(exc)
        done.exception()  # retrieved here, raised to every caller waiting
        raise
    else:
        done.set_result(result)
        return result
    finally:
        if runtime.inflight.get(operation_id) is done:
            del runtime.inflight[operation_id]


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


@dataclass(slots=True)
class _Poll:
    """One poll in progress: its lease, the refusal window it closed (folded into the
    reservation, or put back when nothing was written), and whether the lease is still
    ours to give back."""

    asker: Asker
    record: OperationRecord
    lease: Lease
    window: Window | None
    window_used: bool = False
    lease_held: bool = True  # False once the answer's write (or a refused start) let it go
    store_failed: bool = False

    @property
    def refusals(self) -> int:
        return self.window.count if self.window is not None else 0


async def _poll(
    asker: Asker, record: OperationRecord, *, pace: bool, from_copy: bool = False
) -> tuple[Decision, UpstreamResponse | None]:
    """Steps 8 and 9: lease, pacing window and the reservation (one round trip on shared
    stores, computed from the record in hand), exactly one request sent, the answer written
    with the lease released. Every write happens under the lease. ``from_copy``: a record
    that moved meanwhile is polled from only while it is still due (StaleCopy otherwise;
    the place taken in the pacing window then goes unused). Whatever the way out, ``_end``
    puts back an unused refusal window and gives back a lease still held."""
    runtime, operation_id = asker.runtime, record.operation_id
    lease = Lease(poll_lease(operation_id), new_token())
    poll = _Poll(asker, record, lease, runtime.refusals.close(operation_id))
    try:
        return await _steps(poll, pace=pace, from_copy=from_copy)
    except StoreError:
        poll.store_failed = True
        raise
    finally:
        await _end(poll)


async def _steps(
    poll: _Poll, *, pace: bool, from_copy: bool
) -> tuple[Decision, UpstreamResponse | None]:
    asker, runtime = poll.asker, poll.asker.runtime
    first = decide.take(asker.policy, poll.record, runtime.clock(), poll.refusals)
    started = await _start(poll, first if first.forward else None, pace)
    if isinstance(started, Decision):
        return started, None
    wait, written, moved = started
    if pace and wait > 0:
        return await _paused(asker, poll.record, runtime.clock(), wait), None
    if written:
        poll.window_used = True
        decision = first
        await runtime.effects.carry_out(_reserved(asker, decision, poll.window))
    elif from_copy and (moved is None or not _due(asker.policy, moved, runtime.clock())):
        raise StaleCopy(moved)
    else:
        decision = await _reserve(poll, moved or poll.record)
    if not decision.forward:
        return decision, None
    answer, response = await _send(asker, poll.record)
    poll.lease_held = False  # the answer's write releases the lease with it
    return await _record(asker, decision.record, answer, poll.lease), response


async def _end(poll: _Poll) -> None:
    runtime = poll.asker.runtime
    ttl = lease_ttl(runtime, poll.asker.policy)
    if not poll.window_used:
        runtime.refusals.reopen(poll.record.operation_id, poll.window)
    if not poll.lease_held:
        return
    if poll.store_failed:  # the answer (503) does not wait for a store in trouble
        runtime.releases.later(runtime.coordination, poll.lease, ttl)
        return
    try:
        await runtime.coordination.release_lease(poll.lease.name, poll.lease.token)
    except StoreError:
        runtime.releases.later(runtime.coordination, poll.lease, ttl)
        raise


def _due(policy: ProviderPolicy, record: OperationRecord, now: float) -> bool:
    return decide.admit(policy, record, now).forward


async def _start(
    poll: _Poll, first: Decision | None, pace: bool
) -> tuple[float, bool, OperationRecord | None] | Decision:
    """The lease and the pacing window, with ``first``'s reservation written in the same
    step when there is one: (wait, written, the stored record when it had moved and the
    store says so); or the too-early answer when the lease is someone else's or the store's
    clock says the poll is not due."""
    runtime, policy, lease = poll.asker.runtime, poll.asker.policy, poll.lease
    store, now, ttl = runtime.store, runtime.clock(), lease_ttl(runtime, policy)
    rate = policy.polling.provider_rate if pace else None
    operation_id = poll.record.operation_id
    started: tuple[float | None, bool, OperationRecord | None]
    try:
        if first is None:
            wait = await store.start_poll(lease.name, lease.token, now, ttl, policy.provider, rate)
            started = (wait, False, None)
        else:
            started = await store.start_and_reserve(
                lease.name, lease.token, now, ttl, policy.provider, rate, first.record
            )
    except NotAdmissible as exc:  # by the store's clock not due: the lease is ours, give it up
        return await _come_back(runtime, operation_id, 1.0, str(exc))
    if started[0] is None:
        poll.lease_held = False
        detail = "A status request for this operation is already in flight."
        return await _come_back(runtime, operation_id, 1.0, detail)
    return started[0], started[1], started[2]


async def _reserve(poll: _Poll, record: OperationRecord) -> Decision:
    """Re-check under the lease and spend one status request (or escalate, or refuse),
    folding in the refusals counted meanwhile, from the stored record: the step taken when
    the record in hand had moved."""
    runtime, policy = poll.asker.runtime, poll.asker.policy
    now, refusals = runtime.clock(), poll.refusals
    try:
        decision = await runtime.records.mutate(
            record.operation_id,
            lambda current: _persisting(decide.take(policy, current, now, refusals)),
            known=record,
        )
    except NotAdmissible as exc:
        return await _come_back(runtime, record.operation_id, 1.0, str(exc))
    poll.window_used = True
    await runtime.effects.carry_out(_reserved(poll.asker, decision, poll.window))
    return decision


def _reserved(asker: Asker, decision: Decision, window: Window | None) -> Effects:
    """The effects of a written reservation (or of the escalation written instead): the
    refusals folded in, a cut request found, the decision's own line."""
    now, record = asker.runtime.clock(), decision.record
    found: Effects = effects.NONE
    if window is not None:
        found += effects.of_refusals(record, window.count, window.first_at, window.ends_at, now)
    if decision.cut_at is not None:
        found += effects.of_interruption(record, decision.cut_at, now)
    if not decision.forward:
        found += effects.of_decision(asker.policy, decision, now)
    return found


async def _send(
    asker: Asker, record: OperationRecord
) -> tuple[ProviderAnswer, UpstreamResponse | None]:
    """The one status request, to where the job was submitted (its route values), spaced
    under the provider's ceiling; a 429 or RateLimit answer tightens the ceiling for
    everyone."""
    runtime, policy = asker.runtime, asker.policy
    route = policy.routes.status
    values = {**dict(record.route_values), "job_id": asker.job_id}
    url = policy.upstream + fill(route.path, values, asker.query)
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
        operation_id=record.operation_id,
    )
    limit = provider_limit(answer.status, response.headers if response else {}, runtime.clock())
    if limit is not None:
        await tighten(runtime, policy, *limit)
    return answer, response


async def _record(
    asker: Asker, reserved: OperationRecord, answer: ProviderAnswer, lease: Lease
) -> Decision:
    """Classify the answer into the record (unless a later poll superseded this one), write
    it releasing the lease, and carry out its effects."""
    runtime, policy = asker.runtime, asker.policy
    done, u = runtime.clock(), runtime.rng.random()
    announce = runtime.announces
    decided = await runtime.store.finish_poll(
        reserved.operation_id,
        lambda current: _persisting(
            decide.classify(policy, current, answer, done, u, announce=announce)
            if decide.still_ours(reserved, current)
            else decide.superseded(current, done)
        ),
        known=reserved.evolve(version=reserved.version + 1),
        lease=lease.name,
        token=lease.token,
        durable=_ended,
    )
    detail = _answer_detail(answer, decided)
    found = effects.of_decision(policy, decided, done, http_status=answer.status, detail=detail)
    await runtime.effects.carry_out(found)
    if decided.changed and decided.record.outcome is Outcome.SUCCEEDED:
        keeping.after_success(runtime, policy, decided.record)
    return decided


def _ended(decision: Decision) -> bool:
    """An answer's write must be durable before anyone hears it when the operation stopped
    waiting (an outcome, an escalation); a pending answer need not: its reservation was."""
    return decision.record.outcome is not Outcome.PENDING


async def _paused(asker: Asker, record: OperationRecord, now: float, wait: float) -> Decision:
    """The provider is paused or at its ceiling: too-early, or (SPEC 16) escalated when the
    pause outlasts the operation's deadline. Runs under the lease."""
    policy, runtime = asker.policy, asker.runtime
    decision = await runtime.records.mutate(
        record.operation_id,
        lambda current: _persisting(decide.paused(policy, current, now, wait)),
        known=record,
    )
    await runtime.effects.carry_out(effects.of_decision(policy, decision, runtime.clock()))
    return decision


async def _come_back(runtime: Runtime, operation_id: str, wait: float, detail: str) -> Decision:
    """too-early with ``Retry-After: wait``, on the record as it stands now."""
    record = await runtime.records.get(operation_id)
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
    for operation_id in operation_ids:
        window = runtime.refusals.close(operation_id)
        if window is None:
            continue

        def fold(
            current: OperationRecord, count: int = window.count
        ) -> tuple[OperationRecord | None, OperationRecord]:
            folded = current.evolve(early_refusals=current.early_refusals + count)
            return folded, folded

        record = await runtime.records.mutate(operation_id, fold)
        now = runtime.clock()
        found = effects.of_refusals(record, window.count, window.first_at, window.ends_at, now)
        await runtime.effects.carry_out(found)


async def recover_cut_polls(runtime: Runtime, limit: int = 10_000) -> int:
    """At start (SPEC 16): every status request cut short by a crash gets its audit line.

    A pending record whose reservation has no recorded answer, and whose poll lease nobody
    holds, was being polled by a process that died. How many were found."""
    recovered = 0
    where = OperationFilter(outcome=Outcome.PENDING, limit=limit)
    for record in await runtime.records.list(where):
        if record.inflight_at is None:
            continue
        lease, token = poll_lease(record.operation_id), new_token()
        ttl = runtime.settings.file.limits.upstream_timeout + LEASE_MARGIN  # one write
        if not await runtime.coordination.acquire_lease(lease, token, runtime.clock(), ttl):
            continue  # a live process is polling it now
        try:
            decision = await runtime.records.mutate(
                record.operation_id, lambda current: decide.as_write(decide.recover(current))
            )
        finally:
            await runtime.coordination.release_lease(lease, token)
        if decision is not None and decision.cut_at is not None:
            found = effects.of_interruption(decision.record, decision.cut_at, runtime.clock())
            await runtime.effects.carry_out(found)
            recovered += 1
    return recovered
