"""One contract for every store: memory, SQLite, Redis and PostgreSQL pass the same tests, races
included.

Times are real (now, and a fraction of a second later): a Redis store keeps time by Redis's
clock, not by an argument, so expiry tests sleep briefly instead of moving a fake clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest

from gateway import ConfigError, StoreError
from gateway.core.keys import ACTIVE_RETRY, AgentKey
from gateway.core.models import (
    Escalation,
    FinalResponse,
    IdempotencyEntry,
    IdemState,
    KeptResult,
    LastAnswer,
    OperationFilter,
    OperationRecord,
    Outcome,
    Reason,
    StoredResponse,
)
from gateway.settings.config import MAX_QUOTA, Quotas
from gateway.store import Store, store_from_url

from conftest import pending_record

EXPIRY = 0.2  # seconds, for lease and idempotency expiry


def record(op: str = "op_1", job: str = "job_1", account: str = "team-a") -> OperationRecord:
    """A pending record whose next poll is due now."""
    return pending_record(operation_id=op, provider_job_id=job, account=account)


def idem(key: str = "k", fingerprint: str = "f", ttl: float = 60) -> IdempotencyEntry:
    now = time.time()
    return IdempotencyEntry(key, fingerprint, IdemState.IN_FLIGHT, now, now + ttl)


async def test_a_claim_sent_again_is_still_its_own(store: Store) -> None:
    """A claim sent again (a driver resending after a broken connection) finds its own
    entry and is claimed, not "in use"; another request's claim of the key, with its own
    token, gets the entry."""
    entry = dataclasses.replace(idem(), claim="first")
    assert await store.claim_idempotency(entry, time.time()) is None
    assert await store.claim_idempotency(entry, time.time()) is None
    other = dataclasses.replace(entry, claim="second")
    assert await store.claim_idempotency(other, time.time()) == entry


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
    assert await store.claim_idempotency(idem(fingerprint="other"), time.time()) == entry


async def test_save_is_compare_and_set_on_version(store: Store) -> None:
    """A writer holding an old version loses; the winner's version is one higher."""
    base = await store.create(record())
    assert await store.save(base.evolve(status_requests_used=1))
    stored = await store.get("op_1")
    assert stored is not None and stored.version == base.version + 1
    assert not await store.save(base.evolve(early_refusals=99))
    stored = await store.get("op_1")
    assert stored is not None and stored.status_requests_used == 1
    assert stored.early_refusals == 0


async def test_records_round_trip_every_field(store: Store) -> None:
    now = time.time()
    full = record().evolve(
        outcome=Outcome.ESCALATED,
        final_response=FinalResponse(200, "application/json", b'{"a": "\\u00e9"}\xff'),
        escalation=Escalation(Reason.UNKNOWN_STATE, now, "d", ("resume", "abandon")),
        last_known_state="running",
        last_http_status=200,
        last_polled_at=now + 3.25,
        extended_seconds=60.0,
        extended_requests=2,
        last_answer=LastAnswer(200, "application/json", b'{"s": "\\u00e9"}\xff', now + 1.5),
        result_values=("file-1", "42"),
        route_values=(("app", "fast-sdxl"), ("owner", "fal-ai")),
        kept_result=KeptResult("00001234567-op_1", 12, "ab" * 32, "text/plain", now, now + 9.5),
        copy_attempts=2,
        next_copy_at=now + 10.25,
    )
    await store.create(full)
    assert await store.get("op_1") == full


async def test_a_kept_result_is_recorded_once_and_round_trips(store: Store) -> None:
    """SPEC 23: the kept copy's name, size, sha256 and content type survive every backend
    (written by a mutation, as the gateway records a copy); a second copy recorded after
    it changes nothing, however the two race."""
    from gateway.core.results import record_copy

    now = time.time()
    await store.create(record().evolve(outcome=Outcome.SUCCEEDED, ended_at=now))
    copies = [
        KeptResult(f"name-{i}", 1000 + i, f"{i:064x}", "application/jsonl", now, now + 60)
        for i in range(5)
    ]
    stored = await asyncio.gather(
        *(store.mutate("op_1", lambda r, c=c: record_copy(r, c)) for c in copies)
    )
    winner = stored[0].kept_result
    assert winner in copies and all(s.kept_result == winner for s in stored)
    again = await store.get("op_1")
    assert again is not None and again.kept_result == winner
    too_large = KeptResult("", 9000, "", "text/plain", now, now + 60)
    await store.create(record("op_2", "job_2").evolve(kept_result=too_large))
    found = await store.get("op_2")
    assert found is not None and found.kept_result == too_large and not too_large.kept


