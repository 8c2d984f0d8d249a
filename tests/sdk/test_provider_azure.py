"""policies/azure-read.yaml driven end to end by the real ``azure-core`` LRO machinery
(PipelineClient, LROPoller, LROBasePolling with OperationResourcePolling) as the agent,
through a real gateway on real time (delays scaled down) in front of the demo provider
speaking the Document Intelligence analyze shape. azure-core polls at once after the 202 and
gives up on a 429, which is why the policy holds early calls instead of refusing them."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path
from typing import Any

from azure.core import PipelineClient
from azure.core.credentials import AzureKeyCredential
from azure.core.pipeline import PipelineRequest, PipelineResponse
from azure.core.pipeline.policies import (
    AzureKeyCredentialPolicy,
    ContentDecodePolicy,
    HeadersPolicy,
    RequestIdPolicy,
    RetryPolicy,
    SansIOHTTPPolicy,
    UserAgentPolicy,
)
from azure.core.polling import LROPoller
from azure.core.polling.base_polling import LROBasePolling, OperationResourcePolling
from azure.core.rest import HttpRequest

from gateway.demo.provider import DemoProvider

from conftest import AGENT_TOKEN, PROVIDER_KEY, Harness, fast_polling, live_gateway

ANALYZE = "/documentintelligence/documentModels/prebuilt-read:analyze"
API_VERSION = "2024-11-30"


class Counted(SansIOHTTPPolicy[Any, Any]):
    """Every answer the agent's pipeline received: (method, status)."""

    def __init__(self) -> None:
        self.answers: list[tuple[str, int]] = []

    def on_response(
        self, request: PipelineRequest[Any], response: PipelineResponse[Any, Any]
    ) -> None:
        self.answers.append((request.http_request.method, response.http_response.status_code))


def pipeline(harness: Harness, counted: Counted) -> PipelineClient[Any, Any]:
    """An Azure SDK client's pipeline aimed at the gateway: the SDK's subscription-key
    policy is kept (the gateway replaces the key) and the gateway token is a header."""
    return PipelineClient(
        base_url=str(harness.client.make_url("/p/azure-read")),
        policies=[
            RequestIdPolicy(),
            HeadersPolicy({"Statusgate-Token": AGENT_TOKEN}),
            UserAgentPolicy("statusgate-tests"),
            ContentDecodePolicy(),
            RetryPolicy(),
            AzureKeyCredentialPolicy(
                AzureKeyCredential("agent-has-no-key"), "Ocp-Apim-Subscription-Key"
            ),
            counted,
        ],
    )


def begin_analyze(client: PipelineClient[Any, Any], script: list[Any] | None) -> Any:
    body: dict[str, Any] = {"urlSource": "https://example.test/receipt.pdf"}
    if script is not None:
        body["demo_script"] = script
    request = HttpRequest(
        "POST", client.format_url(ANALYZE), params={"api-version": API_VERSION}, json=body
    )
    return client.send_request(request, _return_pipeline_response=True)


def status_calls(demo: DemoProvider, job: str) -> list[dict[str, Any]]:
    return [e for e in demo.log if e["job_id"] == job and e["kind"] == "status"]


def job_of(operation_location: str) -> str:
    return operation_location.split("/analyzeResults/")[1].split("?")[0]


async def test_azure_core_poller_completes_through_the_gateway(
    tmp_path: Path, live_demo: tuple[DemoProvider, str]
) -> None:
    """LROPoller.result() follows the rewritten Operation-Location to Succeeded, its
    at-once first poll held rather than refused, and the provider sees only the permitted
    polls, spaced by the schedule, each with the gateway's key and the api-version."""
    demo, upstream = live_demo
    polling = fast_polling()
    changes = {"azure-read": {"polling": polling}}
    counted = Counted()
    async with live_gateway(tmp_path, upstream, demo, policy_changes=changes) as harness:
        client = pipeline(harness, counted)

        def agent() -> tuple[Any, str]:
            initial = begin_analyze(client, None)  # the demo's default script for Azure
            location = initial.http_response.headers["Operation-Location"]
            poller = LROPoller(
                client,
                initial,
                lambda response: json.loads(response.http_response.text()),
                LROBasePolling(timeout=1, lro_algorithms=[OperationResourcePolling()]),
            )
            return poller.result(timeout=30), location

        started = time.monotonic()
        result, location = await asyncio.to_thread(agent)
        elapsed = time.monotonic() - started
        job = job_of(location)
        record = await harness.record(job, "azure-read")
        gateway = str(harness.client.make_url("/p/azure-read"))
    assert location.startswith(gateway) and location.endswith(f"api-version={API_VERSION}")
    assert result["status"] == "Succeeded" and result["analyzeResult"]["content"] == "demo text"
    polls = status_calls(demo, job)
    assert len(polls) == 4 == record.status_requests_used  # NotStarted, Running x2, Succeeded
    assert record.outcome.value == "succeeded"
    assert 429 not in [status for _, status in counted.answers]
    gaps = [b["at"] - a["at"] for a, b in itertools.pairwise(polls)]
    assert min(gaps) >= 0.5 * 0.2 - 0.01  # never closer than jitter.min x base_delay
    for entry in polls:
        assert entry["headers"]["Ocp-Apim-Subscription-Key"] == PROVIDER_KEY
        assert f"api-version={API_VERSION}" in entry["path"]
    gets = sum(1 for method, _ in counted.answers if method == "GET")
    print(
        f"azure-read, LROPoller: {gets} status GETs by the poller in {elapsed:.1f}s, "
        f"{len(polls)} provider polls"
    )


async def test_azure_tight_loop_is_held_to_one_provider_poll_per_call(
    tmp_path: Path, live_demo: tuple[DemoProvider, str]
) -> None:
    """An agent that GETs the Operation-Location in a loop with no sleep is held until each
    permitted poll: every call is one provider poll, never a 429, never early."""
    demo, upstream = live_demo
    polling = fast_polling()
    changes = {"azure-read": {"polling": polling}}
    counted = Counted()
    script = [{"state": "Running", "until": 2.0}, {"state": "Succeeded"}]
    async with live_gateway(tmp_path, upstream, demo, policy_changes=changes) as harness:
        client = pipeline(harness, counted)

        def agent() -> tuple[str, int, str]:
            location = begin_analyze(client, script).http_response.headers["Operation-Location"]
            calls, status, stop = 0, "NotStarted", time.monotonic() + 15
            while status not in ("Succeeded", "Failed") and time.monotonic() < stop:
                calls += 1
                answer = client.send_request(HttpRequest("GET", location))
                assert answer.status_code == 200, answer.text()
                status = answer.json()["status"]
            return location, calls, status

        location, calls, status = await asyncio.to_thread(agent)
        record = await harness.record(job_of(location), "azure-read")
    polls = status_calls(demo, job_of(location))
    assert status == "Succeeded"
    assert calls == len(polls) == record.status_requests_used
    print(f"azure-read, tight loop: {calls} calls, {len(polls)} provider polls")
