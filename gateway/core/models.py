"""Frozen records and enums shared by the core, the stores and the HTTP shell.

Instants are float seconds since the Unix epoch (UTC). A record is never changed in place:
every change makes a new record that keeps the ``version`` it was derived from; a store
writes it (as ``version + 1``) only if nobody wrote since, a compare-and-set on ``version``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Clock = Callable[[], float]  # seconds since the epoch; injected everywhere time is read


class Outcome(enum.StrEnum):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    ESCALATED = "escalated"
    ABANDONED = "abandoned"

    @property
    def terminal(self) -> bool:
        """Finished at the provider: answered from the record from now on."""
        return self in _TERMINAL


_TERMINAL = frozenset({Outcome.SUCCEEDED, Outcome.FAILED, Outcome.CANCELLED, Outcome.EXPIRED})


class Reason(enum.StrEnum):
    DEADLINE_EXCEEDED = "deadline_exceeded"
    REQUEST_BUDGET_EXHAUSTED = "request_budget_exhausted"
    PROVIDER_FAILURE = "provider_failure"
    RATE_LIMITED = "rate_limited"
    UNKNOWN_STATE = "unknown_state"
    INTEGRATION_FAILURE = "integration_failure"
    AUTHORIZATION_DENIED = "authorization_denied"
    INPUT_REQUIRED = "input_required"  # an A2A task asks for input (on_input_required: escalate)


class Event(enum.StrEnum):
    """What an audit line records (SPEC section 8, and the additions in docs/reference.md)."""

    SUBMITTED = "submitted"
    SUBMIT_REJECTED = "submit_rejected"  # the provider answered 4xx/5xx
    SUBMIT_FAILED = "submit_failed"  # no answer (timeout, connection)
    SUBMIT_UNTRACKED = "submit_untracked"  # accepted, but no operation could be recorded
    POLLED = "polled"
    REFUSED = "refused"
    FINISHED = "finished"
    ESCALATED = "escalated"
    EXTENDED = "extended"
    RESUMED = "resumed"
    ABANDONED = "abandoned"
    CANCELLED = "cancelled"
    CANCEL_REQUESTED = "cancel_requested"  # an agent's own cancel sent (routes.cancel.by: agent)
    RESULT_FETCHED = "result_fetched"
    RESULT_KEPT = "result_kept"  # a succeeded job's result copied into the result store (SPEC 23)
    PASSTHROUGH = "passthrough"
    NOTIFIED = "notified"
    MESSAGE_SENT = "message_sent"  # an A2A caller's follow-up message, its task recorded
    # (a new task's first answer is its ``submitted`` line's: decide.with_first_task)
    PUSHED = "pushed"  # a push: a provider's (SPEC 23, verified or refused) or a remote A2A agent's
    KEY_CREATED = "key_created"  # an agent key made through the operator API (SPEC 25)
    KEY_REVOKED = "key_revoked"
    QUOTA_EXCEEDED = "quota_exceeded"  # submissions refused by a key's or account's quota


class Failure(enum.Enum):
    """Why a provider request produced no usable HTTP answer."""

    CONNECTION = "connection"  # failed after the request may have reached the provider
    UNREACHABLE = "unreachable"  # failed before anything was sent
    TIMEOUT = "timeout"
    TOO_LARGE = "too_large"
    CREDENTIAL_RENEWED = "credential_renewed"  # a 401 to an expired token; renewed for next


@dataclass(frozen=True, slots=True)
class ProviderAnswer:
    """One upstream answer as the core sees it; ``status`` is None when ``failure`` is set."""

    status: int | None
    body: bytes = b""
    content_type: str = ""
    retry_after: str | None = None
    failure: Failure | None = None


class DelaySource(enum.StrEnum):
    PROVIDER_RETRY_AFTER = "provider_retry_after"
    PROVIDER_POLL_HINT = "provider_poll_hint"
    LOCAL_BACKOFF = "local_backoff"
    MANUAL_EXTENSION = "manual_extension"


@dataclass(frozen=True, slots=True)
class FinalResponse:
    """The provider answer that ended the operation, replayed to every later status call."""

    status: int
    content_type: str
    body: bytes


@dataclass(frozen=True, slots=True)
class LastAnswer:
    """The provider's last answer to a status request while the job was pending, kept for
    ``polling.early_calls: replay`` (SPEC 20): replayed to early status calls as a cache
    would, with ``Age`` counted from ``at``. Only a 2xx answer that left the operation
    pending is kept; any other answer (5xx, 429, 404, no answer) clears it. Its body is an
    answer the upstream client read whole, so at most ``limits.max_response_body``."""

    status: int
    content_type: str
    body: bytes
    at: float


@dataclass(frozen=True, slots=True)
class Escalation:
    reason: Reason
    at: float
    detail: str
    permitted_actions: tuple[str, ...]
    # What was in force when waiting ended: resume compares the live ones with these.
    credential_fingerprint: str = ""
    policy_fingerprint: str = ""


@dataclass(frozen=True, slots=True)
class KeptResult:
    """What the gateway did with a succeeded job's result (SPEC 23, kept results).

    ``name`` is the copy's name in the result store; empty when the result was not kept
    because it was larger than ``results.max_bytes`` (then ``size`` is the most read, and
    the result route forwards as before). Written only once a copy is complete."""

    name: str
    size: int
    sha256: str
    content_type: str
    kept_at: float
    expires_at: float

    @property
    def kept(self) -> bool:
        """A complete copy is in the result store (until ``expires_at``)."""
        return bool(self.name)


@dataclass(frozen=True, slots=True)
class OperationRecord:
    operation_id: str
    provider: str
    account: str
    provider_job_id: str
    request_fingerprint: str
    idempotency_key: str | None
    started_at: float
    deadline_at: float
    max_status_requests: int
    max_transport_failures: int
    max_rate_limited: int
    next_poll_at: float
    delay_source: DelaySource
    credential_fingerprint: str
    policy_fingerprint: str
    status_requests_used: int = 0
    transport_failures_used: int = 0
    rate_limited_used: int = 0
    early_refusals: int = 0
    last_known_state: str | None = None
    outcome: Outcome = Outcome.PENDING
    last_http_status: int | None = None
    last_polled_at: float | None = None
    final_response: FinalResponse | None = None
    escalation: Escalation | None = None
    extended_seconds: float = 0.0  # operator extensions so far, bounded by the policy
    extended_requests: int = 0
    ended_at: float | None = None  # when waiting stopped (kept for the policy's retention)
    cancel_requested_at: float | None = None  # the provider accepted an operator's cancel
    result_fetches: int = 0  # result calls forwarded, bounded by polling.max_result_fetches
    inflight_at: float | None = None  # a status request reserved, its answer not yet recorded
    last_answer: LastAnswer | None = None  # replayed to early calls (early_calls: replay)
    # the final answer's {final.<field>} values of the result route: the result is addressed
    # by them too (SPEC 20); stores index them (Records.find_result)
    result_values: tuple[str, ...] = ()
    # the submit path's named segments besides the job (fal's owner and app): the gateway's
    # own polls and cancels are sent there; (name, value) pairs, sorted
    route_values: tuple[tuple[str, str], ...] = ()
    kept_result: KeptResult | None = None  # the result's kept copy (policy results.keep)
    # SPEC 23: the policy's usage numbers found in the final answer, (kind, number) sorted
    usage: tuple[tuple[str, int | float], ...] = ()
    # SPEC 23: an operation.completed event is owed for this terminal record (a webhook was
    # configured when it ended); stores put it in their outbox in the same write
    announce: bool = False
    copy_attempts: int = 0  # the gateway's own tries at the kept copy (core.results.COPY_TRIES)
    next_copy_at: float | None = None  # no copy try before then (backoff after a failed one)
    version: int = 1

    def evolve(self, **changes: Any) -> OperationRecord:
        """A new record with ``changes`` applied; still the version it was derived from.

        Stores write it as ``version + 1`` only if the stored version is still ``version``.
        Equal to ``dataclasses.replace`` (a test says so) at about a quarter of its cost:
        every poll makes several.
        """
        return _EVOLVE(self, changes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (on the hot path: no deep copies, unlike dataclasses.asdict)."""
        data = {name: getattr(self, name) for name in _RECORD_FIELDS}
        final, escalation, last = self.final_response, self.escalation, self.last_answer
        if last is not None:
            data["last_answer"] = {
                "status": last.status,
                "content_type": last.content_type,
                "body": last.body.decode("latin-1"),
                "at": last.at,
            }
        data["result_values"] = list(self.result_values)
        if self.route_values:
            data["route_values"] = dict(self.route_values)
        else:  # records written before them, and most, have none
            del data["route_values"]
        kept = self.kept_result
        if kept is not None:
            data["kept_result"] = dataclasses.asdict(kept)
        else:  # records written before it, and most, have none
            del data["kept_result"]
        if self.usage:
            data["usage"] = dict(self.usage)
        else:  # records written before SPEC 23, and many after, have none
            del data["usage"]
        if not self.announce:
            del data["announce"]
        if not self.copy_attempts:  # as kept_result: only records whose copy was tried
            del data["copy_attempts"]
        if self.next_copy_at is None:
            del data["next_copy_at"]
        if final is not None:
            data["final_response"] = {
                "status": final.status,
                "content_type": final.content_type,
                "body": final.body.decode("latin-1"),
            }
        if escalation is not None:
            data["escalation"] = {
                "reason": escalation.reason.value,
                "at": escalation.at,
                "detail": escalation.detail,
                "permitted_actions": list(escalation.permitted_actions),
                "credential_fingerprint": escalation.credential_fingerprint,
                "policy_fingerprint": escalation.policy_fingerprint,
            }
        data["outcome"] = self.outcome.value
        data["delay_source"] = self.delay_source.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OperationRecord:
        data = dict(data)
        final = data.get("final_response")
        if final is not None:
            data["final_response"] = FinalResponse(
                status=final["status"],
                content_type=final["content_type"],
                body=final["body"].encode("latin-1"),
            )
        last = data.get("last_answer")
        if last is not None:  # absent from records written before SPEC 20
            data["last_answer"] = LastAnswer(
                status=last["status"],
                content_type=last["content_type"],
                body=last["body"].encode("latin-1"),
                at=last["at"],
            )
        data["result_values"] = tuple(data.get("result_values", ()))
        data["route_values"] = tuple(sorted(data.get("route_values", {}).items()))
        kept = data.get("kept_result")
        if kept is not None:
            data["kept_result"] = KeptResult(**kept)
        data["usage"] = tuple(sorted(data.get("usage", {}).items()))
        esc = data.get("escalation")
        if esc is not None:
            data["escalation"] = Escalation(
                reason=Reason(esc["reason"]),
                at=esc["at"],
                detail=esc["detail"],
                permitted_actions=tuple(esc["permitted_actions"]),
                credential_fingerprint=esc.get("credential_fingerprint", ""),
                policy_fingerprint=esc.get("policy_fingerprint", ""),
            )
        data["outcome"] = Outcome(data["outcome"])
        data["delay_source"] = DelaySource(data["delay_source"])
        return cls(**data)


