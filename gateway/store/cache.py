"""The SQLite store's record cache: records this process wrote or read, bounded in bytes,
so most reads never reach the reader thread. Sound only because one process owns a SQLite
file (every write passes through ``wrote``)."""

from __future__ import annotations

from collections import OrderedDict

from gateway.core.models import OperationRecord
from gateway.settings.config import DEFAULT_CACHE_BYTES

RECORD_OVERHEAD = 1024  # bytes a cached record and its index entries cost, body aside (measured)
RECENT_WRITES = 4096  # writes remembered so a read that raced one is not cached
Job = tuple[str, str, str]


def footprint(record: OperationRecord) -> int:
    """What caching ``record`` costs, in bytes: its final body, the last answer kept to
    replay, and a fixed overhead."""
    final, last = record.final_response, record.last_answer
    kept = (len(final.body) if final is not None else 0) + (len(last.body) if last else 0)
    return RECORD_OVERHEAD + kept


def _job(record: OperationRecord) -> Job:
    return record.account, record.provider, record.provider_job_id


class Cache:
    """Records this process wrote or read, so reads skip the reader thread.

    Sound because one gateway process owns a SQLite file: every write passes through
    ``wrote``. A record read from disk is kept only if no write to it came while it was read
    (``read``), so a slow read never brings back an older version. Bounded in bytes: past
    ``limit`` the least recently used records go; a record larger than ``limit`` is not kept.
    """

    def __init__(self, limit: int = DEFAULT_CACHE_BYTES) -> None:
        self.limit = limit
        self.size = 0
        self.records: OrderedDict[str, tuple[OperationRecord, int]] = OrderedDict()
        self.jobs: dict[Job, str] = {}
        self.writes = 0
        self._written: OrderedDict[str, int] = OrderedDict()  # operation id -> write number

    def get(self, operation_id: str) -> OperationRecord | None:
        entry = self.records.get(operation_id)
        if entry is None:
            return None
        self.records.move_to_end(operation_id)
        return entry[0]

    def peek(self, operation_id: str) -> OperationRecord | None:
        """``get`` without touching the recency order (safe from the writer thread)."""
        entry = self.records.get(operation_id)
        return None if entry is None else entry[0]

    def find(self, account: str, provider: str, job_id: str) -> OperationRecord | None:
        operation_id = self.jobs.get((account, provider, job_id))
        return None if operation_id is None else self.get(operation_id)

    def wrote(self, record: OperationRecord) -> None:
        """A committed write: ``record`` is the newest version there is."""
        self.gone(record.operation_id)
        self._keep(record)

    def gone(self, operation_id: str) -> None:
        """A committed write changed or deleted the record: what is cached is stale."""
        self.writes += 1
        self._written[operation_id] = self.writes
        self._written.move_to_end(operation_id)
        if len(self._written) > RECENT_WRITES:
            self._written.popitem(last=False)
        self.drop(operation_id)

    def read(self, record: OperationRecord, since: int) -> None:
        """``record`` came from a read begun when ``writes`` was ``since``."""
        if self.writes - since >= RECENT_WRITES:
            return  # too many writes meanwhile to tell whether one was to this record
        if self._written.get(record.operation_id, 0) > since:
            return  # written since the read began: what was read may be older
        self.drop(record.operation_id)
        self._keep(record)

    def drop(self, operation_id: str) -> None:
        entry = self.records.pop(operation_id, None)
        if entry is not None:
            self.size -= entry[1]
            self.jobs.pop(_job(entry[0]), None)

    def _keep(self, record: OperationRecord) -> None:
        cost = footprint(record)
        if cost > self.limit:
            return
        self.records[record.operation_id] = (record, cost)
        self.jobs[_job(record)] = record.operation_id
        self.size += cost
        while self.size > self.limit:
            self.drop(next(iter(self.records)))
