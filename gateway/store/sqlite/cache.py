"""The SQLite store's record cache: the records this process wrote or read, bounded in bytes.

Authoritative, not a guess: one process owns a SQLite file and every write passes through
``wrote`` on the event loop, in the same step as its statement, so what is cached is the
newest version there is (this turn's uncommitted writes included, which the writer
connection also sees). A turn rolled back calls ``gone`` for what it wrote.
"""

from __future__ import annotations

from collections import OrderedDict

from gateway.core.models import OperationRecord
from gateway.settings.config import DEFAULT_CACHE_BYTES

RECORD_OVERHEAD = 1024  # bytes a cached record and its index entries cost, body aside (measured)
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
    """Records by operation id and by provider job, least recently used out first once
    ``limit`` bytes are held; a record larger than ``limit`` is not kept."""

    def __init__(self, limit: int = DEFAULT_CACHE_BYTES) -> None:
        self.limit = limit
        self.size = 0
        self.records: OrderedDict[str, tuple[OperationRecord, int]] = OrderedDict()
        self.jobs: dict[Job, str] = {}

    def get(self, operation_id: str) -> OperationRecord | None:
        entry = self.records.get(operation_id)
        if entry is None:
            return None
        self.records.move_to_end(operation_id)
        return entry[0]

    def find(self, account: str, provider: str, job_id: str) -> OperationRecord | None:
        operation_id = self.jobs.get((account, provider, job_id))
        return None if operation_id is None else self.get(operation_id)

    def wrote(self, record: OperationRecord) -> None:
        """``record`` was written or read from the file: it is the newest version there is."""
        self.gone(record.operation_id)
        cost = footprint(record)
        if cost > self.limit:
            return
        self.records[record.operation_id] = (record, cost)
        self.jobs[_job(record)] = record.operation_id
        self.size += cost
        while self.size > self.limit:
            self.gone(next(iter(self.records)))

    def gone(self, operation_id: str) -> None:
        """The record was deleted, or its write rolled back: the file says what it is."""
        entry = self.records.pop(operation_id, None)
        if entry is not None:
            self.size -= entry[1]
            self.jobs.pop(_job(entry[0]), None)