_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(OperationRecord))


def evolver(cls: type[Any], names: tuple[str, ...]) -> Callable[[Any, dict[str, Any]], Any]:
    """A copier for a frozen slotted dataclass written out field by field (no per-field
    loop, no keyword binding, no __init__), generated from the fields so a new field is
    never left out: every slot copied through its own descriptor's setter (no attribute
    lookup, which ``object.__setattr__`` makes each time: half the cost), then the changes
    applied. Unknown names raise TypeError, as dataclasses.replace does."""
    setters = {name: cls.__dict__[name].__set__ for name in names}  # slots' descriptors
    lines = ["def evolve(self, changes):", "    new = _new(_cls)"]
    lines += [f"    _set_{name}(new, self.{name})" for name in names]
    lines += [
        "    for name, value in changes.items():",
        "        setter = _setters.get(name)",
        "        if setter is None:",
        "            raise TypeError(f'unknown fields: {[name]}')",
        "        setter(new, value)",
        "    return new",
    ]
    scope: dict[str, Any] = {"_new": object.__new__, "_cls": cls, "_setters": setters}
    scope.update({f"_set_{name}": setter for name, setter in setters.items()})
    exec("\n".join(lines), scope)  # noqa: S102 - source built above from field names only
    evolve: Callable[[Any, dict[str, Any]], Any] = scope["evolve"]
    return evolve


