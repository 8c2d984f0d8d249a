"""The gateway's own OTLP encoding and export (gateway/otlp.py, export.Endpoint), checked
against the generated classes of opentelemetry-proto and a real HTTP collector."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import math
import os
import socket
import time
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.observe import export, otlp, tracing

from conftest import Exported, otlp_receiver

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
trace_service = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")

scalars = st.one_of(
    st.text(max_size=300),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
)
values = st.one_of(scalars, st.lists(scalars, max_size=4))


def decoded(value: object) -> object:
    """An AnyValue as Python, the way the attributes were given."""
    kind = value.WhichOneof("value")  # type: ignore[attr-defined]
    if kind == "array_value":
        return [decoded(item) for item in value.array_value.values]  # type: ignore[attr-defined]
    return getattr(value, kind)


@settings(max_examples=300, deadline=None)
@given(
    trace_id=st.integers(min_value=1, max_value=2**128 - 1),
    span_id=st.integers(min_value=1, max_value=2**64 - 1),
    parent_id=st.one_of(st.none(), st.integers(min_value=1, max_value=2**64 - 1)),
    remote=st.booleans(),
    state=st.one_of(st.none(), st.sampled_from(["agent=1", "a=b,c=d"])),
    name=st.text(max_size=200),
    kind=st.sampled_from([tracing.SERVER, tracing.CLIENT]),
    start=st.integers(min_value=0, max_value=2**64 - 1),
    attrs=st.dictionaries(st.text(min_size=1, max_size=40), values, max_size=12),
    error=st.one_of(st.none(), st.text(max_size=100)),
    events=st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=2**64 - 1),
            st.text(max_size=40),
            st.dictionaries(st.text(min_size=1, max_size=20), st.text(max_size=300), max_size=3),
        ),
        max_size=2,
    ),
)
def test_every_span_decodes_as_written(
    trace_id: int,
    span_id: int,
    parent_id: int | None,
    remote: bool,
    state: str | None,
    name: str,
    kind: int,
    start: int,
    attrs: dict[str, otlp.AttributeValue],
    error: str | None,
    events: list[otlp.Event],
) -> None:
    """Whatever the ids, names, attribute values and sizes, opentelemetry-proto reads back
    exactly the span that was encoded (alone in a request, and beside another)."""
    framing = otlp.resource_and_scope({"service.name": "sg", "n": 3}, "statusgate", "0.1.0")
    encoded = otlp.span(
        trace_id,
        span_id,
        parent_id,
        remote,
        state,
        name,
        kind,
        start,
        start,
        otlp.attributes(attrs),
        error,
        events,
    )
    for body in (otlp.request(*framing, [encoded]), otlp.request(*framing, [encoded] * 2)):
        request = trace_service.ExportTraceServiceRequest()
        request.ParseFromString(body)
        (resource_spans,) = request.resource_spans
        assert {a.key: decoded(a.value) for a in resource_spans.resource.attributes} == {
            "service.name": "sg",
            "n": 3,
        }
        (scope_spans,) = resource_spans.scope_spans
        assert scope_spans.scope.name == "statusgate"
        span = scope_spans.spans[-1]
        assert int.from_bytes(span.trace_id, "big") == trace_id
        assert int.from_bytes(span.span_id, "big") == span_id
        assert span.parent_span_id == (parent_id.to_bytes(8, "big") if parent_id else b"")
        assert span.trace_state == (state or "")
        assert (span.name, span.kind) == (name, kind)
        assert span.start_time_unix_nano == span.end_time_unix_nano == start
        got = {a.key: decoded(a.value) for a in span.attributes}
        assert got.keys() == attrs.keys()
        for key, value in attrs.items():
            same = got[key] == value or (
                isinstance(value, float) and math.isclose(got[key], value)  # type: ignore[arg-type]
            )
            assert same, (key, value, got[key])
        assert [
            (e.time_unix_nano, e.name, {a.key: decoded(a.value) for a in e.attributes})
            for e in span.events
        ] == events
        assert span.status.code == (2 if error is not None else 0)
        assert span.status.message == (error or "")
        assert span.flags == (0x301 if remote else 0x101)


def _decoded_attributes(encoded: bytes) -> dict[str, object]:
    request = trace_service.ExportTraceServiceRequest()
    request.ParseFromString(otlp.request(b"", b"", [encoded]))
    span = request.resource_spans[0].scope_spans[0].spans[0]
    return {a.key: decoded(a.value) for a in span.attributes}


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.one_of(st.sampled_from(sorted(tracing.VARYING)), st.sampled_from("abc")),
            st.one_of(st.sampled_from([0, 1, True, False, 1.0, "1", "x"]), scalars),
            max_size=5,
        ),
        min_size=1,
        max_size=6,
    )
)
def test_kept_attribute_blocks_never_answer_for_other_values(
    spans: list[dict[str, otlp.AttributeValue]],
) -> None:
    """Spans whose repeating attributes are encoded once and kept: each span still reads
    back exactly as set, types included (True == 1 == 1.0 in Python; a block kept for one
    must never be given for another)."""
    for attrs in spans:
        span = tracing.Span(1, sampled=True)
        span.update(attrs)  # type: ignore[arg-type]
        got = _decoded_attributes(span.encoded())
        assert got.keys() == attrs.keys()
        for key, value in attrs.items():
            assert type(got[key]) is type(value), (key, value, got[key])
            assert got[key] == value or (isinstance(value, float) and math.isnan(value))


def test_the_endpoint_comes_from_the_standard_variables() -> None:
    """The OTLP endpoint, headers, timeout and compression come from the standard
    OTEL_EXPORTER_OTLP_* variables, the traces-specific ones first."""
    base = export.Endpoint.from_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
            "OTEL_EXPORTER_OTLP_HEADERS": "api-key=abc%20def,tenant=t1",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "3",
            "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
        }
    )
    assert base.url == "http://collector:4318/v1/traces"
    assert base.headers["api-key"] == "abc def" and base.headers["tenant"] == "t1"
    assert (base.timeout, base.gzip, base.tls) == (3.0, True, None)
    specific = export.Endpoint.from_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://traces.example/custom",
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "7",
        }
    )
    assert specific.url == "https://traces.example/custom"
    assert specific.timeout == 7.0 and specific.tls is not None
    with pytest.raises(ValueError, match="not an http"):
        export.Endpoint.from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "collector:4318"})


def test_varying_attribute_values_never_enter_the_kept_blocks() -> None:
    """Paths, request ids and operation ids differ on every span: keeping their encodings
    would evict the blocks that repeat, for nothing."""
    otlp._BLOCKS.clear()
    for n in range(3 * otlp.BLOCKS):
        span = tracing.Span(1, sampled=True)
        span.update(
            {
                "url.path": f"/p/demo/v1/jobs/{n}",
                "statusgate.request_id": f"req-{n}",
                "statusgate.operation_id": f"op_{n}",
                "http.request.method": "GET",
                "http.response.status_code": 200,
            }
        )
        span.encoded()
    assert list(otlp._BLOCKS) == [
        (("http.request.method", "GET"), ("http.response.status_code", 200))
    ]


def test_kept_blocks_stay_bounded_whatever_the_values() -> None:
    """A repeating attribute that turns out not to repeat (a new one nobody added to
    VARYING) costs speed, never memory: the kept blocks stay within BLOCKS."""
    otlp._BLOCKS.clear()
    for n in range(3 * otlp.BLOCKS):
        span = tracing.Span(1, sampled=True)
        span.update({"statusgate.new_unique_thing": f"value-{n}", "http.route": "status"})
        span.encoded()
        assert len(otlp._BLOCKS) <= otlp.BLOCKS


def test_userinfo_in_the_endpoint_is_basic_auth_and_never_said() -> None:
    """http://user:password@collector: sent as HTTP Basic authentication, as the SDK does;
    the start line and every error show the URL without it."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel%40team:s3cret-pw@127.0.0.1:9/base"}
    endpoint = export.Endpoint.from_env(env)
    assert endpoint.url == "http://127.0.0.1:9/base/v1/traces"
    assert endpoint.headers["Authorization"] == "Basic b3RlbEB0ZWFtOnMzY3JldC1wdw=="
    problem = endpoint.post(b"spans", retry=False)
    assert problem is not None and "127.0.0.1:9" in problem and "s3cret" not in problem
    said = tracing.setup(env)
    tracing.stop()
    assert said.startswith("tracing on: OTLP/HTTP export to http://127.0.0.1:9/")
    assert "s3cret" not in said and "team" not in said
    # a password with /, ? or # left unencoded: the userinfo still ends at the last @
    raw = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:s3/cr?e#t@127.0.0.1:9"}
    endpoint = export.Endpoint.from_env(raw)
    assert endpoint.url == "http://127.0.0.1:9/v1/traces"
    assert base64.b64decode(endpoint.headers["Authorization"][6:]) == b"otel:s3/cr?e#t"
    said = tracing.setup(raw)
    tracing.stop()
    assert "s3" not in said and "cr" not in said, said
    problem = endpoint.post(b"spans", retry=False)
    assert problem is not None and "s3/" not in problem
    bad = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "otel:s3cret-pw@collector:4318/v1/traces"}
    with pytest.raises(ValueError) as refused:
        export.Endpoint.from_env(bad)
    assert "s3cret" not in str(refused.value)
    assert "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (//collector:4318/v1/traces)" in str(refused.value)


