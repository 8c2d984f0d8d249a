"""``memory://``: everything in dicts of one process. For tests and throwaway runs.

No awaits happen between a read and the write that depends on it, so each method is atomic
on the event loop without locks.
"""

from __future__ import annotations

import builtins

from gateway.core.keys import HOUR, AgentKey, quota_wait
from gateway.core.models import IdempotencyEntry, OperationFilter, OperationRecord, Outcome
from gateway.settings.config import Quotas
from gateway.store.base import (
    PURGE_BATCH,
    Ids,
    Store,
    is_overdue,
    listed_at,
    matches,
    owes,
    purgeable,
)


class MemoryStore(Store):
    def __init__(self) -> None:
        self._records: dict[str, OperationRecord] = {}
        self._by_job: dict[tuple[str, str, str], str] = {}
        self._by_result: dict[tuple[str, str, str], str] = {}  # (account, provider, value)
        self._idempotency: dict[str, IdempotencyEntry] = {}
        self._keys: dict[str, AgentKey] = {}  # by id
        self._key_ids: dict[str, str] = {}  # token sha256 -> key id
        self._active: dict[str, dict[str, float]] = {}  # holder -> operation id -> claimed at
        self._submits: dict[str, dict[str, float]] = {}  # holder -> operation id -> at
        self._owed: dict[str, float] = {}  # completion events owed: id -> ended_at
        self._sent: set[str] = set()  # completion events delivered

    async def create(
        self, record: OperationRecord, idempotency: IdempotencyEntry | None = None
    ) -> OperationRecord:
        job = (record.account, record.provider, record.provider_job_id)
        existing = self._by_job.get(job)
        if existing is not None:
            return self._records[existing]
        self._records[record.operation_id] = record
        self._by_job[job] = record.operation_id
        self._index(record)
        self._owe(record)
        if idempotency is not None:
            self._idempotency[idempotency.key] = idempotency
        return record

    async def get(self, operation_id: str) -> OperationRecord | None:
        return self._records.get(operation_id)

    async def find(self, account: str, provider: str, job_id: str) -> OperationRecord | None:
        operation_id = self._by_job.get((account, provider, job_id))
        return None if operation_id is None else self._records[operation_id]

    async def find_result(self, account: str, provider: str, value: str) -> OperationRecord | None:
        operation_id = self._by_result.get((account, provider, value))
        record = None if operation_id is None else self._records.get(operation_id)
        return record if record is not None and value in record.result_values else None

    def _index(self, record: OperationRecord) -> None:
        for value in record.result_values:
            self._by_result[(record.account, record.provider, value)] = record.operation_id

    async def save(self, record: OperationRecord) -> bool:
        current = self._records.get(record.operation_id)
        if current is None or current.version != record.version:
            return False
        self._records[record.operation_id] = record.evolve(version=record.version + 1)
        self._index(record)
        self._owe(record)
        return True

    def _owe(self, record: OperationRecord) -> None:
        operation_id = record.operation_id
        if owes(record) and operation_id not in self._sent:
            self._owed.setdefault(operation_id, record.ended_at or 0.0)

    async def owed_completions(self, limit: int) -> Ids:
        return sorted(self._owed, key=lambda i: (self._owed[i], i))[:limit]

    async def completion_owed(self, operation_id: str) -> bool:
        return operation_id in self._owed

    async def completion_sent(self, operation_id: str) -> None:
        if self._owed.pop(operation_id, None) is not None:
            self._sent.add(operation_id)

    async def list(self, where: OperationFilter) -> list[OperationRecord]:
        found = [r for r in self._records.values() if matches(r, where)]
        return sorted(found, key=listed_at, reverse=True)[: where.limit]

    async def purge(self, provider: str, ended_before: float, now: float) -> int:
        gone = [
            r
            for r in self._records.values()
            if purgeable(r, provider, ended_before) and r.operation_id not in self._owed
        ]
        for record in gone[:PURGE_BATCH]:
            del self._records[record.operation_id]
            self._owed.pop(record.operation_id, None)
            self._sent.discard(record.operation_id)
            self._by_job.pop((record.account, record.provider, record.provider_job_id), None)
            for value in record.result_values:
                indexed = (record.account, record.provider, value)
                if self._by_result.get(indexed) == record.operation_id:
                    del self._by_result[indexed]
        for key in [k for k, e in self._idempotency.items() if e.expires_at <= now]:
            del self._idempotency[key]
        return min(len(gone), PURGE_BATCH)

    async def overdue(self, provider: str, now: float, limit: int) -> Ids:
        """A scan: memory stores hold what one test makes."""
        late = [r for r in self._records.values() if is_overdue(r, provider, now)]
        return [r.operation_id for r in sorted(late, key=lambda r: r.deadline_at)[:limit]]

    async def open_escalations(self) -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for record in self._records.values():
            if record.outcome is Outcome.ESCALATED and record.escalation is not None:
                pair = (record.provider, record.escalation.reason.value)
                counts[pair] = counts.get(pair, 0) + 1
        return counts

    async def active_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for record in self._records.values():
            if record.outcome is Outcome.PENDING:
                counts[record.provider] = counts.get(record.provider, 0) + 1
        return counts

    async def claim_idempotency(
        self, entry: IdempotencyEntry, now: float
    ) -> IdempotencyEntry | None:
        current = self._idempotency.get(entry.key)
        if current is not None and current.expires_at > now:
            return None if current == entry else current  # equal: this same claim again
        self._idempotency[entry.key] = entry
        return None

    async def put_idempotency(self, entry: IdempotencyEntry) -> None:
        self._idempotency[entry.key] = entry

    async def drop_idempotency(self, key: str) -> None:
        self._idempotency.pop(key, None)

    # -- agent keys and quotas ------------------------------------------------------------
    async def put_key(self, key: AgentKey) -> None:
        self._keys[key.id] = key
        self._key_ids[key.token_sha256] = key.id

    async def key_for(self, token_sha256: str) -> AgentKey | None:
        key_id = self._key_ids.get(token_sha256)
        return None if key_id is None else self._keys.get(key_id)

    async def agent_keys(self) -> builtins.list[AgentKey]:
        return sorted(self._keys.values(), key=lambda k: (k.created_at, k.id))

    async def drop_key(self, key_id: str) -> AgentKey | None:
        key = self._keys.pop(key_id, None)
        if key is not None:
            self._key_ids.pop(key.token_sha256, None)
            if all(other.holder != key.holder for other in self._keys.values()):
                self._active.pop(key.holder, None)
                self._submits.pop(key.holder, None)
        return key

    async def claim_quota(
        self, holder: str, operation_id: str, quotas: Quotas, now: float, hold: float
    ) -> float:
        active = self._active.setdefault(holder, {})
        for held, at in tuple(active.items()):
            record = self._records.get(held)
            ended = record is not None and record.outcome is not Outcome.PENDING
            if ended or (record is None and at <= now - hold):
                del active[held]
        submits = self._submits.setdefault(holder, {})
        for held, at in tuple(submits.items()):
            if at <= now - HOUR:
                del submits[held]
        wait = quota_wait(quotas, len(active), submits.values(), now)
        if wait == 0:
            if quotas.max_active_operations is not None:
                active[operation_id] = now
            if quotas.submits_per_hour is not None:
                submits[operation_id] = now
        return wait

    async def release_quota(self, holder: str, operation_id: str) -> None:
        self._active.get(holder, {}).pop(operation_id, None)

    async def ping(self) -> None:
        return None
