"""OpenTelemetry traces (SPEC 17): a server span per agent request, a client span per
provider call beneath it, W3C trace context continued from the agent and injected into every
provider call.

Optional: on only when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
is set and the ``otel`` extra is installed; configured by the standard ``OTEL_*`` variables
(service name, sampler, batch delays), exported over OTLP/HTTP protobuf. Off, every function
here is a cheap no-op and nothing is imported. Spans never carry a token, a credential, a
query string or an Idempotency-Key: paths are recorded without their query, and header values
are never recorded at all.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


class _State:
    tracer: Any = None  # an opentelemetry Tracer when tracing is on
    provider: Any = None  # its TracerProvider, flushed at stop
    w3c: Any = None  # the W3C trace-context propagator (traceparent, tracestate only)
    server: Any = None  # SpanKind.SERVER
    client: Any = None  # SpanKind.CLIENT


_state = _State()


def setup(environ: Mapping[str, str] | None = None) -> str:
    """Turn tracing on if the environment asks for it and the SDK is there; the one line
    to log once the gateway serves, saying whether tracing is on, or why it is off."""
    env = os.environ if environ is None else environ
    if not any(env.get(name) for name in ENDPOINTS):
        return "tracing off: OTEL_EXPORTER_OTLP_ENDPOINT is not set"
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        return "tracing off: the otel extra is not installed (pip install statusgate[otel])"
    service = env.get("OTEL_SERVICE_NAME") or "statusgate"
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _state.provider = provider
    _state.tracer = trace.get_tracer("statusgate", tracer_provider=provider)
    _state.w3c = TraceContextTextMapPropagator()
    _state.server, _state.client = trace.SpanKind.SERVER, trace.SpanKind.CLIENT
    return f"tracing on: OTLP/HTTP export as service {service}"


def stop() -> None:
    """Export what is still buffered (at shutdown)."""
    if _state.provider is not None:
        _state.provider.shutdown()
        _state.provider = _state.tracer = None


def enabled() -> bool:
    return _state.tracer is not None


class Span:
    """A started span, or nothing when tracing is off; attributes are set through it."""

    def __init__(self, span: Any = None) -> None:
        self._span = span if span is not None and span.is_recording() else None

    @property
    def recording(self) -> bool:
        """Attributes are kept (tracing is on and this trace is sampled): callers skip
        gathering them otherwise."""
        return self._span is not None

    def set(self, **attributes: str | int | float | None) -> None:
        if self._span is None:
            return
        self._span.set_attributes(
            {
                name.replace("__", "."): value
                for name, value in attributes.items()
                if value is not None
            }
        )

    def failed(self, why: str) -> None:
        if self._span is not None:
            from opentelemetry.trace import Status, StatusCode

            self._span.set_status(Status(StatusCode.ERROR, why))


@contextlib.contextmanager
def server_span(name: str, headers: Mapping[str, str]) -> Iterator[Span]:
    """The span of one agent request, continuing the agent's ``traceparent``."""
    tracer = _state.tracer
    if tracer is None:
        yield Span()
        return
    carrier = {key: value for key in _W3C if (value := headers.get(key)) is not None}
    parent = _state.w3c.extract(carrier) if carrier else None
    with tracer.start_as_current_span(name, context=parent, kind=_state.server) as span:
        yield Span(span)


@contextlib.contextmanager
def client_span(name: str, headers: MutableMapping[str, str]) -> Iterator[Span]:
    """The span of one provider call; its ``traceparent`` goes into ``headers``."""
    tracer = _state.tracer
    if tracer is None:
        yield Span()
        return
    for key in [k for k in headers if k.lower() in _W3C]:
        del headers[key]  # the agent's own: this span's context replaces it
    with tracer.start_as_current_span(name, kind=_state.client) as span:
        _state.w3c.inject(headers)
        yield Span(span)


_W3C = ("traceparent", "tracestate")
