"""OpenTelemetry traces (SPEC 17): a server span per agent request, a client span per
provider call beneath it, W3C trace context continued from the agent and injected into every
provider call.

Optional: on only when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
is set and the ``otel`` extra is installed. Off, every function here is a cheap no-op and
nothing is imported.

Where the cost goes, measured: the SDK's tracer spends ~35 us per span on the event loop and
its OTLP encoder ~38 us per span (under the GIL), together about a quarter of a forwarded
poll. So the SDK does what it does once: the sampler (``OTEL_TRACES_SAMPLER`` and its
argument), the resource (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``) and the W3C
propagator that reads an agent's context. A span on the loop is a few slots and the mappings
of attributes given to it; ended, it goes to a bounded buffer, and a thread (export.py)
encodes batches (otlp.py) and posts them as OTLP/HTTP protobuf.

Spans never carry a token, a credential, a query string or an Idempotency-Key: paths are
recorded without their query, and header values are never recorded at all.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
import traceback
from collections.abc import Mapping, MutableMapping
from contextvars import ContextVar
from typing import Any

from gateway.observe import otlp
from gateway.observe.export import Exporter, shown

log = logging.getLogger("statusgate")

ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
SERVER, CLIENT = 2, 3  # as OTLP numbers them (SpanKind in trace.proto)


class Span:
    """A started span, or nothing when tracing is off; attributes are set through it."""

    __slots__ = (
        "attributes",
        "end",
        "error",
        "events",
        "kind",
        "name",
        "parent_id",
        "remote",
        "sampled",
        "span_id",
        "start",
        "state",
        "trace_id",
    )

    def __init__(
        self,
        trace_id: int = 0,
        parent_id: int | None = None,
        *,
        remote: bool = False,
        sampled: bool = False,
        state: str | None = None,
        name: str = "",
        kind: int = SERVER,
    ) -> None:
        self.trace_id = trace_id
        self.span_id = (_random.getrandbits(64) or 1) if trace_id else 0
        self.parent_id = parent_id
        self.remote = remote
        self.sampled = sampled
        self.state = state
        self.name = name
        self.kind = kind
        self.start = time.time_ns()
        self.end = 0
        self.attributes: list[Mapping[str, Any]] = []  # as given; sorted out when encoded
        self.error: str | None = None
        self.events: list[otlp.Event] | None = None

    @property
    def recording(self) -> bool:
        """Attributes are kept (tracing is on and this trace is sampled): callers skip
        gathering them otherwise."""
        return self.sampled

    def update(self, attributes: Mapping[str, str | int | float | None]) -> None:
        """Set these attributes (a None value sets nothing). The mapping is kept as it is
        and read when the span is encoded, off the loop: it must not change afterwards."""
        if self.sampled:
            self.attributes.append(attributes)

    def failed(self, why: str, error_type: str | None = None) -> None:
        """Status ERROR with ``why``; ``error_type`` is the semantic conventions'
        ``error.type`` (an exception's qualified class name, or an HTTP status code)."""
        if not self.sampled:  # not exported (and the shared span of tracing off)
            return
        self.error = why
        if error_type is not None:
            self.attributes.append({"error.type": error_type})

    def raised(self, error: BaseException) -> None:
        """Failed by ``error``: status ERROR, ``error.type``, and (for an Exception, not a
        cancellation) an ``exception`` event with its type and stack frames (file, line,
        function). Never its message: a message may quote a URL with its query, a header or
        a provider's body."""
        if isinstance(error, asyncio.CancelledError):  # the agent went away, say
            self.failed("cancelled", "cancelled")
            return
        kind = type(error)
        module = "" if kind.__module__ == "builtins" else kind.__module__ + "."
        name = module + kind.__qualname__
        self.failed(kind.__name__, name)
        if self.sampled and isinstance(error, Exception):
            frames = "".join(  # where, not what: no source lines, no values
                f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}\n'
                for frame in traceback.StackSummary.extract(
                    traceback.walk_tb(error.__traceback__), lookup_lines=False
                )
            )
            attributes = {"exception.type": name, "exception.stacktrace": frames}
            self.events = [*(self.events or ()), (time.time_ns(), "exception", attributes)]

    def traceparent(self) -> str:
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{'01' if self.sampled else '00'}"

    def encoded(self) -> bytes:
        """The ended span, OTLP-encoded (by the export thread; the loop never touches an
        ended span again). The attributes that repeat (method, route, status, provider,
        account, outcome) are encoded once per combination and kept (otlp.py); the
        VARYING ones are encoded every time."""
        repeating: dict[str, str | int] = {}
        varying: dict[str, Any] = {}
        for given in self.attributes:
            for key, value in given.items():
                if value is None:
                    continue
                # exact types: True == 1 == 1.0; a kept block must never answer for another
                if key not in VARYING and (type(value) is str or type(value) is int):
                    repeating[key] = value
                    varying.pop(key, None)
                else:
                    varying[key] = value
                    repeating.pop(key, None)
        attributes = otlp.repeating_attributes(repeating) if repeating else b""
        if varying:
            attributes += otlp.attributes(varying)
        return otlp.span(
            self.trace_id,
            self.span_id,
            self.parent_id,
            self.remote,
            self.state,
            self.name,
            self.kind,
            self.start,
            self.end,
            attributes,
            self.error,
            self.events,
        )


