"""SPEC 20 on the pure core: which answer an early status call is replayed (``early_calls:
replay``), when none is, and which values of a final answer address its result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core import decide
from gateway.core.decide import Reply
from gateway.core.models import (
    Failure,
    LastAnswer,
    OperationRecord,
    Outcome,
    ProviderAnswer,
)
from gateway.demo.env import demo_env
from gateway.settings.policy import ProviderPolicy, load_policy

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0
JSON = "application/json"


ENV = demo_env(ROOT / "policies", "k")  # every credential a shipped policy may read


def shipped(name: str) -> ProviderPolicy:
    """A shipped policy, every credential it may read set to "k"."""
    return load_policy(ROOT / f"policies/{name}.yaml", f"{name}.yaml", ENV)


@pytest.fixture(scope="module")
def openai() -> ProviderPolicy:
    """The shipped openai-batch policy: early_calls replay, result by output_file_id."""
    return shipped("openai-batch")


def batch(status: str, **more: object) -> bytes:
    return json.dumps({"id": "batch_1", "status": status, **more}).encode()


def opened(policy: ProviderPolicy, answer: ProviderAnswer) -> OperationRecord:
    return decide.open_operation(
        policy,
        operation_id="op_1",
        account="team-a",
        job_id="batch_1",
        fingerprint="f",
        idempotency_key=None,
        answer=answer,
        now=NOW,
        u=1.0,
    ).record


def polled(
    policy: ProviderPolicy, record: OperationRecord, answer: ProviderAnswer
) -> OperationRecord:
    """The record after one poll at its next permitted instant answered ``answer``."""
    at = record.next_poll_at
    reserved = decide.take(policy, record, at).record
    return decide.classify(policy, reserved, answer, at + 0.5, 1.0).record


def test_the_submit_answer_is_replayed_when_it_is_a_pending_status_object(
    openai: ProviderPolicy,
) -> None:
    """A 200 submit answer whose state is pending is the first answer an early call gets."""
    record = opened(openai, ProviderAnswer(200, batch("validating"), JSON))
    decision = decide.admit(openai, record, NOW + 1)
    assert decision.reply is Reply.REPLAY and not decision.forward and not decision.changed
    assert decision.retry_after == pytest.approx(record.next_poll_at - NOW - 1)
    assert record.last_answer == LastAnswer(200, JSON, batch("validating"), NOW)


@pytest.mark.parametrize(
    "answer",
    [
        ProviderAnswer(202, batch("validating"), JSON),  # not what a status call answers
        ProviderAnswer(200, batch("completed"), JSON),  # not pending: would end the loop early
        ProviderAnswer(200, b"", ""),  # no status object at all (an Azure-style 202)
    ],
)
def test_a_submit_answer_that_is_not_a_pending_status_is_never_replayed(
    openai: ProviderPolicy, answer: ProviderAnswer
) -> None:
    """Without a pending 200 status object to replay, an early call is 429 too-early."""
    record = opened(openai, answer)
    assert record.last_answer is None
    assert decide.admit(openai, record, NOW + 1).problem == "too-early"


def test_the_latest_pending_answer_is_replayed_with_its_time(openai: ProviderPolicy) -> None:
    """Each pending 2xx answer replaces the kept one; its instant makes the Age."""
    record = opened(openai, ProviderAnswer(200, batch("validating"), JSON))
    record = polled(openai, record, ProviderAnswer(200, batch("in_progress"), JSON))
    assert record.last_answer is not None
    assert record.last_answer.body == batch("in_progress")
    assert record.last_answer.at == record.last_polled_at
    assert decide.admit(openai, record, record.next_poll_at - 1).reply is Reply.REPLAY


@pytest.mark.parametrize(
    "answer",
    [
        ProviderAnswer(None, failure=Failure.CONNECTION),
        ProviderAnswer(None, failure=Failure.TIMEOUT),
        ProviderAnswer(503, b'{"error": "busy"}', JSON),
        ProviderAnswer(500, b"oops", "text/plain"),
        ProviderAnswer(429, b"", "", retry_after="30"),
    ],
    ids=["connection", "timeout", "503", "500", "429"],
)
def test_no_replay_after_a_failure_5xx_or_429(
    openai: ProviderPolicy, answer: ProviderAnswer
) -> None:
    """An answer that was not a pending 2xx clears what was kept: the usual too-early."""
    record = opened(openai, ProviderAnswer(200, batch("validating"), JSON))
    record = polled(openai, record, answer)
    assert record.outcome is Outcome.PENDING and record.last_answer is None
    assert decide.admit(openai, record, record.next_poll_at - 1).problem == "too-early"


def test_never_replayed_when_waiting_must_end(openai: ProviderPolicy) -> None:
    """Escalated, over-budget and past-deadline operations keep their 409, replay or not."""
    record = opened(openai, ProviderAnswer(200, batch("validating"), JSON))
    assert record.last_answer is not None
    spent = record.evolve(status_requests_used=record.max_status_requests)
    assert decide.admit(openai, spent, NOW + 1).problem == "operation-escalated"
    late = record.evolve(deadline_at=NOW + 1)
    assert decide.admit(openai, late, NOW + 1).problem == "operation-escalated"
    escalated = decide.admit(openai, late, NOW + 1).record
    assert decide.admit(openai, escalated, NOW + 1).problem == "operation-escalated"


def test_refuse_and_hold_policies_never_replay_nor_keep_answers() -> None:
    """Replay is the policy's choice: the default stays 429 too-early, and records of
    policies that do not replay carry no answer to replay (nothing extra is stored)."""
    policy = shipped("demo-jobs")
    assert policy.polling.early_calls == "refuse"
    record = opened(policy, ProviderAnswer(200, b'{"id": "j", "state": "queued"}', JSON))
    assert record.last_answer is None
    assert decide.admit(policy, record, NOW + 0.5).problem == "too-early"
    record = polled(policy, record, ProviderAnswer(200, b'{"id": "j", "state": "running"}', JSON))
    assert record.last_answer is None
    kept_before_a_reload = record.evolve(last_answer=LastAnswer(200, JSON, b"{}", NOW))
    cleared = polled(
        policy, kept_before_a_reload, ProviderAnswer(200, b'{"state": "running"}', JSON)
    )
    assert cleared.last_answer is None


def test_a_finished_operation_keeps_its_final_answer_and_its_result_values(
    openai: ProviderPolicy,
) -> None:
    """Success stores the addressable {final.*} values; the replay copy is dropped."""
    record = opened(openai, ProviderAnswer(200, batch("validating"), JSON))
    done = polled(
        openai, record, ProviderAnswer(200, batch("completed", output_file_id="F9"), JSON)
    )
    assert done.outcome is Outcome.SUCCEEDED
    assert done.result_values == ("F9",)
    assert done.last_answer is None
    failed = polled(openai, record, ProviderAnswer(200, batch("failed", output_file_id="F9"), JSON))
    assert failed.outcome is Outcome.FAILED and failed.result_values == ()


@pytest.mark.parametrize(
    ("value", "indexed"),
    [
        ("file-abc_1.jsonl", ("file-abc_1.jsonl",)),
        (12345, ("12345",)),
        ("a/b", ()),
        ("a..b", ()),
        ("..", ()),
        (".", ()),
        ("a?b", ()),
        ("a#b", ()),
        ("x" * 200, ("x" * 200,)),
        ("x" * 201, ()),
        ("", ()),
        (True, ()),
        (None, ()),
        ({"id": "F9"}, ()),
    ],
)
def test_only_values_one_path_segment_can_carry_are_indexed(
    openai: ProviderPolicy, value: object, indexed: tuple[str, ...]
) -> None:
    """Values with /, .., ?, # or over 200 characters are never indexed (SPEC 20)."""
    assert decide.result_values(openai, {"output_file_id": value}) == indexed