async def test_the_gateways_copy_tries_are_counted_once_each_across_replicas(
    store: Store, tmp_path: Path
) -> None:
    """SPEC 23 (docs/results.md): a copy try counts a result fetch and a try in one
    mutation, and a failed try its backoff; tries racing on every backend stop at
    COPY_TRIES, each counted once, and the record keeps them."""
    from gateway.core.results import COPY_TRIES, Refusal, copy_failed, copy_fetch
    from gateway.settings.policy import load_policy

    from conftest import PROVIDER_ENV, ROOT

    source = (ROOT / "policies" / "demo-jobs.yaml").read_text() + "results: {keep: true}\n"
    path = tmp_path / "demo-jobs.yaml"
    path.write_text(source)
    policy = load_policy(path, "demo-jobs.yaml", PROVIDER_ENV)
    now = time.time()
    await store.create(record().evolve(outcome=Outcome.SUCCEEDED, ended_at=now))
    tried = await asyncio.gather(
        *(store.mutate("op_1", lambda r: copy_fetch(policy, r, now)) for _ in range(5))
    )
    assert sum(1 for t in tried if isinstance(t, Refusal)) == 5 - COPY_TRIES
    await store.mutate("op_1", lambda r: copy_failed(r, now))
    again = await store.get("op_1")
    assert again is not None and again.copy_attempts == again.result_fetches == COPY_TRIES
    assert again.next_copy_at == now + 20.0


async def test_mutate_applies_a_pure_change(store: Store) -> None:
    await store.create(record())
    bump = await store.mutate("op_1", lambda r: (r.evolve(early_refusals=2), "x"))
    assert bump == "x"
    assert (await store.get("op_1")).early_refusals == 2  # type: ignore[union-attr]
    assert await store.mutate("op_1", lambda r: (None, r.version)) == 2


async def test_concurrent_mutations_lose_no_update(store: Store) -> None:
    """Fifty concurrent read-modify-writes all land: none overwrites another."""
    await store.create(record())

    async def bump() -> None:
        await store.mutate("op_1", lambda r: (r.evolve(early_refusals=r.early_refusals + 1), None))

    await asyncio.gather(*(bump() for _ in range(50)))
    stored = await store.get("op_1")
    assert stored is not None
    assert stored.early_refusals == 50
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
    assert len(await store.list(OperationFilter(limit=1))) == 1


async def test_idempotency_first_writer_wins_until_expiry(store: Store) -> None:
    assert await store.claim_idempotency(idem(fingerprint="a", ttl=EXPIRY), time.time()) is None
    seen = await store.claim_idempotency(idem(fingerprint="b"), time.time())
    assert seen is not None and seen.fingerprint == "a"
    await asyncio.sleep(EXPIRY + 0.05)
    assert await store.claim_idempotency(idem(fingerprint="c"), time.time()) is None


async def test_idempotency_claim_race_has_one_winner(store: Store) -> None:
    now = time.time()
    results = await asyncio.gather(
        *(store.claim_idempotency(idem(fingerprint=str(i)), now) for i in range(20))
    )
    assert results.count(None) == 1


async def test_idempotency_put_and_drop(store: Store) -> None:
    now = time.time()
    await store.claim_idempotency(idem(), now)
    response = StoredResponse(202, (("Location", "/x"),), b"{}")
    done = IdempotencyEntry("k", "f", IdemState.COMPLETED, now, now + 60, "op_1", response)
    await store.put_idempotency(done)
    assert await store.claim_idempotency(idem(), now) == done
    await store.drop_idempotency("k")
    assert await store.claim_idempotency(idem(), now) is None


async def test_leases_are_exclusive_until_expiry_and_released_by_owner_only(store: Store) -> None:
    assert await store.acquire_lease("poll:op_1", "t1", time.time(), EXPIRY)
    assert not await store.acquire_lease("poll:op_1", "t2", time.time(), EXPIRY)
    await store.release_lease("poll:op_1", "t2")
    assert not await store.acquire_lease("poll:op_1", "t2", time.time(), EXPIRY)
    await asyncio.sleep(EXPIRY + 0.05)
    assert await store.acquire_lease("poll:op_1", "t2", time.time(), 10)
    await store.release_lease("poll:op_1", "t2")
    assert await store.acquire_lease("poll:op_1", "t3", time.time(), 10)