VARYING = frozenset(
    {
        "url.path",
        "statusgate.request_id",
        "statusgate.operation_id",
        "http.request.method_original",  # whatever an agent sent
    }
)
"""Attributes whose values differ from span to span: never part of a kept block."""
_NOTHING = Span()
_current: ContextVar[Span | None] = ContextVar("statusgate_span", default=None)
_random = random.Random()  # span and trace ids: unique, not secret (as the SDK's generator)
# forked workers (statusgate serve --workers N) must not repeat their parent's ids
os.register_at_fork(after_in_child=_random.seed)


class _Tracer:
    """What tracing needs while it is on: the sampler, the W3C propagator, the buffer of
    ended spans and the exporter."""

    def __init__(self, sampler: Any, w3c: Any, exporter: Exporter) -> None:
        from opentelemetry import trace

        self.sampler = sampler
        self.w3c = w3c
        self.exporter = exporter
        self._trace = trace
        self._kinds = {SERVER: trace.SpanKind.SERVER, CLIENT: trace.SpanKind.CLIENT}
        self.roots = _static_root_decision(sampler.get_description())

    def start(self, name: str, kind: int, carrier: Mapping[str, str] | None) -> Span:
        """A span beneath the current one, or beneath the agent's context in ``carrier``,
        or a new trace's root; sampled as the configured sampler decides."""
        parent = _current.get()
        if parent is not None and parent.trace_id:
            return Span(
                parent.trace_id,
                parent.span_id,
                sampled=parent.sampled,  # a child follows its local parent, as ParentBased
                state=parent.state,
                name=name,
                kind=kind,
            )
        if not carrier and self.roots is not None:  # a root, decided alike for every trace
            trace_id = _random.getrandbits(128) or 1
            return Span(trace_id, None, sampled=self.roots, name=name, kind=kind)
        context = self.w3c.extract(carrier) if carrier else None
        remote = self._trace.get_current_span(context).get_span_context()
        trace_id = remote.trace_id if remote.is_valid else _random.getrandbits(128) or 1
        decision = self.sampler.should_sample(context, trace_id, name, self._kinds[kind])
        state = decision.trace_state if decision.trace_state is not None else remote.trace_state
        return Span(
            trace_id,
            remote.span_id if remote.is_valid else None,
            remote=remote.is_valid,
            sampled=decision.decision.is_sampled(),
            state=state.to_header() or None if state is not None else None,
            name=name,
            kind=kind,
        )


def _static_root_decision(description: str) -> bool | None:
    """Whether the sampler samples every new trace (True), none (False), or decides per
    trace (None), from its description; asking it costs ~8 us a request."""
    root = description.removeprefix("ParentBased{root:").split(",", 1)[0]
    return {"AlwaysOnSampler": True, "AlwaysOffSampler": False}.get(root)


class _State:
    tracer: _Tracer | None = None


_state = _State()


