"""Carrying out effects (gateway/core/effects.py): audit lines, metric changes and webhook
notices, in order, in one place; and the webhook notifier's lifecycle.

Audit lines are written before the caller answers the agent. Nothing here decides anything:
what to write, count and notify comes from the core as data.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from typing import Any

from gateway import AuditUnavailable
from gateway.core.effects import Count, Effect, Line, notice_body, of_delivery
from gateway.core.models import Clock, OperationRecord
from gateway.observe.audit import AuditLog
from gateway.observe.context import current_request_id
from gateway.observe.metrics import Metrics
from gateway.observe.mirror import AuditMirror
from gateway.observe.notify import Notifier, notifier_for
from gateway.settings.config import Settings

log = logging.getLogger("statusgate")


class Effects:
    def __init__(self, *, clock: Clock, metrics: Metrics, audit: AuditLog | None) -> None:
        self._clock = clock
        self.metrics = metrics
        self.audit = audit
        self.mirror: AuditMirror | None = None  # set at start on a store that keeps lines
        self.notifier: Notifier | None = None  # set at start when a webhook is configured

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
            on_outcome=self.delivered,
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
            await self.delivered(notice, f"dropped, not delivered: {why}")
        if notices:
            log.warning("%d webhook notices dropped, not delivered: %s", len(notices), why)

    async def carry_out(self, effects: Iterable[Effect]) -> None:
        """Every effect, in order: lines appended (each caused by a request carries its
        ``request_id``, SPEC 13), metrics changed, notices queued for the webhook."""
        for effect in effects:
            if isinstance(effect, Line):
                if self.audit is not None:
                    await self._append(dict(effect.fields))
            elif isinstance(effect, Count):
                if effect.observe:
                    self.metrics.histogram(effect.metric, *effect.labels).observe(effect.value)
                else:
                    self.metrics.counter(effect.metric, *effect.labels).inc(effect.value)
            else:
                if effect.kind == "operation.escalated":
                    _log_escalation(effect.record)
                if self.notifier is not None:
                    message_id = f"msg_{secrets.token_hex(12)}"
                    self.notifier.submit(notice_body(effect, message_id, self._clock()))

    def check_audit(self) -> None:
        """The gate before any work with side effects (a submission, a poll, an operator
        action): AuditUnavailable while audit lines the disk refused still wait; each check
        tries to write them, so the gate opens by itself once space returns."""
        if self.audit is not None and not self.audit.writable():
            raise AuditUnavailable

    async def delivered(self, notice: dict[str, Any], outcome: str) -> None:
        """The webhook's delivery outcome, counted and as an audit line of its own."""
        await self.carry_out(of_delivery(notice, outcome, self._clock()))

    async def _append(self, fields: dict[str, Any]) -> None:
        assert self.audit is not None
        request_id = current_request_id()
        if request_id is not None:
            fields["request_id"] = request_id
        await self.audit.append(fields)


def _log_escalation(record: OperationRecord) -> None:
    """One warning when waiting ends in an escalation, so an operator watching the logs (not
    only the audit, the metrics or the webhook) sees what now waits for a decision. The
    escalation's detail stays out: it may quote a remote agent's own words (an A2A
    INPUT_REQUIRED message); the audit line and the console have it."""
    escalation = record.escalation
    reason = escalation.reason.value if escalation is not None else "unknown"
    log.warning(
        "operation %s of %s (account %s) escalated: %s",
        record.operation_id,
        record.provider,
        record.account,
        reason,
        extra={
            "operation_id": record.operation_id,
            "provider": record.provider,
            "account": record.account,
            "reason": reason,
        },
    )