async def test_lease_race_has_one_winner(store: Store) -> None:
    now = time.time()
    won = await asyncio.gather(*(store.acquire_lease("l", f"t{i}", now, 5) for i in range(20)))
    assert won.count(True) == 1


async def test_a_push_delivery_is_claimed_once_within_its_window(store: Store) -> None:
    """SPEC 23's replay window: of 20 concurrent claims of one delivery one wins; a released
    claim (a push that could not be handled) can be claimed again, and so can one whose
    window passed; another delivery is its own."""
    now = time.time()
    claims = await asyncio.gather(*(store.claim_delivery("p:msg_1", now, 5) for _ in range(20)))
    won = [c for c in claims if c is not None]
    assert len(won) == 1
    assert await store.claim_delivery("p:msg_2", now, 5) is not None
    await store.release_delivery("p:msg_1", won[0])
    again = await store.claim_delivery("p:msg_1", time.time(), EXPIRY)
    assert again is not None
    assert await store.claim_delivery("p:msg_1", time.time(), EXPIRY) is None
    await asyncio.sleep(EXPIRY + 0.05)
    assert await store.claim_delivery("p:msg_1", time.time(), 5) is not None


async def test_ping_and_active_counts(store: Store) -> None:
    await store.ping()
    await store.create(record("op_1", "j1"))
    done = await store.create(record("op_2", "j2"))
    await store.create(record("op_3", "j3").evolve(provider="other"))
    assert await store.active_counts() == {"demo-jobs": 2, "other": 1}
    await store.save(done.evolve(outcome=Outcome.SUCCEEDED))
    assert (await store.active_counts())["demo-jobs"] == 1


async def test_clock_is_close_to_real_time(store: Store) -> None:
    assert abs(store.clock() - time.time()) < 1.0


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


def test_unknown_scheme_and_bad_options_are_clear_errors() -> None:
    with pytest.raises(ConfigError, match="scheme 'mysql' is not supported"):
        store_from_url("mysql://x")
    with pytest.raises(ConfigError, match="unknown option"):
        store_from_url("redis://127.0.0.1:6379/0?prefx=a")
    with pytest.raises(ConfigError, match="prefix"):
        store_from_url("redis://127.0.0.1:6379/0?prefix={x}")


async def test_purge_deletes_what_stopped_waiting_before_the_cutoff(store: Store) -> None:
    now = time.time()
    await store.create(record("op_old", "j1").evolve(outcome=Outcome.SUCCEEDED, ended_at=now - 100))
    await store.create(record("op_new", "j2").evolve(outcome=Outcome.FAILED, ended_at=now - 1))
    await store.create(record("op_wait", "j3"))
    await store.create(
        record("op_other", "j4").evolve(provider="other", outcome=Outcome.SUCCEEDED, ended_at=0)
    )
    await store.claim_idempotency(idem("gone", ttl=-1), now)
    assert await store.purge("demo-jobs", now - 10, now) == 1
    assert await store.get("op_old") is None
    assert await store.find("team-a", "demo-jobs", "j1") is None
    for kept in ("op_new", "op_wait", "op_other"):
        assert await store.get(kept) is not None
    assert await store.claim_idempotency(idem("gone"), now) is None  # the expired key went


async def test_open_escalations_follow_every_write_and_purge(store: Store) -> None:
    """The escalations waiting on a person, per provider and reason, as the store holds
    them: counted when escalated, uncounted when resumed or purged."""
    now = time.time()
    for i, reason in enumerate([Reason.UNKNOWN_STATE, Reason.UNKNOWN_STATE, Reason.RATE_LIMITED]):
        created = await store.create(record(f"op_{i}", f"job_{i}"))
        escalation = Escalation(reason, now, "d", ("abandon",))
        escalated = created.evolve(outcome=Outcome.ESCALATED, escalation=escalation, ended_at=now)
        assert await store.save(escalated)
    assert await store.open_escalations() == {
        ("demo-jobs", "unknown_state"): 2,
        ("demo-jobs", "rate_limited"): 1,
    }
    stored = await store.get("op_0")
    assert stored is not None
    resumed = stored.evolve(outcome=Outcome.PENDING, escalation=None, ended_at=None)
    assert await store.save(resumed)
    assert await store.open_escalations() == {
        ("demo-jobs", "unknown_state"): 1,
        ("demo-jobs", "rate_limited"): 1,
    }
    assert await store.purge("demo-jobs", now + 1, now) == 2
    assert await store.open_escalations() == {}


