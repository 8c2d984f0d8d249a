"""Prometheus metrics of SPEC section 9 on an injected CollectorRegistry.

Labels are providers, routes, outcomes, reasons and classes only: never an operation id,
job id, account token or anything else unbounded or secret.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
REQUEST_BUCKETS = (1, 2, 3, 5, 8, 12, 20, 30, 50, 80, 120, 200)


def status_class(status: int | None, failure: str | None = None) -> str:
    """``2xx``..``5xx`` for HTTP answers, else ``timeout`` or ``error``."""
    if status is not None:
        return f"{status // 100}xx"
    return "timeout" if failure == "timeout" else "error"


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
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

    def set_active(self, counts: dict[str, int], providers: list[str]) -> None:
        for provider in providers:
            self.operations_active.labels(provider).set(counts.get(provider, 0))
