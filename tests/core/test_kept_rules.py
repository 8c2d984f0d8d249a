"""The pure rules of kept results (SPEC 23): which record is owed a copy, which copy may
be served, how a copy's name carries its expiry, and the agent-facing path of a copy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gateway.core.models import KeptResult, OperationRecord, Outcome
from gateway.core.results import (
    COPY_TRIES,
    COPY_WAIT,
    Refusal,
    awaits_copy,
    copy_expiry,
    copy_failed,
    copy_fetch,
    copy_name,
    copy_tried,
    fetch,
    kept_result_path,
    owes_copy,
    record_copy,
    result_path,
    served_copy,
)
from gateway.settings.policy import ProviderPolicy, load_policy

from conftest import PROVIDER_ENV, ROOT, pending_record

NOW = 1_800_000_000.0


def keeping_policy(tmp_path: Path, keep: bool = True, ttl: str = "1h") -> ProviderPolicy:
    source = (ROOT / "policies" / "demo-jobs.yaml").read_text()
    path = tmp_path / "demo-jobs.yaml"
    path.write_text(source + f"results: {{keep: {str(keep).lower()}, ttl: {ttl}}}\n")
    return load_policy(path, "demo-jobs.yaml", PROVIDER_ENV)


def succeeded(**changes: Any) -> OperationRecord:
    return pending_record().evolve(outcome=Outcome.SUCCEEDED, ended_at=NOW, **changes)


def copy(name: str = "00001800003600-op", expires: float = NOW + 3600) -> KeptResult:
    return KeptResult(name, 10, "00" * 32, "text/plain", NOW, expires)


def test_a_copy_is_owed_only_after_success_once_within_budget_and_ttl(tmp_path: Path) -> None:
    policy = keeping_policy(tmp_path)
    assert owes_copy(policy, succeeded(), NOW)
    assert not owes_copy(policy, pending_record(), NOW)
    assert not owes_copy(policy, succeeded(kept_result=copy()), NOW)
    assert not owes_copy(policy, succeeded(result_fetches=10), NOW)
    assert not owes_copy(policy, succeeded(), NOW + 3600)
    off = keeping_policy(tmp_path, keep=False)
    assert not owes_copy(off, succeeded(), NOW)


def test_a_completion_event_waits_for_an_owed_copy_for_a_minute_at_most(tmp_path: Path) -> None:
    """The event names the kept result when there will be one: it waits while the copy is
    owed, never past COPY_WAIT after the end, and never for a policy that keeps nothing."""
    policy = keeping_policy(tmp_path)
    assert awaits_copy(policy, succeeded(), NOW)
    assert awaits_copy(policy, succeeded(), NOW + COPY_WAIT - 1)
    assert not awaits_copy(policy, succeeded(), NOW + COPY_WAIT)
    assert not awaits_copy(policy, succeeded(kept_result=copy()), NOW)
    assert not awaits_copy(keeping_policy(tmp_path, keep=False), succeeded(), NOW)
    backing_off = succeeded(copy_attempts=1, next_copy_at=NOW + 5)
    assert not owes_copy(policy, backing_off, NOW) and awaits_copy(policy, backing_off, NOW)


def with_budget(policy: ProviderPolicy, fetches: int) -> ProviderPolicy:
    polling = policy.polling.model_copy(update={"max_result_fetches": fetches})
    return policy.model_copy(update={"polling": polling})


def test_the_gateways_copy_tries_are_few_and_backed_off(tmp_path: Path) -> None:
    """A copy that fails (the provider answers 404, 5xx or a redirect) is tried again at
    most COPY_TRIES times in all, each after a doubled backoff on the clock, each counted
    on the record; then the gateway gives up and the budget's other fetches stay the
    agent's."""
    policy = keeping_policy(tmp_path)
    record, now, waits = succeeded(), NOW, []
    for tries in range(1, COPY_TRIES + 1):
        assert owes_copy(policy, record, now)
        new, fetched = copy_fetch(policy, record, now)
        assert new is not None and not isinstance(fetched, Refusal)
        assert (fetched.result_fetches, fetched.copy_attempts) == (tries, tries)
        assert copy_tried(policy, fetched)
        failed, backed_off = copy_failed(fetched, now + 1)
        assert failed is not None and backed_off.next_copy_at is not None
        assert not owes_copy(policy, backed_off, now + 1)
        assert not owes_copy(policy, backed_off, backed_off.next_copy_at - 0.5)
        waits.append(backed_off.next_copy_at - (now + 1))
        record, now = backed_off, backed_off.next_copy_at
    assert waits == [5.0, 10.0, 20.0]
    assert not owes_copy(policy, record, now) and not owes_copy(policy, record, now + 600)
    assert copy_fetch(policy, record, now)[0] is None
    assert fetch(policy, record)[0] is not None  # the agent's own calls still forward