async def test_the_escalation_queue_is_oldest_escalation_first_from_an_index(store: Store) -> None:
    """``escalation_queue(limit)`` gives the open escalations waiting longest, by escalation
    time (not start time), ties by id, and the number open; resumed and purged ones leave."""
    now = time.time()
    escalated_at = {"op_a": now - 5, "op_b": now - 50, "op_c": now - 20, "op_d": now - 50}
    for n, (op, at) in enumerate(escalated_at.items()):
        created = await store.create(record(op, f"job_{n}").evolve(started_at=now - n))
        escalation = Escalation(Reason.UNKNOWN_STATE, at, "d", ("abandon",))
        escalated = created.evolve(outcome=Outcome.ESCALATED, escalation=escalation, ended_at=at)
        assert await store.save(escalated)
    await store.create(record("op_e", "job_e"))  # pending: never in the queue
    waiting, total = await store.escalation_queue(3)
    assert [r.operation_id for r in waiting] == ["op_b", "op_d", "op_c"] and total == 4
    stored = await store.get("op_b")
    assert stored is not None
    assert await store.save(stored.evolve(outcome=Outcome.PENDING, escalation=None, ended_at=None))
    waiting, total = await store.escalation_queue(10)
    assert [r.operation_id for r in waiting] == ["op_d", "op_c", "op_a"] and total == 3
    assert await store.purge("demo-jobs", now + 1, now) == 3
    assert await store.escalation_queue(10) == ([], 0)


async def test_list_pages_from_a_position_and_new_operations_never_disturb_paging(
    store: Store,
) -> None:
    """``before`` pages newest first by (started_at, operation_id), ties by id, with filters;
    operations created between pages neither repeat nor shift the pages that follow."""
    t = time.time()
    starts = {"op_a": t, "op_b": t, "op_c": t - 1, "op_d": t - 2, "op_e": t - 2, "op_f": t - 3}
    for n, (op, started) in enumerate(starts.items()):
        made = record(op, f"j{n}").evolve(started_at=started)
        await store.create(made.evolve(outcome=Outcome.SUCCEEDED) if op == "op_c" else made)
    expected = ["op_b", "op_a", "op_c", "op_e", "op_d", "op_f"]
    assert [r.operation_id for r in await store.list(OperationFilter())] == expected
    seen: list[str] = []
    before = None
    while True:
        page = await store.list(OperationFilter(limit=2, before=before))
        if not page:
            break
        seen += [r.operation_id for r in page]
        before = (page[-1].started_at, page[-1].operation_id)
        await store.create(record(f"op_new{len(seen)}", f"new{len(seen)}"))  # newer than all
    assert seen == expected
    pending = OperationFilter(outcome=Outcome.PENDING, before=(t - 1, "op_c"), limit=10)
    assert [r.operation_id for r in await store.list(pending)] == ["op_e", "op_d", "op_f"]
    assert await store.list(OperationFilter(before=(t - 3, "op_f"))) == []


async def test_start_poll_takes_the_lease_and_a_place_in_the_pacing_window(store: Store) -> None:
    """One step (one round trip on Redis): the lease is exclusive, the window counts the
    call, a full window says how long to wait (the lease is still taken)."""
    now = time.time()
    assert await store.start_poll("poll:a", "t1", now, 5.0, "prov-a", 1.0) == 0
    assert await store.start_poll("poll:a", "t2", now, 5.0, "prov-a", 1.0) is None
    wait = await store.start_poll("poll:b", "t3", now, 5.0, "prov-a", 1.0)
    assert wait is not None and 0 < wait <= 1.1
    assert not await store.acquire_lease("poll:b", "t4", now, 5.0)  # taken although paced
    await store.release_lease("poll:a", "t1")
    assert await store.start_poll("poll:a", "t5", now, 5.0, "prov-b", None) == 0


async def test_tightening_pauses_the_provider_in_start_poll_and_pace(store: Store) -> None:
    """A provider's 429 pause (rate 0 until a moment) is seen by every later call."""
    now = store.clock()
    await store.tighten("prov-c", 0.0, now + 30)
    wait = await store.start_poll("poll:c", "t1", now, 5.0, "prov-c", None)
    assert wait is not None and 25 < wait <= 30.5
    assert 25 < await store.pace("prov-c", 10.0, now) <= 30.5
    assert await store.pace("prov-other", 10.0, now) == 0


