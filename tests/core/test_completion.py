"""SPEC 23, the pure part: usage numbers found in a final answer, the operation.completed
body, the retry delay, and the classify step that records both in the ending write."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core import completion, decide, effects
from gateway.core.models import OperationRecord, Outcome, ProviderAnswer
from gateway.settings.policy import ProviderPolicy, load_policy

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0
PATHS = {"input_tokens": "usage.input_tokens", "pages": "result.pages", "cost": "bill.0.usd"}


@pytest.fixture(scope="module")
def policy() -> ProviderPolicy:
    return load_policy(ROOT / "policies/demo-jobs.yaml", "demo-jobs.yaml", {"DEMO_API_KEY": "k"})


def answer(body: object) -> ProviderAnswer:
    return ProviderAnswer(200, json.dumps(body).encode(), "application/json")


def opened(policy: ProviderPolicy) -> OperationRecord:
    return decide.open_operation(
        policy,
        operation_id="op_1",
        account="team-a",
        job_id="j",
        fingerprint="f",
        idempotency_key="k",
        answer=answer({"id": "j", "state": "queued"}),
        now=NOW,
        u=1.0,
    ).record


def test_usage_found_takes_numbers_and_skips_the_rest() -> None:
    """Whole and fractional numbers (also inside lists) are found; a missing path, a
    string, a boolean, null or an object is left out, never an error."""
    body = {"usage": {"input_tokens": 1200}, "result": {"pages": "3"}, "bill": [{"usd": 0.25}]}
    found = completion.usage_found(PATHS, json.dumps(body).encode())
    assert found == (
        ("cost", 0.25),
        ("input_tokens", 1200),
        ("pages", 3),
    )  # "3": int64 as Google writes it
    body = {"usage": {"input_tokens": "1e3"}, "result": {"pages": "three"}, "bill": {"usd": 1}}
    assert completion.usage_found(PATHS, json.dumps(body).encode()) == ()
    assert completion.usage_found(PATHS, b'{"usage": {"input_tokens": true}}') == ()
    assert completion.usage_found(PATHS, b"not json") == ()
    assert completion.usage_found({}, b'{"a": 1}') == ()


@given(
    st.dictionaries(
        st.sampled_from(["a", "b", "c"]),
        st.none() | st.booleans() | st.text().filter(lambda t: not completion.NUMERAL.fullmatch(t)),
    )
)
def test_usage_never_holds_anything_but_numbers(values: dict[str, object]) -> None:
    """Null, booleans and strings that are not numerals are never usage."""
    body = json.dumps({"u": values}).encode()
    assert completion.usage_found({k: f"u.{k}" for k in "abc"}, body) == ()


def test_usage_past_64_bits_still_lets_the_record_be_written(policy: ProviderPolicy) -> None:
    """A numeral too large for a 64-bit integer (a string of 25 digits, or a number the
    json module read whole from a body orjson refuses) is kept as a float: the ending
    record still serialises as every store writes it (orjson), so the operation can end."""
    digits = "1234567890123456789012345"
    body = {"usage": {"input_tokens": digits}, "result": {"pages": 3}}
    found = completion.usage_found(PATHS, json.dumps(body).encode())
    assert found == (("input_tokens", float(digits)), ("pages", 3))
    utf16 = ('{"usage": {"input_tokens": ' + digits + "}}").encode("utf-16")
    assert completion.usage_found(PATHS, utf16) == (("input_tokens", float(digits)),)
    huge = ('{"usage": {"input_tokens": 1' + "0" * 400 + "}}").encode("utf-16")
    assert completion.usage_found(PATHS, huge) == ()  # past any float: left out
    done = {"id": "j", "state": "succeeded", "result": {"pages": 3}, "usage": body["usage"]}
    ended = decide.classify(policy, opened(policy), answer(done), NOW + 5, 1.0, announce=True)
    orjson.dumps(ended.record.to_dict())  # what the SQLite, Redis and PostgreSQL stores write


def test_the_ending_answer_records_usage_and_owes_the_event(policy: ProviderPolicy) -> None:
    """A success recorded by classify carries its usage and, with a webhook configured,
    ``announce``; a pending answer carries neither; without a webhook, usage alone."""
    record = opened(policy)
    done = {
        "id": "j",
        "state": "succeeded",
        "result": {"pages": 3},
        "usage": {"input_tokens": 9, "output_tokens": 4},
    }
    ended = decide.classify(policy, record, answer(done), NOW + 5, 1.0, announce=True).record
    assert ended.outcome is Outcome.SUCCEEDED and ended.announce
    assert ended.usage == (("input_tokens", 9), ("output_tokens", 4), ("pages", 3))
    quiet = decide.classify(policy, record, answer(done), NOW + 5, 1.0).record
    assert quiet.usage == ended.usage and not quiet.announce
    running = answer({"id": "j", "state": "running", "usage": {"input_tokens": 1}})
    waiting = decide.classify(policy, record, running, NOW + 5, 1.0, announce=True).record
    assert waiting.usage == () and not waiting.announce


def test_a_failure_is_announced_too_and_an_escalation_is_not(policy: ProviderPolicy) -> None:
    """Every terminal outcome owes the event; an escalation (waiting on a person) does not."""
    record = opened(policy)
    failed = answer({"id": "j", "state": "failed", "error": {"code": "x"}})
    assert decide.classify(policy, record, failed, NOW + 5, 1.0, announce=True).record.announce
    odd = answer({"id": "j", "state": "weird"})
    escalated = decide.classify(policy, record, odd, NOW + 5, 1.0, announce=True).record
    assert escalated.outcome is Outcome.ESCALATED and not escalated.announce


def test_usage_is_counted_once_when_the_operation_finishes(policy: ProviderPolicy) -> None:
    """The finishing decision's effects count each positive usage number once, labelled by
    provider, account and kind."""
    record = opened(policy)
    body = {"id": "j", "state": "succeeded", "result": {"pages": 3}, "usage": {"input_tokens": 0}}
    decision = decide.classify(policy, record, answer(body), NOW + 5, 1.0)
    counts = [
        e for e in effects.of_decision(policy, decision, NOW + 5) if isinstance(e, effects.Count)
    ]
    usage = [(c.labels, c.value) for c in counts if c.metric == "usage"]
    assert usage == [(("demo-jobs", "team-a", "pages"), 3.0)]


def test_event_body_and_its_optional_result_url(policy: ProviderPolicy) -> None:
    """The body names the operation, its outcome, the provider's state and its usage, with
    a webhook-id that is the same every time; result_url only when one is given."""
    record = opened(policy).evolve(
        outcome=Outcome.SUCCEEDED, last_known_state="succeeded", usage=(("pages", 3),)
    )
    body = completion.event_body(record, "2027-01-15T08:00:00.000Z")
    assert body == {
        "type": "operation.completed",
        "id": "completed_op_1",
        "operation_id": "op_1",
        "provider": "demo-jobs",
        "account": "team-a",
        "outcome": "succeeded",
        "provider_state": "succeeded",
        "usage": {"pages": 3},
        "ended_at": "2027-01-15T08:00:00.000Z",
    }
    kept = completion.event_body(record, None, result_url="https://gw.example/r/op_1")
    assert kept["result_url"] == "https://gw.example/r/op_1"


@given(st.integers(1, 100), st.floats(0, 0.999999))
def test_retry_delay_doubles_within_bounds(failures: int, u: float) -> None:
    """The delay after n failures is base * 2^(n-1), capped, times a jitter in [0.5, 1.5)."""
    delay = completion.retry_delay(failures, 1.0, u)
    plain = min(completion.MAX_DELAY, 2.0 ** (failures - 1))
    assert 0.5 * plain <= delay < 1.5 * plain
