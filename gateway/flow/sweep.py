"""The background sweeper: refusal windows closed when their poll time comes (quota
refusal windows when they end), operations past their deadline escalated whether or not
an agent asks (SPEC 16), finished records
purged past their policy's retention (on PostgreSQL, the audit lines kept of them too), and
kept results copied when owed and deleted past their ttl (SPEC 23). One loop per process;
its work is idempotent across replicas (compare-and-set and leases)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable

from gateway import StoreError
from gateway.core import decide, effects
from gateway.core.models import poll_lease
from gateway.flow import keeping, polls, quotas
from gateway.flow.leases import new_token
from gateway.flow.runtime import Runtime
from gateway.settings.policy import ProviderPolicy
from gateway.store.base import PURGE_BATCH

log = logging.getLogger("statusgate")
SWEEP_SECONDS = 1.0
PURGE_EVERY = 60  # sweeps between retention purges
PURGE_ROUNDS = 20  # full batches one purge may delete per provider before the next sweep
OVERDUE_EVERY = 2  # sweeps between deadline checks: SPEC 16 allows 10 s
OVERDUE_BATCH = 500  # overdue operations escalated per provider per check
OVERDUE_LEASE = 10.0  # seconds: the poll lease held while one is escalated
KEEP_EVERY = 5  # sweeps between looks for owed result copies (SPEC 23)


async def run(runtime: Runtime) -> None:
    """Close refusal windows whose poll time has come, so counts reach the audit log and
    the record even when the agent never calls again; every few seconds, escalate what is
    past its deadline; now and then, purge what the policies' retention no longer keeps."""
    sweeps = 0
    while True:
        await asyncio.sleep(SWEEP_SECONDS)
        sweeps += 1
        if sweeps % PURGE_EVERY == 0:
            await _step("purge", purge_finished(runtime))
            await _step("kept results past their ttl", keeping.delete_expired(runtime))
        if sweeps % KEEP_EVERY == 0:
            await _step("owed result copies", keeping.keep_owed(runtime))
        audit = runtime.effects.audit
        if audit is not None:
            audit.follow()  # a rename is followed even while this process writes nothing
        if audit is not None and not audit.writable():
            continue  # escalations and refusal lines wait for space (each sweep tries)
        if sweeps % OVERDUE_EVERY == 0:
            await _step("deadline check", escalate_overdue(runtime))
        ended = runtime.refusals.ended(runtime.clock())
        await _step("refusal windows", polls.close_refusal_windows(runtime, ended))
        await _step("quota refusal windows", quotas.close_windows(runtime))


async def _step(name: str, step: Awaitable[object]) -> None:
    """One step of the sweeper: a failure is logged and the sweeper goes on (it must never
    die: deadlines would then go unseen)."""
    try:
        await step
    except StoreError:
        pass  # counted where it happened; tried again at the next sweep
    except Exception:
        log.exception("sweeper: %s failed; trying again at the next sweep", name)


async def escalate_overdue(runtime: Runtime) -> int:
    """SPEC 16: pending operations past their deadline are escalated whether or not an
    agent asks (audit line, metrics, webhook as usual); how many this call escalated.

    Providers no longer in the policies are left alone; one that cannot be escalated now (a
    poll holds its lease, or the store failed on it) is tried again at the next check."""
    escalated = 0
    for policy in list(runtime.settings.policies.values()):
        late = await runtime.records.overdue(policy.provider, runtime.clock(), OVERDUE_BATCH)
        for operation_id in late:
            with contextlib.suppress(StoreError):
                escalated += await _escalate(runtime, policy, operation_id)
    return escalated


async def _escalate(runtime: Runtime, policy: ProviderPolicy, operation_id: str) -> bool:
    """Under the poll lease, as a poll would: no status request is in flight meanwhile.

    With several replicas the store's compare-and-set lets one write win; only the
    replica whose write won gets a decision back, so effects happen once."""
    lease, token = poll_lease(operation_id), new_token()
    if not await runtime.coordination.acquire_lease(lease, token, runtime.clock(), OVERDUE_LEASE):
        return False
    try:
        now = runtime.clock()
        decision = await runtime.records.mutate(
            operation_id, lambda current: decide.as_write(decide.overdue(policy, current, now))
        )
        if decision is None:
            return False
        found = effects.NONE
        if decision.cut_at is not None:  # a poll cut short by a crash gets its line too
            found += effects.of_interruption(decision.record, decision.cut_at, now)
        await runtime.effects.carry_out(found + effects.of_decision(policy, decision, now))
        return True
    finally:
        await runtime.coordination.release_lease(lease, token)


async def purge_finished(runtime: Runtime) -> int:
    """Delete records that stopped waiting longer ago than their policy's retention, in
    full batches while there are more (up to PURGE_ROUNDS per provider)."""
    now = runtime.clock()
    purged = 0
    for name, policy in list(runtime.settings.policies.items()):
        for _ in range(PURGE_ROUNDS):
            batch = await runtime.records.purge(name, now - policy.retention, now)
            purged += batch
            if batch < PURGE_BATCH:
                break
    if purged:
        log.info("purged %d finished operations past their retention", purged)
    await purge_audit_lines(runtime, now)
    return purged


async def purge_audit_lines(runtime: Runtime, now: float) -> int:
    """On a store that keeps every replica's audit lines: those older than the longest
    retention of any policy whose operation is gone, from the start of each chain (so each
    chain kept stays one verifiable run). The files are not touched."""
    lines, policies = runtime.store.audit_lines, runtime.settings.policies
    if lines is None or not policies:
        return 0
    longest = max(policy.retention for policy in policies.values())
    return await lines.purge(now - longest, PURGE_BATCH)
