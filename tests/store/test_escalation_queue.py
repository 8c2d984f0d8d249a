"""The console's escalation queue reads an index, not every escalated record (issue 22)."""

from __future__ import annotations

import time
from pathlib import Path

import redis as sync_redis

from gateway.core.models import Escalation, OperationRecord, Outcome, Reason
from gateway.flow.runtime import RUNTIME
from gateway.store import store_from_url
from gateway.store.redis.store import RedisStore

from conftest import OPERATOR_TOKEN, Harness, pending_record

OPS = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


def escalated(n: int, started: float, at: float) -> OperationRecord:
    escalation = Escalation(Reason.UNKNOWN_STATE, at, "d", ("abandon",))
    return pending_record(
        operation_id=f"op_{n:06d}", provider_job_id=f"job_{n}", started_at=started
    ).evolve(outcome=Outcome.ESCALATED, escalation=escalation, ended_at=at)


async def test_the_oldest_escalation_heads_the_queue_behind_ten_thousand_newer_ones(
    make_harness: object, tmp_path: Path
) -> None:
    """With 10,050 open escalations, the one escalated first (on the operation started
    first) heads GET /admin/escalations and the total counts them all: the queue is not
    cut at the 10,000 most recently started operations."""
    harness: Harness = await make_harness(store_url=f"sqlite:///{tmp_path / 'q.db'}")  # type: ignore[operator]
    store = harness.client.app[RUNTIME].store
    now = time.time()
    for n in range(10_050):
        await store.create(escalated(n, started=now - 100_000 + n, at=now - 50_000 + n))
    started = time.perf_counter()
    answer = await harness.client.get("/admin/escalations?limit=3", headers=OPS)
    took = time.perf_counter() - started
    body = await answer.json()
    assert answer.status == 200, body
    assert [e["operation_id"] for e in body["escalations"]] == [
        "op_000000",
        "op_000001",
        "op_000002",
    ]
    assert body["total"] == 10_050
    assert took < 0.25, took  # three records read, not ten thousand


async def test_redis_escalations_from_before_the_queue_index_are_found(redis_url: str) -> None:
    """Escalations stored before the queue sets existed (an upgrade: only the open hash)
    are added to the queue the first time it is read."""
    store = store_from_url(redis_url)
    assert isinstance(store, RedisStore)
    await store.open()
    try:
        now = time.time()
        for n in range(3):
            await store.create(escalated(n, started=now - n, at=now - 10 * n))
        client = sync_redis.Redis.from_url(redis_url.partition("?")[0])
        try:
            client.delete(store.keys.indexes("demo-jobs", "")[4])  # as an older version left it
        finally:
            client.close()
        waiting, total = await store.escalation_queue(2)
        assert [r.operation_id for r in waiting] == ["op_000002", "op_000001"] and total == 3
    finally:
        await store.close()
