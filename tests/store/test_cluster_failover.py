"""A Redis Cluster losing a primary under load: the gateway fails closed (503), never 500."""

from __future__ import annotations

import asyncio
import collections
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from redis.asyncio.client import Pipeline

from gateway import StoreError
from gateway.store import store_from_url
from gateway.store.redis.store import RedisStore
from gateway.store.redis.turns import Turns

from conftest import RedisCluster3, real_time_harness

LOAD_SECONDS = 8.0
WORKERS = 24


@pytest.fixture
def private_cluster(tmp_path: Path) -> RedisCluster3:
    """A three-primary cluster of this test's own (one of its primaries gets killed)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH: cannot start a private Redis Cluster")
    cluster = RedisCluster3(tmp_path / "cluster", node_timeout_ms=500)
    (tmp_path / "cluster").mkdir()
    cluster.start()
    yield cluster  # type: ignore[misc]
    for _, process in cluster.servers:
        if process.poll() is None:
            process.terminate()
            process.wait(5)


async def test_killing_a_primary_under_load_gives_503_never_500(
    private_cluster: RedisCluster3, tmp_path: Path
) -> None:
    """With status calls and submits in flight, SIGKILL on one cluster primary turns into 503
    store-unavailable answers (with Retry-After), never a 500, and the gateway keeps serving."""
    polling = {"base_delay": "50ms", "max_delay": "100ms", "max_status_requests": 10_000}
    url = f"redis+cluster://{private_cluster.nodes}/?prefix=failover"
    async with real_time_harness(
        tmp_path, store_url=url, policy_changes={"demo-jobs": {"polling": polling}}
    ) as harness:
        running = [{"state": "running"}] * 1000
        jobs = []
        for n in range(12):
            answer = await harness.submit(running, key=f"warm-{n}")
            assert answer.status == 202, await answer.text()
            jobs.append((await answer.json())["id"])
        statuses: collections.Counter[int] = collections.Counter()
        bad: list[str] = []
        stop = time.monotonic() + LOAD_SECONDS

        async def worker(n: int) -> None:
            turn = 0
            while time.monotonic() < stop:
                turn += 1
                if turn % 5 == 0:
                    answer = await harness.submit(running, key=f"load-{n}-{turn}")
                else:
                    answer = await harness.poll(jobs[(n + turn) % len(jobs)])
                statuses[answer.status] += 1
                if answer.status >= 500 and answer.status != 503:
                    bad.append(await answer.text())
                elif answer.status == 409:  # created at the provider, not recorded: said so
                    assert "submission-outcome-unknown" in await answer.text()
                elif answer.status == 503:
                    assert "Retry-After" in answer.headers
                await asyncio.sleep(0.005)

        async def kill_one_primary() -> None:
            await asyncio.sleep(1.0)
            _, victim = private_cluster.servers[1]
            os.kill(victim.pid, signal.SIGKILL)

        await asyncio.gather(kill_one_primary(), *(worker(n) for n in range(WORKERS)))
        assert not bad, (statuses, bad[:3])
        assert statuses[503] > 0, statuses  # the failover was seen
        assert set(statuses) <= {200, 202, 409, 429, 503}, statuses
        metrics = await (await harness.client.get("/metrics")).text()
        assert "statusgate_store_errors_total" in metrics


@pytest.mark.parametrize(
    "failure",
    [
        RuntimeError("readuntil() called while another coroutine is already waiting"),
        AttributeError("'NoneType' object has no attribute 'read'"),
        IndexError("pop from an empty deque"),
        KeyError("127.0.0.1:7001"),
    ],
)
async def test_whatever_the_cluster_client_raises_becomes_a_store_error(
    redis_url: str, failure: Exception, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A driver failure of any type (what redis-py's cluster client raises while a primary
    fails over) leaves the store as StoreError, so the gateway answers 503, never 500: from
    the pool and from the hot path's pipelines alike."""
    store = store_from_url(redis_url)
    assert isinstance(store, RedisStore)

    async def broken(*args: object, **kwargs: object) -> None:
        raise failure

    store._redis.hget = broken
    store._redis.get = broken
    monkeypatch.setattr(Pipeline, "execute", broken)  # a cluster's hot path: the pool's
    monkeypatch.setattr(Turns, "_pipeline", broken)  # one Redis: the turns' own round trip
    try:
        with pytest.raises(StoreError) as caught:
            await store.get("op_failover")
        assert caught.value.__cause__ is failure
        with pytest.raises(StoreError):
            await store.find("team-a", "demo-jobs", "job-1")
    finally:
        await store.close()