def test_records_from_the_previous_layout_load_without_the_new_fields(
    openai: ProviderPolicy,
) -> None:
    """A stored record written before SPEC 20 (no last_answer, no result_values) loads;
    the new fields survive a round trip, bodies byte for byte."""
    record = opened(openai, ProviderAnswer(200, batch("validating") + b"\xff", JSON))
    old = record.to_dict()
    del old["last_answer"], old["result_values"]
    loaded = OperationRecord.from_dict(json.loads(json.dumps(old)))
    assert loaded.last_answer is None and loaded.result_values == ()
    again = OperationRecord.from_dict(
        json.loads(json.dumps(record.evolve(result_values=("F9",)).to_dict()))
    )
    assert again == record.evolve(result_values=("F9",))


ANSWERS = st.one_of(
    st.sampled_from(["validating", "in_progress", "finalizing"]).map(
        lambda s: ProviderAnswer(200, batch(s), JSON)
    ),
    st.just(ProviderAnswer(503, b"", "")),
    st.just(ProviderAnswer(429, b"", "")),
    st.just(ProviderAnswer(None, failure=Failure.CONNECTION)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(ANSWERS, max_size=8), st.floats(0.01, 0.99))
def test_a_replay_is_always_the_last_answer_and_never_spends(
    answers: list[ProviderAnswer], fraction: float
) -> None:
    """Invariants: an early call under replay never forwards and never writes; what it
    replays is exactly the last answer recorded, and only when that was a pending 2xx."""
    policy = shipped("openai-batch")
    record = opened(policy, ProviderAnswer(200, batch("validating"), JSON))
    last: ProviderAnswer | None = ProviderAnswer(200, batch("validating"), JSON)
    for answer in answers:
        if record.outcome is not Outcome.PENDING:
            break
        record = polled(policy, record, answer)
        last = answer
    if record.outcome is not Outcome.PENDING:
        return
    now = record.next_poll_at - fraction * (record.next_poll_at - (record.last_polled_at or NOW))
    if now >= record.next_poll_at:
        return
    decision = decide.admit(policy, record, now)
    assert not decision.forward and not decision.changed
    assert decision.record == record
    replayable = last is not None and last.status is not None and 200 <= last.status < 300
    assert (decision.reply is Reply.REPLAY) == replayable
    if replayable:
        assert last is not None and record.last_answer is not None
        assert record.last_answer.body == last.body