@pytest.fixture
async def collector() -> AsyncIterator[tuple[Exported, str]]:
    """A collector that is busy once (503, Retry-After: 0), then takes every export."""
    async with otlp_receiver(busy_once=True) as (got, url):
        yield got, url


async def test_an_export_is_tried_again_when_the_collector_is_busy(
    collector: tuple[Exported, str],
) -> None:
    """A busy collector's answer is tried again and the retry goes through."""
    got, url = collector
    endpoint = export.Endpoint.from_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": url,
            "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer collector-key",
        }
    )
    assert await asyncio.to_thread(endpoint.post, b"spans", retry=True) is None
    assert len(got) == 2
    headers, body = got[1]
    assert headers["content-encoding"] == "gzip"
    assert body == b"spans"  # aiohttp gunzipped it: it was gzip
    assert headers["content-type"] == "application/x-protobuf"
    assert headers["authorization"] == "Bearer collector-key"
    got.clear()
    assert await asyncio.to_thread(endpoint.post, b"spans", retry=False) == (
        "the collector answered 503"
    )


async def test_an_unreachable_collector_is_a_reason_not_an_exception() -> None:
    """An unreachable collector gives a reason to log, never an exception."""
    endpoint = export.Endpoint.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    problem = await asyncio.to_thread(endpoint.post, b"spans", retry=False)
    assert problem is not None and "unreachable (ConnectionRefusedError)" in problem


