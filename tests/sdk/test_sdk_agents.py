"""Issue 21's "Done when": the real SDKs, as agents use them, against schedules whose
Retry-After is minutes (SPEC 20).

Each SDK runs at its default settings (retries, timeouts, poll intervals) in a naive loop
(``while not done: job = retrieve(id)``, no sleep) or its own waiter / poller, against the
demo provider (moto for AWS) asking for ``Retry-After: 200`` on every pending answer. Time is
virtual so the test takes seconds, not the twenty minutes it describes: the gateway and the
demo provider share a FakeClock; every agent request to the gateway moves it on by STEP
seconds (the time one turn of an agent's loop takes), and every ``time.sleep`` of the agent's
thread (SDK retry back-offs, waiter delays, poller intervals) moves it on by its length
instead of sleeping. Each test asserts no exception reached the agent, provider calls no
closer than the provider asked, and the output fetched through the gateway by the SDK's own
call; and prints its row of the issue's table (``SDK-TABLE``)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anthropic
import boto3
import botocore.exceptions
import openai
import pytest
import requests
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from azure.core import PipelineClient
from azure.core.credentials import AzureKeyCredential
from azure.core.pipeline.policies import (
    AzureKeyCredentialPolicy,
    ContentDecodePolicy,
    HeadersPolicy,
    RequestIdPolicy,
    RetryPolicy,
    UserAgentPolicy,
)
from azure.core.polling import LROPoller
from azure.core.polling.base_polling import LROBasePolling
from azure.core.rest import HttpRequest
from moto.server import ThreadedMotoServer

from gateway.demo.provider import DemoProvider
from gateway.flow.runtime import RUNTIME
from gateway.run.app import create_app
from gateway.settings.config import load_settings
from gateway.store import store_from_url

from conftest import (
    AGENT_TOKEN,
    PROVIDER_ENV,
    PROVIDER_KEY,
    FakeClock,
    RecordingProxy,
    free_port,
    write_config,
)

T = TypeVar("T")
STEP = 2.0  # virtual seconds one turn of an agent's loop takes
ASKED = 200  # the Retry-After, in seconds, of every pending provider answer
MAX_CALLS = 5_000  # a naive loop that never ends is stopped here (and fails its test)
INPUT = b'{"custom_id": "request-1", "method": "POST", "url": "/v1/chat/completions"}\n'


def slow(*states: str, last: str) -> list[dict[str, Any]]:
    """A demo script: each state for 300 virtual seconds, every answer asking for
    ``Retry-After: 200``, then ``last``."""
    steps = [
        {"state": state, "retry_after": ASKED, "until": 300 * (n + 1)}
        for n, state in enumerate(states)
    ]
    return [*steps, {"state": last}]


# -- virtual time ----------------------------------------------------------------------------


@dataclass
class Agent:
    """The agent's side of virtual time and what it did: requests it sent to the gateway,
    seconds its SDK slept, exceptions that reached its code."""

    clock: FakeClock
    calls: list[str] = field(default_factory=list)
    slept: list[float] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)

    async def run(self, work: Callable[[], T]) -> T:
        """``work`` in a thread of its own (its ``time.sleep`` is virtual)."""
        return await asyncio.to_thread(work)

    def caught(self, error: BaseException) -> None:
        self.exceptions.append(f"{type(error).__name__}: {str(error)[:120]}")


@contextlib.contextmanager
def virtual_sleep(agent: Agent) -> Iterator[None]:
    """``time.sleep`` outside the event loop's thread (the agent's thread and any it
    started, such as azure-core's poller thread) moves the clock on instead of sleeping."""
    real, loop_thread = time.sleep, threading.get_ident()

    def sleep(seconds: float) -> None:
        if threading.get_ident() == loop_thread:
            real(seconds)
            return
        agent.slept.append(seconds)
        agent.clock.advance(max(0.0, seconds))
        real(0.0005)

    time.sleep = sleep  # type: ignore[assignment]
    try:
        yield
    finally:
        time.sleep = real


