"""The rules of the result route (SPEC sections 4, 12, 16 and 23), as pure functions.

A result is fetched only after success, only while the operation's result budget lasts,
and from a provider path that may be filled from the stored final answer. A policy with
``results.keep`` has it fetched once more after success and kept (SPEC 23): which record
is owed a copy, which copy may be served, and how a copy is named are decided here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.core.effects import Effects, Line, line_fields
from gateway.core.models import Event, KeptResult, OperationRecord, Outcome
from gateway.core.routing import Finals, fill, final_values, job_values
from gateway.settings.policy import ProviderPolicy, placeholders


@dataclass(frozen=True, slots=True)
class Refusal:
    slug: str
    detail: str


def provider_values(
    policy: ProviderPolicy, record: OperationRecord, given: Mapping[str, str]
) -> Finals | Refusal:
    """The values the result route's provider path needs (and the query a final URL value
    carried), or why there is no result: the job's own (its id, the values its submit was
    sent to), the ``given`` segments of the agent's call (ElevenLabs' ``{language_code}``),
    and the final answer's fields (``{final.<field>}``)."""
    route = policy.routes.result
    assert route is not None
    if record.outcome is not Outcome.SUCCEEDED:
        return _not_succeeded(record)
    values = {**given, **job_values(record)}
    missing = [
        name
        for name in placeholders(route.path)
        if not name.startswith("final.") and name.rstrip("*") not in values
    ]
    if missing:
        detail = f"The result route needs {{{missing[0]}}}: call it with its full path."
        return Refusal("invalid-request", detail)
    if "{final." not in route.path:
        return Finals(values)
    final = record.final_response
    try:
        body = json.loads(final.body) if final is not None else None
    except (ValueError, RecursionError):
        body = None
    found = final_values(route.path, body, policy.upstream)
    if isinstance(found, str):
        return Refusal("not-ready", f"The job succeeded but {found}: there is no result to fetch.")
    return Finals({**values, **found.values}, found.query)


def fetch(
    policy: ProviderPolicy, record: OperationRecord
) -> tuple[OperationRecord | None, OperationRecord | Refusal]:
    """Count one result fetch on the record before it is sent (a store mutation)."""
    if record.outcome is not Outcome.SUCCEEDED:
        return None, _not_succeeded(record)
    limit = policy.polling.max_result_fetches
    if record.result_fetches >= limit:
        detail = f"The result was fetched {record.result_fetches} times; the limit is {limit}."
        return None, Refusal("result-budget-exhausted", detail)
    new = record.evolve(result_fetches=record.result_fetches + 1)
    return new, new


def _not_succeeded(record: OperationRecord) -> Refusal:
    detail = f"The operation is {record.outcome.value}; the result is served after success."
    return Refusal("not-ready", detail)


# -- kept results (SPEC 23) ----------------------------------------------------------------

COPY_WAIT = 60.0  # seconds a completion event waits for its operation's kept copy


COPY_TRIES = 3  # the gateway's own tries at a copy (each one result fetch), then it gives up
COPY_BACKOFF = 5.0  # seconds before the second try; doubled before each later one


def owes_copy(policy: ProviderPolicy, record: OperationRecord, now: float) -> bool:
    """The record's result should be fetched and kept now: its policy keeps results, the
    job succeeded, nothing is recorded about a copy yet, the job ended less than ``ttl``
    ago (a copy made later would be deleted at once), and the gateway's own tries do not
    starve the agent: fewer than ``COPY_TRIES`` so far, the last one's backoff over, and
    the result budget keeps at least one fetch for the agent after this one."""
    keeping = policy.results
    return (
        keeping.keep
        and policy.routes.result is not None
        and record.outcome is Outcome.SUCCEEDED
        and record.kept_result is None
        and record.copy_attempts < COPY_TRIES
        and (record.next_copy_at is None or record.next_copy_at <= now)
        and record.result_fetches + 1 < policy.polling.max_result_fetches
        and (record.ended_at is None or record.ended_at + keeping.ttl > now)
    )


def awaits_copy(policy: ProviderPolicy, record: OperationRecord, now: float) -> bool:
    """The event waits: its policy keeps results and the copy of this one is still owed,
    for at most COPY_WAIT after the operation ended, so the event names the kept result
    (``result_url``) when there will be one, and is never held up long by a copy that fails:
    while a try is owed (now or after its backoff) or may be under way."""
    ended = record.ended_at if record.ended_at is not None else now
    when = max(now, record.next_copy_at or now)
    owed = owes_copy(policy, record, when) or copy_tried(policy, record)
    return owed and now < ended + COPY_WAIT