def test_the_sampler_decides_roots_once_when_it_can() -> None:
    """Always-on and always-off samplers decide root spans once; a ratio sampler decides per
    span."""
    on = "ParentBased{root:AlwaysOnSampler,remoteParentSampled:AlwaysOnSampler}"
    assert tracing._static_root_decision(on) is True
    assert tracing._static_root_decision("AlwaysOffSampler") is False
    assert tracing._static_root_decision("ParentBased{root:TraceIdRatioBased{0.5},x}") is None


def test_otel_sdk_disabled_turns_tracing_off() -> None:
    """OTEL_SDK_DISABLED=true turns tracing off even with an endpoint set, and says so."""
    env = {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    assert tracing.setup(env) == "tracing off: OTEL_SDK_DISABLED is true"
    assert not tracing.enabled()


def test_forked_workers_make_ids_of_their_own() -> None:
    """statusgate serve --workers N forks after import: trace, span and request ids and
    lease tokens must not repeat the parent's sequence."""
    from gateway.flow.leases import new_token
    from gateway.observe.context import request_id_from

    def ids() -> str:
        return f"{request_id_from(None)} {tracing._random.getrandbits(64)} {new_token()}"

    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child process
        os.write(write, ids().encode())
        os._exit(0)
    os.waitpid(child, 0)
    theirs = os.read(read, 200).decode().split()
    os.close(read)
    os.close(write)
    ours = ids().split()
    assert all(a != b for a, b in zip(theirs, ours, strict=True))


def _exporter(url: str, timeout: str = "10", **batching: str) -> export.Exporter:
    """An exporter to ``url`` that waits to be woken (or stopped); ``batching``: the
    OTEL_BSP_ variables without their prefix."""
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": url,
        "OTEL_EXPORTER_OTLP_TIMEOUT": timeout,
        "OTEL_BSP_SCHEDULE_DELAY": "600000",
        **{f"OTEL_BSP_{name}": value for name, value in batching.items()},
    }
    return export.Exporter(env, {"service.name": "sg"})


