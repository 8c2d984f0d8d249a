"""OpenTelemetry traces (SPEC 17) from a real gateway process to a real OTLP/HTTP receiver:
the agent's trace is continued, provider calls are client spans of it and carry its
traceparent to the provider, and no secret is in any exported byte."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.demo_provider import DemoProvider

from conftest import AGENT_TOKEN, PROVIDER_KEY, Exported, Served, otlp_receiver

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


def attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in span.attributes:
        value = item.value
        out[item.key] = value.string_value or value.int_value
    return out


async def test_agent_trace_continues_through_the_gateway_to_the_provider(
    tmp_path: Path,
    upstream: tuple[DemoProvider, str],
    gateways: list[Served],
    receiver: tuple[list[bytes], str],
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
        async with http.post(f"{base}?api_key=q1", json=body, headers=headers) as r:
            job = (await r.json())["id"]
        await asyncio.sleep(1.1)
        async with http.get(f"{base}/{job}", headers={**auth, "Prefer": "wait=5"}) as r:
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
    for span in client:
        assert attributes(span)["statusgate.provider"] == "demo-jobs"
        assert attributes(span)["http.response.status_code"] in (200, 202)
    sent = [e for e in demo.log if e["method"] in ("GET", "POST")]
    assert all(e["headers"]["traceparent"].split("-")[1] == TRACE_ID for e in sent)
    exported = b"".join(body for _, body in bodies)
    for secret in (AGENT_TOKEN, PROVIDER_KEY, "secret-idem-key-1", "api_key", "q1"):
        assert secret.encode() not in exported


async def test_without_an_endpoint_tracing_is_off_and_says_so_once(
    tmp_path: Path, upstream: tuple[DemoProvider, str], gateways: list[Served]
) -> None:
    """No OTEL endpoint: the gateway serves as usual and logs once that tracing is off."""
    _, url = upstream
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ""}
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
