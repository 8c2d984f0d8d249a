"""One contract for every store: memory and SQLite pass the same tests, races included."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.errors import StoreError
from gateway.models import (
    DelaySource,
    IdempotencyEntry,
    IdemState,
    OperationFilter,
    OperationRecord,
    Outcome,
    StoredResponse,
)
from gateway.store import Store, store_from_url

NOW = 1_800_000_000.0


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    url = {"memory": "memory://", "sqlite": f"sqlite:///{tmp_path}/contract.db"}[request.param]
    the_store = store_from_url(url)
    yield the_store
    await the_store.close()


def record(op: str = "op_1", job: str = "job_1", account: str = "team-a") -> OperationRecord:
    return OperationRecord(
        operation_id=op,
        provider="demo-jobs",
        account=account,
        provider_job_id=job,
        request_fingerprint="fp",
        idempotency_key=None,
        started_at=NOW,
        deadline_at=NOW + 600,
        max_status_requests=12,
        max_transport_failures=3,
        max_rate_limited=3,
        next_poll_at=NOW + 1,
        delay_source=DelaySource.LOCAL_BACKOFF,
        credential_fingerprint="c",
        policy_fingerprint="p",
    )


def idem(key: str = "k", fingerprint: str = "f", expires_at: float = NOW + 60) -> IdempotencyEntry:
    return IdempotencyEntry(key, fingerprint, IdemState.IN_FLIGHT, NOW, expires_at)


async def test_create_get_find(store: Store) -> None:
    """A created record is found by id and by (account, provider, job id), unchanged."""
    created = await store.create(record())
    assert await store.get("op_1") == created
    assert await store.find("team-a", "demo-jobs", "job_1") == created
    assert await store.find("team-b", "demo-jobs", "job_1") is None
    assert await store.get("op_2") is None


async def test_create_twice_for_one_job_returns_the_first(store: Store) -> None:
    first = await store.create(record("op_1"))
    again = await store.create(record("op_2"))
    assert again == first
    assert await store.get("op_2") is None


async def test_create_stores_the_idempotency_entry_with_the_record(store: Store) -> None:
    entry = idem()
    await store.create(record(), entry)
    assert await store.claim_idempotency(idem(fingerprint="other"), NOW) == entry


async def test_save_is_compare_and_set_on_version(store: Store) -> None:
    """A writer holding an old version loses; the winner's version is one higher."""
    base = await store.create(record())
    assert await store.save(base.evolve(status_requests_used=1))
    stored = await store.get("op_1")
    assert stored is not None and stored.version == base.version + 1
    assert not await store.save(base.evolve(status_requests_used=99))
    stored = await store.get("op_1")
    assert stored is not None and stored.status_requests_used == 1


async def test_records_round_trip_every_field(store: Store) -> None:
    from gateway.models import Escalation, FinalResponse, Reason

    full = record().evolve(
        outcome=Outcome.ESCALATED,
        final_response=FinalResponse(200, "application/json", b'{"a": "\\u00e9"}\xff'),
        escalation=Escalation(Reason.UNKNOWN_STATE, NOW, "d", ("resume", "abandon")),
        last_known_state="running",
        last_http_status=200,
        last_polled_at=NOW + 3,
    )
    await store.create(full)
    assert await store.get("op_1") == full


async def test_mutate_applies_a_pure_change(store: Store) -> None:
    await store.create(record())
    result = await store.mutate(
        "op_1", lambda r: (r.evolve(early_refusals=r.early_refusals + 2), "x")
    )
    assert result == "x"
    assert (await store.get("op_1")).early_refusals == 2  # type: ignore[union-attr]
    assert await store.mutate("op_1", lambda r: (None, r.version)) == 2


async def test_concurrent_mutations_lose_no_update(store: Store) -> None:
    """Fifty concurrent read-modify-writes all land: none overwrites another."""
    await store.create(record())

    async def bump() -> None:
        await store.mutate(
            "op_1", lambda r: (r.evolve(status_requests_used=r.status_requests_used + 1), None)
        )

    await asyncio.gather(*(bump() for _ in range(50)))
    stored = await store.get("op_1")
    assert stored is not None
    assert stored.status_requests_used == 50
    assert stored.version == 51


