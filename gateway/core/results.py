"""The rules of the result route (SPEC sections 4, 12 and 16), as pure functions.

A result is fetched only after success, only while the operation's result budget lasts,
and from a provider path that may be filled from the stored final answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.core.models import OperationRecord, Outcome
from gateway.core.routing import final_values, job_values
from gateway.settings.policy import ProviderPolicy, placeholders


@dataclass(frozen=True, slots=True)
class Refusal:
    slug: str
    detail: str


def provider_values(
    template: str, record: OperationRecord, given: Mapping[str, str]
) -> dict[str, str] | Refusal:
    """The values the result route's provider path needs, or why there is no result yet:
    the job's own (its id, the values its submit was sent to), then the ``given`` segments
    of the agent's call (ElevenLabs' ``{language_code}``)."""
    if record.outcome is not Outcome.SUCCEEDED:
        return _not_succeeded(record)
    values = {**given, **job_values(record)}
    missing = [
        name
        for name in placeholders(template)
        if not name.startswith("final.") and name.rstrip("*") not in values
    ]
    if missing:
        detail = f"The result route needs {{{missing[0]}}}: call it with its full path."
        return Refusal("invalid-request", detail)
    if "{final." not in template:
        return values
    final = record.final_response
    try:
        body = json.loads(final.body) if final is not None else None
    except (ValueError, RecursionError):
        body = None
    found = final_values(template, body)
    if isinstance(found, str):
        return Refusal(
            "not-ready",
            f"The job succeeded but its final answer has no usable {found!r}: "
            "there is no result to fetch.",
        )
    return {**values, **found}


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
