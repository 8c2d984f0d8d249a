"""A real gateway process on SQLite (and on PostgreSQL and Redis) killed at the worst moments, and
stopped with SIGTERM while calls are in flight. After every restart no counter went
backwards, every provider call is counted, and the audit chain verifies (at worst with a
torn final line)."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from gateway.core.models import OperationRecord
from gateway.demo.provider import DemoProvider
from gateway.observe.audit import read_lines, records, verify

from conftest import (
    AGENT_TOKEN,
    PROVIDER_ENV,
    PROVIDER_KEY,
    free_port,
    start_statusgate,
    wait_until_up,
    write_config,
)

AUTH = {"Authorization": f"Bearer {AGENT_TOKEN}"}


class Gateway:
    """One `statusgate serve` process on a SQLite file (or a PostgreSQL schema, or Redis
    keys under a prefix), restartable."""

    def __init__(self, folder: Path, upstream: str, store: str | None = None) -> None:
        self.port = free_port()
        self.db = folder / "gateway.db"
        self.postgres = store if store is not None and store.startswith("postgres") else None
        self.redis = store if store is not None and store.startswith("redis") else None
        self.audit = folder / "audit.jsonl"
        self.config = write_config(
            folder,
            upstream,
            store=store or f"sqlite:///{self.db}",
            config_changes={
                "listen": {"port": self.port},
                "audit": {"path": "audit.jsonl"},
                "limits": {"upstream_timeout": "2s"},  # so a dead process's lease lasts 3 s
            },
        )
        self.process: subprocess.Popen[bytes] | None = None
        self.url = f"http://127.0.0.1:{self.port}/p/demo-jobs/v1/jobs"

    async def start(self) -> None:
        env = {**os.environ, **PROVIDER_ENV}
        self.process = start_statusgate(["serve", "--config", str(self.config)], env)
        await asyncio.to_thread(wait_until_up, self.port, self.process)

    def signal(self, number: int) -> None:
        assert self.process is not None
        os.kill(self.process.pid, number)

    async def wait(self) -> int:
        assert self.process is not None
        code = await asyncio.to_thread(self.process.wait, 15)
        stderr = self.process.stderr.read().decode() if self.process.stderr else ""
        assert "Traceback" not in stderr and PROVIDER_KEY not in stderr, stderr
        return code

    def record(self, job: str) -> OperationRecord:
        import json

        if self.redis is not None:
            return self._redis_record(job)
        if self.postgres is not None:
            with self._postgres() as conn:
                row = conn.execute(
                    f"SELECT data FROM {self._table} WHERE provider_job_id = %s", (job,)
                ).fetchone()
            return OperationRecord.from_dict(json.loads(row[0]))
        with sqlite3.connect(self.db) as conn:
            row = conn.execute(
                "SELECT data FROM operations WHERE provider_job_id = ?", (job,)
            ).fetchone()
        return OperationRecord.from_dict(json.loads(row[0]))

    def _redis_record(self, job: str) -> OperationRecord:
        """Read as the store keeps it (gateway/store/redis/layout.py), one Redis."""
        import json

        import redis

        from gateway.store.redis.layout import Keys

        assert self.redis is not None
        base, prefix = self.redis.split("?prefix=", 1)
        keys = Keys(prefix, cluster=False, shards=1)
        client = redis.Redis.from_url(base)
        try:
            operation_id = client.get(keys.job("team-a", "demo-jobs", job))
            assert operation_id is not None, job
            data = client.hget(keys.op(operation_id.decode()), "d")
        finally:
            client.close()
        assert data is not None, operation_id
        return OperationRecord.from_dict(json.loads(data))

    @property
    def _table(self) -> str:
        assert self.postgres is not None
        return '"' + self.postgres.rsplit("schema=", 1)[1] + '".operations'

    def _postgres(self) -> Any:
        import psycopg

        assert self.postgres is not None
        return psycopg.connect(self.postgres.split("?", 1)[0], autocommit=True)

    def blocker(self) -> tuple[Any, Any]:
        """(lock, unlock) of the store's operations, so the gateway's next write waits."""
        if self.postgres is not None:
            conn = self._postgres()

            def lock() -> None:
                conn.execute("BEGIN")
                conn.execute(f"LOCK TABLE {self._table} IN EXCLUSIVE MODE")

            def unlock() -> None:
                conn.execute("ROLLBACK")
                conn.close()

            return lock, unlock
        blocker = sqlite3.connect(self.db, isolation_level=None, timeout=5)

        def unlock_sqlite() -> None:
            blocker.execute("ROLLBACK")
            blocker.close()

        return (lambda: blocker.execute("BEGIN EXCLUSIVE")), unlock_sqlite


async def started(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Gateway, DemoProvider]]:
    """The gateway on the store ``request.param`` names, and the demo provider it calls."""
    store = None
    if request.param != "sqlite":
        store = request.getfixturevalue(f"{request.param}_url")
    demo = DemoProvider(api_key=PROVIDER_KEY)
    server = TestServer(demo.app(), host="127.0.0.1")
    await server.start_server()
    gateway = Gateway(tmp_path, str(server.make_url("")).rstrip("/"), store)
    await gateway.start()
    yield gateway, demo
    if gateway.process is not None and gateway.process.poll() is None:
        gateway.process.kill()
        await gateway.wait()
    await server.close()


@pytest.fixture(params=["sqlite", "postgres"])
async def setup(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Gateway, DemoProvider]]:
    """The gateway on the stores whose writes a test can hold up from outside (a SQLite
    file, a PostgreSQL schema)."""
    async for pair in started(request, tmp_path):
        yield pair


@pytest.fixture(params=["sqlite", "postgres", "redis"])
async def any_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Gateway, DemoProvider]]:
    """The gateway on every store that outlives its process: SQLite, PostgreSQL, Redis."""
    async for pair in started(request, tmp_path):
        yield pair


async def submit(http: aiohttp.ClientSession, gateway: Gateway, script: list[Any], key: str) -> str:
    payload = {"demo_submit": {"poll_after_seconds": 0}, "demo_script": script}
    async with http.post(gateway.url, json=payload, headers={**AUTH, "Idempotency-Key": key}) as r:
        assert r.status == 202
        return str((await r.json())["id"])


async def poll_after_restart(gateway: Gateway, job: str) -> tuple[int, str]:
    """Poll as told until answered. The dead process's lease stands until it expires, so
    the first answers are too-early: nobody polls while a poll may still be in flight."""
    async with aiohttp.ClientSession() as http:
        for _ in range(6):
            async with http.get(f"{gateway.url}/{job}", headers=AUTH) as r:
                if r.status != 429:
                    return r.status, r.headers.get("Statusgate-Outcome", "")
                await asyncio.sleep(float(r.headers.get("Retry-After", "1")))
    raise AssertionError("still too early after the lease should have expired")


def call_lines(gateway: Gateway, operation_id: str) -> list[tuple[str, str]]:
    """Issue 9.15: the audit lines that stand for status requests sent to the provider."""
    return [
        (line["event"], line["decision"])
        for line in records(gateway.audit)
        if line.get("operation_id") == operation_id and line["event"] in ("polled", "finished")
    ]


def calls(demo: DemoProvider, job: str) -> int:
    return sum(1 for e in demo.log if e["job_id"] == job and e["method"] == "GET")


async def until(condition: Any) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never held")


async def test_sigkill_right_after_the_reservation(
    any_store: tuple[Gateway, DemoProvider],
) -> None:
    """Killed while the provider answers the reserved call: the budget counts that call,
    the restarted gateway audits it as interrupted and polls again when due."""
    gateway, demo = any_store
    async with aiohttp.ClientSession() as http:
        script = [{"state": "running", "delay": 1.5}, {"state": "running"}]
        job = await submit(http, gateway, script, "a")
        await asyncio.sleep(0.6)
        pending = asyncio.create_task(http.get(f"{gateway.url}/{job}", headers=AUTH))
        await until(lambda: calls(demo, job) == 1)
        gateway.signal(signal.SIGKILL)
        await gateway.wait()
        pending.cancel()
    reserved = gateway.record(job)
    assert reserved.status_requests_used == calls(demo, job) == 1
    await gateway.start()
    status, _ = await poll_after_restart(gateway, job)
    assert status == 200
    after = gateway.record(job)
    assert after.status_requests_used == calls(demo, job) == 2
    assert verify(read_lines(gateway.audit), None).intact
    assert call_lines(gateway, after.operation_id) == [
        ("polled", "interrupted"),
        ("polled", "pending"),
    ]


async def test_sigkill_right_after_the_provider_answered(
    setup: tuple[Gateway, DemoProvider],
) -> None:
    """The provider answers while the test holds the gateway's store write lock, so the
    gateway is killed with the answer in hand and not yet recorded."""
    gateway, demo = setup
    lock, unlock = gateway.blocker()
    answered = asyncio.Event()

    async def lock_store(job_id: str) -> None:
        lock()
        answered.set()

    async with aiohttp.ClientSession() as http:
        job = await submit(http, gateway, [{"state": "running"}, {"state": "succeeded"}], "b")
        await asyncio.sleep(0.6)
        demo.before_answer = lock_store
        pending = asyncio.create_task(http.get(f"{gateway.url}/{job}", headers=AUTH))
        await answered.wait()
        await asyncio.sleep(0.2)  # the gateway now waits for the lock to record the answer
        gateway.signal(signal.SIGKILL)
        await gateway.wait()
        pending.cancel()
        demo.before_answer = None
    # PostgreSQL sees its client gone within client_connection_check_interval (250 ms) and
    # drops the waiting write; released sooner, the write would land, as if sent just
    # before the kill.
    await asyncio.sleep(0.5)
    unlock()
    record = gateway.record(job)
    assert record.status_requests_used == calls(demo, job) == 1
    assert record.last_known_state == "queued"  # the answer was lost, never half-written
    await gateway.start()
    status, outcome = await poll_after_restart(gateway, job)
    assert (status, outcome) == (200, "succeeded")
    after = gateway.record(job)
    assert after.status_requests_used == calls(demo, job) == 2
    assert verify(read_lines(gateway.audit), None).intact
    assert call_lines(gateway, after.operation_id) == [
        ("polled", "interrupted"),
        ("finished", "succeeded"),
    ]


async def test_torn_audit_tail_after_a_crash(setup: tuple[Gateway, DemoProvider]) -> None:
    """A kill during an audit write leaves at most a torn final line (simulated here by
    cutting the last line, as a power cut would): verify reports only that, and the
    restarted gateway sets it aside and continues the chain."""
    gateway, _ = setup
    async with aiohttp.ClientSession() as http:
        job = await submit(http, gateway, [{"state": "running"}], "c")
        await asyncio.sleep(0.6)
        async with http.get(f"{gateway.url}/{job}", headers=AUTH) as r:
            assert r.status == 200
    gateway.signal(signal.SIGKILL)
    await gateway.wait()
    data = gateway.audit.read_bytes()
    gateway.audit.write_bytes(data[: len(data) - 40])
    verdict = verify(read_lines(gateway.audit), None)
    assert verdict.intact and verdict.torn_tail
    await gateway.start()
    await asyncio.sleep(1.5)
    async with aiohttp.ClientSession() as http, http.get(f"{gateway.url}/{job}", headers=AUTH) as r:
        assert r.status in (200, 429)
    await asyncio.sleep(0.3)
    verdict = verify(read_lines(gateway.audit), None)
    assert verdict.intact and not verdict.torn_tail
    assert list(gateway.audit.parent.glob("audit.jsonl.torn-*"))


async def test_sigterm_drains_calls_in_flight(setup: tuple[Gateway, DemoProvider]) -> None:
    gateway, demo = setup
    async with aiohttp.ClientSession() as http:
        jobs = [
            await submit(http, gateway, [{"state": "running", "delay": 1}], f"d{i}")
            for i in range(4)
        ]
        await asyncio.sleep(0.6)

        async def poll(job: str) -> tuple[int, str]:
            async with http.get(f"{gateway.url}/{job}", headers=AUTH) as r:
                return r.status, r.headers.get("Statusgate-Provider-State", "")

        in_flight = [asyncio.create_task(poll(job)) for job in jobs]
        await until(lambda: all(calls(demo, job) == 1 for job in jobs))
        gateway.signal(signal.SIGTERM)
        answers = await asyncio.gather(*in_flight)
    assert answers == [(200, "running")] * 4
    assert await gateway.wait() == 0
    lines = list(read_lines(gateway.audit))
    assert verify(lines, None).intact
    polled = [line for line in lines if b'"event":"polled"' in line]
    assert len(polled) == 4
    for job in jobs:
        assert gateway.record(job).status_requests_used == 1
