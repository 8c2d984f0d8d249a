"""Prometheus metrics of SPEC section 9 on an injected CollectorRegistry.

Labels are providers, routes, outcomes, reasons and classes only: never an operation id,
job id, account token or anything else unbounded or secret.

The series every request touches (``Metrics.child``) are counted first as plain numbers on
the event loop (``Tally``, ``HistogramTally``) and added to prometheus_client's series
before anything reads them: a scrape, any collection of the registry, and with several
workers every FLUSH_SECONDS (their values are files the other workers' scrapes read).
prometheus_client takes a lock per increment; removing the two of a request's metrics
measured ~8% of a too-early refusal's throughput. Tallies are touched on the loop only.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)

from gateway import __version__
from gateway.core.models import Outcome, Reason
from gateway.core.problems import PROBLEMS

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
REQUEST_BUCKETS = (1, 2, 3, 5, 8, 12, 20, 30, 50, 80, 120, 200)
ROUTES = ("submit", "status", "result", "cancel", "passthrough")
# Not primed as agent outcomes: ``overloaded`` is refused before the provider and route are
# known (its own counter); ``unknown-key`` answers the keys API only, never an agent route.
NOT_AGENT_OUTCOMES = ("overloaded", "unknown-key")
AGENT_OUTCOMES = (
    "forwarded",
    "cached",
    *(slug for slug in PROBLEMS if slug not in NOT_AGENT_OUTCOMES),
)
STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx", "error", "timeout")
FINISHED = (*(o.value for o in Outcome if o.terminal), "abandoned")
HOLD_BOUNDS = ("account", "total")
GUIDANCE = ("provider_retry_after", "provider_poll_hint", "hint_rejected")
STORE_OPERATIONS = (
    "acquire_lease",
    "active_counts",
    "claim_idempotency",
    "create",
    "drop_idempotency",
    "escalation_queue",
    "find",
    "get",
    "list",
    "mutate",
    "open",
    "open_escalations",
    "overdue",
    "pace",
    "ping",
    "purge",
    "put_idempotency",
    "release_lease",
    "save",
    "tighten",
    "time",
)


# A ``_created`` series per counter and histogram child doubled the scrape (4,170 series at
# start, half of them timestamps no dashboard or alert reads): not exported.
disable_created_metrics()  # type: ignore[no-untyped-call]

# ``statusgate serve --workers N`` sets this before prometheus_client is imported: every
# worker writes its values to files there, and a scrape of any worker sums them up.
MULTIPROCESS = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
FLUSH_SECONDS = 1.0  # with several workers: how often tallies reach the shared files


def exposition(metrics: Metrics) -> bytes:
    """The text a scrape gets: this process's registry, or with several workers the values
    of all of them (counters and histograms summed, gauges the most recent)."""
    metrics.flush()
    if not MULTIPROCESS:
        return bytes(generate_latest(metrics.registry))
    merged = CollectorRegistry()
    multiprocess.MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
    return bytes(generate_latest(merged))


def status_class(status: int | None, failure: str | None = None) -> str:
    """``2xx``..``5xx`` for HTTP answers, else ``timeout`` or ``error``."""
    if status is not None:
        return f"{status // 100}xx"
    return "timeout" if failure == "timeout" else "error"


class Tally:
    """A counter series' increments, kept as a number until ``flush`` adds them to it."""

    __slots__ = ("pending", "series")

    def __init__(self, series: Any) -> None:
        self.series = series
        self.pending = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:  # refused here, as Counter.inc refuses it, not at the next scrape
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.pending += amount

    def flush(self) -> None:
        if self.pending:
            amount, self.pending = self.pending, 0.0
            self.series.inc(amount)


class HistogramTally:
    """A histogram series' observations, kept as per-bucket counts and a sum until ``flush``
    adds them to it: the same buckets, count and sum as ``observe`` would have made."""

    __slots__ = ("bounds", "counts", "series", "total")

    def __init__(self, series: Any) -> None:
        self.series = series
        self.bounds: list[float] = list(series._upper_bounds)  # ends with +Inf
        self.counts = [0] * len(self.bounds)
        self.total = 0.0

    def observe(self, amount: float) -> None:
        """As ``Histogram.observe``: the first bucket whose bound is >= ``amount`` (NaN:
        none, only the sum)."""
        self.total += amount
        if amount == amount:
            self.counts[bisect_left(self.bounds, amount)] += 1

    def flush(self) -> None:
        counts = self.counts
        if not any(counts) and not self.total:
            return
        total, self.counts, self.total = self.total, [0] * len(counts), 0.0
        buckets = self.series._buckets
        for index, count in enumerate(counts):
            if count:
                buckets[index].inc(count)
        self.series._sum.inc(total)


