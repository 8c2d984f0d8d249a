"""policies/celery-flower.yaml driven end to end against a REAL provider: a Celery worker and
Flower (its HTTP API) as processes of their own on a private Redis key space, behind a
recording proxy, through a real gateway on real time (delays scaled down). The agent is plain
HTTP, as Flower's API has no SDK."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from conftest import (
    AGENT_TOKEN,
    OPERATOR_TOKEN,
    Harness,
    RecordingProxy,
    fast_polling,
    free_port,
    live_gateway,
    permitted_polls,
    wait_until_up,
)

TESTS = Path(__file__).resolve().parent
FLOWER_USER, FLOWER_PASSWORD = "statusgate", "flower-basic-secret-71c2"
BASIC = "Basic " + base64.b64encode(f"{FLOWER_USER}:{FLOWER_PASSWORD}".encode()).decode()
AUTH = {"Authorization": f"Bearer {AGENT_TOKEN}"}
STARTUP = 60.0  # seconds the worker and Flower get to come up


def _flower_call(base: str, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)  # noqa: S310
    request.add_header("Authorization", BASIC)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310 (loopback)
        return json.loads(answer.read())


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL to the process group it leads (a worker's pool children)."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)


@pytest.fixture(scope="module")
def flower(redis_base_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Celery worker (prefork, 2 processes) and a real Flower with basic auth, on a
    key prefix of their own; Flower's base URL. Both are stopped, and the keys deleted,
    at the end of the module."""
    import redis

    prefix = f"sgcelery-{uuid.uuid4().hex[:10]}:"
    logs = tmp_path_factory.mktemp("celery")
    env = {
        **os.environ,
        "PYTHONPATH": str(TESTS),
        "STATUSGATE_CELERY_REDIS": redis_base_url,
        "STATUSGATE_CELERY_PREFIX": prefix,
    }
    celery = [sys.executable, "-m", "celery", "-A", "celery_tasks"]
    port = free_port()
    processes: list[subprocess.Popen[bytes]] = []

    def start(args: list[str], log: str) -> subprocess.Popen[bytes]:
        with (logs / log).open("wb") as out:
            process = subprocess.Popen(
                celery + args,
                cwd=TESTS,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        processes.append(process)
        return process

    try:
        worker = ["worker", "--loglevel=WARNING", "--concurrency=2", "--without-gossip"]
        worker += ["--without-mingle", "--without-heartbeat", "-n", f"{prefix}w@127.0.0.1"]
        start(worker, "worker.log")
        serve = ["flower", "--address=127.0.0.1", f"--port={port}", "--logging=warning"]
        flower_process = start(
            [*serve, f"--basic-auth={FLOWER_USER}:{FLOWER_PASSWORD}"], "flower.log"
        )
        wait_until_up(port, flower_process)
        base = f"http://127.0.0.1:{port}"
        task = _flower_call(
            base, "POST", "/api/task/async-apply/celery_tasks.add", {"args": [1, 2]}
        )
        deadline = time.monotonic() + STARTUP
        while time.monotonic() < deadline:  # the worker is consuming once a task has run
            answer = _flower_call(base, "GET", f"/api/task/result/{task['task-id']}")
            if answer["state"] == "SUCCESS":
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the Celery worker ran no task in {STARTUP}s; see {logs}")
        yield base
    finally:
        for process in processes:
            _stop(process)
        client = redis.Redis.from_url(redis_base_url)
        keys = list(client.scan_iter(match=f"{prefix}*", count=500))
        if keys:
            client.delete(*keys)
        client.close()


@pytest.fixture
async def gateway(
    flower: str, tmp_path: Path
) -> AsyncIterator[tuple[Harness, RecordingProxy, dict[str, Any]]]:
    """A gateway in front of a recording proxy in front of Flower, with the policy's
    credential set to Flower's basic auth and its polling scaled down."""
    proxy = RecordingProxy(flower)
    upstream = await proxy.start()
    polling = fast_polling()
    changes = {"celery-flower": {"credential": {"value": BASIC}, "polling": polling}}
    try:
        async with live_gateway(tmp_path, upstream, policy_changes=changes) as harness:
            yield harness, proxy, polling
    finally:
        await proxy.close()


async def submit(http: aiohttp.ClientSession, harness: Harness, task: str, args: list[Any]) -> str:
    url = harness.client.make_url(f"/p/celery-flower/api/task/async-apply/{task}")
    async with http.post(url, json={"args": args}, headers=AUTH) as answer:
        assert answer.status == 200, await answer.text()
        body = await answer.json()
        return str(body["task-id"])


async def tight_loop(
    http: aiohttp.ClientSession, harness: Harness, task_id: str, limit: float, until: str = ""
) -> tuple[int, dict[str, Any], Any]:
    """A naive agent: GET the task's result again at once until its outcome is not pending
    (or its provider state is ``until``), no sleep, bounded by ``limit`` seconds."""
    url = harness.client.make_url(f"/p/celery-flower/api/task/result/{task_id}")
    calls, body, headers = 0, {}, None
    stop = time.monotonic() + limit
    while time.monotonic() < stop and calls < 50_000:
        calls += 1
        async with http.get(url, headers=AUTH) as answer:
            assert answer.status in (200, 429), await answer.text()
            if answer.status != 200:
                continue
            body, headers = await answer.json(), answer.headers
            if headers["Statusgate-Outcome"] != "pending" or body.get("state") == until:
                break
    return calls, body, headers


def polls_of(proxy: RecordingProxy, task_id: str) -> list[dict[str, Any]]:
    return [r for r in proxy.requests if r["path"].startswith(f"/api/task/result/{task_id}")]


async def test_celery_task_returning_none_succeeds(
    gateway: tuple[Harness, RecordingProxy, dict[str, Any]],
) -> None:
    """A real task that returns None ends SUCCESS with "result": null, which
    success_requires {path: result, allow_null: true} accepts; Flower got the gateway's
    basic auth, never the agent's token."""
    harness, proxy, _ = gateway
    async with aiohttp.ClientSession() as http:
        task_id = await submit(http, harness, "celery_tasks.returns_none", [])
        _, body, headers = await tight_loop(http, harness, task_id, 15.0)
        added = await submit(http, harness, "celery_tasks.add", [2, 3])
        _, sum_body, _ = await tight_loop(http, harness, added, 15.0)
    assert body["state"] == "SUCCESS" and body["result"] is None
    assert headers["Statusgate-Outcome"] == "succeeded"
    assert sum_body["result"] == 5
    for request in proxy.requests:
        assert request["headers"]["Authorization"] == BASIC
        assert AGENT_TOKEN not in str(request["headers"])


async def test_celery_tight_loop_gets_flower_only_the_permitted_polls(
    gateway: tuple[Harness, RecordingProxy, dict[str, Any]],
) -> None:
    """An agent polling a 2-second task with no sleep makes thousands of calls; Flower
    sees no more result requests than the schedule permits."""
    harness, proxy, polling = gateway
    async with aiohttp.ClientSession() as http:
        task_id = await submit(http, harness, "celery_tasks.slow", [2.0])
        started = time.monotonic()
        calls, body, headers = await tight_loop(http, harness, task_id, 15.0)
        elapsed = time.monotonic() - started
    polls = polls_of(proxy, task_id)
    assert body["state"] == "SUCCESS" and body["result"] == 2.0
    assert headers["Statusgate-Outcome"] == "succeeded"
    assert len(polls) <= permitted_polls(polling, elapsed)
    assert calls > 20 * len(polls)
    print(
        f"celery-flower, tight loop: {calls} calls in {elapsed:.1f}s, {len(polls)} Flower "
        f"result requests (schedule permits at most {permitted_polls(polling, elapsed)})"
    )


async def test_celery_failed_task_is_a_failure(
    gateway: tuple[Harness, RecordingProxy, dict[str, Any]],
) -> None:
    """A task that raises ends FAILURE: outcome failed, the exception kept in the body."""
    harness, _, _ = gateway
    async with aiohttp.ClientSession() as http:
        task_id = await submit(http, harness, "celery_tasks.fails", [])
        _, body, headers = await tight_loop(http, harness, task_id, 15.0)
    assert body["state"] == "FAILURE" and "scripted failure" in body["result"]
    assert headers["Statusgate-Outcome"] == "failed"


async def test_celery_running_task_revoked_by_an_operator_is_cancelled(
    gateway: tuple[Harness, RecordingProxy, dict[str, Any]],
) -> None:
    """An operator's cancel of a running task is sent to Flower as POST
    /api/task/revoke/{id}?terminate=true; the worker kills it, Celery reports REVOKED and
    the outcome is cancelled."""
    harness, proxy, _ = gateway
    async with aiohttp.ClientSession() as http:
        task_id = await submit(http, harness, "celery_tasks.slow", [30])
        _, body, _ = await tight_loop(http, harness, task_id, 15.0, until="STARTED")
        assert body["state"] == "STARTED"
        record = await harness.record(task_id, "celery-flower")
        answer = await harness.client.post(
            f"/admin/operations/{record.operation_id}/cancel",
            json={"reason": "no longer needed"},
            headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
        )
        assert answer.status == 200, await answer.text()
        _, body, headers = await tight_loop(http, harness, task_id, 15.0)
    revokes = [r for r in proxy.requests if r["method"] == "POST" and "/revoke/" in r["path"]]
    assert [r["path"] for r in revokes] == [f"/api/task/revoke/{task_id}?terminate=true"]
    assert body["state"] == "REVOKED"
    assert headers["Statusgate-Outcome"] == "cancelled"