async def test_concurrent_cas_has_one_winner(store: Store) -> None:
    base = await store.create(record())
    results = await asyncio.gather(*(store.save(base.evolve(early_refusals=i)) for i in range(20)))
    assert results.count(True) == 1


async def test_mutate_unknown_operation_is_a_store_error(store: Store) -> None:
    with pytest.raises(StoreError):
        await store.mutate("op_missing", lambda r: (None, None))


async def test_list_filters(store: Store) -> None:
    await store.create(record("op_1", "j1"))
    await store.create(record("op_2", "j2", account="team-b").evolve(outcome=Outcome.SUCCEEDED))
    assert {r.operation_id for r in await store.list(OperationFilter())} == {"op_1", "op_2"}
    assert [r.operation_id for r in await store.list(OperationFilter(account="team-b"))] == ["op_2"]
    pending = await store.list(OperationFilter(outcome=Outcome.PENDING))
    assert [r.operation_id for r in pending] == ["op_1"]
    assert await store.list(OperationFilter(provider="other")) == []


async def test_idempotency_first_writer_wins_until_expiry(store: Store) -> None:
    assert await store.claim_idempotency(idem(fingerprint="a"), NOW) is None
    seen = await store.claim_idempotency(idem(fingerprint="b"), NOW)
    assert seen is not None and seen.fingerprint == "a"
    assert (
        await store.claim_idempotency(idem(fingerprint="c", expires_at=NOW + 200), NOW + 61) is None
    )


async def test_idempotency_claim_race_has_one_winner(store: Store) -> None:
    results = await asyncio.gather(
        *(store.claim_idempotency(idem(fingerprint=str(i)), NOW) for i in range(20))
    )
    assert results.count(None) == 1


async def test_idempotency_put_and_drop(store: Store) -> None:
    await store.claim_idempotency(idem(), NOW)
    done = IdempotencyEntry(
        "k",
        "f",
        IdemState.COMPLETED,
        NOW,
        NOW + 60,
        "op_1",
        StoredResponse(202, (("Location", "/x"),), b"{}"),
    )
    await store.put_idempotency(done)
    assert await store.claim_idempotency(idem(), NOW) == done
    await store.drop_idempotency("k")
    assert await store.claim_idempotency(idem(), NOW) is None


async def test_leases_are_exclusive_until_expiry_and_released_by_owner_only(store: Store) -> None:
    assert await store.acquire_lease("poll:op_1", "t1", NOW, 10)
    assert not await store.acquire_lease("poll:op_1", "t2", NOW + 5, 10)
    await store.release_lease("poll:op_1", "t2")
    assert not await store.acquire_lease("poll:op_1", "t2", NOW + 5, 10)
    assert await store.acquire_lease("poll:op_1", "t2", NOW + 10, 10)
    await store.release_lease("poll:op_1", "t2")
    assert await store.acquire_lease("poll:op_1", "t3", NOW + 11, 10)


async def test_ping(store: Store) -> None:
    await store.ping()


async def test_sqlite_survives_reopen(tmp_path: Path) -> None:
    """Records written by one SQLite store are read by the next one on the same file."""
    url = f"sqlite:///{tmp_path}/reopen.db"
    first = store_from_url(url)
    created = await first.create(record())
    await first.save(created.evolve(status_requests_used=4))
    await first.close()
    second = store_from_url(url)
    stored = await second.get("op_1")
    await second.close()
    assert stored is not None and stored.status_requests_used == 4


async def test_closed_sqlite_store_raises_store_error(tmp_path: Path) -> None:
    closed = store_from_url(f"sqlite:///{tmp_path}/closed.db")
    await closed.ping()
    await closed.close()
    with pytest.raises(StoreError):
        await closed.get("op_1")


def test_unknown_scheme_is_a_clear_error() -> None:
    from gateway.errors import ConfigError

    with pytest.raises(ConfigError, match="scheme 'postgres' is not supported"):
        store_from_url("postgres://x")
