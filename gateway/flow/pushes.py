"""A provider's push, step by step (SPEC 23): verified, claimed once across replicas (its
delivery id), read, matched to the operations of that provider only, then applied to the
record or answered by one poll at once (in the background: the push is answered first);
counted and audited whatever happens.

The rules are core/pushes.py's; the signature check is provider/pushes.py's. Nothing here
answers HTTP (http/hooks.py does): ``receive`` says which status the provider gets.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from gateway import StoreError
from gateway.core import decide, effects, pushes
from gateway.core.models import OperationRecord, Outcome
from gateway.flow import keeping, polls
from gateway.flow.runtime import Runtime
from gateway.provider.pushes import Keys, verify
from gateway.settings.policy import ProviderPolicy
from gateway.settings.push import Push

log = logging.getLogger("statusgate")
UNTIMED_WINDOW = 86400.0  # replay window of schemes whose pushes carry no timestamp
KEYS = Keys()  # JWKS key sets, shared by the process


@dataclass(frozen=True, slots=True)
class Received:
    """What the provider is answered: ``status`` (200 handled or replayed, 202 nothing to
    do for the gateway, 401 refused) and the ``result`` counted."""

    status: int
    result: str


async def receive(
    runtime: Runtime, policy: ProviderPolicy, headers: Mapping[str, str], body: bytes
) -> Received:
    """Handle one push for ``policy``'s provider (its push section is on)."""
    push = policy.pushes
    assert push is not None
    provider, now = policy.provider, runtime.clock()
    verdict = await verify(push.verify, headers, body, now, upstream=runtime.upstream, keys=KEYS)
    if verdict.refused is not None:
        return await _done(runtime, provider, Received(401, "refused"), detail=verdict.refused)
    reading = pushes.read(push, body)
    if reading is None or reading.job_id is None:
        detail = "the push is not a JSON object" if reading is None else "no job id at the path"
        return await _done(runtime, provider, Received(202, "invalid"), detail=detail)
    key = f"{provider}:{verdict.delivery}"
    claim = await runtime.coordination.claim_delivery(key, now, _window(push))
    if claim is None:
        return await _done(runtime, provider, Received(200, "replayed"), detail=verdict.delivery)
    try:
        return await _handle(runtime, policy, reading)
    except (StoreError, asyncio.CancelledError):
        await runtime.coordination.release_delivery(key, claim)  # the provider's retry counts
        raise


def _window(push: Push) -> float:
    """How long a delivery id is remembered: a replay older than the tolerance fails the
    timestamp check anyway; schemes without a timestamp remember a day."""
    verify_rule = push.verify
    timed = verify_rule.scheme in ("standard-webhooks", "ed25519-jwks") or (
        verify_rule.timestamp_header is not None
    )
    return 2 * verify_rule.tolerance if timed else UNTIMED_WINDOW


async def _handle(runtime: Runtime, policy: ProviderPolicy, reading: pushes.Reading) -> Received:
    assert reading.job_id is not None
    records = await _operations(runtime, policy.provider, reading.job_id)
    if not records:
        detail = f"no operation of {policy.provider} for this job"
        return await _done(runtime, policy.provider, Received(202, "unknown_job"), detail=detail)
    results = [await _apply(runtime, policy, record, reading) for record in records]
    return Received(200, results[0])


async def _operations(runtime: Runtime, provider: str, job_id: str) -> list[OperationRecord]:
    """The operations of ``provider`` (only) for this job, under every account that may use
    it: a push never reaches another provider's operation."""
    accounts = [a.id for a in runtime.settings.file.accounts if a.allows(provider)]
    found = await asyncio.gather(*(runtime.records.find(a, provider, job_id) for a in accounts))
    return [r for r in found if r is not None and r.provider == provider]


async def _apply(
    runtime: Runtime, policy: ProviderPolicy, record: OperationRecord, reading: pushes.Reading
) -> str:
    """Apply the push to one operation: written as a status answer, or one poll now."""
    now, u = runtime.clock(), runtime.rng.random()

    def change(current: OperationRecord) -> tuple[OperationRecord | None, pushes.Action]:
        action = pushes.step(policy, current, reading, now, u, announce=runtime.announces)
        written, _ = decide.as_write(action.decision)
        return written, action

    action = await runtime.records.mutate(record.operation_id, change, known=record)
    if action.step is pushes.Step.APPLIED:
        assert action.decision is not None
        found = effects.of_decision(policy, action.decision, now, detail="from a push")
        found += effects.of_push(policy.provider, "applied", now, record=action.decision.record)
        await runtime.effects.carry_out(found)
        keeping.after_success(runtime, policy, action.decision.record)  # when it succeeded
        return "applied"
    if action.step is not pushes.Step.POLL:
        result = action.step.value
        await runtime.effects.carry_out(
            effects.of_push(policy.provider, result, now, record=record)
        )
        return result
    assert action.decision is not None
    due = action.decision.record
    await runtime.effects.carry_out(
        effects.of_push(policy.provider, "polled", now, record=due, detail="a thin push: one poll")
    )
    runtime.spawn(_poll_once(runtime, policy, due))  # the provider is answered at once
    return "polled"


async def _poll_once(runtime: Runtime, policy: ProviderPolicy, record: OperationRecord) -> None:
    """The one poll a thin push asks for, made for the record's account with its effects
    as for any poll; one already in flight (here or at another replica) stands for it.
    Run in the background: the provider is answered without waiting for its own status
    route (webhook senders give a few seconds, a poll may take ``upstream_timeout``)."""
    if record.outcome is not Outcome.PENDING:
        return
    asker = polls.record_asker(runtime, policy, record)
    try:
        await polls.shared_poll(asker, record, pace=True)
    except StoreError as exc:  # the schedule's next poll (or the next push) goes on
        log.warning("the poll a push asked for on %s failed: %s", record.operation_id, exc)


async def _done(runtime: Runtime, provider: str, received: Received, *, detail: str) -> Received:
    """A push that touched no operation: counted and audited, then answered."""
    found = effects.of_push(provider, received.result, runtime.clock(), detail=detail)
    await runtime.effects.carry_out(found)
    return received