def _spans(count: int) -> list[tracing.Span]:
    return [tracing.Span(n + 1, sampled=True, name="GET /p") for n in range(count)]


def _exported(bodies: Exported) -> int:
    count = 0
    for _, body in bodies:
        request = trace_service.ExportTraceServiceRequest()
        request.ParseFromString(body)
        count += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
    return count


async def test_stop_exports_every_buffered_span_at_once() -> None:
    """At shutdown the buffer is exported whole, in batches, without waiting for the
    schedule delay."""
    async with otlp_receiver() as (got, url):
        exporter = _exporter(url, MAX_EXPORT_BATCH_SIZE="100", MAX_QUEUE_SIZE="1000")
        for span in _spans(950):
            exporter.spans.append(span)  # as add() does, without waking the thread
        started = time.monotonic()
        await asyncio.to_thread(exporter.stop)
        assert time.monotonic() - started < 5
        assert not exporter.thread.is_alive()
        assert _exported(got) == 950 and len(got) == 10


async def test_stop_is_bounded_when_the_collector_never_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A collector that takes connections and never answers: stop returns within the
    export timeout (here 0.5 s) and says how many spans it dropped; it never hangs."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)  # connections complete in the backlog; nothing is ever read
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        exporter = _exporter(url, timeout="0.5", MAX_EXPORT_BATCH_SIZE="100")
        exporter.spans.extend(_spans(500))
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="statusgate"):
            await asyncio.to_thread(exporter.stop)
        took = time.monotonic() - started
        assert took < 3, took  # one export timeout (0.5 s), not one per batch
        exporter.thread.join(2)
        assert not exporter.thread.is_alive()
    said = caplog.text
    assert "100 spans not exported" in said and "400 spans dropped" in said, said


