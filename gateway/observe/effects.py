"""Carrying out what a persisted decision says besides the answer: audit line, metrics,
escalation webhook; and the per-operation windows that aggregate too-early refusals.

The audit line is written before the caller answers the agent. Nothing here decides
anything: the event, the record and the plan come from decide.py or actions.py.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from typing import Any

from gateway.core.decide import Decision, Reply
from gateway.core.escalation import message, problem_members
from gateway.core.models import Clock, DelaySource, Event, OperationRecord
from gateway.observe.audit import AuditLog, iso, line_fields
from gateway.observe.context import current_request_id
from gateway.observe.metrics import Metrics
from gateway.observe.notify import Notifier, notifier_for
from gateway.settings.config import Settings
from gateway.settings.policy import ProviderPolicy

log = logging.getLogger("statusgate")


@dataclass
class Window:
    """Too-early refusals of one operation while it waited for one next_poll_at."""

    count: int
    first_at: float
    ends_at: float


class RefusalWindows:
    def __init__(self) -> None:
        self._open: dict[str, Window] = {}

    def note(self, record: OperationRecord, now: float) -> None:
        window = self._open.get(record.operation_id)
        if window is None or window.ends_at != record.next_poll_at:
            if window is not None:  # the schedule moved under us: keep counting, new end
                window.ends_at = record.next_poll_at
            else:
                self._open[record.operation_id] = Window(0, now, record.next_poll_at)
            window = self._open[record.operation_id]
        window.count += 1

    def close(self, operation_id: str) -> Window | None:
        return self._open.pop(operation_id, None)

    def reopen(self, operation_id: str, window: Window | None) -> None:
        """Put back a window closed for a write that did not happen (counts kept)."""
        if window is None:
            return
        current = self._open.get(operation_id)
        if current is None:
            self._open[operation_id] = window
        else:
            current.count += window.count
            current.first_at = min(current.first_at, window.first_at)

    def ended(self, now: float) -> list[str]:
        return [op for op, window in self._open.items() if window.ends_at <= now]

    def all(self) -> list[str]:
        return list(self._open)


# Operator actions by audit event, as named in operation.decided webhooks.
OPERATOR_EVENTS = {
    Event.EXTENDED: "extend",
    Event.RESUMED: "resume",
    Event.ABANDONED: "abandon",
    Event.CANCELLED: "cancel",
}


class Effects:
    def __init__(self, *, clock: Clock, metrics: Metrics, audit: AuditLog | None) -> None:
        self._clock = clock
        self.metrics = metrics
        self.audit = audit
        self.notifier: Notifier | None = None  # set at start when a webhook is configured
        self.refusals = RefusalWindows()

    async def restart_notifier(self, settings: Settings) -> None:
        """Start (or, on a reload that changed it, replace) the webhook notifier; notices
        the old one had not delivered go to the new one, or are reported dropped."""
        left = await self.notifier.close() if self.notifier is not None else []
        hook = settings.file.escalation
        self.notifier = notifier_for(
            hook.webhook_url,
            attempts=hook.webhook_attempts,
            timeout=hook.webhook_timeout,
            backoff=hook.webhook_backoff,
            secret=settings.webhook_secret,
            on_outcome=self.notified,
            on_drop=lambda: self.metrics.webhook_deliveries.labels("dropped").inc(),
        )
        if self.notifier is None:
            await self.dropped(left, "the webhook was removed by a reload")
        else:
            for notice in left:
                self.notifier.submit(notice)

    async def close_notifier(self, grace: float) -> None:
        """Shutdown: deliver for up to ``grace`` seconds, then report the rest dropped."""
        if self.notifier is not None:
            left = await self.notifier.close(grace)
            self.notifier = None
            await self.dropped(left, "the gateway shut down")

    async def dropped(self, notices: list[dict[str, Any]], why: str) -> None:
        """Notices that will never be delivered: each counted and audited, one log line."""
        for notice in notices:
            await self.notified(notice, f"dropped, not delivered: {why}")
        if notices:
            log.warning("%d webhook notices dropped, not delivered: %s", len(notices), why)

    async def decided(
        self,
        policy: ProviderPolicy,
        decision: Decision,
        *,
        event: Event | None = None,
        http_status: int | None = None,
        detail: str | None = None,
        actor: str = "gateway",
    ) -> None:
        """Audit, count and notify one persisted decision (no-op when it has no event)."""
        event = event or decision.event
        if event is None:
            return
        record = decision.record
        if event is Event.ESCALATED and record.escalation is not None:
            detail = record.escalation.detail if detail is None else detail
        if self.audit is not None:
            await self._append(
                line_fields(
                    record,
                    event=event,
                    at=self._clock(),
                    decision=_decision_word(decision, record),
                    http_status=http_status,
                    detail=detail,
                    actor=actor,
                )
            )
        self._count(policy, decision, event)
        if self.notifier is None:
            return
        if event is Event.ESCALATED:
            self.notifier.submit(self._notice("operation.escalated", policy, record))
        elif event in OPERATOR_EVENTS and actor != "gateway":
            notice = self._notice("operation.decided", policy, record)
            notice.update(action=OPERATOR_EVENTS[event], actor=actor, detail=detail)
            self.notifier.submit(notice)

    async def refused(self, record: OperationRecord, window: Window) -> None:
        """One line for a closed refusal window, with its count."""
        if self.audit is None:
            return
        await self._append(
            line_fields(
                record.evolve(next_poll_at=window.ends_at),
                event=Event.REFUSED,
                at=self._clock(),
                decision="too-early",
                detail=f"first at {iso(window.first_at)}",
                count=window.count,
            )
        )

    async def interrupted(self, record: OperationRecord, sent_at: float) -> None:
        """SPEC 16: the line a status request cut short by a crash could not write itself,
        written when the cut is found (the next poll under the lease, or at start)."""
        if self.audit is None:
            return
        detail = f"request sent at {iso(sent_at)} was cut short; no answer was recorded"
        await self._append(
            line_fields(
                record, event=Event.POLLED, at=self._clock(), decision="interrupted", detail=detail
            )
        )

    async def call(
        self,
        *,
        provider: str,
        account: str,
        event: Event,
        http_status: int | None,
        detail: str,
        operation: OperationRecord | None = None,
    ) -> None:
        """One audit line for a provider call outside the polling loop (a rejected submit,
        a passthrough call, a result fetch)."""
        if self.audit is None:
            return
        if operation is not None:
            fields = line_fields(
                operation,
                event=event,
                at=self._clock(),
                decision="forwarded",
                http_status=http_status,
                detail=detail,
            )
        else:
            fields = {
                "at": iso(self._clock()),
                "operation_id": None,
                "provider": provider,
                "account": account,
                "event": event,
                "http_status": http_status,
                "decision": "forwarded",
                "detail": detail,
                "actor": "gateway",
            }
        await self._append(fields)

    async def notified(self, notice: dict[str, Any], outcome: str) -> None:
        """The webhook's delivery outcome, counted and as an audit line of its own."""
        result = next(
            (word for word in ("delivered", "dropped") if outcome.startswith(word)), "failed"
        )
        self.metrics.webhook_deliveries.labels(result).inc()
        if self.audit is None:
            return
        await self._append(
            {
                "at": iso(self._clock()),
                "operation_id": notice["operation_id"],
                "provider": notice["provider"],
                "account": notice["account"],
                "event": Event.NOTIFIED.value,
                "decision": "webhook",
                "reason": notice["reason"],
                "detail": outcome,
                "actor": "gateway",
            }
        )

    async def _append(self, fields: dict[str, Any]) -> None:
        """One audit line; lines caused by a request carry its ``request_id`` (SPEC 13)."""
        assert self.audit is not None
        request_id = current_request_id()
        if request_id is not None:
            fields["request_id"] = request_id
        await self.audit.append(fields)

    def _count(self, policy: ProviderPolicy, decision: Decision, event: Event) -> None:
        record, m = decision.record, self.metrics
        provider = record.provider
        if event is Event.SUBMITTED:
            m.operations_started.labels(provider).inc()
        if event is Event.ESCALATED and record.escalation is not None:
            m.escalations.labels(provider, record.escalation.reason.value).inc()
        if event in (Event.FINISHED, Event.ABANDONED):  # the operation ended
            m.operations_finished.labels(provider, record.outcome.value).inc()
            m.requests_per_operation.labels(provider).observe(record.status_requests_used)
        plan = decision.plan
        if plan is not None:
            if plan.source in (DelaySource.PROVIDER_RETRY_AFTER, DelaySource.PROVIDER_POLL_HINT):
                m.provider_guidance.labels(provider, plan.source.value).inc()
            if plan.hint_rejected:
                m.provider_guidance.labels(provider, "hint_rejected").inc()

    def _notice(self, kind: str, policy: ProviderPolicy, record: OperationRecord) -> dict[str, Any]:
        """A webhook body: ``type`` (Standard Webhooks event type), a message ``id`` kept
        across retries, and what an operator needs to decide."""
        members = problem_members(record, policy)
        return {
            "type": kind,
            "id": f"msg_{secrets.token_hex(12)}",
            "timestamp": iso(self._clock()),
            "outcome": record.outcome.value,
            "operation_id": record.operation_id,
            "provider": record.provider,
            "account": record.account,
            "provider_job_id": record.provider_job_id,
            "reason": members["reason"],
            "escalated_at": members.get("escalated_at"),
            "permitted_actions": members["permitted_actions"],
            "message": message(record, policy),
        }


def _decision_word(decision: Decision, record: OperationRecord) -> str:
    if decision.problem is not None:
        return decision.problem
    if decision.reply is Reply.FINAL:
        return "answer-from-record"
    return record.outcome.value
