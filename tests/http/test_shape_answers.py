"""SPEC 22 over HTTP, on a fake clock: job URLs in answers rewritten to the gateway (dotted
fields, an upstream with a path prefix, submit, status, replay and final answers alike),
each client's pacing dialect (openai-poll-after-ms, with the real openai SDK's poll helper;
the queue position in replays), and ``Prefer: wait`` as Replicate's SDK sends it on create."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient, TestServer

from conftest import AGENT_TOKEN, FakeClock
from doubles import Answer, Double, Seen, bearer, due, gateway, record_of, serve

GATEWAY = "http://gateway.test"
CDN = "https://cdn.example/out/image-1.png"


# -- a fal-like queue behind a path prefix ---------------------------------------------------


def fal_policy(upstream: str) -> dict[str, Any]:
    return {
        "provider": "fal-test",
        "shape": "queue",
        "upstream": f"{upstream}/fal-queue",
        "credential": {"header": "Authorization", "value": "Key ${DEMO_API_KEY}"},
        "routes": {
            "submit": {"path": "/fal-ai/flux", "job_id": {"from": "body", "path": "request_id"}},
            "status": {"path": "/fal-ai/flux/requests/{job_id}/status"},
            "result": {"path": "/fal-ai/flux/requests/{job_id}"},
        },
        "states": {
            "pending": ["IN_QUEUE", "IN_PROGRESS"],
            "success": ["COMPLETED"],
            "failure_if_present": ["error"],
            "cancelled": [],
            "success_requires": ["response_url"],
        },
        "polling": {"base_delay": "2s", "max_delay": "8s", "jitter": {"min": 1, "max": 1}},
    }


class FalQueue:
    """fal's queue API under ``/fal-queue``: the request's URLs in every answer."""

    def __init__(self) -> None:
        self.upstream = ""
        self.polls = 0

    def urls(self) -> dict[str, str]:
        base = f"{self.upstream}/fal-queue/fal-ai/flux/requests/r1"
        return {
            "status_url": f"{base}/status",
            "response_url": base,
            "cancel_url": f"{base}/cancel",
        }

    def __call__(self, seen: Seen) -> Answer:
        if seen.method == "POST":
            return 200, {"request_id": "r1", "queue_position": 4, **self.urls()}, {}
        if seen.path.startswith("/fal-queue/fal-ai/flux/requests/r1/status"):
            self.polls += 1
            if self.polls < 3:
                body = {"status": "IN_QUEUE", "queue_position": 3 - self.polls, **self.urls()}
                return 200, body, {}
            return 200, {"status": "COMPLETED", "logs": None, **self.urls()}, {}
        return 200, {"images": [{"url": CDN}]}, {}


@pytest.fixture
async def fal(
    tmp_path: Path, clock: FakeClock
) -> AsyncIterator[tuple[TestClient[Any, Any], Double]]:
    queue = FalQueue()
    double = Double(queue)
    server = await serve(double)
    queue.upstream = str(server.make_url("")).rstrip("/")
    client = await gateway(
        tmp_path, clock, queue.upstream, {"fal-test": fal_policy(queue.upstream)}
    )
    yield client, double
    await client.close()
    await server.close()


def gateway_urls(base: str = f"{GATEWAY}/p/fal-test/fal-ai/flux/requests/r1") -> dict[str, str]:
    return {"status_url": f"{base}/status", "response_url": base, "cancel_url": f"{base}/cancel"}


async def test_queue_urls_lead_back_to_the_gateway_in_every_answer(
    fal: tuple[TestClient[Any, Any], Double], clock: FakeClock
) -> None:
    """fal's status_url, response_url and cancel_url, under an upstream with a path prefix,
    are the gateway's in the submit answer, a live status answer, a replay and the final
    answer; the output's URL on another host is left alone."""
    client, double = fal
    submitted = await client.post(
        "/p/fal-test/fal-ai/flux", json={"prompt": "a cat"}, headers=bearer()
    )
    assert submitted.status == 200, await submitted.text()
    assert await submitted.json() == {"request_id": "r1", "queue_position": 4, **gateway_urls()}
    await due(client, clock, "fal-test", "r1")
    status = "/p/fal-test/fal-ai/flux/requests/r1/status"
    live = await client.get(status, headers=bearer())
    assert live.status == 200, await live.text()
    assert await live.json() == {"status": "IN_QUEUE", "queue_position": 2, **gateway_urls()}
    early = await client.get(status, headers=bearer())
    assert early.headers["Statusgate-Outcome"] == "pending" and "Age" in early.headers
    assert await early.json() == {"status": "IN_QUEUE", "queue_position": 2, **gateway_urls()}
    for _ in range(2):
        await due(client, clock, "fal-test", "r1")
        final = await client.get(status, headers=bearer())
    assert final.headers["Statusgate-Outcome"] == "succeeded"
    assert (await final.json())["response_url"] == gateway_urls()["response_url"]
    again = await client.get(status, headers=bearer())  # from the record
    assert (await again.json())["cancel_url"] == gateway_urls()["cancel_url"]
    output = await client.get("/p/fal-test/fal-ai/flux/requests/r1", headers=bearer())
    assert await output.json() == {"images": [{"url": CDN}]}
    sent = double.calls("POST", "/fal-queue/fal-ai/flux")
    assert len(sent) == 1 and sent[0].headers["Authorization"].startswith("Key sk-")


