"""The reservation, answer and lease rules exist three times: in Python (the pure
``shared.reservation`` and the memory store), in Redis's Lua scripts and in PostgreSQL's
PL/pgSQL functions. These tests feed the same generated inputs to all of them and compare
every outcome field: the answer code, the stored record (every field) and each lease step.

A backend whose server cannot be had is skipped with the reason conftest gives. Times are
chosen seconds away from every boundary, on the store's own clock, so a busy machine
cannot move an example across one.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway import NotAdmissible
from gateway.core.models import FinalResponse, OperationRecord, Outcome
from gateway.store import MemoryStore, Store, store_from_url
from gateway.store.redis.layout import SYNC_TOLERANCE as REDIS_TOLERANCE
from gateway.store.shared import REFUSED, STALE, WRITTEN, reservation

from conftest import pending_record

TWINS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
OFFSETS = st.sampled_from([-120.0, -10.0, 10.0, 120.0])  # seconds from the store's now
numbers = itertools.count()


class Backend:
    """One store on an event loop of its own, so hypothesis's synchronous examples can
    drive it, beside a memory store (the Python twin) on the same loop."""

    def __init__(self, url: str) -> None:
        self.runner = asyncio.Runner()
        self.store: Store = store_from_url(url)
        self.memory = MemoryStore()
        self.run(self.store.open())

    def run(self, work: Any) -> Any:
        return self.runner.run(work)

    def close(self) -> None:
        self.run(self.store.close())
        self.runner.close()


@pytest.fixture(params=["redis", "postgres"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """Redis or PostgreSQL (a prefix or schema of this test's own), beside the memory twin."""
    url = request.getfixturevalue(f"{request.param}_url")
    if request.param == "postgres":
        url += "&timeout=5s"  # a loaded machine: what the rule says, not how fast
    the = Backend(url)
    yield the
    the.close()


def case_record(
    now: float, used: int, budget: int, outcome: Outcome, deadline: float, due: float
) -> OperationRecord:
    number = next(numbers)
    ended = outcome is not Outcome.PENDING
    return pending_record(
        operation_id=f"op_{number}",
        provider_job_id=f"job_{number}",
        status_requests_used=used,
        max_status_requests=budget,
        outcome=outcome,
        deadline_at=now + deadline,
        next_poll_at=now + due,
        ended_at=now if ended else None,
        final_response=FinalResponse(200, "application/json", b"{}") if ended else None,
    )


async def reserve_on(store: Store, reserve: OperationRecord) -> tuple[int, OperationRecord | None]:
    """The reservation through the poll's first step (start_and_reserve: cas.lua inside
    start_reserve.lua, sg_cas inside sg_start): its answer code and the record stored after."""
    lease = f"poll:{reserve.operation_id}"
    try:
        wait, written, _ = await store.start_and_reserve(
            lease, "t", store.clock(), 30.0, "prov-twins", None, reserve
        )
        assert wait == 0  # no pacing asked for: the reservation always runs
        code = WRITTEN if written else STALE
    except NotAdmissible:
        code = REFUSED
    finally:
        await store.release_lease(lease, "t")
    return code, await store.get(reserve.operation_id)


# One case of the reservation rule: (used, budget, outcome, deadline, due, spend, stale).
# Weighted towards the admissible corner, where one condition decides.
Case = tuple[int, int, Outcome, float, float, int, bool]
CASES = st.lists(
    st.tuples(
        st.integers(0, 3),
        st.integers(0, 3),
        st.sampled_from([Outcome.PENDING] * 4 + [Outcome.SUCCEEDED]),
        OFFSETS,
        OFFSETS,
        st.sampled_from([1, 1, 1, 0, 2]),
        st.sampled_from([False] * 4 + [True]),
    ),
    min_size=4,
    max_size=12,
)


def check_reservation(backend: Backend, case: Case) -> None:
    used, budget, outcome, deadline, due, spend, stale = case
    store = backend.store
    now = store.clock()
    stored = backend.run(store.create(case_record(now, used, budget, outcome, deadline, due)))
    reserve = stored.evolve(status_requests_used=used + spend, last_polled_at=now)
    if stale:
        reserve = reserve.evolve(version=stored.version + 5)
    expected = reservation(stored, reserve, store.clock(), REDIS_TOLERANCE)
    code, after = backend.run(reserve_on(store, reserve))
    assert code == expected, case
    want = reserve.evolve(version=reserve.version + 1) if code == WRITTEN else stored
    assert after is not None and after.to_dict() == want.to_dict()
    if expected != REFUSED:
        twin = backend.memory
        created = backend.run(twin.create(stored.evolve(version=1)))
        twin_reserve = reserve.evolve(version=created.version + (5 if stale else 0))
        twin_code, twin_after = backend.run(reserve_on(twin, twin_reserve))
        assert twin_code == code
        assert twin_after is not None
        assert twin_after.to_dict() == {**after.to_dict(), "version": twin_after.version}


@TWINS
@given(cases=CASES)
def test_the_reservation_rule_is_one_rule_in_python_lua_and_plpgsql(
    backend: Backend, cases: list[Case]
) -> None:
    """For any stored record (budget, outcome, deadline and due time either side of the
    store's now) and any write (spending 0, 1 or 2 requests, current or stale), the store's
    script answers what ``shared.reservation`` answers on the store's clock, and stores
    exactly what that answer implies; the memory store agrees wherever the clock is not
    asked (it decides in one process and checks no clock)."""
    for case in cases:
        check_reservation(backend, case)


@TWINS
@given(
    stale=st.booleans(),
    ends=st.booleans(),
    refusals=st.integers(0, 3),
    answer=st.binary(max_size=64),
)
def test_the_answer_rule_is_one_rule_in_python_lua_and_plpgsql(
    backend: Backend, stale: bool, ends: bool, refusals: int, answer: bytes
) -> None:
    """Recording a poll's answer (finish_poll: the write and the lease's release in one
    step, cas_release.lua / sg_finish) from a current or a stale record in hand gives the
    same result and the same stored record, every field, as the memory store; the lease is
    free afterwards on both."""
    now = backend.store.clock()

    def change(current: OperationRecord) -> tuple[OperationRecord, int]:
        changed = current.evolve(early_refusals=current.early_refusals + refusals)
        if ends:
            final = FinalResponse(200, "application/json", answer)
            changed = changed.evolve(outcome=Outcome.SUCCEEDED, final_response=final, ended_at=now)
        return changed, current.version

    record = case_record(now, 0, 3, Outcome.PENDING, 120.0, -10.0)
    outcomes = []
    for store in (backend.store, backend.memory):
        created = backend.run(store.create(record))
        known = created
        if stale:  # the store moved on since the record in hand was read
            backend.run(store.mutate(record.operation_id, lambda r: (r.evolve(), None)))
        lease = f"poll:{record.operation_id}"
        assert backend.run(store.acquire_lease(lease, "t", store.clock(), 30.0))
        seen = backend.run(
            store.finish_poll(record.operation_id, change, known=known, lease=lease, token="t")
        )
        after = backend.run(store.get(record.operation_id))
        free = backend.run(store.acquire_lease(lease, "u", store.clock(), 30.0))
        assert after is not None
        outcomes.append((seen, after.to_dict(), free))
    assert outcomes[0] == outcomes[1]


@TWINS
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["acquire", "release"]), st.sampled_from("ABC")),
        min_size=1,
        max_size=8,
    )
)
def test_the_lease_rule_is_one_rule_in_python_lua_and_plpgsql(
    backend: Backend, steps: list[tuple[str, str]]
) -> None:
    """Any sequence of takes and releases by three tokens (no lease expires meanwhile)
    answers step for step as the memory store's leases do: a lease is taken or renewed
    unless another token holds it, and released only by its holder."""
    name = f"twins:{next(numbers)}"
    answers = []
    for store in (backend.store, backend.memory):
        seen = []
        for step, token in steps:
            if step == "acquire":
                seen.append(backend.run(store.acquire_lease(name, token, store.clock(), 60.0)))
            else:
                backend.run(store.release_lease(name, token))
                seen.append(None)
        answers.append(seen)
    assert answers[0] == answers[1]
