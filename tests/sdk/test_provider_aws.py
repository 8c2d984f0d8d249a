"""policies/aws-transcribe.yaml driven end to end by the real ``boto3`` SDK as the agent
against a real ``moto`` server speaking Amazon Transcribe (JSON-RPC over POST /, told apart
by X-Amz-Target), with a recording proxy in front of moto, through a real gateway on real
time (delays scaled down). The agent signs with its gateway token as the access key id; what
reaches moto must carry the gateway's key id and a valid SigV4 signature."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from moto.server import ThreadedMotoServer

from conftest import (
    AGENT_TOKEN,
    Harness,
    RecordingProxy,
    fast_polling,
    free_port,
    live_gateway,
    permitted_polls,
)

GATEWAY_KEY_ID, GATEWAY_SECRET = "AKIDSTATUSGATE0001", "gateway-secret-access-key-5d1e"
START, GET = "Transcribe.StartTranscriptionJob", "Transcribe.GetTranscriptionJob"


def _moto_api(base: str, path: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(  # noqa: S310 (loopback)
        base + path, data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=5):  # noqa: S310 (loopback)
        pass


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
async def gateway_to(
    moto: str, folder: Path, polling: dict[str, Any]
) -> AsyncIterator[tuple[Harness, RecordingProxy]]:
    """A gateway with its own AWS keys in front of a recording proxy in front of moto;
    moto's state is reset afterwards."""
    proxy = RecordingProxy(moto)
    upstream = await proxy.start()
    keys = {"access_key_id": GATEWAY_KEY_ID, "secret_access_key": GATEWAY_SECRET}
    changes = {"aws-transcribe": {"credential": {"aws_sigv4": keys}, "polling": polling}}
    try:
        async with live_gateway(folder, upstream, policy_changes=changes) as harness:
            yield harness, proxy
    finally:
        await proxy.close()
        _moto_api(moto, "/moto-api/reset", {})


def transcribe(harness: Harness, suffix: str = "", **kw: Any) -> Any:
    """The agent's client, exactly as it would talk to AWS but for the endpoint and the
    gateway token as its access key id."""
    return boto3.client(
        "transcribe",
        endpoint_url=str(harness.client.make_url("/p/aws-transcribe")) + suffix,
        aws_access_key_id=AGENT_TOKEN,
        aws_secret_access_key="anything",
        region_name="us-east-1",
        **kw,
    )


def run_job(client: Any, name: str, limit: float) -> tuple[dict[str, Any], int, int]:
    """Start a job and call GetTranscriptionJob in a loop with no sleep until it is done;
    the SDK's own retries stay on, and a ClientError it gives up with is retried at once."""
    client.start_transcription_job(
        TranscriptionJobName=name,
        Media={"MediaFileUri": "s3://recordings/call.wav"},
        LanguageCode="en-US",
    )
    job: dict[str, Any] = {}
    calls, errors, stop = 0, 0, time.monotonic() + limit
    while job.get("TranscriptionJobStatus") not in ("COMPLETED", "FAILED"):
        if time.monotonic() > stop or calls >= 10_000:
            break
        calls += 1
        try:
            job = client.get_transcription_job(TranscriptionJobName=name)["TranscriptionJob"]
        except botocore.exceptions.ClientError:
            errors += 1
    return job, calls, errors


def signature_is_valid(seen: dict[str, Any]) -> bool:
    """Recompute the SigV4 signature with botocore over what moto received, at the
    recorded X-Amz-Date, with the gateway's keys."""
    authorization = seen["headers"]["Authorization"]
    signed = authorization.split("SignedHeaders=")[1].split(",")[0].split(";")
    headers = {k: v for k, v in seen["headers"].items() if k.lower() in signed}
    request = AWSRequest(method=seen["method"], url=seen["url"], data=seen["body"], headers=headers)
    request.context["timestamp"] = seen["headers"]["X-Amz-Date"]
    signer = SigV4Auth(Credentials(GATEWAY_KEY_ID, GATEWAY_SECRET), "transcribe", "us-east-1")
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    return bool(authorization.endswith(f"Signature={expected}"))


def targets(proxy: RecordingProxy, target: str, name: str) -> list[dict[str, Any]]:
    return [
        r
        for r in proxy.requests
        if r["headers"].get("X-Amz-Target") == target
        and json.loads(r["body"]).get("TranscriptionJobName") == name
    ]


