"""Observe: what the gateway tells people about what it did. The hash-chained audit
log, Prometheus metrics, JSON logs, OpenTelemetry spans and their OTLP export, signed
webhook notices, and ``effects.carry_out``, the one place a step's effects (audit line,
metric changes, notices) are performed.

Decides nothing. May import ``gateway.store`` and the layers below it; never the provider,
flow or HTTP layers.
"""