async def test_a_pause_kept_longer_than_the_cap_is_bounded(store: Store) -> None:
    """``bound_pause`` ends a tightening kept past an instant at that instant (a month-long
    pause stored before pauses were bounded), and leaves shorter ones as they are."""
    now = store.clock()
    await store.tighten("prov-m", 0.0, now + 2_505_600)
    await store.tighten("prov-s", 0.0, now + 10)
    await store.bound_pause("prov-m", now + 30)
    await store.bound_pause("prov-s", now + 30)
    await store.bound_pause("prov-none", now + 30)
    assert 25 < await store.pace("prov-m", None, now) <= 30.5
    assert 5 < await store.pace("prov-s", None, now) <= 10.5
    assert await store.pace("prov-none", None, now) == 0


async def test_finish_poll_writes_and_releases_in_one_step(store: Store) -> None:
    """From the record in hand when it is current, by the usual loop when it is not; the
    lease is released either way."""
    created = await store.create(record())
    assert await store.acquire_lease("poll:op_1", "t1", time.time(), 5.0)

    def bump(current: OperationRecord) -> tuple[OperationRecord, int]:
        return current.evolve(early_refusals=current.early_refusals + 1), current.version

    seen = await store.finish_poll("op_1", bump, known=created, lease="poll:op_1", token="t1")
    assert seen == 1
    assert await store.acquire_lease("poll:op_1", "t2", time.time(), 5.0)
    stale = created  # version 1, the store has 2 now
    seen = await store.finish_poll("op_1", bump, known=stale, lease="poll:op_1", token="t2")
    assert seen == 2
    stored = await store.get("op_1")
    assert stored is not None and stored.early_refusals == 2 and stored.version == 3
    assert await store.acquire_lease("poll:op_1", "t3", time.time(), 5.0)


async def test_start_and_reserve_writes_the_reservation_with_the_lease(store: Store) -> None:
    """One step (one round trip on Redis): the lease, a place in the pacing window and the
    reservation computed from the record in hand; a moved record is not written (the lease
    is still taken, and a store that hands back the stored record hands back the current
    one), a full window writes nothing, a held lease takes nothing."""
    created = await store.create(record())
    now = time.time()
    reserved = created.evolve(status_requests_used=1, last_polled_at=now)
    wait, written, moved = await store.start_and_reserve(
        "poll:op_1", "t1", now, 5.0, "prov-r", 1.0, reserved
    )
    assert (wait, written, moved) == (0, True, None)
    stored = await store.get("op_1")
    assert stored is not None and stored.status_requests_used == 1 and stored.version == 2
    assert await store.start_and_reserve("poll:op_1", "t2", now, 5.0, "prov-r", None, reserved) == (
        None,
        False,
        None,
    )
    await store.release_lease("poll:op_1", "t1")
    stale = created.evolve(early_refusals=3)  # version 1, the store has 2
    wait, written, moved = await store.start_and_reserve(
        "poll:op_1", "t3", now, 5.0, "prov-s", None, stale
    )
    assert (wait, written) == (0, False)
    assert moved is None or moved == stored  # the stored record, version 2
    assert not await store.acquire_lease("poll:op_1", "t4", now, 5.0)  # t3 holds it
    await store.release_lease("poll:op_1", "t3")
    fresh = await store.get("op_1")
    assert fresh is not None
    wait, written, _ = await store.start_and_reserve(
        "poll:op_1", "t5", now, 5.0, "prov-r", 1.0, fresh.evolve(early_refusals=1)
    )
    assert wait is not None and wait > 0 and not written  # prov-r's window is full
    after = await store.get("op_1")
    assert after is not None and after.early_refusals == 0


def succeeded(op: str, job: str, *values: str, account: str = "team-a") -> OperationRecord:
    """A record whose final answer was recorded with these result values."""
    final = FinalResponse(200, "application/json", b"{}")
    return record(op, job, account).evolve(
        outcome=Outcome.SUCCEEDED, final_response=final, ended_at=time.time(), result_values=values
    )


