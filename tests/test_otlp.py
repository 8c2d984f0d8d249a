"""The gateway's own OTLP encoding and export (gateway/otlp.py, tracing.Endpoint), checked
against the generated classes of opentelemetry-proto and a real HTTP collector."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import time
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import otlp, tracing

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
    exactly the span that was encoded (twice: the second time from the attribute cache)."""
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
    base = tracing.Endpoint.from_env(
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
    specific = tracing.Endpoint.from_env(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://traces.example/custom",
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "7",
        }
    )
    assert specific.url == "https://traces.example/custom"
    assert specific.timeout == 7.0 and specific.tls is not None
    with pytest.raises(ValueError, match="not an http"):
        tracing.Endpoint.from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "collector:4318"})


def test_varying_attribute_values_never_enter_the_kept_blocks() -> None:
    """Paths, request ids and operation ids differ on every span: keeping their encodings
    would evict the blocks that repeat, for nothing."""
    tracing._BLOCKS.clear()
    for n in range(3 * tracing.BLOCKS):
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
    assert list(tracing._BLOCKS) == [
        (("http.request.method", "GET"), ("http.response.status_code", 200))
    ]


def test_userinfo_in_the_endpoint_is_basic_auth_and_never_said() -> None:
    """http://user:password@collector: sent as HTTP Basic authentication, as the SDK does;
    the start line and every error show the URL without it."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel%40team:s3cret-pw@127.0.0.1:9/base"}
    endpoint = tracing.Endpoint.from_env(env)
    assert endpoint.url == "http://127.0.0.1:9/base/v1/traces"
    assert endpoint.headers["Authorization"] == "Basic b3RlbEB0ZWFtOnMzY3JldC1wdw=="
    problem = endpoint.post(b"spans", retry=False)
    assert problem is not None and "127.0.0.1:9" in problem and "s3cret" not in problem
    said = tracing.setup(env)
    tracing.stop()
    assert said.startswith("tracing on: OTLP/HTTP export to http://127.0.0.1:9/")
    assert "s3cret" not in said and "team" not in said
    bad = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "otel:s3cret-pw@collector:4318/v1/traces"}
    with pytest.raises(ValueError) as refused:
        tracing.Endpoint.from_env(bad)
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
    got, url = collector
    endpoint = tracing.Endpoint.from_env(
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
    endpoint = tracing.Endpoint.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    problem = await asyncio.to_thread(endpoint.post, b"spans", retry=False)
    assert problem is not None and "unreachable" in problem


def test_the_sampler_decides_roots_once_when_it_can() -> None:
    on = "ParentBased{root:AlwaysOnSampler,remoteParentSampled:AlwaysOnSampler}"
    assert tracing._static_root_decision(on) is True
    assert tracing._static_root_decision("AlwaysOffSampler") is False
    assert tracing._static_root_decision("ParentBased{root:TraceIdRatioBased{0.5},x}") is None


def test_otel_sdk_disabled_turns_tracing_off() -> None:
    env = {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    assert tracing.setup(env) == "tracing off: OTEL_SDK_DISABLED is true"
    assert not tracing.enabled()


def test_forked_workers_make_ids_of_their_own() -> None:
    """statusgate serve --workers N forks after import: trace, span and request ids must
    not repeat the parent's sequence."""
    from gateway.context import request_id_from

    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child process
        os.write(write, f"{request_id_from(None)} {tracing._random.getrandbits(64)}".encode())
        os._exit(0)
    os.waitpid(child, 0)
    theirs = os.read(read, 200).decode()
    os.close(read)
    os.close(write)
    assert theirs != f"{request_id_from(None)} {tracing._random.getrandbits(64)}"


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
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": url,
            "OTEL_BSP_SCHEDULE_DELAY": "600000",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "100",
            "OTEL_BSP_MAX_QUEUE_SIZE": "1000",
        }
        exporter = tracing._Exporter(env, {"service.name": "sg"})
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
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{silent.getsockname()[1]}",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "0.5",
            "OTEL_BSP_SCHEDULE_DELAY": "600000",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "100",
        }
        exporter = tracing._Exporter(env, {"service.name": "sg"})
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
