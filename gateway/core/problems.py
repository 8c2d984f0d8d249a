"""RFC 9457 problem details: the one table of slugs, and the bodies built from it.

Bodies carry only what the caller may know: no stack traces, credentials, internal hosts or
file paths. Pure: the HTTP responses are built in gateway/http/problems.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ProblemType:
    status: int
    title: str
    explanation: str
    # X-Should-Retry (SPEC 12): False where retrying the same request cannot change the
    # answer; True where it can, after Retry-After. None sends no header.
    retry: bool | None = False


PROBLEMS: Mapping[str, ProblemType] = {
    "unauthenticated": ProblemType(
        401, "Unauthenticated", "The bearer token is missing or not known to the gateway."
    ),
    "forbidden": ProblemType(
        403, "Forbidden", "The token is valid but may not use this provider or this API."
    ),
    "forbidden-role": ProblemType(
        403,
        "Forbidden for this role",
        "The operator is known, but their role may not do this. Roles: viewer (reads "
        "operations, escalations and stories), decider (also decides escalations: extend, "
        "cancel, abandon, resume), admin (also reloads the config and manages keys). The "
        "members required_role and role name the role needed and the caller's. An "
        "operator's role is operators[].role in the gateway config, or, for single sign-on, "
        "what the identity provider's roles claim maps to through oidc.roles.",
    ),
    "unknown-provider": ProblemType(
        404, "Unknown provider", "No policy is loaded for the provider named in the path."
    ),
    "route-not-allowed": ProblemType(
        404,
        "Route not allowed",
        "Only the methods and paths declared in the provider's policy are served; the gateway "
        "is not an open proxy.",
    ),
    "unknown-operation": ProblemType(
        404, "Unknown operation", "No operation of this account matches the job id."
    ),
    "invalid-request": ProblemType(400, "Invalid request", "The request is malformed."),
    "request-too-large": ProblemType(
        413, "Request too large", "The request body is larger than limits.max_request_body."
    ),
    "idempotency-key-missing": ProblemType(
        400,
        "Idempotency key missing",
        "This provider's submit route requires an Idempotency-Key header.",
    ),
    "idempotency-key-conflict": ProblemType(
        422,
        "Idempotency key conflict",
        "The key was already used for a different request (method, path or body differ).",
    ),
    "idempotency-key-in-use": ProblemType(
        409,
        "Idempotency key in use",
        "The original request with this key is still in flight; retry after it finishes.",
        retry=True,
    ),
    "submission-outcome-unknown": ProblemType(
        409,
        "Submission outcome unknown",
        "The original submission reached the provider but its answer was lost, and the "
        "provider does not take idempotency keys. The gateway never resubmits: a person must "
        "check at the provider whether the job exists.",
    ),
    "too-early": ProblemType(
        429,
        "Too early",
        "The next status request for this operation is not permitted yet. Retry after the "
        "Retry-After header, or send 'Prefer: wait=N' to let the gateway wait.",
        retry=True,
    ),
    "operation-escalated": ProblemType(
        409,
        "Operation escalated",
        "Waiting for this operation has ended and needs a person's decision. The members "
        "reason, escalated_at, permitted_actions and message say why and what can be done.",
    ),
    "not-ready": ProblemType(
        409, "Not ready", "The result is served only after the operation has succeeded."
    ),
    "approval-required": ProblemType(
        403,
        "Approval required",
        "This action is taken by an operator through the operator API, not by an agent.",
    ),
    "quota-exceeded": ProblemType(
        429,
        "Quota exceeded",
        "The agent key or account has reached one of its quotas: max_active_operations "
        "(pending operations at once; retry once one has ended) or submits_per_hour "
        "(submissions in any sliding hour; retry after the Retry-After header). Nothing "
        "was sent to the provider.",
        retry=True,
    ),
    "unknown-key": ProblemType(404, "Unknown key", "No agent key has this id (or it was revoked)."),
    "provider-rate-limited": ProblemType(
        429,
        "Provider rate limited",
        "The provider asked the gateway to slow down; retry after the Retry-After header.",
        retry=True,
    ),
    "provider-unavailable": ProblemType(
        503,
        "Provider unavailable",
        "The provider failed or could not be reached; retry after the Retry-After header.",
        retry=True,
    ),
    "provider-timeout": ProblemType(
        504,
        "Provider timeout",
        "The provider did not answer within limits.upstream_timeout; retry after the "
        "Retry-After header.",
        retry=True,
    ),
    "job-not-visible-yet": ProblemType(
        503,
        "Job not visible yet",
        "The provider does not show the job yet, which is normal shortly after submission.",
        retry=True,
    ),
    "integration-failure": ProblemType(
        502,
        "Integration failure",
        "The provider accepted the submission but its answer cannot be tracked (no valid job "
        "id). The gateway does not resubmit.",
    ),
    "store-unavailable": ProblemType(
        503,
        "Store unavailable",
        "The gateway cannot reach its store and fails closed: nothing was forwarded.",
        retry=True,
    ),
    "overloaded": ProblemType(
        503,
        "Overloaded",
        "The gateway already has limits.max_in_flight requests in hand and answers at once "
        "rather than queue this one: nothing was read, stored or forwarded. Retry after the "
        "Retry-After header.",
        retry=True,
    ),
    "action-not-permitted": ProblemType(
        409,
        "Action not permitted",
        "The operator action is not among the escalation's permitted actions, or it is over "
        "the policy's bounds; the detail names the rule or the limit.",
    ),
    "provider-credential-rejected": ProblemType(
        502,
        "Provider credential rejected",
        "The provider refused the gateway's own credential for this provider (not the "
        "agent's token). No operation was created; an operator must fix the credential. "
        "Retrying the same request cannot help until then.",
    ),
    "result-budget-exhausted": ProblemType(
        409,
        "Result budget exhausted",
        "The operation's result has been fetched polling.max_result_fetches times; the "
        "gateway forwards no more result calls for it.",
    ),
    "request-timeout": ProblemType(
        408,
        "Request timeout",
        "The request body did not arrive within limits.body_timeout.",
        retry=True,
    ),
    "config-rejected": ProblemType(
        422,
        "Config rejected",
        "The reloaded config or a policy is invalid, or changes a setting that needs a "
        "restart. Nothing changed: the gateway keeps serving the running set. The member "
        "problems lists what statusgate check would say.",
    ),
    "internal-error": ProblemType(
        500,
        "Internal error",
        "The gateway hit a bug. It is logged on the gateway; nothing about it is shown here.",
        retry=True,
    ),
}


def retry_after_value(seconds: float) -> str:
    """Retry-After delay-seconds: whole seconds, rounded up, never negative."""
    return str(max(0, math.ceil(seconds - 1e-9)))


def body(
    slug: str,
    detail: str,
    *,
    operation_id: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The problem document of ``slug``: RFC 9457 members, ours, and (SPEC 20) the
    ``error`` envelope OpenAI-compatible SDKs print, so an SDK's exception names the
    problem instead of "Error code: 409"."""
    kind = PROBLEMS[slug]
    document: dict[str, Any] = {
        "type": f"/problems/{slug}",
        "title": kind.title,
        "status": kind.status,
        "detail": detail,
        "error": {"message": detail, "type": slug, "code": slug},
    }
    if operation_id is not None:
        document["operation_id"] = operation_id
    if extra:
        document.update(extra)
    return document


def retry_after_ms(seconds: float) -> str:
    """Retry-After-Ms: whole milliseconds, rounded up, never negative."""
    return str(max(0, math.ceil(seconds * 1000 - 1e-6)))
