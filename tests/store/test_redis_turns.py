"""The Redis hot path's pipelines (gateway/store/redis_turns.py): what one loop turn asks for
goes in one round trip, each caller gets its own answer or error, NOSCRIPT costs one more
round trip, and a Redis that cannot answer or keep up fails callers at once."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis
import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.core.models import OperationRecord
from gateway.errors import StoreError
from gateway.store import redis_layout as lua
from gateway.store import store_from_url
from gateway.store.redis import RedisStore
from gateway.store.redis_turns import Overloaded, Turns

from conftest import RedisServer, pending_record

Sends = list[AbstractConnection]


@pytest.fixture
def sends(monkeypatch: pytest.MonkeyPatch) -> Sends:
    """Every write to a Redis socket from here on (one a round trip), by connection."""
    seen: Sends = []
    send = AbstractConnection.send_packed_command

    async def counted(self: AbstractConnection, *args: Any, **kwargs: Any) -> None:
        seen.append(self)
        await send(self, *args, **kwargs)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
    return seen


def record(n: int) -> OperationRecord:
    return pending_record(operation_id=f"op_{n}", provider_job_id=f"job_{n}")


async def created(redis_url: str, count: int) -> tuple[RedisStore, list[OperationRecord]]:
    """A store with ``count`` records, its pipelines' connection open and its scripts loaded
    (a new connection's handshake and a first NOSCRIPT are round trips of their own)."""
    store = store_from_url(redis_url)
    assert isinstance(store, RedisStore)
    records = [await store.create(record(n)) for n in range(count)]
    client = sync_redis.Redis.from_url(redis_url.split("?")[0])
    for script in (lua.CAS, lua.START_POLL, lua.START_RESERVE, lua.CAS_RELEASE):
        client.script_load(script)
    client.close()
    assert await store.get("op_0") is not None
    return store, records


async def test_one_turns_scripts_go_in_one_round_trip(redis_url: str, sends: Sends) -> None:
    """Twenty record writes and twenty poll starts asked for in one loop turn reach Redis in
    one write to one connection, and each caller gets its own answer."""
    store, records = await created(redis_url, 20)
    try:
        sends.clear()
        writes = [store.save(r.evolve(early_refusals=1)) for r in records]
        starts = [
            store.start_poll(f"poll:op_{n}", "t", time.time(), 5.0, "demo-jobs", None)
            for n in range(20)
        ]
        answers = await asyncio.gather(*writes, *starts)
        assert answers == [True] * 20 + [0.0] * 20
        assert len(sends) == 1
        again = await asyncio.gather(
            *(
                store.start_poll(f"poll:op_{n}", "u", time.time(), 5.0, "demo-jobs", None)
                for n in range(20)
            )
        )
        assert again == [None] * 20  # the leases are held: each caller saw its own lease
        assert len(sends) == 2
    finally:
        await store.close()


async def test_one_turns_reads_go_in_one_round_trip(redis_url: str, sends: Sends) -> None:
    """Fifty reads of ten records in one loop turn: one round trip, every record as stored."""
    store, records = await created(redis_url, 10)
    try:
        sends.clear()
        answers = await asyncio.gather(*(store.get(f"op_{n % 10}") for n in range(50)))
        assert answers == [records[n % 10] for n in range(50)]
        assert len(sends) == 1
    finally:
        await store.close()


async def test_a_failing_script_fails_its_own_caller_only(redis_url: str, sends: Sends) -> None:
    """A write whose script fails in Redis (its record key holds a string: WRONGTYPE inside
    the script) raises StoreError for its caller; the writes sent with it go through."""
    store, records = await created(redis_url, 5)
    try:
        client = sync_redis.Redis.from_url(redis_url.split("?")[0])
        client.set(store.keys.op("op_2"), "not a record")
        client.close()
        sends.clear()
        answers = await asyncio.gather(
            *(store.save(r.evolve(early_refusals=1)) for r in records), return_exceptions=True
        )
        assert len(sends) == 1
        assert isinstance(answers[2], StoreError)
        assert answers[:2] + answers[3:] == [True] * 4
        assert [await store.get(f"op_{n}") for n in (0, 1, 3, 4)] == [
            r.evolve(early_refusals=1, version=2) for r in records[:2] + records[3:]
        ]
    finally:
        await store.close()


async def test_after_a_script_flush_one_more_round_trip(redis_url: str, sends: Sends) -> None:
    """After SCRIPT FLUSH (a Redis restart) the scripts of one turn are loaded and sent again
    in one more round trip, and every write goes through once."""
    store, records = await created(redis_url, 10)
    try:
        client = sync_redis.Redis.from_url(redis_url.split("?")[0])
        client.script_flush()
        client.close()
        sends.clear()
        answers = await asyncio.gather(*(store.save(r.evolve(early_refusals=1)) for r in records))
        assert answers == [True] * 10
        assert len(sends) == 2
        stored = await asyncio.gather(*(store.get(r.operation_id) for r in records))
        assert {r.version for r in stored if r} == {2}
    finally:
        await store.close()


async def test_past_the_bound_callers_are_refused_at_once(redis_base_url: str) -> None:
    """With more commands waiting than the bound, a caller is refused without waiting; the
    store turns Overloaded, a RedisError, into StoreError (503 store-unavailable)."""
    turns = Turns(aioredis.Redis.from_url(redis_base_url, max_connections=1), bound=3)
    try:
        asked = [turns.call(("PING",)) for _ in range(4)]
        answers = await asyncio.gather(*asked, return_exceptions=True)
        assert answers[:3] == [[True]] * 3
        assert isinstance(answers[3], Overloaded)
        assert await turns.call(("PING",), ("PING",)) == [True, True]  # the queue drained
        alone = await turns.call(*[("PING",)] * 5)  # larger than the bound, nothing waiting
        assert alone == [True] * 5
    finally:
        await turns.aclose()


async def test_a_redis_that_does_not_answer_fails_every_caller_at_once() -> None:
    """Nothing listening: every caller of the pipeline, and those queued behind it, gets the
    connection error within the connect timeout."""
    client = aioredis.Redis(
        port=1,
        socket_connect_timeout=0.3,
        socket_timeout=0.3,
        max_connections=1,
        retry=Retry(NoBackoff(), 1),  # as the store's
    )
    turns = Turns(client)
    try:
        started = time.perf_counter()
        first = [turns.call(("GET", "x")) for _ in range(5)]
        answers = await asyncio.gather(*first, return_exceptions=True)
        assert all(isinstance(a, RedisConnectionError) for a in answers), answers
        assert time.perf_counter() - started < 1.0
    finally:
        await turns.aclose()


async def test_callers_queued_behind_a_pipeline_that_times_out_fail_with_it() -> None:
    """A Redis that takes the connection and never answers: the pipeline in flight times
    out, and the callers that queued behind it meanwhile fail at the same moment, not one
    timeout later each (nor are its commands sent again: no retry after a timeout)."""
    received: list[bytes] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(65536):
            if b"HELLO" in chunk:  # the handshake is answered (RESP3), nothing after it
                writer.write(b"%2\r\n$6\r\nserver\r\n$5\r\nredis\r\n$5\r\nproto\r\n:3\r\n")
            elif b"CLIENT" in chunk:
                writer.write(b"+OK\r\n")
            else:
                received.append(chunk)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = aioredis.Redis(
        port=port,
        socket_connect_timeout=0.3,
        socket_timeout=0.3,
        max_connections=1,
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),  # as the store's
        driver_info=None,
    )
    turns = Turns(client)
    try:
        started = time.perf_counter()
        first = asyncio.ensure_future(turns.call(("SET", "x", "1")))
        await asyncio.sleep(0.1)  # the first pipeline is out, waiting for its answer
        behind = [asyncio.ensure_future(turns.call(("GET", "x"))) for _ in range(3)]
        answers = await asyncio.gather(first, *behind, return_exceptions=True)
        elapsed = time.perf_counter() - started
        assert all(isinstance(a, Exception) for a in answers), answers
        assert elapsed < 0.55, elapsed  # one timeout (0.3 s), not two
        assert b"".join(received).count(b"SET") == 1  # sent once, never again
    finally:
        await turns.aclose()
        server.close()
        await server.wait_closed()