def test_a_try_cut_short_is_made_again_at_once_and_a_kept_copy_ends_the_tries(
    tmp_path: Path,
) -> None:
    """A try that recorded no failure (its process died) leaves the copy owed at once (the
    lease decides who makes it); a recorded copy takes no failure after it."""
    policy = keeping_policy(tmp_path)
    _, tried = copy_fetch(policy, succeeded(), NOW)
    assert not isinstance(tried, Refusal) and owes_copy(policy, tried, NOW)
    kept = tried.evolve(kept_result=copy())
    assert copy_failed(kept, NOW)[0] is None and not copy_tried(policy, kept)
    assert copy_failed(succeeded(), NOW)[0] is None


def test_the_gateway_never_takes_the_agents_last_result_fetch(tmp_path: Path) -> None:
    two = with_budget(keeping_policy(tmp_path), 2)
    new, tried = copy_fetch(two, succeeded(), NOW)
    assert new is not None and not isinstance(tried, Refusal) and tried.result_fetches == 1
    assert not owes_copy(two, tried, NOW + 3000)  # one fetch left: the agent's
    assert not owes_copy(two, succeeded(result_fetches=1), NOW)
    assert not owes_copy(with_budget(two, 1), succeeded(), NOW)
    assert copy_fetch(two, succeeded(result_fetches=1), NOW)[0] is None


def test_a_copy_is_served_until_it_expires_and_never_when_too_large() -> None:
    kept = copy()
    assert served_copy(succeeded(kept_result=kept), NOW) == kept
    assert served_copy(succeeded(kept_result=kept), NOW + 3600) is None
    too_large = KeptResult("", 99, "", "text/plain", NOW, NOW + 3600)
    assert served_copy(succeeded(kept_result=too_large), NOW) is None


def test_only_the_first_copy_is_recorded() -> None:
    first, second = copy("a"), copy("b")
    new, stored = record_copy(succeeded(), first)
    assert new is not None and stored.kept_result == first
    again, kept = record_copy(stored, second)
    assert again is None and kept.kept_result == first


@given(st.floats(min_value=0, max_value=9.9e10, allow_nan=False), st.text("op_0123ABC", min_size=1))
def test_a_copys_name_carries_its_expiry_rounded_up(expires: float, operation_id: str) -> None:
    """The sweep deletes a copy no earlier than its expiry, by its name alone."""
    found = copy_expiry(copy_name(operation_id, expires))
    assert found is not None and found - 1 < expires <= found


def test_names_not_ours_have_no_expiry() -> None:
    assert copy_expiry(".partial") is None and copy_expiry("12-op") is None


def test_the_agent_facing_path_of_a_kept_result(tmp_path: Path) -> None:
    policy = keeping_policy(tmp_path)
    record = succeeded(kept_result=copy())
    path = kept_result_path(policy, record)
    assert path == "/p/demo-jobs/v1/jobs/job_1/result"
    assert kept_result_path(policy, succeeded()) is None
    assert result_path(policy, succeeded()) == path  # before its copy is made
    assert result_path(policy, pending_record()) is None