def ticking(agent: Agent) -> Any:
    """Middleware: each agent request moves the clock on by STEP (its loop's turn)."""

    @web.middleware
    async def tick(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/p/"):
            agent.calls.append(f"{request.method} {request.path}")
            agent.clock.advance(STEP)
        response: web.StreamResponse = await handler(request)
        return response

    return tick


@dataclass
class Setup:
    base: str  # the gateway's own base URL
    demo: DemoProvider
    agent: Agent
    client: TestClient[Any, Any]


@contextlib.asynccontextmanager
async def gateway(
    tmp_path: Path, upstream: str | None = None, *, policy_changes: dict[str, Any] | None = None
) -> AsyncIterator[Setup]:
    """The gateway on a FakeClock, its public base URL its own loopback address (SDKs follow
    the URLs it hands out), in front of the demo provider on the same clock (or
    ``upstream``), with the shipped policies as they are but for the upstream."""
    clock = FakeClock()
    agent = Agent(clock)
    demo = DemoProvider(api_key=PROVIDER_KEY, clock=clock)
    provider = TestServer(demo.app(), host="127.0.0.1")
    await provider.start_server()
    port = free_port()
    changes = {"public_base_url": f"http://127.0.0.1:{port}"}
    target = upstream or str(provider.make_url("")).rstrip("/")
    path = write_config(tmp_path, target, policy_changes=policy_changes, config_changes=changes)
    settings = load_settings(path, env={**os.environ, **PROVIDER_ENV})
    app = create_app(
        settings,
        store=store_from_url("memory://"),
        clock=clock,
        rng=random.Random(7),
        sleep=clock.sleep,
    )
    app.middlewares.append(ticking(agent))
    client: TestClient[Any, Any] = TestClient(TestServer(app, host="127.0.0.1", port=port))
    await client.start_server()
    try:
        with virtual_sleep(agent):
            yield Setup(f"http://127.0.0.1:{port}", demo, agent, client)
    finally:
        await client.close()
        await provider.close()


async def result_fetches(setup: Setup, provider: str, job: str) -> int:
    """How many result fetches the gateway counted on the account's operation."""
    record = await setup.client.app[RUNTIME].store.find("team-a", provider, job)
    assert record is not None
    return int(record.result_fetches)


def polls_at(demo: DemoProvider, job: str) -> list[float]:
    """When the provider answered a status call about ``job`` (virtual time)."""
    return [e["at"] for e in demo.log if e["job_id"] == job and e["kind"] == "status"]


def assert_within_schedule(times: list[float], submitted: float, asked: float = ASKED) -> None:
    """No provider poll came sooner than the provider asked after the previous one."""
    assert times, "the provider was never polled"
    assert times[0] >= submitted
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap >= asked - 1e-6 for gap in gaps), gaps


def table(sdk: str, loop: str, agent: Agent, provider_calls: int) -> None:
    """One row of the issue's table, for the report (pytest -s shows it)."""
    row = [sdk, loop, str(len(agent.calls)), str(provider_calls), str(len(agent.exceptions))]
    print("\nSDK-TABLE | " + " | ".join(row) + " | " + "; ".join(agent.exceptions[:2]))


# -- openai ----------------------------------------------------------------------------------

OPENAI_DONE = {"completed", "failed", "expired", "cancelled"}


async def test_openai_naive_retrieve_loop_at_default_settings(tmp_path: Path) -> None:
    """openai at its defaults: files.create, batches.create, a naive batches.retrieve loop
    through 200-second Retry-Afters and files.content(output_file_id) all succeed with no
    exception, the provider polled no closer than it asked."""
    async with gateway(tmp_path) as setup:
        client = openai.OpenAI(base_url=f"{setup.base}/p/openai-batch/v1", api_key=AGENT_TOKEN)
        script = slow("validating", "in_progress", "finalizing", last="completed")
        agent = setup.agent
        started = agent.clock.now

        def work() -> tuple[Any, bytes | None]:
            uploaded = client.files.create(file=("input.jsonl", INPUT), purpose="batch")
            batch = client.batches.create(
                input_file_id=uploaded.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
                extra_body={"demo_script": script},
            )
            while batch.status not in OPENAI_DONE and len(agent.calls) < MAX_CALLS:
                try:
                    batch = client.batches.retrieve(batch.id)
                except openai.APIError as error:
                    agent.caught(error)
            output = None
            if batch.output_file_id is not None:
                try:
                    output = client.files.content(batch.output_file_id).content
                except openai.APIError as error:
                    agent.caught(error)
            return batch, output

        batch, output = await agent.run(work)
        times = polls_at(setup.demo, batch.id)
        fetched = await result_fetches(setup, "openai-batch", batch.id)
    table("openai", "naive batches.retrieve", agent, len(times))
    assert agent.exceptions == []
    assert batch.status == "completed"
    assert output is not None and b"request-1" in output
    assert fetched == 1  # files.content went through the gated, counted result route
    assert_within_schedule(times, started)
    assert len(times) <= 1 + (agent.clock.now - started) / ASKED


