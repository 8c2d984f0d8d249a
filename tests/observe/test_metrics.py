"""/metrics after a scripted mix of jobs: every SPEC section 9 metric with expected counts."""

from __future__ import annotations

import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.flow.runtime import RUNTIME

from conftest import Harness


async def scrape(harness: Harness) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = await harness.client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(await response.text()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_after_a_scripted_mix(harness: Harness) -> None:
    """After a scripted mix of jobs every SPEC 9 metric has the expected counts."""
    ok = (
        await (
            await harness.submit(
                [{"state": "running", "poll_after_seconds": 3}, {"state": "succeeded"}], key="a"
            )
        ).json()
    )["id"]
    bad = (await (await harness.submit([{"state": "mystery"}], key="b")).json())["id"]
    flaky = (
        await (
            await harness.submit(
                [
                    {"http": 503, "retry_after": "30"},
                    {"state": "running", "poll_after_seconds": -1},
                ],
                key="c",
            )
        ).json()
    )["id"]
    waiting = (await (await harness.submit([{"state": "running"}], key="d")).json())["id"]
    await harness.poll(ok)  # too early
    await harness.poll(ok)  # too early
    for _ in range(2):
        await harness.poll_when_due(ok)
    await harness.poll(ok)  # cached
    await harness.poll_when_due(bad)
    await harness.poll_when_due(flaky)
    await harness.poll_when_due(flaky)
    await harness.client.get("/p/demo-jobs/v1/nothing", headers=harness.auth())
    del waiting

    s = await scrape(harness)
    agent = "statusgate_agent_requests_total"
    assert value(s, agent, provider="demo-jobs", route="submit", outcome="forwarded") == 4
    assert value(s, agent, provider="demo-jobs", route="status", outcome="too-early") == 2
    assert value(s, agent, provider="demo-jobs", route="status", outcome="forwarded") == 3
    assert value(s, agent, provider="demo-jobs", route="status", outcome="cached") == 1
    assert value(s, agent, provider="demo-jobs", route="status", outcome="operation-escalated") == 1
    assert (
        value(s, agent, provider="demo-jobs", route="status", outcome="provider-unavailable") == 1
    )
    up = "statusgate_upstream_requests_total"
    assert value(s, up, provider="demo-jobs", route="submit", status_class="2xx") == 4
    assert value(s, up, provider="demo-jobs", route="status", status_class="2xx") == 4
    assert value(s, up, provider="demo-jobs", route="status", status_class="5xx") == 1
    assert (
        value(
            s,
            "statusgate_upstream_request_duration_seconds_count",
            provider="demo-jobs",
            route="status",
        )
        == 5
    )
    assert value(s, "statusgate_request_duration_seconds_count", route="status") == 8
    assert value(s, "statusgate_operations_started_total", provider="demo-jobs") == 4
    assert (
        value(s, "statusgate_operations_finished_total", provider="demo-jobs", outcome="succeeded")
        == 1
    )
    assert (
        value(s, "statusgate_escalations_total", provider="demo-jobs", reason="unknown_state") == 1
    )
    assert value(s, "statusgate_operations_active", provider="demo-jobs") == 2
    assert value(s, "statusgate_operations_active", provider="batch-api") == 0
    guidance = "statusgate_provider_guidance_total"
    assert value(s, guidance, provider="demo-jobs", source="provider_poll_hint") == 1
    assert value(s, guidance, provider="demo-jobs", source="provider_retry_after") == 1
    assert value(s, guidance, provider="demo-jobs", source="hint_rejected") == 1
    assert value(s, "statusgate_status_requests_per_operation_count", provider="demo-jobs") == 1
    assert value(s, "statusgate_status_requests_per_operation_sum", provider="demo-jobs") == 2
    assert ("statusgate_store_errors_total", ()) not in s or value(
        s, "statusgate_store_errors_total"
    ) == 0
    text = await (await harness.client.get("/metrics")).text()
    for job in (ok, bad, flaky):
        assert job not in text
    assert re.search(r"op_[0-9A-Z]{26}", text) is None  # no operation id as a label


async def test_store_errors_are_counted(make_harness, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A store call that fails is counted in statusgate_store_errors_total by operation."""
    import sqlite3

    db = tmp_path / "m.db"
    harness = await make_harness(store_url=f"sqlite:///{db}?busy_timeout=100ms")
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        response = await harness.submit([{"state": "running"}])
        assert response.status == 503
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    s = await scrape(harness)
    assert value(s, "statusgate_store_errors_total", operation="claim_idempotency") == 1


async def test_no_created_series_and_a_bounded_scrape_at_start(harness: Harness) -> None:
    """A fresh gateway exports no ``_created`` series, and its whole scrape stays at the
    size of the series SPEC 13 asks for from the start (it was 4,170, half ``_created``)."""
    response = await harness.client.get("/metrics")
    text = await response.text()
    series = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert not [line for line in series if "_created" in line.split("{")[0]]
    providers = len(harness.client.app[RUNTIME].settings.policies)
    assert len(series) <= 320 * providers + 100, (providers, len(series))  # 8 policies: 2,561


def test_tallies_add_up_to_what_direct_observations_make() -> None:
    """The hot path's tallies (plain numbers on the loop) reach prometheus_client's series
    as the same buckets, count, sum and counter values as observing each value directly,
    bound values included; a read of the registry sees them without an explicit flush."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    from gateway.observe.metrics import LATENCY_BUCKETS, Metrics

    values = [0.0, 0.0004, 0.0005, 0.0009, 0.001, 0.003, 0.01, 0.7, 2.5, 9.99, 10.0, 11.0, 1e9]
    with pytest.raises(ValueError):  # refused at once, as Counter.inc refuses it
        Metrics(CollectorRegistry()).counter("agent_requests", "p", "status", "x").inc(-1)
    tallied = Metrics(CollectorRegistry())
    for round_ in range(2):  # a second round after a flush adds to the first
        for seconds in values:
            tallied.histogram("request_duration", "status").observe(seconds)
            tallied.counter("agent_requests", "p", "status", "forwarded").inc()
        tallied.counter("upstream_requests", "p", "status", "2xx").inc(2.5)
        if round_ == 0:
            tallied.flush()
    direct = CollectorRegistry()
    histogram = Histogram(
        "statusgate_request_duration_seconds",
        "Time the gateway took to answer an agent or operator",
        ["route"],
        buckets=LATENCY_BUCKETS,
        registry=direct,
    )
    counter = Counter(
        "statusgate_agent_requests",
        "Agent requests by provider, route and outcome (forwarded, cached or a problem slug)",
        ["provider", "route", "outcome"],
        registry=direct,
    )
    for _ in range(2):
        for seconds in values:
            histogram.labels("status").observe(seconds)
            counter.labels("p", "status", "forwarded").inc()

    def lines(text: bytes, prefix: str) -> list[str]:
        return [
            line
            for line in text.decode().splitlines()
            if line.startswith(prefix) and 'route="status"' in line
        ]

    scraped = generate_latest(tallied.registry)  # no flush asked: the registry flushes
    for prefix in ("statusgate_request_duration_seconds", "statusgate_agent_requests_total"):
        assert lines(scraped, prefix) == lines(generate_latest(direct), prefix), prefix
    assert (
        tallied.registry.get_sample_value(
            "statusgate_upstream_requests_total",
            {"provider": "p", "route": "status", "status_class": "2xx"},
        )
        == 5.0
    )
