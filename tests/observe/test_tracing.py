"""OpenTelemetry traces (SPEC 17) from a real gateway process to a real OTLP/HTTP receiver:
the agent's trace is continued, provider calls are client spans of it and carry its
traceparent to the provider, and no secret is in any exported byte."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.demo.provider import DemoProvider

from conftest import (
    AGENT_TOKEN,
    PROVIDER_KEY,
    Exported,
    RedisServer,
    Served,
    free_port,
    otlp_receiver,
)

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
trace_service = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
AGENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Exported, str]]:
    async with otlp_receiver() as (got, url):
        yield got, url


def spans(bodies: Exported) -> list[Any]:
    found = []
    for _, body in bodies:
        request = trace_service.ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                found.extend(scope.spans)
    return found


def attributes(item: Any) -> dict[str, Any]:
    """A span's or an event's attributes."""
    out: dict[str, Any] = {}
    for pair in item.attributes:
        value = pair.value
        out[pair.key] = value.string_value or value.int_value
    return out


async def test_agent_trace_continues_through_the_gateway_to_the_provider(
    tmp_path: Path,
    upstream: tuple[DemoProvider, str],
    gateways: list[Served],
    receiver: tuple[Exported, str],
) -> None:
    """Server spans continue the agent's traceparent, each provider call is a client span
    beneath them, the provider sees the same trace id, and nothing secret is exported."""
    demo, url = upstream
    bodies, endpoint = receiver
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    served = await Served(tmp_path, url, tmp_path / "g.db", env=env).up()
    gateways.append(served)
    base = f"http://127.0.0.1:{served.port}/p/demo-jobs/v1/jobs"
    parent = {"traceparent": f"00-{TRACE_ID}-{AGENT_SPAN}-01", "tracestate": "agent=1"}
    auth = {"Authorization": f"Bearer {AGENT_TOKEN}", **parent}
    async with aiohttp.ClientSession() as http:
        body = {"input": "x", "demo_script": [{"state": "succeeded"}]}
        headers = {**auth, "Idempotency-Key": "secret-idem-key-1", "X-Request-Id": "trace-1"}
        async with http.post(f"{base}?api_key=query-secret-q1", json=body, headers=headers) as r:
            job = (await r.json())["id"]
        await asyncio.sleep(1.1)
        # header names in another case (as Go's net/http sends them): replaced all the same
        shouting = {"Traceparent": parent["traceparent"], "TraceState": "agent=1"}
        headers = {"Authorization": f"Bearer {AGENT_TOKEN}", **shouting, "Prefer": "wait=5"}
        async with http.get(f"{base}/{job}", headers=headers) as r:
            assert r.headers["Statusgate-Outcome"] == "succeeded"
    await asyncio.to_thread(served.stop)  # the exporter flushes to the receiver at exit
    found = spans(bodies)
    server = [s for s in found if s.kind == s.SPAN_KIND_SERVER]
    client = [s for s in found if s.kind == s.SPAN_KIND_CLIENT]
    assert len(server) == 2 and len(client) == 2, [s.name for s in found]
    assert {s.trace_id.hex() for s in found} == {TRACE_ID}
    assert {s.parent_span_id.hex() for s in server} == {AGENT_SPAN}
    server_ids = {s.span_id for s in server}
    assert all(s.parent_span_id in server_ids for s in client)
    submit_span = next(s for s in server if attributes(s)["http.request.method"] == "POST")
    assert attributes(submit_span)["statusgate.request_id"] == "trace-1"
    assert attributes(submit_span)["statusgate.account"] == "team-a"
    assert attributes(submit_span)["statusgate.provider"] == "demo-jobs"
    assert attributes(submit_span)["statusgate.operation_id"].startswith("op_")
    operation = attributes(submit_span)["statusgate.operation_id"]
    for span in client:
        assert attributes(span)["statusgate.provider"] == "demo-jobs"
        assert attributes(span)["statusgate.account"] == "team-a"
        assert attributes(span)["http.response.status_code"] in (200, 202)
    routes = {attributes(s)["statusgate.route"]: attributes(s) for s in client}
    assert "statusgate.operation_id" not in routes["submit"]  # the provider's answer makes it
    assert routes["status"]["statusgate.operation_id"] == operation
    sent = [e for e in demo.log if e["method"] in ("GET", "POST")]
    client_ids = {s.span_id.hex() for s in client}
    for call in sent:
        _, trace, span_id, _ = call["headers"]["traceparent"].split("-")
        assert trace == TRACE_ID and span_id in client_ids  # the client span's, not the agent's
        assert call["headers"]["tracestate"] == "agent=1"
    exported = b"".join(body for _, body in bodies)
    for secret in (AGENT_TOKEN, PROVIDER_KEY, "secret-idem-key-1", "api_key", "query-secret-q1"):
        assert secret.encode() not in exported


@pytest.mark.parametrize("disabled", [False, True], ids=["no endpoint", "OTEL_SDK_DISABLED"])
async def test_without_an_endpoint_tracing_is_off_and_says_so_once(
    tmp_path: Path,
    upstream: tuple[DemoProvider, str],
    gateways: list[Served],
    receiver: tuple[Exported, str],
    disabled: bool,
) -> None:
    """No OTEL endpoint, or the SDK disabled beside one: the gateway serves as usual,
    exports nothing and logs once that tracing is off."""
    _, url = upstream
    bodies, endpoint = receiver
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ""}
    if disabled:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SDK_DISABLED": "TRUE"}
    served = await Served(tmp_path, url, tmp_path / "g.db", env=env).up()
    gateways.append(served)
    async with aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {AGENT_TOKEN}", "Idempotency-Key": "k"}
        async with http.post(
            f"http://127.0.0.1:{served.port}/p/demo-jobs/v1/jobs", json={}, headers=headers
        ) as r:
            assert r.status == 202
    stderr = await asyncio.to_thread(served.stop)
    assert stderr.count("tracing off") == 1
    assert ("OTEL_SDK_DISABLED is true" in stderr) is disabled
    assert bodies == []


@pytest.fixture
def redis_to_stop() -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH: cannot stop a private Redis under a gateway")
    server = RedisServer()
    server.start()
    yield server
    server.stop()


async def test_failures_mark_the_spans_they_happen_in(
    tmp_path: Path,
    upstream: tuple[DemoProvider, str],
    gateways: list[Served],
    receiver: tuple[Exported, str],
    redis_to_stop: RedisServer,
) -> None:
    """An exception the gateway answers for (its store gone: 503) marks the server span
    ERROR with error.type and an exception event (type and frames, never the message); a
    provider that cannot be reached marks the client span; 4xx answers mark nothing."""
    _, url = upstream
    bodies, endpoint = receiver
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    store = f"{redis_to_stop.url}?prefix=spans-{free_port()}"
    on_redis = await Served(tmp_path / "a", url, tmp_path / "a.db", env=env, store_url=store).up()
    dead_provider = f"http://127.0.0.1:{free_port()}"
    unreachable = await Served(tmp_path / "b", dead_provider, tmp_path / "b.db", env=env).up()
    gateways += [on_redis, unreachable]
    auth = {"Authorization": f"Bearer {AGENT_TOKEN}"}
    async with aiohttp.ClientSession() as http:
        for served, key in ((on_redis, "k-1"), (unreachable, "k-2")):
            base = f"http://127.0.0.1:{served.port}/p/demo-jobs/v1/jobs"
            async with http.get(f"{base}/op_unknown", headers=auth) as r:
                assert r.status == 404
            if served is on_redis:
                redis_to_stop.stop()
            async with http.post(base, json={}, headers={**auth, "Idempotency-Key": key}) as r:
                assert r.status in (502, 503, 504), r.status
    for served in (on_redis, unreachable):
        await asyncio.to_thread(served.stop)
    found = spans(bodies)
    refused = [s for s in found if attributes(s).get("http.response.status_code") == 404]
    assert len(refused) == 2 and all(s.status.code == 0 for s in refused)
    assert all("error.type" not in attributes(s) for s in refused)
    (store_failure,) = [s for s in found if attributes(s).get("error.type") == "gateway.StoreError"]
    assert store_failure.kind == store_failure.SPAN_KIND_SERVER
    assert store_failure.status.code == store_failure.status.STATUS_CODE_ERROR
    assert store_failure.status.message == "StoreError"
    (event,) = store_failure.events
    assert event.name == "exception"
    assert attributes(event)["exception.type"] == "gateway.StoreError"
    assert 'File "' in attributes(event)["exception.stacktrace"]
    assert redis_to_stop.url.split("//")[1] not in bytes(store_failure.SerializeToString()).decode(
        errors="replace"
    )
    (client,) = [s for s in found if s.kind == s.SPAN_KIND_CLIENT]
    assert client.status.code == client.status.STATUS_CODE_ERROR
    assert attributes(client)["error.type"] in ("unreachable", "connection")
    (server,) = [s for s in found if s.span_id == client.parent_span_id]
    assert server.status.code == server.status.STATUS_CODE_ERROR
    assert attributes(server)["error.type"] == str(attributes(server)["http.response.status_code"])


async def test_a_request_cut_short_and_an_unknown_method_are_spans_of_bounded_names(
    tmp_path: Path,
    upstream: tuple[DemoProvider, str],
    gateways: list[Served],
    receiver: tuple[Exported, str],
) -> None:
    """An agent that hangs up on a held poll leaves a span that says what the request was
    and that it was cancelled; a method no HTTP specification knows is _OTHER in the name
    and the attributes (its own spelling kept aside), so agents cannot grow span names."""
    _, url = upstream
    bodies, endpoint = receiver
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}
    served = await Served(tmp_path, url, tmp_path / "g.db", env=env).up()
    gateways.append(served)
    base = f"http://127.0.0.1:{served.port}/p/demo-jobs/v1/jobs"
    auth = {"Authorization": f"Bearer {AGENT_TOKEN}"}
    async with aiohttp.ClientSession() as http:
        body = {"demo_script": [{"state": "running"}]}
        async with http.post(base, json=body, headers={**auth, "Idempotency-Key": "k"}) as r:
            job = (await r.json())["id"]
        held = {**auth, "Prefer": "wait=20", "X-Request-Id": "cut-short-1"}
        with pytest.raises(asyncio.TimeoutError):
            timeout = aiohttp.ClientTimeout(total=1.5)
            async with http.get(f"{base}/{job}", headers=held, timeout=timeout) as r:
                await r.read()
        async with http.request("PROPFIND", f"{base}/{job}", headers=auth) as r:
            assert r.status >= 400
        await asyncio.sleep(0.5)  # the gateway notices the hang-up
    await asyncio.to_thread(served.stop)
    found = spans(bodies)
    (cut,) = [s for s in found if attributes(s).get("statusgate.request_id") == "cut-short-1"]
    assert cut.status.code == cut.status.STATUS_CODE_ERROR
    assert attributes(cut)["error.type"] == "cancelled"
    assert attributes(cut)["url.path"] == f"/p/demo-jobs/v1/jobs/{job}"
    (brewed,) = [s for s in found if attributes(s).get("http.request.method") == "_OTHER"]
    assert brewed.name == "_OTHER /p"
    assert attributes(brewed)["http.request.method_original"] == "PROPFIND"