# -- anthropic -------------------------------------------------------------------------------


async def test_anthropic_naive_retrieve_loop_at_default_settings(tmp_path: Path) -> None:
    """anthropic at its defaults: batches.create, a naive batches.retrieve loop through
    200-second Retry-Afters and batches.results (following results_url through the
    gateway) succeed with no exception, the provider polled no closer than it asked."""
    async with gateway(tmp_path) as setup:
        client = anthropic.Anthropic(
            base_url=f"{setup.base}/p/anthropic-batches",
            api_key="agent-has-no-key",
            default_headers={"Statusgate-Token": AGENT_TOKEN},
        )
        agent = setup.agent
        started = agent.clock.now
        script = slow("in_progress", "in_progress", last="ended")
        requests_ = [
            {"custom_id": "request-1", "params": {"model": "m", "max_tokens": 8, "messages": []}}
        ]

        def work() -> tuple[Any, list[str]]:
            batch = client.messages.batches.create(
                requests=requests_,  # type: ignore[arg-type]
                extra_body={"demo_script": script},
            )
            while batch.processing_status != "ended" and len(agent.calls) < MAX_CALLS:
                try:
                    batch = client.messages.batches.retrieve(batch.id)
                except anthropic.APIError as error:
                    agent.caught(error)
            ids: list[str] = []
            try:
                ids = [item.custom_id for item in client.messages.batches.results(batch.id)]
            except anthropic.APIError as error:
                agent.caught(error)
            return batch, ids

        batch, ids = await agent.run(work)
        times = polls_at(setup.demo, batch.id)
        fetched = await result_fetches(setup, "anthropic-batches", batch.id)
    table("anthropic", "naive batches.retrieve", agent, len(times))
    assert agent.exceptions == []
    assert batch.processing_status == "ended" and ids == ["request-1"]
    assert fetched == 1  # batches.results followed results_url to the result route
    assert_within_schedule(times, started)


# -- google operations over HTTP -------------------------------------------------------------


async def test_google_operation_naive_get_loop_over_http(tmp_path: Path) -> None:
    """A naive loop of plain HTTP GETs of a Google long-running operation, raising on any
    error status as an HTTP client's agent does, ends with the response inline, no
    exception, the provider polled no closer than it asked."""
    async with gateway(tmp_path) as setup:
        agent = setup.agent
        started = agent.clock.now
        base = f"{setup.base}/p/google-operations/v1"
        auth = {"Authorization": f"Bearer {AGENT_TOKEN}"}
        script = slow("running", "pending", last="done")

        def work() -> dict[str, Any]:
            with requests.Session() as http:
                answer = http.post(
                    f"{base}/projects/p/locations/us/jobs",
                    json={"input": "gs://bucket/doc.pdf", "demo_script": script},
                    headers=auth,
                )
                answer.raise_for_status()
                operation: dict[str, Any] = answer.json()
                name = operation["name"]
                while not operation.get("done") and len(agent.calls) < MAX_CALLS:
                    try:
                        answer = http.get(f"{base}/{name}", headers=auth)
                        answer.raise_for_status()
                        operation = answer.json()
                    except requests.HTTPError as error:
                        agent.caught(error)
                return operation

        operation = await agent.run(work)
        times = polls_at(setup.demo, operation["name"])
    table("google operations (HTTP)", "naive GET", agent, len(times))
    assert agent.exceptions == []
    assert operation["done"] is True and operation["response"]["pages"] == 3
    assert_within_schedule(times, started)


# -- azure-core ------------------------------------------------------------------------------

ANALYZE = "/documentintelligence/documentModels/prebuilt-read:analyze"


