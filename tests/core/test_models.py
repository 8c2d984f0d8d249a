"""Records: the generated copier behaves exactly as dataclasses.replace."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core.decide import Decision, Reply
from gateway.core.models import OperationRecord, Outcome

from conftest import pending_record

NUMBERS = ("status_requests_used", "next_poll_at", "deadline_at", "version", "early_refusals")


@given(
    st.dictionaries(
        st.sampled_from(NUMBERS), st.integers(min_value=0, max_value=10**6), max_size=5
    ),
    st.sampled_from(list(Outcome)),
    st.one_of(st.none(), st.text(max_size=20)),
)
def test_evolve_equals_dataclasses_replace(
    numbers: dict[str, int], outcome: Outcome, state: str | None
) -> None:
    """For any changes, evolve gives the record dataclasses.replace gives, and leaves the
    original and the caller's changes as they were."""
    record = pending_record()
    before = dataclasses.replace(record)
    changes: dict[str, Any] = {**numbers, "outcome": outcome, "last_known_state": state}
    asked = dict(changes)
    assert record.evolve(**changes) == dataclasses.replace(record, **changes)
    assert changes == asked
    assert record == before


def test_evolve_refuses_unknown_fields() -> None:
    """A misspelt field is a TypeError, never silently dropped."""
    with pytest.raises(TypeError, match="unknown fields"):
        pending_record().evolve(statu_requests_used=1)


def test_evolve_copies_every_field() -> None:
    """Every field of the record survives a copy, whatever fields are added later."""
    record = pending_record()
    copy = record.evolve()
    for field in dataclasses.fields(OperationRecord):
        assert getattr(copy, field.name) == getattr(record, field.name)


@given(
    st.booleans(),
    st.booleans(),
    st.one_of(st.none(), st.floats(allow_nan=False)),
    st.one_of(st.none(), st.text(max_size=20)),
)
def test_a_decision_evolves_as_dataclasses_replace_does(
    changed: bool, forward: bool, retry_after: float | None, detail: str | None
) -> None:
    """Decisions use the same generated copier: equal to dataclasses.replace, every field."""
    decision = Decision(pending_record(), Reply.PROVIDER, problem="too-early", cut_at=1.0)
    changes: dict[str, Any] = {
        "changed": changed,
        "forward": forward,
        "retry_after": retry_after,
        "detail": detail,
    }
    assert decision.evolve(**changes) == dataclasses.replace(decision, **changes)
    assert decision.evolve() == decision
    with pytest.raises(TypeError, match="unknown fields"):
        decision.evolve(forwarded=True)


def test_route_values_round_trip_and_are_left_out_when_empty() -> None:
    """A record's route values survive to_dict/from_dict; a record without any writes no
    key, so records stay as they were written before route values existed."""
    plain = pending_record()
    assert "route_values" not in plain.to_dict()
    assert OperationRecord.from_dict(plain.to_dict()) == plain
    kept = plain.evolve(route_values=(("app", "fast-sdxl"), ("owner", "fal-ai")))
    assert kept.to_dict()["route_values"] == {"app": "fast-sdxl", "owner": "fal-ai"}
    assert OperationRecord.from_dict(kept.to_dict()) == kept
