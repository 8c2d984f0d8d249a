"""Every parser of outside input, under Hypothesis: no input makes one raise anything but
the project's own validation error (or return nonsense)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import ConfigError
from gateway.core.decide import classify, lookup
from gateway.core.models import ProviderAnswer
from gateway.core.schedule import (
    parse_next_check_at,
    parse_poll_after,
    parse_retry_after,
    provider_limit,
)
from gateway.http.prefer import prefer_wait
from gateway.provider.headers import Rewriter, to_provider
from gateway.settings.policy import load_policy
from gateway.settings.units import parse_duration, parse_size

from conftest import pending_record

ROOT = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
POLICY = load_policy(ROOT / "policies/demo-jobs.yaml", "demo", {"DEMO_API_KEY": "k-123456"})


@given(st.text(max_size=60))
def test_retry_after_never_raises(value: str) -> None:
    """Any Retry-After text gives None or a finite, non-negative delay, never an exception."""
    seconds = parse_retry_after(value, NOW)
    assert seconds is None or (math.isfinite(seconds) and seconds >= 0)


@given(JSON)
def test_poll_hints_never_raise(value: Any) -> None:
    """Any JSON value as a poll hint gives None or a finite, non-negative delay or instant."""
    seconds = parse_poll_after(value)
    assert seconds is None or (math.isfinite(seconds) and seconds >= 0)
    instant = parse_next_check_at(value, NOW)
    assert instant is None or instant >= 0


@given(st.text(max_size=40))
def test_next_check_at_text_never_raises(value: str) -> None:
    """Any text as next_check_at is parsed without an exception."""
    parse_next_check_at(value, NOW)


@given(st.one_of(st.text(max_size=20), JSON))
def test_durations_and_sizes_raise_only_value_error(value: Any) -> None:
    """Any value given as a duration or size is a non-negative number or a ValueError, nothing
    else."""
    for parse in (parse_duration, parse_size):
        try:
            result = parse(value)
        except ValueError:
            continue
        assert result >= 0


@given(JSON, st.text(max_size=30))
def test_state_paths_never_raise(data: Any, path: str) -> None:
    """Looking up any dotted path in any JSON value never raises."""
    lookup(data, path)


@given(st.binary(max_size=300), st.integers(100, 599), st.text(max_size=20))
def test_classify_takes_any_answer(body: bytes, status: int, retry_after: str) -> None:
    """Any status, body and Retry-After is classified without spending a status request."""
    record = pending_record(next_poll_at=NOW, started_at=NOW, deadline_at=NOW + 600)
    decision = classify(POLICY, record, ProviderAnswer(status, body, "", retry_after), NOW, 0.5)
    assert decision.record.status_requests_used == record.status_requests_used


@given(
    st.dictionaries(
        st.sampled_from(["RateLimit", "RateLimit-Remaining", "RateLimit-Reset", "Retry-After"]),
        st.text(max_size=40),
    ),
    st.integers(100, 599),
)
def test_rate_limit_fields_never_raise(headers: dict[str, str], status: int) -> None:
    """Any rate-limit headers give None or a non-negative limit whose reset is not in the past."""
    limit = provider_limit(status, headers, NOW)
    assert limit is None or (limit[0] >= 0 and limit[1] >= NOW)


@given(st.lists(st.text(max_size=30), max_size=3))
def test_prefer_never_raises(values: list[str]) -> None:
    """Any Prefer header values give None or a non-negative wait."""
    wait = prefer_wait(values)
    assert wait is None or wait >= 0


@given(st.text(max_size=80))
def test_url_rewriting_never_raises_or_leaves_the_upstream(url: str) -> None:
    """Any URL is rewritten to the gateway's provider path or dropped, never pointed elsewhere."""
    rewritten = Rewriter(POLICY, "https://gw.example").url(url)
    assert rewritten is None or rewritten.startswith("https://gw.example/p/demo-jobs/")


@given(st.lists(st.tuples(st.text(max_size=20), st.text(max_size=20)), max_size=6))
def test_request_headers_never_carry_line_breaks(headers: list[tuple[str, str]]) -> None:
    """No header sent to the provider carries a CR or LF, whatever the agent sent."""
    sent = to_provider(headers, POLICY)
    assert all("\r" not in v and "\n" not in v for v in sent.values())


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "provider",
                "upstream",
                "credential",
                "routes",
                "states",
                "polling",
                "hints",
                "retention",
                "other",
            ]
        ),
        JSON,
        max_size=8,
    )
)
def test_random_policy_files_give_config_errors_only(
    tmp_path_factory: Any, data: dict[str, Any]
) -> None:
    """A random policy mapping loads or gives ConfigError lines naming the file, never another
    exception."""
    path = tmp_path_factory.mktemp("p") / "random.yaml"
    path.write_text(yaml.safe_dump(data))
    try:
        load_policy(path, "random.yaml", {})
    except ConfigError as exc:
        assert all(line.startswith("random.yaml: ") for line in exc.problems)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200))
def test_random_yaml_text_gives_config_errors_only(tmp_path_factory: Any, text: str) -> None:
    """Random text as a policy file is a ConfigError, never another exception."""
    path = tmp_path_factory.mktemp("p") / "random.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        load_policy(path, "random.yaml", {})