async def test_find_result_finds_an_operation_by_a_value_of_its_final_answer(store: Store) -> None:
    """SPEC 20: a result value is findable once the write that recorded it returned (by
    create, save, mutate or finish_poll), for that account and provider only."""
    await store.create(succeeded("op_1", "j1", "file-1"))
    found = await store.find_result("team-a", "demo-jobs", "file-1")
    assert found is not None and found.operation_id == "op_1"
    assert await store.find_result("team-b", "demo-jobs", "file-1") is None
    assert await store.find_result("team-a", "other", "file-1") is None
    assert await store.find_result("team-a", "demo-jobs", "file-2") is None
    assert await store.find_result("team-a", "demo-jobs", "j1") is None  # a job id is no value

    pending = await store.create(record("op_2", "j2"))
    assert await store.save(succeeded("op_2", "j2", "file-2").evolve(version=pending.version))
    mutated = await store.create(record("op_3", "j3"))
    await store.mutate("op_3", lambda r: (succeeded("op_3", "j3", "file-3", "n-3"), None))
    polled = await store.create(record("op_4", "j4"))
    assert await store.acquire_lease("poll:op_4", "t", time.time(), 5.0)
    await store.finish_poll(
        "op_4",
        lambda r: (succeeded("op_4", "j4", "file-4").evolve(version=r.version), None),
        known=polled,
        lease="poll:op_4",
        token="t",
    )
    for value, operation_id in [
        ("file-2", "op_2"),
        ("file-3", "op_3"),
        ("n-3", "op_3"),
        ("file-4", "op_4"),
    ]:
        found = await store.find_result("team-a", "demo-jobs", value)
        assert found is not None and found.operation_id == operation_id, value
    assert mutated.result_values == ()


async def test_find_result_values_are_per_account(store: Store) -> None:
    """Two accounts whose outputs share a value each find their own operation."""
    await store.create(succeeded("op_a", "ja", "shared", account="team-a"))
    await store.create(succeeded("op_b", "jb", "shared", account="team-b"))
    a = await store.find_result("team-a", "demo-jobs", "shared")
    b = await store.find_result("team-b", "demo-jobs", "shared")
    assert a is not None and a.operation_id == "op_a"
    assert b is not None and b.operation_id == "op_b"


async def test_a_lost_write_indexes_nothing_and_purge_forgets_the_values(store: Store) -> None:
    """A write that lost its compare-and-set makes no value findable; a purged operation's
    values are found no more."""
    created = await store.create(record("op_1", "j1"))
    assert await store.save(created)  # version 2 now
    assert not await store.save(succeeded("op_1", "j1", "file-lost"))  # still version 1
    assert await store.find_result("team-a", "demo-jobs", "file-lost") is None
    now = time.time()
    await store.create(succeeded("op_2", "j2", "file-old").evolve(ended_at=now - 100))
    assert await store.purge("demo-jobs", now - 10, now) == 1
    assert await store.find_result("team-a", "demo-jobs", "file-old") is None


async def test_the_default_find_result_pages_through_list() -> None:
    """The base store's find_result (what a backend without an index of its own gets)
    keeps the same contract, paging past the first page of ``list``."""
    store = store_from_url("memory://")
    await store.create(succeeded("op_first", "j0", "file-first").evolve(started_at=1.0))
    for n in range(150):
        await store.create(record(f"op_{n}", f"j{n + 1}").evolve(started_at=10.0 + n))
    found = await Store.find_result(store, "team-a", "demo-jobs", "file-first")
    assert found is not None and found.operation_id == "op_first"
    assert await Store.find_result(store, "team-b", "demo-jobs", "file-first") is None
    assert await Store.find_result(store, "team-a", "demo-jobs", "file-none") is None


# -- agent keys and quotas (SPEC 25) -------------------------------------------------------


def agent_key(key_id: str = "key_1", digest: str = "a" * 64, at: float = 1.0) -> AgentKey:
    return AgentKey(
        id=key_id,
        account="team-k",
        providers=("demo-jobs",),
        token_sha256=digest,
        created_at=at,
        expires_at=at + 3600,
        quotas=Quotas(max_active_operations=2, submits_per_hour=10),
        created_by="ops",
    )


async def test_agent_keys_are_found_by_digest_listed_and_dropped(store: Store) -> None:
    """A stored key is found by its token's digest, listed oldest first, and once dropped
    is found by neither; dropping an unknown id answers None."""
    first, second = agent_key("key_1", "a" * 64, 1.0), agent_key("key_2", "b" * 64, 2.0)
    await store.put_key(second)
    await store.put_key(first)
    assert await store.key_for("a" * 64) == first
    assert await store.key_for("c" * 64) is None
    assert await store.agent_keys() == [first, second]
    assert await store.drop_key("key_1") == first
    assert await store.key_for("a" * 64) is None
    assert await store.agent_keys() == [second]
    assert await store.drop_key("key_1") is None