@pytest.mark.parametrize(
    "suffix",
    [
        "",
        "/",
    ],
    ids=["endpoint-as-documented", "endpoint-with-trailing-slash"],
)
async def test_boto3_transcription_job_reaches_moto_signed_with_the_gateway_key(
    moto_server: str, tmp_path: Path, suffix: str
) -> None:
    """StartTranscriptionJob and a tight GetTranscriptionJob loop (status by POST, the job
    named in the body, each early call held) work unchanged, and every request moto received
    carries the gateway's access key id, never the agent's token, with a valid signature."""
    name = f"call-{uuid.uuid4().hex[:8]}"
    polling = fast_polling(early_calls="hold")
    async with gateway_to(moto_server, tmp_path, polling) as (harness, proxy):
        client = transcribe(harness, suffix)
        sent: list[int] = []
        client.meta.events.register("before-send", lambda **_: sent.append(1))
        started = time.monotonic()
        job, calls, errors = await asyncio.to_thread(run_job, client, name, 20.0)
        elapsed = time.monotonic() - started
        record = await harness.record(name, "aws-transcribe")
    assert job["TranscriptionJobStatus"] == "COMPLETED"
    assert job["Transcript"]["TranscriptFileUri"].startswith("https://s3.us-east-1.amazonaws.com/")
    assert record.outcome.value == "succeeded"
    polls = targets(proxy, GET, name)
    assert len(targets(proxy, START, name)) == 1
    assert len(polls) == 3 == record.status_requests_used  # QUEUED, IN_PROGRESS, COMPLETED
    assert len(polls) <= permitted_polls(polling, elapsed)
    assert (calls, errors, len(sent)) == (3, 0, 4)  # held, never refused: no retries
    for seen in proxy.requests:
        authorization = seen["headers"]["Authorization"]
        assert authorization.startswith(f"AWS4-HMAC-SHA256 Credential={GATEWAY_KEY_ID}/")
        assert AGENT_TOKEN not in str(seen["headers"])
        assert "X-Amz-Security-Token" not in seen["headers"]
        assert signature_is_valid(seen), seen["headers"].get("X-Amz-Target")
    print(
        f"aws-transcribe, boto3 loop: {calls} get_transcription_job calls "
        f"({errors} gave up), {len(sent)} HTTP requests, {len(polls)} provider polls"
    )


async def test_boto3_waiter_completes_with_early_calls_held(
    moto_server: str, tmp_path: Path
) -> None:
    """boto3's transcription_job_completed waiter, at a tenth of its real cadence against a
    tenth of the policy's schedule, completes: its early calls are held to the next permitted
    poll instead of refused, so moto sees one poll per waiter attempt."""
    polling = fast_polling(
        base_delay="500ms", max_delay="4500ms", jitter={"min": 1, "max": 1}, early_calls="hold"
    )
    name = f"wait-{uuid.uuid4().hex[:8]}"
    async with gateway_to(moto_server, tmp_path, polling) as (harness, proxy):
        client = transcribe(harness, "/")
        attempts: list[int] = []
        client.meta.events.register(
            "before-send.transcribe.GetTranscriptionJob", lambda **_: attempts.append(1)
        )

        def agent() -> float:
            client.start_transcription_job(
                TranscriptionJobName=name,
                Media={"MediaFileUri": "s3://recordings/call.wav"},
                LanguageCode="en-US",
            )
            started = time.monotonic()
            waiter = client.get_waiter("transcription_job_completed")
            waiter.wait(TranscriptionJobName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 20})
            return time.monotonic() - started

        elapsed = await asyncio.to_thread(agent)
        record = await harness.record(name, "aws-transcribe")
    polls = targets(proxy, GET, name)
    assert record.outcome.value == "succeeded"
    assert len(attempts) == len(polls) == 3 == record.status_requests_used
    assert elapsed >= 3.5 - 0.05  # the third poll waited for its turn: 0.5 + 1 + 2 s
    print(
        f"aws-transcribe, boto3 waiter: {len(attempts)} GetTranscriptionJob requests in "
        f"{elapsed:.1f}s, {len(polls)} provider polls"
    )


async def test_boto3_waiter_gives_up_when_early_calls_are_refused(
    moto_server: str, tmp_path: Path
) -> None:
    """Why early calls are not refused: with ``early_calls: refuse`` the waiter's first
    call is 429 too-early, boto3's retries (which ignore Retry-After) cannot outlast it, and
    the waiter fails with the job still running."""
    polling = fast_polling(
        base_delay="4s", max_delay="4s", jitter={"min": 1, "max": 1}, early_calls="refuse"
    )
    name = f"refused-{uuid.uuid4().hex[:8]}"
    async with gateway_to(moto_server, tmp_path, polling) as (harness, proxy):
        client = transcribe(harness, "/")

        def agent() -> None:
            client.start_transcription_job(
                TranscriptionJobName=name,
                Media={"MediaFileUri": "s3://recordings/call.wav"},
                LanguageCode="en-US",
            )
            waiter = client.get_waiter("transcription_job_completed")
            waiter.wait(TranscriptionJobName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 20})

        with pytest.raises(botocore.exceptions.WaiterError, match="429"):
            await asyncio.to_thread(agent)
    assert targets(proxy, GET, name) == []