def azure_client(setup: Setup) -> PipelineClient[Any, Any]:
    """An Azure SDK client's pipeline with its default policies (RetryPolicy included),
    aimed at the gateway; the gateway token as a header, the SDK's key replaced."""
    return PipelineClient(
        base_url=f"{setup.base}/p/azure-read",
        policies=[
            RequestIdPolicy(),
            HeadersPolicy({"Statusgate-Token": AGENT_TOKEN}),
            UserAgentPolicy("statusgate-tests"),
            ContentDecodePolicy(),
            RetryPolicy(),
            AzureKeyCredentialPolicy(
                AzureKeyCredential("agent-has-no-key"), "Ocp-Apim-Subscription-Key"
            ),
        ],
    )


def begin_analyze(client: PipelineClient[Any, Any], script: list[Any]) -> Any:
    body = {"urlSource": "https://example.test/receipt.pdf", "demo_script": script}
    request = HttpRequest(
        "POST", client.format_url(ANALYZE), params={"api-version": "2024-11-30"}, json=body
    )
    return client.send_request(request, _return_pipeline_response=True)


def job_of(location: str) -> str:
    return location.split("/analyzeResults/")[1].split("?")[0]


async def test_azure_core_lro_poller_at_default_settings(tmp_path: Path) -> None:
    """azure-core's LROPoller with its default polling (Retry-After obeyed) follows the
    rewritten Operation-Location to Succeeded with no exception, result() returning the
    analysis, the provider polled no closer than it asked."""
    async with gateway(tmp_path) as setup:
        client, agent = azure_client(setup), setup.agent
        started = agent.clock.now
        script = slow("NotStarted", "Running", last="Succeeded")

        def work() -> tuple[Any, str]:
            initial = begin_analyze(client, script)
            location = initial.http_response.headers["Operation-Location"]
            poller = LROPoller(
                client,
                initial,
                lambda response: json.loads(response.http_response.text()),
                LROBasePolling(),
            )
            try:
                return poller.result(), location
            except Exception as error:
                agent.caught(error)
                return None, location

        result, location = await agent.run(work)
        times = polls_at(setup.demo, job_of(location))
    table("azure-core", "LROPoller.result()", agent, len(times))
    assert agent.exceptions == []
    assert result["status"] == "Succeeded" and result["analyzeResult"]["content"] == "demo text"
    assert_within_schedule(times, started)


async def test_azure_core_naive_get_loop_at_default_settings(tmp_path: Path) -> None:
    """A naive loop of azure-core GETs of the Operation-Location, default RetryPolicy,
    ends Succeeded with no exception, the provider polled no closer than it asked."""
    async with gateway(tmp_path) as setup:
        client, agent = azure_client(setup), setup.agent
        started = agent.clock.now
        script = slow("NotStarted", "Running", last="Succeeded")

        def work() -> tuple[dict[str, Any], str]:
            location = begin_analyze(client, script).http_response.headers["Operation-Location"]
            status: dict[str, Any] = {"status": "NotStarted"}
            while status["status"] not in ("Succeeded", "Failed") and len(agent.calls) < MAX_CALLS:
                try:
                    answer = client.send_request(HttpRequest("GET", location))
                    answer.raise_for_status()
                    status = answer.json()
                except Exception as error:
                    agent.caught(error)
            return status, location

        status, location = await agent.run(work)
        times = polls_at(setup.demo, job_of(location))
    table("azure-core", "naive send_request GET", agent, len(times))
    assert agent.exceptions == []
    assert status["status"] == "Succeeded" and status["analyzeResult"]["content"] == "demo text"
    assert_within_schedule(times, started)


# -- boto3 -----------------------------------------------------------------------------------

GET_JOB = "Transcribe.GetTranscriptionJob"
GATEWAY_KEY_ID, GATEWAY_SECRET = "AKIDSTATUSGATE0001", "gateway-secret-access-key-5d1e"


class AskingProxy(RecordingProxy):
    """The recording proxy in front of moto, adding ``Retry-After: 200`` to every
    GetTranscriptionJob answer (moto gives no timing guidance) and noting its time."""

    def __init__(self, target: str, clock: FakeClock) -> None:
        super().__init__(target)
        self.clock = clock
        self.polls: list[tuple[str, float]] = []

    async def _forward(self, request: web.Request) -> web.Response:
        answer = await super()._forward(request)
        if request.headers.get("X-Amz-Target") == GET_JOB:
            name = json.loads(self.requests[-1]["body"]).get("TranscriptionJobName", "")
            self.polls.append((name, self.clock.now))
            answer.headers["Retry-After"] = str(ASKED)
        return answer