@pytest.fixture
def primary_and_replica(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer]]:
    """A private redis-server and a replica of it, in sync (their files, the sync's RDB
    among them, in ``tmp_path``, not the working directory)."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH: cannot start a primary and its replica")
    primary, replica = RedisServer(tmp_path / "primary"), RedisServer(tmp_path / "replica")
    primary.start()
    replica.start()
    client = sync_redis.Redis(port=replica.port)
    client.replicaof("127.0.0.1", str(primary.port))
    deadline = time.monotonic() + 10
    while client.info("replication").get("master_link_status") != "up":
        assert time.monotonic() < deadline, "the replica never synced"
        time.sleep(0.05)
    client.close()
    yield primary, replica
    if replica.process is not None:
        os.kill(replica.process.pid, signal.SIGCONT)
    replica.stop()
    primary.stop()


async def test_wait_replicas_holds_each_write_to_its_replica(
    primary_and_replica: tuple[RedisServer, RedisServer],
) -> None:
    """With wait_replicas=1, concurrent writes count once the replica has them; with the
    replica stalled every one fails closed within a second, their WAITs sent as one (a
    stalled replica costs a pipeline one WAIT timeout, not one per writer)."""
    primary, replica = primary_and_replica
    store = store_from_url(f"{primary.url}?prefix=waits&wait_replicas=1")
    assert isinstance(store, RedisStore)
    client = sync_redis.Redis(port=primary.port)
    try:
        records = [await store.create(record(n)) for n in range(20)]
        saves = [store.save(r.evolve(early_refusals=1)) for r in records]
        assert await asyncio.gather(*saves) == [True] * 20
        assert replica.process is not None
        os.kill(replica.process.pid, signal.SIGSTOP)
        client.config_resetstat()
        started = time.perf_counter()
        saves = [store.save(r.evolve(early_refusals=2, version=2)) for r in records]
        answers = await asyncio.gather(*saves, return_exceptions=True)
        assert time.perf_counter() - started < 1.0
        assert all(isinstance(a, StoreError) and "0 of 1" in str(a) for a in answers), answers
        assert client.info("commandstats")["cmdstat_wait"]["calls"] == 1
    finally:
        client.close()
        await store.close()