async def test_a_replay_keeps_the_providers_queue_position(
    fal: tuple[TestClient[Any, Any], Double], clock: FakeClock
) -> None:
    """On a queue policy an early call's replay is the last status answer as the provider
    gave it, queue_position included, and reaches no provider."""
    client, double = fal
    await client.post("/p/fal-test/fal-ai/flux", json={}, headers=bearer())
    await due(client, clock, "fal-test", "r1")
    status = "/p/fal-test/fal-ai/flux/requests/r1/status"
    await client.get(status, headers=bearer())
    polls = len(double.calls("GET", "/fal-queue/fal-ai/flux/requests/r1/status"))
    replays = [await (await client.get(status, headers=bearer())).json() for _ in range(3)]
    assert {r["queue_position"] for r in replays} == {2}
    assert len(double.calls("GET", "/fal-queue/fal-ai/flux/requests/r1/status")) == polls == 1


# -- a Replicate-like prediction API ---------------------------------------------------------


def replicate_policy(upstream: str) -> dict[str, Any]:
    return {
        "provider": "replicate-test",
        "shape": "queue",
        "upstream": upstream,
        "credential": {"header": "Authorization", "value": "Bearer ${DEMO_API_KEY}"},
        "routes": {
            "submit": {"path": "/v1/predictions", "job_id": {"from": "body", "path": "id"}},
            "status": {"path": "/v1/predictions/{job_id}"},
            "cancel": {"method": "POST", "path": "/v1/predictions/{job_id}/cancel"},
        },
        "states": {
            "pending": ["starting", "processing"],
            "success": ["succeeded"],
            "failure": ["failed"],
            "cancelled": ["canceled", "aborted"],
        },
        "polling": {
            "base_delay": "1s",
            "max_delay": "4s",
            "jitter": {"min": 1, "max": 1},
            "max_hold": "60s",
        },
    }


class Predictions:
    """Replicate's predictions: ``starting``, then ``processing`` until ``done_after``
    status polls, then ``succeeded`` with an output on another host."""

    def __init__(self, done_after: int) -> None:
        self.upstream = ""
        self.done_after = done_after
        self.polls = 0

    def prediction(self, status: str) -> dict[str, Any]:
        base = f"{self.upstream}/v1/predictions/p1"
        urls = {
            "get": base,
            "cancel": f"{base}/cancel",
            "stream": "https://stream.replicate.example/v1/files/p1",
            "web": "https://replicate.example/p/p1",
        }
        output = CDN if status == "succeeded" else None
        return {"id": "p1", "status": status, "output": output, "urls": urls}

    def __call__(self, seen: Seen) -> Answer:
        if seen.method == "POST":
            return 201, self.prediction("starting"), {}
        self.polls += 1
        done = self.polls >= self.done_after
        return 200, self.prediction("succeeded" if done else "processing"), {}


async def predictions(
    tmp_path: Path, clock: FakeClock, done_after: int
) -> tuple[TestClient[Any, Any], Double, TestServer]:
    api = Predictions(done_after)
    double = Double(api)
    server = await serve(double)
    api.upstream = str(server.make_url("")).rstrip("/")
    policy = replicate_policy(api.upstream)
    client = await gateway(tmp_path, clock, api.upstream, {"replicate-test": policy})
    return client, double, server