@pytest.fixture(scope="module")
def moto_server() -> Iterator[str]:
    """A real moto server on a free loopback port, in a thread; its base URL."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def aws_gateway(tmp_path: Path, moto: str) -> AsyncIterator[tuple[Setup, AskingProxy]]:
    proxy = AskingProxy(moto, FakeClock())  # its clock is replaced by the gateway's below
    upstream = await proxy.start()
    keys = {"access_key_id": GATEWAY_KEY_ID, "secret_access_key": GATEWAY_SECRET}
    changes = {"aws-transcribe": {"credential": {"aws_sigv4": keys}}}
    try:
        async with gateway(tmp_path, upstream, policy_changes=changes) as setup:
            proxy.clock = setup.agent.clock
            yield setup, proxy
    finally:
        await proxy.close()


def transcribe(setup: Setup) -> Any:
    """boto3's client at its defaults, the gateway as endpoint, its token as the key id."""
    return boto3.client(
        "transcribe",
        endpoint_url=f"{setup.base}/p/aws-transcribe",
        aws_access_key_id=AGENT_TOKEN,
        aws_secret_access_key="anything",
        region_name="us-east-1",
    )


def start_job(client: Any, name: str) -> None:
    client.start_transcription_job(
        TranscriptionJobName=name,
        Media={"MediaFileUri": "s3://recordings/call.wav"},
        LanguageCode="en-US",
    )


async def test_boto3_waiter_at_default_settings(moto_server: str, tmp_path: Path) -> None:
    """boto3's transcription_job_completed waiter at its defaults (every 10 s, 180 tries)
    completes with no exception, and get_transcription_job then names the transcript;
    moto is polled no closer than the 200 s asked."""
    name = f"wait-{uuid.uuid4().hex[:8]}"
    async with aws_gateway(tmp_path, moto_server) as (setup, proxy):
        client, agent = transcribe(setup), setup.agent
        started = agent.clock.now

        def work() -> dict[str, Any]:
            start_job(client, name)
            try:
                client.get_waiter("transcription_job_completed").wait(TranscriptionJobName=name)
                job: dict[str, Any] = client.get_transcription_job(TranscriptionJobName=name)
                return job["TranscriptionJob"]
            except (botocore.exceptions.ClientError, botocore.exceptions.WaiterError) as error:
                agent.caught(error)
                return {}

        job = await agent.run(work)
        times = [at for polled, at in proxy.polls if polled == name]
    table("boto3", "waiter transcription_job_completed", agent, len(times))
    assert agent.exceptions == []
    assert job["TranscriptionJobStatus"] == "COMPLETED"
    assert job["Transcript"]["TranscriptFileUri"].startswith("https://")
    assert_within_schedule(times, started)


async def test_boto3_naive_loop_at_default_settings(moto_server: str, tmp_path: Path) -> None:
    """A naive get_transcription_job loop at boto3's defaults (its retries on) ends
    COMPLETED with no exception; moto is polled no closer than the 200 s asked."""
    name = f"loop-{uuid.uuid4().hex[:8]}"
    async with aws_gateway(tmp_path, moto_server) as (setup, proxy):
        client, agent = transcribe(setup), setup.agent
        started = agent.clock.now

        def work() -> dict[str, Any]:
            start_job(client, name)
            job: dict[str, Any] = {"TranscriptionJobStatus": "QUEUED"}
            while job["TranscriptionJobStatus"] not in ("COMPLETED", "FAILED"):
                if len(agent.calls) >= MAX_CALLS:
                    break
                try:
                    job = client.get_transcription_job(TranscriptionJobName=name)[
                        "TranscriptionJob"
                    ]
                except botocore.exceptions.ClientError as error:
                    agent.caught(error)
            return job

        job = await agent.run(work)
        times = [at for polled, at in proxy.polls if polled == name]
    table("boto3", "naive get_transcription_job", agent, len(times))
    assert agent.exceptions == []
    assert job["TranscriptionJobStatus"] == "COMPLETED"
    assert job["Transcript"]["TranscriptFileUri"].startswith("https://")
    assert_within_schedule(times, started)