_EVOLVE: Callable[[OperationRecord, dict[str, Any]], OperationRecord] = evolver(
    OperationRecord, _RECORD_FIELDS
)


class IdemState(enum.StrEnum):
    IN_FLIGHT = "in_flight"
    COMPLETED = "completed"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A submit answer kept for idempotent replay, headers already rewritten for agents."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


@dataclass(frozen=True, slots=True)
class IdempotencyEntry:
    key: str
    fingerprint: str
    state: IdemState
    created_at: float
    expires_at: float
    operation_id: str | None = None
    response: StoredResponse | None = None
    # made afresh by the request that claims the key: a claim a driver sent again after a
    # broken connection finds its own entry (byte for byte), not another request's
    claim: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if self.response is not None:
            data["response"] = {
                "status": self.response.status,
                "headers": [list(h) for h in self.response.headers],
                "body": self.response.body.decode("latin-1"),
            }
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IdempotencyEntry:
        data = dict(data)
        resp = data.get("response")
        if resp is not None:
            data["response"] = StoredResponse(
                status=resp["status"],
                headers=tuple((k, v) for k, v in resp["headers"]),
                body=resp["body"].encode("latin-1"),
            )
        data["state"] = IdemState(data["state"])
        return cls(**data)


@dataclass(frozen=True, slots=True)
class OperationFilter:
    """Which operations ``Store.list`` returns: newest first by (started_at, operation_id).

    ``before`` is a page's position: only operations strictly before that (started_at,
    operation_id) pair in this order. Operations inserted later start later, so a page read
    from a position never repeats or skips one that existed when paging began."""

    outcome: Outcome | None = None
    provider: str | None = None
    account: str | None = None
    limit: int = 100
    before: tuple[float, str] | None = None


def poll_lease(operation_id: str) -> str:
    """The name of the lease held while one provider call about an operation is in flight
    (a status poll, an operator's cancel, an overdue escalation): one per operation."""
    return f"poll:{operation_id}"