def setup(environ: Mapping[str, str] | None = None) -> str:
    """Turn tracing on if the environment asks for it and the SDK is there; the one line
    to log once the gateway serves, saying whether tracing is on, or why it is off."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return "tracing off: OTEL_SDK_DISABLED is true"
    if not any(env.get(name) for name in ENDPOINTS):
        return "tracing off: OTEL_EXPORTER_OTLP_ENDPOINT is not set"
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return "tracing off: the otel extra is not installed (pip install statusgate[otel])"
    # the SDK reads OTEL_TRACES_SAMPLER (and _ARG), OTEL_SERVICE_NAME and
    # OTEL_RESOURCE_ATTRIBUTES from the process environment
    sampler = TracerProvider().sampler
    resource = dict(Resource.create().attributes)
    if str(resource.get("service.name", "")).startswith("unknown_service"):
        resource["service.name"] = "statusgate"  # SPEC 17's default, not the SDK's
    service = resource["service.name"]
    try:
        exporter = Exporter(env, resource)
    except (ValueError, OSError) as exc:  # an endpoint that is no URL, a TLS file missing
        return f"tracing off: {exc}"
    _state.tracer = _Tracer(sampler, TraceContextTextMapPropagator(), exporter)
    return f"tracing on: OTLP/HTTP export to {shown(exporter.endpoint.url)} as service {service}"


def stop() -> None:
    """Export what is still buffered (at shutdown)."""
    tracer, _state.tracer = _state.tracer, None
    if tracer is not None:
        tracer.exporter.stop()


def enabled() -> bool:
    return _state.tracer is not None


def replaced() -> frozenset[str]:
    """Agent headers (lower case) never forwarded as they are: with tracing on, each
    provider call carries the W3C context of its own span instead."""
    return _W3C_SET if _state.tracer is not None else _NONE


_NONE: frozenset[str] = frozenset()


class _Off:
    """The context of a span when tracing is off: nothing."""

    __slots__ = ()

    def __enter__(self) -> Span:
        return _NOTHING

    def __exit__(self, *exc: object) -> None:
        return None


_OFF = _Off()


class _Current:
    """A started span for the length of a ``with``: current (its provider calls are its
    children) when ``current``; a failure inside marks it; ended, it goes to the exporter.
    A class rather than a generator context manager: two of these run per request."""

    __slots__ = ("_span", "_token", "_tracer")

    def __init__(self, tracer: _Tracer, span: Span, *, current: bool) -> None:
        self._tracer = tracer
        self._span = span
        self._token = _current.set(span) if current else None

    def __enter__(self) -> Span:
        return self._span

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: object
    ) -> None:
        if error is not None:
            self._span.raised(error)
        if self._token is not None:
            _current.reset(self._token)
        _end(self._tracer, self._span)


def server_span(name: str, headers: Mapping[str, str]) -> _Off | _Current:
    """The span of one agent request, continuing the agent's ``traceparent``; provider
    calls made while it is current (held polls included) become its children."""
    tracer = _state.tracer
    if tracer is None:
        return _OFF
    carrier = {key: value for key in _W3C if (value := headers.get(key)) is not None}
    return _Current(tracer, tracer.start(name, SERVER, carrier), current=True)


def client_span(name: str, headers: MutableMapping[str, str]) -> _Off | _Current:
    """The span of one provider call; its ``traceparent`` goes into ``headers``."""
    tracer = _state.tracer
    if tracer is None:
        return _OFF
    span = tracer.start(name, CLIENT, None)  # headers.to_provider left out the agent's
    headers["traceparent"] = span.traceparent()
    if span.state:
        headers["tracestate"] = span.state
    return _Current(tracer, span, current=False)


def record_exception(error: BaseException) -> None:
    """Mark the current span (the agent request's, or nothing) failed by ``error``: for
    errors the gateway turns into an answer, which never reach the span's ``with``."""
    span = _current.get()
    if span is not None:
        span.raised(error)


def _end(tracer: _Tracer, span: Span) -> None:
    """Hand an ended, sampled span to the exporter."""
    if span.sampled:
        span.end = time.time_ns()
        tracer.exporter.add(span)


_W3C = ("traceparent", "tracestate")
_W3C_SET = frozenset(_W3C)