def expected_urls() -> dict[str, str]:
    base = f"{GATEWAY}/p/replicate-test/v1/predictions/p1"
    return {
        "get": base,
        "cancel": f"{base}/cancel",
        "stream": "https://stream.replicate.example/v1/files/p1",
        "web": "https://replicate.example/p/p1",
    }


async def test_prefer_wait_on_create_holds_the_agent_not_the_provider(
    tmp_path: Path, clock: FakeClock
) -> None:
    """``Prefer: wait`` on the create call, as replicate-python's run() sends it: the
    provider gets the submission without Prefer; the agent is held, polled for on the
    schedule, and gets the finished prediction (urls.get and urls.cancel rewritten, the
    stream and web URLs on other hosts left alone) with Preference-Applied: wait=60."""
    client, double, server = await predictions(tmp_path, clock, done_after=3)
    try:
        started = clock.now
        answer = await client.post(
            "/p/replicate-test/v1/predictions",
            json={"version": "v1", "input": {"prompt": "a cat"}},
            headers={**bearer(), "Prefer": "wait"},
        )
        assert answer.status == 200, await answer.text()
        body = await answer.json()
        assert body["status"] == "succeeded" and body["output"] == CDN
        assert body["urls"] == expected_urls()
        assert answer.headers["Preference-Applied"] == "wait=60"
        assert answer.headers["Statusgate-Outcome"] == "succeeded"
        created = double.calls("POST", "/v1/predictions")
        assert len(created) == 1 and "Prefer" not in created[0].headers
        polls = double.calls("GET", "/v1/predictions/p1")
        assert len(polls) == 3
        assert clock.now - started >= 1 + 2 + 4  # each poll waited for its turn
    finally:
        await client.close()
        await server.close()


async def test_a_create_held_past_its_wait_answers_the_submission_itself(
    tmp_path: Path, clock: FakeClock
) -> None:
    """``Prefer: wait=5`` on a prediction that takes longer: after 5 s the agent gets the
    create answer itself (status starting, which Replicate's SDK reads as "not done, poll
    on"), never a later processing answer it would take for the end; Retry-After and the
    operation's headers are current; the polls made while holding stayed on schedule."""
    client, double, server = await predictions(tmp_path, clock, done_after=100)
    try:
        started = clock.now
        answer = await client.post(
            "/p/replicate-test/v1/predictions",
            json={"version": "v1", "input": {}},
            headers={**bearer(), "Prefer": "wait=5"},
        )
        assert answer.status == 201, await answer.text()
        body = await answer.json()
        assert body["status"] == "starting" and body["urls"] == expected_urls()
        assert answer.headers["Preference-Applied"] == "wait=5"
        assert answer.headers["Statusgate-Outcome"] == "pending"
        assert int(answer.headers["Retry-After"]) >= 1
        assert clock.now - started <= 5
        polls = len(double.calls("GET", "/v1/predictions/p1"))
        assert 1 <= polls <= 2  # at 1 s and 3 s; the next is due at 7 s
        record = await record_of(client, "replicate-test", "p1")
        assert record.status_requests_used == polls
    finally:
        await client.close()
        await server.close()


