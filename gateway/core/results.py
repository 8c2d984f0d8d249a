"""The rules of the result route (SPEC sections 4, 12 and 16), as pure functions.

A result is fetched only after success, only while the operation's result budget lasts,
and from a provider path that may be filled from the stored final answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.core.models import OperationRecord, Outcome
from gateway.core.routing import Finals, final_values, job_values
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
