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
propagator that reads an agent's context. A span on the loop is a few slots, and ended, a
tuple in a bounded buffer; a thread encodes batches (otlp.py, a few us a span) and posts them
as OTLP/HTTP protobuf to the endpoint that the standard ``OTEL_EXPORTER_OTLP_*`` variables
name (headers, timeout in seconds as the Python SDK reads it, gzip, TLS files). The batching
variables ``OTEL_BSP_SCHEDULE_DELAY``, ``OTEL_BSP_MAX_QUEUE_SIZE`` and
``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` mean what they mean to the SDK's batch processor; a full
buffer drops spans and says so.

Spans never carry a token, a credential, a query string or an Idempotency-Key: paths are
recorded without their query, and header values are never recorded at all.
"""

from __future__ import annotations

import base64
import gzip
import logging
import os
import random
import ssl
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from . import __version__, otlp

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
        cancellation) an ``exception`` event with its type and stack frames. Never its
        message: a message may quote a URL with its query, a header or a provider's body."""
        kind = type(error)
        module = "" if kind.__module__ == "builtins" else kind.__module__ + "."
        name = module + kind.__qualname__
        self.failed(kind.__name__, name)
        if self.sampled and isinstance(error, Exception):
            frames = "".join(traceback.format_tb(error.__traceback__))
            attributes = {"exception.type": name, "exception.stacktrace": frames}
            self.events = [*(self.events or ()), (time.time_ns(), "exception", attributes)]

    def traceparent(self) -> str:
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{'01' if self.sampled else '00'}"

    def encoded(self) -> bytes:
        """The ended span, OTLP-encoded (by the export thread; the loop never touches an
        ended span again). The attributes that repeat (method, route, status, provider,
        account, outcome) are encoded once per combination and kept, up to BLOCKS
        combinations; the VARYING ones are encoded every time."""
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
        attributes = b""
        if repeating:
            shape = tuple(repeating.items())
            kept = _BLOCKS.get(shape)
            if kept is None:
                kept = otlp.attributes(repeating)
                if len(_BLOCKS) >= BLOCKS:
                    _BLOCKS.clear()
                _BLOCKS[shape] = kept
            attributes = kept
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


VARYING = frozenset({"url.path", "statusgate.request_id", "statusgate.operation_id"})
"""Attributes whose values differ from span to span: never part of a kept block."""
BLOCKS = 4096
_BLOCKS: dict[tuple[tuple[str, str | int], ...], bytes] = {}
_NOTHING = Span()
_current: ContextVar[Span | None] = ContextVar("statusgate_span", default=None)
_random = random.Random()  # span and trace ids: unique, not secret (as the SDK's generator)
# forked workers (statusgate serve --workers N) must not repeat their parent's ids
os.register_at_fork(after_in_child=_random.seed)


class _Tracer:
    """What tracing needs while it is on: the sampler, the W3C propagator, the buffer of
    ended spans and the exporter."""

    def __init__(self, sampler: Any, w3c: Any, exporter: _Exporter) -> None:
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


class _Exporter:
    """Ended spans, buffered on the loop and exported in batches by a thread: encoded by
    otlp.py and posted to the OTLP/HTTP endpoint."""

    def __init__(self, env: Mapping[str, str], resource: Mapping[str, Any]) -> None:
        self.delay = _number(env, "OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
        self.limit = _number(env, "OTEL_BSP_MAX_QUEUE_SIZE", 2048)
        self.batch = min(_number(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512), self.limit)
        self.endpoint = Endpoint.from_env(env)
        self.framing = otlp.resource_and_scope(resource, "statusgate", __version__)
        self.spans: list[Span] = []  # ended spans, encoded by the thread
        self.dropped = 0
        self.wake = threading.Condition()
        self.stopping = False
        self.deadline = float("inf")  # set at stop: the flush at shutdown ends by then
        self.thread = threading.Thread(target=self._run, name="statusgate-traces", daemon=True)
        self.thread.start()

    def add(self, span: Span) -> None:
        """On the loop: never blocks; past the queue limit the span is dropped."""
        spans = self.spans
        if len(spans) >= self.limit:
            self.dropped += 1
            return
        spans.append(span)
        if len(spans) == self.batch:
            with self.wake:
                self.wake.notify()

    def stop(self) -> None:
        """Export what is buffered, within one export timeout in all (each export tried
        once); what is left by then is dropped and counted in a warning. Never hangs."""
        with self.wake:
            self.stopping = True
            self.deadline = time.monotonic() + self.endpoint.timeout
            self.wake.notify()
        self.thread.join(self.endpoint.timeout + 1.0)
        if self.thread.is_alive():  # a collector that neither answers nor refuses
            log.warning("traces: the export at shutdown did not finish; spans dropped")

    def _run(self) -> None:
        while True:
            with self.wake:
                if not self.stopping and len(self.spans) < self.batch:
                    self.wake.wait(self.delay)
                stopping = self.stopping
            while self.spans:
                left = self.deadline - time.monotonic()
                if self.stopping and left <= 0:
                    self.dropped += len(self.spans)
                    self.spans.clear()
                    break
                batch = self.spans[: self.batch]
                del self.spans[: len(batch)]  # the loop only appends: these are the first
                self._export(batch, min(left, self.endpoint.timeout))
            if self.dropped:
                log.warning("traces: %d spans dropped (buffer full or shutdown)", self.dropped)
                self.dropped = 0
            if stopping:
                return

    def _pause(self, seconds: float) -> bool:
        """Wait between attempts; False (give up retrying) once the gateway is stopping."""
        with self.wake:
            if not self.stopping:
                self.wake.wait(seconds)
            return not self.stopping

    def _export(self, batch: list[Span], timeout: float) -> None:
        body = otlp.request(*self.framing, self._encoded(batch))
        retry = not self.stopping
        problem = self.endpoint.post(body, retry=retry, pause=self._pause, timeout=timeout)
        if problem is not None:
            log.warning("traces: %d spans not exported: %s", len(batch), problem)

    @staticmethod
    def _encoded(batch: list[Span]) -> list[bytes]:
        """The batch encoded, a few spans at a time: between them the thread lets go of the
        GIL, so the loop, when it has work, waits tens of microseconds for it, not the
        interpreter's switch interval (5 ms). Encoding here rather than on the loop puts
        the work where the loop is idle (waiting on the store or the provider). A span
        that cannot be encoded is dropped with a warning."""
        encoded = []
        for done, span in enumerate(batch, 1):
            try:
                encoded.append(span.encoded())
            except (ValueError, TypeError, UnicodeError, OverflowError) as exc:
                name, why = span.name, type(exc).__name__
                log.warning("traces: span %r dropped, not encodable: %s", name, why)
            if done % YIELD_EVERY == 0:
                time.sleep(0)  # lets go of the GIL
        return encoded


YIELD_EVERY = 8


def _number(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name, "")
    return int(value) if value.isdigit() and int(value) > 0 else default


@dataclass(frozen=True)
class Endpoint:
    """Where and how spans are posted, from the standard OTLP exporter variables (the
    traces-specific one first, then the general one)."""

    url: str
    headers: dict[str, str]
    timeout: float
    gzip: bool
    tls: ssl.SSLContext | None

    RETRIABLE = (429, 502, 503, 504)
    ATTEMPTS = 4

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Endpoint:
        """Userinfo in the URL (``http://user:password@collector``) becomes HTTP Basic
        authentication, as the SDK's exporter does, and is never said back: errors and the
        start line show the URL without it."""
        from opentelemetry.util.re import parse_env_headers

        def get(name: str, default: str = "") -> str:
            return env.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or env.get(
                f"OTEL_EXPORTER_OTLP_{name}", default
            )

        variable = next(name for name in (*ENDPOINTS, "") if not name or env.get(name))
        url = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or (
            env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").removesuffix("/") + "/v1/traces"
        )
        if not url.startswith(("http://", "https://")):
            raise ValueError(
                f"{variable or 'the OTLP endpoint'} ({shown(url)}) is not an http:// or "
                "https:// URL"
            )
        headers = {
            "Content-Type": "application/x-protobuf",
            "User-Agent": f"statusgate/{__version__}",
        }
        parts = urllib.parse.urlsplit(url)
        if "@" in parts.netloc:
            userinfo, host = parts.netloc.rsplit("@", 1)
            user, _, password = userinfo.partition(":")
            login = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}"
            headers["Authorization"] = "Basic " + base64.b64encode(login.encode()).decode()
            url = urllib.parse.urlunsplit(parts._replace(netloc=host))
        headers.update(parse_env_headers(get("HEADERS"), liberal=True))
        try:
            timeout = float(get("TIMEOUT", "10"))
        except ValueError:
            timeout = 10.0
        tls = None
        if url.startswith("https:"):
            tls = ssl.create_default_context(cafile=get("CERTIFICATE") or None)
            if get("CLIENT_CERTIFICATE"):
                tls.load_cert_chain(get("CLIENT_CERTIFICATE"), get("CLIENT_KEY") or None)
        return cls(
            url,
            headers,
            timeout if timeout > 0 else 10.0,
            get("COMPRESSION").lower() == "gzip",
            tls,
        )

    def post(
        self,
        body: bytes,
        *,
        retry: bool,
        pause: Callable[[float], bool] | None = None,
        timeout: float | None = None,
    ) -> str | None:
        """Post one export request; None when the collector took it, else what went wrong.
        Busy answers and connection failures are tried again (up to four attempts, waiting
        1, 2, 4 s or the collector's Retry-After) unless ``retry`` is off (at shutdown).
        ``timeout``: for each attempt, instead of the configured one."""
        headers = dict(self.headers)
        if self.gzip:
            body = gzip.compress(body, compresslevel=6)
            headers["Content-Encoding"] = "gzip"
        problem = "not tried"
        for attempt in range(self.ATTEMPTS if retry else 1):
            wait = float(2**attempt)
            request = urllib.request.Request(self.url, body, headers, method="POST")  # noqa: S310
            try:  # the scheme is http or https: from_env refuses any other
                with urllib.request.urlopen(  # noqa: S310
                    request, timeout=timeout or self.timeout, context=self.tls
                ):
                    return None
            except urllib.error.HTTPError as exc:
                problem = f"the collector answered {exc.code}"
                if exc.code not in self.RETRIABLE:
                    return problem
                after = exc.headers.get("Retry-After", "")
                wait = float(after) if after.isdigit() else wait
            except (OSError, ValueError) as exc:
                problem = (
                    f"the collector at {shown(self.url)} is unreachable ({type(exc).__name__})"
                )
            if attempt + 1 < self.ATTEMPTS and retry:
                if pause is None:
                    time.sleep(min(wait, 30.0))
                elif not pause(min(wait, 30.0)):
                    break
        return problem


def shown(url: str) -> str:
    """A URL as it may be logged: without userinfo, query or fragment."""
    parts = urllib.parse.urlsplit(url if "://" in url else "//" + url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return f"{parts.scheme + ':' if parts.scheme else ''}//{host}{parts.path}"


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
    service = env.get("OTEL_SERVICE_NAME") or "statusgate"
    sampler = TracerProvider().sampler  # as OTEL_TRACES_SAMPLER and its argument say
    resource = Resource.create({"service.name": service}).attributes
    try:
        exporter = _Exporter(env, resource)
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