async def test_a_quota_counts_active_places_until_the_operation_ends(store: Store) -> None:
    """max_active_operations: places are taken by submissions in flight and pending
    operations; a place comes back when its operation ends or when released; a place with
    no record is free after ``hold``."""
    quotas = Quotas(max_active_operations=2)
    now = time.time()
    assert await store.claim_quota("key:k", "op_1", quotas, now, 60) == 0
    assert await store.claim_quota("key:k", "op_2", quotas, now, 60) == 0
    assert await store.claim_quota("key:k", "op_3", quotas, now, 60) == ACTIVE_RETRY
    assert await store.claim_quota("key:other", "op_3", quotas, now, 60) == 0  # its own
    await store.create(record("op_1", "job_1"))
    assert await store.claim_quota("key:k", "op_3", quotas, now, 60) == ACTIVE_RETRY
    await store.mutate("op_1", lambda r: (r.evolve(outcome=Outcome.SUCCEEDED, ended_at=now), 0))
    assert await store.claim_quota("key:k", "op_3", quotas, now, 60) == 0  # op_1 ended
    await store.release_quota("key:k", "op_3")
    assert await store.claim_quota("key:k", "op_4", quotas, now, 60) == 0
    assert await store.claim_quota("key:k", "op_5", quotas, now, 60) > 0
    later = now + 61  # op_2 and op_4 never got a record: in flight for too long
    assert await store.claim_quota("key:k", "op_5", quotas, later, 60) == 0


async def test_a_quota_counts_submits_in_a_sliding_hour(store: Store) -> None:
    """submits_per_hour: the wait is until the oldest counted submission is an hour old;
    a release gives back no submission (it was forwarded)."""
    quotas = Quotas(submits_per_hour=2)
    now = time.time()
    assert await store.claim_quota("account:a", "op_1", quotas, now, 60) == 0
    assert await store.claim_quota("account:a", "op_2", quotas, now + 10, 60) == 0
    await store.release_quota("account:a", "op_2")
    wait = await store.claim_quota("account:a", "op_3", quotas, now + 20, 60)
    assert wait == pytest.approx(3600 - 20, abs=0.01)
    assert await store.claim_quota("account:a", "op_3", quotas, now + 3601, 60) == 0


async def test_the_largest_quotas_a_key_may_have_are_counted(store: Store) -> None:
    """A quota as large as the settings accept is counted by every backend (PostgreSQL's
    function takes integers: a larger one was a store error, every submission a 503)."""
    quotas = Quotas(max_active_operations=MAX_QUOTA, submits_per_hour=MAX_QUOTA)
    assert await store.claim_quota("key:big", "op_1", quotas, time.time(), 60) == 0


async def test_concurrent_quota_claims_never_take_more_than_the_limit(store: Store) -> None:
    """Twenty claims at once for three places: exactly three are counted."""
    quotas = Quotas(max_active_operations=3, submits_per_hour=100)
    now = time.time()
    waits = await asyncio.gather(
        *(store.claim_quota("key:race", f"op_{n}", quotas, now, 60) for n in range(20))
    )
    assert sorted(waits)[:4] == [0, 0, 0, ACTIVE_RETRY]


async def test_dropping_a_key_forgets_its_counts(store: Store) -> None:
    """A key dropped takes its quota counts along (its id is never used again anyway)."""
    await store.put_key(agent_key())
    quotas = Quotas(max_active_operations=1)
    now = time.time()
    assert await store.claim_quota("key:key_1", "op_1", quotas, now, 60) == 0
    await store.drop_key("key_1")
    assert await store.claim_quota("key:key_1", "op_2", quotas, now, 60) == 0


async def _end(store: Store, op: str, job: str, at: float, *, announce: bool = True) -> None:
    """Create ``op`` pending, then end it with one compare-and-set write (as a poll does)."""
    created = await store.create(record(op, job))
    ended = created.evolve(outcome=Outcome.SUCCEEDED, ended_at=at, announce=announce)
    assert await store.save(ended)


async def test_a_terminal_write_that_announces_owes_one_completion(store: Store) -> None:
    """The write that ends an operation with ``announce`` set owes its completion event,
    oldest ended first; one without ``announce``, or still pending, owes none."""
    now = time.time()
    await _end(store, "op_b", "job_b", now + 2)
    await _end(store, "op_a", "job_a", now + 1)
    await _end(store, "op_c", "job_c", now, announce=False)
    await store.create(record("op_d", "job_d").evolve(announce=True))  # pending: owes nothing
    assert await store.owed_completions(10) == ["op_a", "op_b"]
    assert await store.owed_completions(1) == ["op_a"]
    assert await store.completion_owed("op_a")
    assert not await store.completion_owed("op_c")
    assert not await store.completion_owed("op_d")