async def test_a_bare_prefer_wait_on_a_status_call_holds_up_to_max_hold(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A status call with a bare ``Prefer: wait`` (no value) is held as ``wait=max_hold``."""
    client, double, server = await predictions(tmp_path, clock, done_after=2)
    try:
        await client.post("/p/replicate-test/v1/predictions", json={}, headers=bearer())
        held = await client.get(
            "/p/replicate-test/v1/predictions/p1", headers={**bearer(), "Prefer": "wait"}
        )
        assert held.headers["Preference-Applied"] == "wait=60"
        assert (await held.json())["status"] == "succeeded"
        assert len(double.calls("GET", "/v1/predictions/p1")) == 2
    finally:
        await client.close()
        await server.close()


# -- openai-poll-after-ms ---------------------------------------------------------------------


def video_policy(upstream: str) -> dict[str, Any]:
    return {
        "provider": "videos-test",
        "shape": "openai-job",
        "upstream": upstream,
        "credential": {"header": "Authorization", "value": "Bearer ${DEMO_API_KEY}"},
        "routes": {
            "submit": {"path": "/v1/videos"},
            "status": {"path": "/v1/videos/{job_id}"},
        },
        "states": {
            "pending": ["queued", "in_progress"],
            "success": ["completed"],
            "failure": ["failed"],
            "cancelled": [],
            "expired": [],
        },
        "polling": {
            "base_delay": "10s",
            "max_delay": "40s",
            "jitter": {"min": 1, "max": 1},
            "max_status_requests": 20,
        },
    }


class Videos:
    """OpenAI's videos: queued, in_progress until ``done_after`` polls, completed."""

    def __init__(self, done_after: int) -> None:
        self.done_after = done_after
        self.polls = 0

    def __call__(self, seen: Seen) -> Answer:
        status = "queued"
        if seen.method == "GET":
            self.polls += 1
            status = "completed" if self.polls >= self.done_after else "in_progress"
        video = {"id": "video_1", "object": "video", "status": status, "model": "sora-2"}
        return (
            200,
            {**video, "created_at": 1, "progress": 0, "seconds": "4", "size": "720x1280"},
            {},
        )


async def test_openai_job_answers_carry_openai_poll_after_ms(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Submit, live pending and replayed answers of an openai-job policy carry
    openai-poll-after-ms: the whole milliseconds until the next permitted poll; a final
    answer and a policy of no such shape carry none."""
    double = Double(Videos(done_after=2))
    server = await serve(double)
    upstream = str(server.make_url("")).rstrip("/")
    client = await gateway(tmp_path, clock, upstream, {"videos-test": video_policy(upstream)})
    try:
        created = await client.post("/p/videos-test/v1/videos", json={}, headers=bearer())
        assert created.headers["openai-poll-after-ms"] == "10000"
        clock.advance(2.5)
        early = await client.get("/p/videos-test/v1/videos/video_1", headers=bearer())
        assert "Age" in early.headers and early.headers["openai-poll-after-ms"] == "7500"
        await due(client, clock, "videos-test", "video_1")
        live = await client.get("/p/videos-test/v1/videos/video_1", headers=bearer())
        assert (await live.json())["status"] == "in_progress"
        assert live.headers["openai-poll-after-ms"] == "20000"
        assert live.headers["Retry-After"] == "20"
        await due(client, clock, "videos-test", "video_1")
        final = await client.get("/p/videos-test/v1/videos/video_1", headers=bearer())
        assert final.headers["Statusgate-Outcome"] == "succeeded"
        assert "openai-poll-after-ms" not in final.headers
        headers = {**bearer(), "Idempotency-Key": "k"}
        plain = await client.post("/p/demo-jobs/v1/jobs", json={"input": "x"}, headers=headers)
        assert "Statusgate-Operation" in plain.headers  # the double answered demo-jobs too
        assert "openai-poll-after-ms" not in plain.headers
    finally:
        await client.close()
        await server.close()


async def test_the_openai_sdk_poll_helper_waits_as_told(tmp_path: Path, clock: FakeClock) -> None:
    """The real openai SDK's ``videos.create_and_poll`` (which sleeps for the first
    openai-poll-after-ms it sees, then keeps that interval) completes through the gateway
    with no exception; its sleeps are the gateway's, and the provider is polled only when
    the schedule permits (early calls answered from the record)."""
    double = Double(Videos(done_after=3))
    server = await serve(double)
    upstream = str(server.make_url("")).rstrip("/")
    client = await gateway(tmp_path, clock, upstream, {"videos-test": video_policy(upstream)})
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:  # the SDK's own sleep, on the test's clock
        sleeps.append(seconds)
        clock.advance(seconds)

    sdk = openai.OpenAI(
        base_url=str(client.make_url("/p/videos-test/v1")), api_key=AGENT_TOKEN, max_retries=0
    )
    sdk.videos._sleep = sleep  # type: ignore[method-assign]
    try:
        with pytest.warns(DeprecationWarning):
            video = await asyncio.to_thread(sdk.videos.create_and_poll, prompt="a cat")
        assert video.status == "completed"
        assert sleeps and set(sleeps) == {10.0}  # the first hint, kept by the helper
        polls = len(double.calls("GET", "/v1/videos/video_1"))
        assert polls == 3  # at 10 s, 30 s and 70 s; every other call was answered early
        assert len(sleeps) >= math.ceil(70 / 10)
    finally:
        sdk.close()
        await client.close()
        await server.close()