def test_the_timeout_is_seconds_or_else_milliseconds_and_headers_are_never_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """10 is seconds (as the Python SDK reads it), 10000 milliseconds (as the OpenTelemetry
    specification says); a malformed header entry is skipped and named by position only."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TIMEOUT": "10"}
    assert export.Endpoint.from_env(env).timeout == 10.0
    assert export.Endpoint.from_env({**env, "OTEL_EXPORTER_OTLP_TIMEOUT": "10000"}).timeout == 10.0
    headers = "tenant=t1,Authorization: Bearer hidden-token,x-key=a%3Db"
    with caplog.at_level(logging.WARNING, logger="statusgate"):
        endpoint = export.Endpoint.from_env({**env, "OTEL_EXPORTER_OTLP_HEADERS": headers})
    assert endpoint.headers["tenant"] == "t1" and endpoint.headers["x-key"] == "a=b"
    assert "Authorization" not in endpoint.headers
    assert "entry 2 is not name=value" in caplog.text and "hidden-token" not in caplog.text


class _Raw:
    """A TCP server on loopback that answers every connection with ``answer`` and closes."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            with contextlib.suppress(ConnectionError):
                await reader.read(65536)
                writer.write(self.answer)
                await writer.drain()
            writer.close()

        self.server = await asyncio.start_server(serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


async def test_a_collector_that_answers_no_http_is_a_reason_and_the_thread_lives_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A collector that answers garbage (an OTLP/gRPC port, say): each export is a warning,
    the export thread goes on, and a span that fails to encode costs only itself."""

    class Unencodable:
        name = "bad"

        def encoded(self) -> bytes:
            raise RuntimeError("not a span")

    async with _Raw(b"SSH-2.0-nope\r\n\r\n") as url:
        exporter = _exporter(url, MAX_EXPORT_BATCH_SIZE="2")
        with caplog.at_level(logging.WARNING, logger="statusgate"):
            exporter.add(Unencodable())
            exporter.add(_spans(1)[0])  # the batch is full: the thread wakes
            for _ in range(100):
                if "2 spans dropped export failed (RuntimeError)" in caplog.text:
                    break
                await asyncio.sleep(0.02)
            assert exporter.thread.is_alive()
            for span in _spans(2):
                exporter.add(span)
            await asyncio.to_thread(exporter.stop)
    said = caplog.text
    assert "2 spans dropped export failed (RuntimeError)" in said, said
    assert "2 spans not exported: the collector at" in said and "failed (BadStatusLine)" in said


async def test_a_redirecting_collector_is_not_followed() -> None:
    """A redirect is an answer: the spans and the collector's credentials go nowhere else."""
    async with _Raw(b"") as elsewhere:
        moved = f"HTTP/1.1 307 Temporary Redirect\r\nLocation: {elsewhere}/v1/traces\r\n"
        redirecting = _Raw(moved.encode() + b"Content-Length: 0\r\n\r\n")
        async with redirecting as url:
            env = {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_EXPORTER_OTLP_HEADERS": "k=secret"}
            endpoint = export.Endpoint.from_env(env)
            problem = await asyncio.to_thread(endpoint.post, b"spans", retry=False)
        assert problem == "the collector answered 307"
        assert redirecting.connections == 1


async def test_a_full_buffer_is_said_while_the_overload_lasts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Spans dropped because the buffer is full are counted and said after every export,
    not only once the buffer empties (under overload it does not)."""
    async with otlp_receiver() as (got, url):
        exporter = _exporter(url, MAX_QUEUE_SIZE="10", MAX_EXPORT_BATCH_SIZE="5")
        with caplog.at_level(logging.WARNING, logger="statusgate"):
            exporter.spans.extend(_spans(10))  # full, before the thread gets to it
            for span in _spans(7):
                exporter.add(span)
            await asyncio.to_thread(exporter.stop)
        assert _exported(got) == 10
    assert "export buffer full, 7 spans dropped" in caplog.text


def test_an_exception_marks_a_span_without_its_message() -> None:
    """Status ERROR, error.type the exception's qualified class, an exception event with
    its type and frames; never the message (it may quote a URL with a key)."""
    span = tracing.Span(1, sampled=True, name="GET status", kind=tracing.CLIENT)
    try:
        raise TimeoutError("GET https://p.example/jobs?key=secret-in-message")
    except TimeoutError as exc:
        span.raised(exc)
    request = trace_service.ExportTraceServiceRequest()
    request.ParseFromString(otlp.request(b"", b"", [span.encoded()]))
    exported = request.resource_spans[0].scope_spans[0].spans[0]
    assert exported.status.code == exported.status.STATUS_CODE_ERROR
    assert {a.key: decoded(a.value) for a in exported.attributes} == {"error.type": "TimeoutError"}
    (event,) = exported.events
    attrs = {a.key: decoded(a.value) for a in event.attributes}
    assert event.name == "exception" and attrs["exception.type"] == "TimeoutError"
    assert "test_an_exception_marks_a_span_without_its_message" in str(
        attrs["exception.stacktrace"]
    )
    assert b"secret-in-message" not in request.SerializeToString()