async def test_a_record_created_ended_owes_its_completion_too(store: Store) -> None:
    """The rule is the write's, not the path's: a record created terminal and announcing
    (as a restore or an import writes it) owes the event as a save would."""
    ended = record().evolve(outcome=Outcome.FAILED, ended_at=time.time(), announce=True)
    await store.create(ended)
    assert await store.owed_completions(10) == ["op_1"]


async def test_a_completion_marked_sent_is_never_owed_again(store: Store) -> None:
    """Once sent, writing the terminal record again (any later change) owes nothing."""
    await _end(store, "op_1", "job_1", time.time())
    await store.completion_sent("op_1")
    assert await store.owed_completions(10) == []
    assert not await store.completion_owed("op_1")
    stored = await store.get("op_1")
    assert stored is not None and await store.save(stored.evolve(early_refusals=3))
    assert await store.owed_completions(10) == []
    assert not await store.completion_owed("op_1")


async def test_writing_an_owing_record_again_owes_it_once(store: Store) -> None:
    """A second write of an owing terminal record keeps one entry, not two."""
    await _end(store, "op_1", "job_1", time.time())
    stored = await store.get("op_1")
    assert stored is not None and await store.save(stored.evolve(early_refusals=1))
    assert await store.owed_completions(10) == ["op_1"]


async def test_a_lost_compare_and_set_owes_nothing(store: Store) -> None:
    """A terminal write that loses its compare-and-set makes no outbox entry."""
    created = await store.create(record())
    assert await store.save(created.evolve(early_refusals=1))
    stale = created.evolve(outcome=Outcome.SUCCEEDED, ended_at=time.time(), announce=True)
    assert not await store.save(stale)
    assert await store.owed_completions(10) == []


async def test_purge_keeps_a_record_owing_its_event_until_sent(store: Store) -> None:
    """A record whose completion event is still owed outlives its retention (SPEC 23:
    exactly once, however long the receiver is down); once sent, the next purge takes it
    and its outbox entry."""
    now = time.time()
    await _end(store, "op_1", "job_1", now - 100)
    await _end(store, "op_2", "job_2", now - 100)
    await store.completion_sent("op_2")
    assert await store.purge("demo-jobs", now, now) == 1
    assert await store.get("op_2") is None
    assert await store.get("op_1") is not None
    assert await store.owed_completions(10) == ["op_1"]
    await store.completion_sent("op_1")
    assert await store.purge("demo-jobs", now, now) == 1
    assert await store.get("op_1") is None
    assert await store.owed_completions(10) == []
    assert not await store.completion_owed("op_1")


async def test_usage_round_trips(store: Store) -> None:
    """A record's usage numbers (whole and fractional) come back as written."""
    await _end(store, "op_1", "job_1", time.time())
    stored = await store.get("op_1")
    assert stored is not None
    usage = (("cost", 0.25), ("input_tokens", 1200))
    assert await store.save(stored.evolve(usage=usage))
    again = await store.get("op_1")
    assert again is not None and again.usage == usage and again.announce


async def test_a_rotated_key_shares_its_predecessors_counts(store: Store) -> None:
    """A rotated key's successor is stored and read back with the holder it counts under
    (its first key's), so dropping the old key keeps the counts; dropping the last key
    counting under that holder forgets them."""
    first = agent_key("key_1", "a" * 64, 1.0)
    second = first.successor("key_2", "b" * 64, 2.0, "ops")
    third = second.successor("key_3", "c" * 64, 3.0, "ops")
    assert first.holder == second.holder == third.holder == "key:key_1"
    quotas = Quotas(max_active_operations=1)
    now = time.time()
    await store.put_key(first)
    assert await store.claim_quota(first.holder, "op_1", quotas, now, 60) == 0
    await store.put_key(second)
    assert await store.drop_key("key_1") == first
    assert await store.key_for("b" * 64) == second
    assert await store.claim_quota(second.holder, "op_2", quotas, now, 60) == ACTIVE_RETRY
    await store.put_key(third)
    await store.drop_key("key_2")
    assert await store.agent_keys() == [third]
    assert await store.claim_quota(third.holder, "op_2", quotas, now, 60) == ACTIVE_RETRY
    await store.drop_key("key_3")
    assert await store.claim_quota(third.holder, "op_2", quotas, now, 60) == 0