def copy_fetch(
    policy: ProviderPolicy, record: OperationRecord, now: float
) -> tuple[OperationRecord | None, OperationRecord | Refusal]:
    """Count one of the gateway's own copy tries on the record before it is sent (a store
    mutation, under the operation's lease): one result fetch and one try; refused when the
    record no longer owes a copy (an agent took the budget, another try came first)."""
    if not owes_copy(policy, record, now):
        return None, Refusal("not-ready", "The result is not owed a copy now.")
    new = record.evolve(
        result_fetches=record.result_fetches + 1, copy_attempts=record.copy_attempts + 1
    )
    return new, new


def copy_failed(
    record: OperationRecord, now: float
) -> tuple[OperationRecord | None, OperationRecord]:
    """Record that the latest try kept nothing (a 404, a 5xx, a redirect, no answer): no
    try before ``COPY_BACKOFF`` doubled per try so far has passed, on the injected clock, so
    replicas and restarts agree. A try cut short by a crash records nothing: the lease
    lapses and the next try comes at once (still counted in ``COPY_TRIES``)."""
    if record.kept_result is not None or record.copy_attempts == 0:
        return None, record
    wait = COPY_BACKOFF * 2 ** (record.copy_attempts - 1)
    new = record.evolve(next_copy_at=now + wait)
    return new, new


def copy_tried(policy: ProviderPolicy, record: OperationRecord) -> bool:
    """A copy was tried and none is recorded: a try may still be under way (in this process
    or under another replica's lease), which the result route waits for before it forwards."""
    return (
        policy.results.keep
        and record.outcome is Outcome.SUCCEEDED
        and record.kept_result is None
        and record.copy_attempts > 0
    )


def served_copy(record: OperationRecord, now: float) -> KeptResult | None:
    """The kept copy the result route answers from, if there is one still within its ttl."""
    kept = record.kept_result
    if kept is None or not kept.kept or kept.expires_at <= now:
        return None
    return kept


def copy_name(operation_id: str, expires_at: float) -> str:
    """The copy's name in the result store: its expiry first (whole seconds, rounded up), so
    the ttl sweep reads what to delete from a listing alone, without a store lookup."""
    return f"{-int(-expires_at // 1):011d}-{operation_id}"


def copy_expiry(name: str) -> float | None:
    """The expiry a copy's name carries (``copy_name``), or None for a name not ours."""
    head, _, rest = name.partition("-")
    return float(head) if head.isdigit() and len(head) == 11 and rest else None


def record_copy(
    record: OperationRecord, kept: KeptResult
) -> tuple[OperationRecord | None, OperationRecord]:
    """Record a complete copy (or that the result was too large) on the record, a store
    mutation: only the first one counts; a later one leaves the record as it is."""
    if record.kept_result is not None:
        return None, record
    new = record.evolve(kept_result=kept)
    return new, new


def kept_result_path(policy: ProviderPolicy, record: OperationRecord) -> str | None:
    """The agent-facing path (``/p/<provider>/...``, no query) of the record's kept result,
    from which its URL is the gateway's ``public_base_url`` plus this; None when no copy
    is kept, or the result route needs values only an agent's call gives."""
    if record.kept_result is None or not record.kept_result.kept:
        return None
    return result_path(policy, record)


def result_path(policy: ProviderPolicy, record: OperationRecord) -> str | None:
    """The agent-facing path of the record's result route, kept or not (a copy is made
    just after success: an announcement of the success may name it before it exists);
    None without a result route or when it needs values only an agent's call gives."""
    route = policy.routes.result
    if route is None:
        return None
    values = provider_values(policy, record, {})
    if isinstance(values, Refusal):
        return None
    path = fill(route.path, values.values).partition("?")[0]
    return f"/p/{policy.provider}{path}"


def kept_line(record: OperationRecord, kept: KeptResult, now: float, http_status: int) -> Effects:
    """The audit line of a copy made (``result_kept``, with its size and sha256) or of a
    result too large to keep."""
    if kept.kept:
        detail = f"kept {kept.size} bytes, sha256 {kept.sha256}"
    else:
        detail = f"not kept: larger than results.max_bytes (over {kept.size} bytes)"
    fields = line_fields(
        record,
        event=Event.RESULT_KEPT if kept.kept else Event.RESULT_FETCHED,
        at=now,
        decision="forwarded",
        http_status=http_status,
        detail=detail,
    )
    if kept.kept:
        fields.update(size=kept.size, sha256=kept.sha256)
    return (Line(fields),)
