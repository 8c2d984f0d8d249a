"""A cancel request sent to a provider (SPEC 12, 20a), for an operator's decision or for an
agent cancelling its own job (``routes.cancel.by: agent``).

Owns the order of the steps: the operation's poll lease (one provider call per operation at
a time, so a cancel never crosses a poll), the record read again under it, the rule
(``actions.may_cancel``: a cancel route, none accepted yet, the operation pending or its
escalation permitting it), exactly one request to the cancel route, and the record's change
(``actions.cancelled``: still pending, ``cancel_requested_at``, a fresh ``cancel_checks``
budget) written before the lease is let go. Never decides who may ask, never answers HTTP,
and leaves the effects (the audit line names who asked) to the caller.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gateway.core import actions
from gateway.core.models import OperationRecord, ProviderAnswer, poll_lease
from gateway.core.routing import body_with_job_id, fill, job_values
from gateway.flow.leases import new_token
from gateway.flow.polls import lease_ttl
from gateway.flow.runtime import Runtime
from gateway.provider.client import UpstreamResponse
from gateway.provider.headers import to_provider
from gateway.provider.send import send_upstream
from gateway.settings.policy import ProviderPolicy

BUSY = "a status request or another cancel is in flight; try again in a moment"


@dataclass(frozen=True, slots=True)
class Sent:
    """What a cancel request came to. ``answer`` is None when nothing was sent: the lease
    was someone else's (``busy``) or the rule refused (``refusal``); ``record`` is then the
    record as it stands. When sent, ``result`` is the record's change (or its refusal: the
    provider did not accept) and ``record`` the record after it."""

    record: OperationRecord
    refusal: str | None = None
    busy: bool = False
    answer: ProviderAnswer | None = None
    response: UpstreamResponse | None = None
    result: actions.ActionResult | None = None


@dataclass(frozen=True, slots=True)
class Request:
    """The cancel request's headers (ready for the provider), body and query."""

    headers: Mapping[str, str]
    body: bytes | None = None
    query: str = ""


def gateway_request(policy: ProviderPolicy, record: OperationRecord) -> Request:
    """A cancel the gateway makes with nothing of an agent's request (an operator's, an MCP
    task's): the route's match headers, and the job id in a JSON body where the route reads
    it there."""
    route = policy.routes.cancel
    assert route is not None
    headers = to_provider(route.match.headers.items() if route.match else [], policy)
    body = None
    if route.job_id is not None and route.job_id.path is not None:
        body = body_with_job_id(route.job_id.path, record.provider_job_id)
        headers.setdefault("Content-Type", "application/json")
    return Request(headers, body)


async def cancel_at_provider(
    runtime: Runtime,
    policy: ProviderPolicy,
    record: OperationRecord,
    request: Request,
    reason: str = "",
) -> Sent:
    """Send the policy's cancel route for ``record`` once, under the operation's lease, and
    write what the provider's answer means for the record."""
    lease, token = poll_lease(record.operation_id), new_token()
    if not await runtime.coordination.acquire_lease(
        lease, token, runtime.clock(), lease_ttl(runtime, policy)
    ):
        return Sent(record, BUSY, busy=True)
    try:
        current = await runtime.records.get(record.operation_id) or record
        refusal = actions.may_cancel(policy, current)
        if refusal is not None:
            return Sent(current, refusal)
        answer, response = await _send(runtime, policy, current, request)
        now = runtime.clock()

        def change(
            stored: OperationRecord,
        ) -> tuple[OperationRecord | None, actions.ActionResult]:
            done = actions.cancelled(policy, stored, answer, reason, now)
            return done.record, done

        result = await runtime.records.mutate(record.operation_id, change, known=current)
    finally:
        await runtime.coordination.release_lease(lease, token)
    after = result.record or current
    return Sent(after, result.refusal, answer=answer, response=response, result=result)


async def _send(
    runtime: Runtime, policy: ProviderPolicy, record: OperationRecord, request: Request
) -> tuple[ProviderAnswer, UpstreamResponse | None]:
    route = policy.routes.cancel
    assert route is not None
    url = policy.upstream + fill(route.path, job_values(record), request.query)
    return await send_upstream(
        runtime.channel(policy),
        policy,
        "cancel",
        route.method,
        url,
        dict(request.headers),
        request.body,
        operation_id=record.operation_id,
    )