class _Flush:
    """Registered before every metric: collected first, so a registry read anywhere (a
    scrape, ``get_sample_value``) sees what the tallies hold. Exports nothing itself."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> list[Any]:
        self._metrics.flush()
        return []


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._children: dict[tuple[str, tuple[str, ...]], Tally | HistogramTally] = {}
        r = self.registry
        r.register(_Flush(self))
        self.agent_requests = Counter(
            "statusgate_agent_requests",
            "Agent requests by provider, route and outcome (forwarded, cached or a problem slug)",
            ["provider", "route", "outcome"],
            registry=r,
        )
        self.upstream_requests = Counter(
            "statusgate_upstream_requests",
            "Requests sent to providers by status class",
            ["provider", "route", "status_class"],
            registry=r,
        )
        self.upstream_duration = Histogram(
            "statusgate_upstream_request_duration_seconds",
            "Time from sending a provider request to its complete answer",
            ["provider", "route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.request_duration = Histogram(
            "statusgate_request_duration_seconds",
            "Time the gateway took to answer an agent or operator",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.operations_started = Counter(
            "statusgate_operations_started",
            "Operations recorded after a successful submit",
            ["provider"],
            registry=r,
        )
        self.operations_finished = Counter(
            "statusgate_operations_finished",
            "Operations that stopped waiting, by outcome",
            ["provider", "outcome"],
            registry=r,
        )
        self.escalations = Counter(
            "statusgate_escalations",
            "Escalations by reason",
            ["provider", "reason"],
            registry=r,
        )
        self.operations_active = Gauge(
            "statusgate_operations_active",
            "Pending operations in the store (the whole store, not only this replica's)",
            ["provider"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.provider_pauses_clamped = Counter(
            "statusgate_provider_pauses_clamped",
            "Provider-wide pauses asked for longer than polling.max_provider_pause, clamped",
            ["provider"],
            registry=r,
        )
        self.provider_guidance = Counter(
            "statusgate_provider_guidance",
            "Provider timing guidance used (or rejected) for scheduling",
            ["provider", "source"],
            registry=r,
        )
        self.requests_per_operation = Histogram(
            "statusgate_status_requests_per_operation",
            "Status requests an operation used, observed when it stops waiting",
            ["provider"],
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.store_errors = Counter(
            "statusgate_store_errors",
            "Store calls that failed; the gateway answered store-unavailable",
            ["operation"],
            registry=r,
        )
        self.overloaded = Counter(
            "statusgate_overloaded_requests",
            "Agent requests answered 503 overloaded (limits.max_in_flight in hand, or"
            " limits.max_connections open)",
            registry=r,
        )

        self.keys_changed = Counter(
            "statusgate_keys_changed",
            "Agent keys made (event=key_created) or revoked (event=key_revoked) through the"
            " operator API",
            ["event"],
            registry=r,
        )
        self.holds_declined = Counter(
            "statusgate_holds_declined",
            "Status calls that asked to be held, answered at once: limits.max_held_per_account"
            " (bound=account) or limits.max_held (bound=total) were held already",
            ["provider", "bound"],
            registry=r,
        )
        self.escalations_open = Gauge(
            "statusgate_escalations_open",
            "Escalated operations waiting on a person's decision (the whole store)",
            ["provider", "reason"],
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.webhook_deliveries = Counter(
            "statusgate_webhook_deliveries",
            "Webhook deliveries by result (delivered, failed after every attempt, dropped)",
            ["result"],
            registry=r,
        )
        self.usage = Counter(
            "statusgate_usage",
            "Usage numbers the final answers reported (the policies' usage: keys), counted"
            " once per operation when recorded",
            ["provider", "account", "kind"],
            registry=r,
        )
        self.completion_deliveries = Counter(
            "statusgate_completion_deliveries",
            "operation.completed attempts by result (delivered, failed: tried again later,"
            " given_up: owed past 7 days, dropped: no webhook configured; both marked sent"
            " unposted)",
            ["result"],
            registry=r,
        )
        self.pushes = Counter(
            "statusgate_pushes",
            "Provider pushes at /hooks/<provider> by result (applied, polled, pending,"
            " ignored, replayed, unknown_job, invalid, refused)",
            ["provider", "result"],
            registry=r,
        )
        self.config_reloads = Counter(
            "statusgate_config_reloads",
            "Live reloads of the config and policies by result",
            ["result"],
            registry=r,
        )
        build = Gauge(
            "statusgate_build_info",
            "The running Statusgate version",
            ["version"],
            registry=r,
            multiprocess_mode="max",
        )
        build.labels(__version__).set(1)
        if not MULTIPROCESS:  # with --workers, each worker's own figures would mislead
            ProcessCollector(registry=r)
        for result in ("delivered", "failed", "dropped"):
            self.webhook_deliveries.labels(result)
        for result in ("ok", "error"):
            self.config_reloads.labels(result)
        for result in ("delivered", "failed", "given_up", "dropped"):
            self.completion_deliveries.labels(result)
        self.last_reload_ok = Gauge(
            "statusgate_config_last_reload_successful",
            "1 if the last reload was applied (or none was tried), 0 if it was refused",
            registry=r,
            multiprocess_mode="mostrecent",
        )
        self.last_reload_ok.set(1)
        for operation in STORE_OPERATIONS:
            self.store_errors.labels(operation)

    def counter(self, metric: str, *labels: str) -> Tally:
        """The tally of the counter series ``getattr(self, metric).labels(*labels)``, kept:
        the hot path asks for the same few series on every request, and prometheus_client's
        ``labels`` takes a lock and builds a key each time. Label values come from the
        config (providers, routes, outcomes, slugs), so the series are few."""
        found = self._children.get((metric, labels))
        if found is None:
            found = self._children[(metric, labels)] = Tally(self._series(metric, labels))
        assert isinstance(found, Tally), metric
        return found

    def histogram(self, metric: str, *labels: str) -> HistogramTally:
        """The tally of the histogram series ``getattr(self, metric).labels(*labels)``."""
        found = self._children.get((metric, labels))
        if found is None:
            series = self._series(metric, labels)
            found = self._children[(metric, labels)] = HistogramTally(series)
        assert isinstance(found, HistogramTally), metric
        return found

    def _series(self, metric: str, labels: tuple[str, ...]) -> Any:
        return getattr(self, metric).labels(*labels)

    def flush(self) -> None:
        """Add what every tally holds to its series (on the event loop)."""
        for tally in list(self._children.values()):
            tally.flush()

    def prime(self, providers: Iterable[str]) -> None:
        """Every series of every configured provider exists from the start at 0, so that
        ``increase()`` over a first failure reads 1, not nothing (SPEC 13)."""
        for provider in providers:
            for route in ROUTES:
                for outcome in AGENT_OUTCOMES:
                    self.agent_requests.labels(provider, route, outcome)
                for label in STATUS_CLASSES:
                    self.upstream_requests.labels(provider, route, label)
                self.upstream_duration.labels(provider, route)
            self.operations_started.labels(provider)
            for outcome in FINISHED:
                self.operations_finished.labels(provider, outcome)
            for reason in Reason:
                self.escalations.labels(provider, reason.value)
                self.escalations_open.labels(provider, reason.value)
            for source in GUIDANCE:
                self.provider_guidance.labels(provider, source)
            self.operations_active.labels(provider)
            self.requests_per_operation.labels(provider)
            self.provider_pauses_clamped.labels(provider)
            for bound in HOLD_BOUNDS:
                self.holds_declined.labels(provider, bound)
        for route in (*ROUTES, "admin", "mcp", "other"):
            self.request_duration.labels(route)

    def set_active(self, counts: dict[str, int], providers: list[str]) -> None:
        for provider in providers:
            self.operations_active.labels(provider).set(counts.get(provider, 0))

    def set_open(self, counts: dict[tuple[str, str], int], providers: list[str]) -> None:
        """Escalations waiting per provider and reason, as the store counts them."""
        for provider in providers:
            for reason in Reason:
                value = counts.get((provider, reason.value), 0)
                self.escalations_open.labels(provider, reason.value).set(value)
