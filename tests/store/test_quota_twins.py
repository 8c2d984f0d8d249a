"""The quota rule exists three times: in Python (``keys.quota_wait``, which the memory and
SQLite stores apply), in Redis's quota.lua and in PostgreSQL's sg_quota. This test feeds
the same generated steps (claims at moving instants, releases, operations opened and
ended) to a shared store and to the memory twin and compares every answer. Instants are
arguments of ``claim_quota``, not a clock, so no example depends on timing."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st
from test_rule_twins import TWINS, Backend, backend

from gateway.core.models import OperationRecord, Outcome
from gateway.settings.config import Quotas
from gateway.store import Store

from conftest import pending_record

__all__ = ["backend"]  # the fixture, used by name

START = 1_800_000_000.0
HOLD = 60.0
holders = itertools.count()
LIMIT = st.one_of(st.none(), st.integers(1, 3))
STEP = st.tuples(
    st.sampled_from(["claim"] * 4 + ["release", "open", "end"]),
    st.integers(0, 4),  # which operation
    st.sampled_from([0.0, 1.0, 30.0, 61.0, 1800.0, 3599.0, 3601.0]),  # seconds that pass
)


def ended_at(now: float) -> Callable[[OperationRecord], tuple[OperationRecord, None]]:
    return lambda record: (record.evolve(outcome=Outcome.SUCCEEDED, ended_at=now), None)


async def run(store: Store, holder: str, quotas: Quotas, steps: list[Any]) -> list[Any]:
    now, seen = START, []
    for action, number, passed in steps:
        now += passed
        operation = f"{holder}-op{number}"
        if action == "claim":
            seen.append(round(await store.claim_quota(holder, operation, quotas, now, HOLD), 6))
        elif action == "release":
            await store.release_quota(holder, operation)
        elif action == "open" and await store.get(operation) is None:
            job = f"{holder}-job{number}"
            await store.create(pending_record(operation_id=operation, provider_job_id=job))
        elif action == "end" and await store.get(operation) is not None:
            await store.mutate(operation, ended_at(now))
    return seen


@TWINS
@given(max_active=LIMIT, per_hour=LIMIT, steps=st.lists(STEP, min_size=1, max_size=12))
@example(  # a place freed by time whose record came later (Redis freed places lazily)
    max_active=2,
    per_hour=None,
    steps=[("claim", 0, 0.0), ("claim", 1, 61.0), ("open", 0, 0.0), ("claim", 0, 0.0)],
)
def test_the_quota_rule_is_one_rule_in_python_lua_and_plpgsql(
    backend: Backend, max_active: int | None, per_hour: int | None, steps: list[Any]
) -> None:
    """Any sequence of claims, releases and operations opened or ended answers claim for
    claim as the memory store does: the same waits (0 when counted), whichever quota binds."""
    quotas = Quotas(max_active_operations=max_active, submits_per_hour=per_hour)
    holder = f"key:twins{next(holders)}"
    shared = backend.run(run(backend.store, holder, quotas, steps))
    memory = backend.run(run(backend.memory, holder, quotas, steps))
    assert shared == memory
