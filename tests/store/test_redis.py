"""Redis-only guarantees: reservations checked on Redis time, scripts surviving a Redis
restart, and an in-process gateway that fails closed while Redis is down or stalled."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis as sync_redis

from gateway import ConfigError, NotAdmissible, StoreError
from gateway.core.models import OperationRecord, Outcome
from gateway.flow.runtime import RUNTIME
from gateway.store import store_from_url
from gateway.store.redis.store import RedisStore

from conftest import RedisServer, Served, pending_record, real_time_harness


def record(**changes: Any) -> OperationRecord:
    return pending_record(**{"operation_id": "op_r", "max_status_requests": 3, **changes})


async def test_spending_a_request_is_checked_on_redis_time(redis_url: str) -> None:
    """A write that spends a status request is refused when, by Redis TIME, the poll is not
    due, the deadline has passed or the budget is spent; other writes are not checked."""
    store = store_from_url(redis_url)
    try:
        early = await store.create(record(next_poll_at=time.time() + 30))
        with pytest.raises(NotAdmissible):
            await store.save(early.evolve(status_requests_used=1))
        assert await store.save(early.evolve(early_refusals=1))
        late = await store.create(
            record(operation_id="op_late", provider_job_id="j2", deadline_at=time.time() - 1)
        )
        with pytest.raises(NotAdmissible):
            await store.save(late.evolve(status_requests_used=1))
        spent = await store.create(
            record(operation_id="op_spent", provider_job_id="j3", status_requests_used=3)
        )
        with pytest.raises(NotAdmissible):
            await store.save(spent.evolve(status_requests_used=4))
        due = await store.create(record(operation_id="op_due", provider_job_id="j4"))
        with pytest.raises(NotAdmissible):
            await store.save(due.evolve(status_requests_used=2))  # one at a time only
        assert await store.save(due.evolve(status_requests_used=1))
    finally:
        await store.close()


async def test_scripts_survive_a_script_flush(redis_url: str) -> None:
    """After SCRIPT FLUSH (what a Redis restart does to the script cache) writes still work."""
    store = store_from_url(redis_url)
    try:
        created = await store.create(record())
        client = sync_redis.Redis.from_url(redis_url.split("?")[0])
        client.script_flush()
        client.close()
        assert await store.save(created.evolve(early_refusals=1))
        assert await store.acquire_lease("x", "t", time.time(), 1)
    finally:
        await store.close()


async def test_keys_are_hash_tagged_and_prefixed(redis_url: str) -> None:
    """Every Redis key carries the store prefix and record keys a hash tag."""
    store = store_from_url(redis_url)
    assert isinstance(store, RedisStore)
    try:
        await store.create(record())
        client = sync_redis.Redis.from_url(redis_url.split("?")[0])
        keys = sorted(k.decode() for k in client.scan_iter(match=f"{store.prefix}:*"))
        client.close()
        assert f"{store.prefix}:op:{{op_r}}" in keys
        assert all(k.startswith(store.prefix + ":") for k in keys)
        tagged = [k for k in keys if ":op:" in k or ":job:" in k]
        assert all("{" in k and k.endswith("}") for k in tagged)
    finally:
        await store.close()


async def test_a_local_copy_is_acted_on_only_through_the_reservation(redis_url: str) -> None:
    """Store.known: the record as this process last wrote or read it, no round trip. When
    another replica wrote since, a reservation from the copy is not written and the store
    hands back the stored record, so the poll reserves from that without another read."""
    here, there = store_from_url(redis_url), store_from_url(redis_url)
    await here.open()
    await there.open()
    try:
        created = await here.create(record())
        assert here.known("team-a", "demo-jobs", "job_1") == created
        assert there.known("team-a", "demo-jobs", "job_1") is None  # never seen there
        assert await there.find("team-a", "demo-jobs", "job_1") == created
        assert await here.save(created.evolve(early_refusals=2))  # version 2, written here
        copy = there.known("team-a", "demo-jobs", "job_1")
        assert copy == created  # there's copy is older now
        now = time.time()
        reserve = copy.evolve(status_requests_used=1, last_polled_at=now)
        wait, written, moved = await there.start_and_reserve(
            "poll:op_r", "t", now, 5.0, "demo-jobs", None, reserve
        )
        assert (wait, written) == (0, False)
        assert moved is not None and moved.version == 2 and moved.early_refusals == 2
        assert there.known("team-a", "demo-jobs", "job_1") == moved
        stored = await there.get("op_r")
        assert stored is not None and stored.status_requests_used == 0  # nothing spent
    finally:
        await here.close()
        await there.close()


async def test_a_purge_drops_the_outbox_entry_of_a_record_deleted_already(
    redis_url: str,
) -> None:
    """A purge whose pipeline deleted a record but not its indexes (it is not a transaction:
    the connection may drop between) finds it gone at the next purge; its outbox entry goes
    too, else the sender would read it at every look for ever."""
    store = store_from_url(redis_url)
    assert isinstance(store, RedisStore)
    await store.open()
    try:
        now = time.time()
        created = await store.create(record())
        ended = created.evolve(outcome=Outcome.SUCCEEDED, ended_at=now - 100, announce=True)
        assert await store.save(ended)
        assert await store.owed_completions(10) == [ended.operation_id]
        await store._redis.delete(store.keys.op(ended.operation_id))  # half a purge
        assert await store.purge("demo-jobs", now, now) == 0  # nothing left to delete
        assert await store.owed_completions(10) == []
    finally:
        await store.close()


async def test_reads_in_one_loop_turn_share_one_round_trip(redis_url: str) -> None:
    """Fifty concurrent reads of one record and of ten others: every caller gets the
    record as stored, and each distinct record was decoded once."""
    store = store_from_url(redis_url)
    assert isinstance(store, RedisStore)
    await store.open()
    try:
        for n in range(10):
            await store.create(record(operation_id=f"op_{n}", provider_job_id=f"job_{n}"))
        answers = await asyncio.gather(*(store.get(f"op_{n % 10}") for n in range(50)))
        assert [a.operation_id for a in answers if a] == [f"op_{n % 10}" for n in range(50)]
        assert answers[0] is answers[10]  # one decoded copy shared within the batch
        assert await store.get("op_missing") is None
    finally:
        await store.close()


async def test_on_a_cluster_an_operations_keys_share_one_slot(redis_cluster_url: str) -> None:
    """Every script that writes a record touches the record, its poll lease and the
    provider's index keys of its shard: one slot, spread over the primaries by shard."""
    from redis.crc import key_slot

    store = store_from_url(redis_cluster_url)
    assert isinstance(store, RedisStore)
    try:
        slots = set()
        for n in range(200):
            operation_id = f"op_{n}"
            shard = store.keys.shard(operation_id)
            keys = [store.keys.op(operation_id), store.keys.lease(f"poll:{operation_id}")]
            keys += store.keys.indexes("demo-jobs", shard)
            assert len({key_slot(k.encode()) for k in keys}) == 1, keys
            slots.add(key_slot(keys[0].encode()))
        assert len(slots) == 64  # the default shards, all in use
        await store.create(record())
        assert (await store.find("team-a", "demo-jobs", "job_1")) is not None
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis+cluster://h:1,h:2/?wait_replicas=1", "wait_replicas is for one Redis"),
        ("redis+cluster://h:1/?shards=0", "shards must be between 1 and 16384"),
        ("redis+cluster://h:1/3", "has no database number"),
        ("redis+cluster://h:x", "names no node"),
        ("redis+cluster://h:1/?replicas=2", "unknown option(s) replicas"),
    ],
)
def test_a_cluster_url_that_cannot_work_says_why(url: str, problem: str) -> None:
    """A cluster URL that cannot work is a ConfigError saying why."""
    with pytest.raises(ConfigError) as caught:
        store_from_url(url)
    assert any(problem in line for line in caught.value.problems), caught.value.problems


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, with an append-only file so a restart keeps data."""

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH: cannot stop and restart a private Redis")
    server = RedisServer(data_dir=tmp_path / "redis")
    server.start()
    yield server
    if server.process is not None:
        os.kill(server.process.pid, signal.SIGCONT)
    server.stop()


async def test_fail_closed_while_redis_is_down_or_stalled(
    private_redis: RedisServer, tmp_path: Path
) -> None:
    """Redis stalled (SIGSTOP) or stopped: every call answers 503 store-unavailable within a
    second and nothing reaches the provider; /readyz is not ready; within about a second of
    Redis being back the next due poll goes through."""
    polling = {"base_delay": "200ms", "jitter": {"min": 1}}
    async with real_time_harness(
        tmp_path,
        store_url=f"{private_redis.url}?prefix=failclosed",
        policy_changes={"demo-jobs": {"polling": polling}},
    ) as harness:
        demo = harness.provider
        job = (await (await harness.submit([{"state": "running"}])).json())["id"]
        assert (await harness.poll_when_due(job)).status == 200
        assert private_redis.process is not None
        for phase in ("stalled", "stopped"):
            if phase == "stalled":
                os.kill(private_redis.process.pid, signal.SIGSTOP)
            else:
                private_redis.stop()
            await asyncio.sleep(0.3)
            seen = len(demo.log)
            for call in range(4):
                started = time.perf_counter()
                if call == 3:
                    response = await harness.submit([{"state": "running"}], key=f"new-{phase}")
                else:
                    response = await harness.poll(job)
                took = time.perf_counter() - started
                assert response.status == 503, phase
                assert (await response.json())["type"] == "/problems/store-unavailable"
                assert "Retry-After" in response.headers
                assert took < 1.0, (phase, took)
            assert len(demo.log) == seen
            assert (await harness.client.get("/readyz")).status == 503
            if phase == "stalled":
                os.kill(private_redis.process.pid, signal.SIGCONT)
                await asyncio.sleep(0.2)
                assert (await harness.client.get("/readyz")).status == 200
        private_redis.start()
        await asyncio.sleep(0.2)
        # A poll sent into the stall took its lease when Redis woke (the queued command ran
        # late); the gateway releases it in the background once Redis answers again, so
        # the operation is free again within about a second, not after the lease's time.
        for _ in range(20):
            response = await harness.poll_when_due(job)
            if response.status != 429:
                break
            await asyncio.sleep(0.1)
        assert response.status == 200, await response.text()
        assert len(harness.provider_calls(job)) == 2
        assert (await harness.client.get("/readyz")).status == 200
        metrics = await (await harness.client.get("/metrics")).text()
        assert 'statusgate_store_errors_total{operation="find"}' in metrics


async def test_gateway_flow_on_redis(redis_url: str, tmp_path: Path) -> None:
    """The ordinary flow on a Redis store with real time: refuse, poll, finish, cache."""
    async with real_time_harness(
        tmp_path,
        store_url=redis_url,
        policy_changes={"demo-jobs": {"polling": {"base_delay": "100ms"}}},
    ) as harness:
        script = [{"state": "running"}, {"state": "succeeded"}]
        job = (await (await harness.submit(script)).json())["id"]
        assert (await harness.poll(job)).status == 429
        assert (await harness.poll_when_due(job)).status == 200
        done = await harness.poll_when_due(job)
        assert done.headers["Statusgate-Outcome"] == "succeeded"
        assert (await harness.poll(job)).status == 200
        assert len(harness.provider_calls(job)) == 2
        record = await harness.record(job)
        assert record.status_requests_used == 2 and record.early_refusals == 1


async def test_a_stale_copy_never_answers_for_the_stored_record(
    redis_url: str, tmp_path: Path
) -> None:
    """This process's copy says a poll is due, but another replica has polled since (the
    stored record is not due) or the record is gone: the agent gets what the stored record
    says (429 too-early counted as a refusal, then 404), and the provider sees nothing."""
    async with real_time_harness(
        tmp_path,
        store_url=redis_url,
        policy_changes={"demo-jobs": {"polling": {"base_delay": "100ms"}}},
    ) as harness:
        job = (await (await harness.submit([{"state": "running"}])).json())["id"]
        assert (await harness.poll_when_due(job)).status == 200
        await asyncio.sleep(0.2)  # due now, by this process's copy too
        other = store_from_url(redis_url)  # another replica's view
        assert isinstance(other, RedisStore)
        await other.open()
        try:
            stored = await other.find("team-a", "demo-jobs", job)
            assert stored is not None
            later = time.time() + 60
            assert await other.save(stored.evolve(next_poll_at=later, status_requests_used=2))
            calls = len(harness.provider_calls(job))
            refused = await harness.poll(job)
            assert refused.status == 429, await refused.text()
            assert (await refused.json())["type"] == "/problems/too-early"
            assert 55 <= int(refused.headers["Retry-After"]) <= 60
            assert len(harness.provider_calls(job)) == calls
            copy = harness.client.app[RUNTIME].store.known("team-a", "demo-jobs", job)
            assert copy is not None and copy.next_poll_at == later  # the stored one now
            second = await (await harness.submit([{"state": "running"}], key="k2")).json()
            assert (await harness.poll_when_due(second["id"])).status == 200
            await asyncio.sleep(0.2)  # due by this process's copy
            gone = await other.find("team-a", "demo-jobs", second["id"])
            assert gone is not None
            client = sync_redis.Redis.from_url(redis_url.split("?")[0])
            client.delete(other.keys.op(gone.operation_id))
            client.close()
        finally:
            await other.close()
        answer = await harness.poll(second["id"])
        assert answer.status == 404, await answer.text()
        assert len(harness.provider_calls(second["id"])) == 1
        assert harness.client.app[RUNTIME].store.known("team-a", "demo-jobs", second["id"]) is None


async def test_wait_replicas_fails_closed_without_enough_replicas(redis_url: str) -> None:
    """With wait_replicas=1 on a Redis without replicas, writes are not trusted: StoreError."""
    store = store_from_url(f"{redis_url}&wait_replicas=1")
    try:
        with pytest.raises(StoreError, match="0 of 1 replicas"):
            await store.create(record())
    finally:
        await store.close()


async def test_a_gateway_started_while_redis_is_down_waits_not_ready_then_serves(
    tmp_path: Path, upstream: tuple[Any, str], gateways: list[Served]
) -> None:
    """A store unreachable at start is no reason to exit (on Kubernetes a crash loop):
    `statusgate serve` stays up, /readyz answers 503, and once Redis answers the gateway is
    ready and start-up recovery has run, without a restart."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH: cannot start a private Redis late")
    _, url = upstream
    server = RedisServer()  # its port, nothing listening yet
    served = Served(tmp_path, url, tmp_path / "unused.db", store_url=server.url)
    gateways.append(served)
    await served.up()
    async with aiohttp.ClientSession() as http:
        ready = f"http://127.0.0.1:{served.port}/readyz"
        async with http.get(ready) as answer:
            assert answer.status == 503
        server.start()
        try:
            for _ in range(100):
                async with http.get(ready) as answer:
                    if answer.status == 200:
                        break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the gateway never became ready")
        finally:
            stderr = served.stop()
            server.stop()
    assert served.process is not None and served.process.returncode == 0
    assert "recovery runs once it answers" in stderr


def test_commands_are_packed_by_hiredis_as_redis_py_packs_them() -> None:
    """The store's connections pack commands with hiredis (redis-py's asyncio connection
    packs in Python): the bytes on the wire are redis-py's own, and what redis-py refuses
    (None, bools) is refused alike."""
    import redis.asyncio as aioredis
    from redis.asyncio.connection import Connection
    from redis.exceptions import DataError

    from gateway.store.redis.clients import PackedConnection

    packed, plain = PackedConnection(), Connection()
    arguments = ["EVALSHA", "0123abc", 2, "{k}:op", b"{k}:raw", 1.5, -3, 2**70, 1 / 3]
    arguments += [float("inf"), "", "a b", "é\u2603", b"\x00\xff", 1e20, 0.1]
    assert packed.pack_command(*arguments) == plain.pack_command(*arguments)
    assert packed.pack_commands([arguments, ["GET", "x"]]) == plain.pack_commands(
        [arguments, ["GET", "x"]]
    )
    for refused in (None, True):
        with pytest.raises(DataError):
            packed.pack_command("SET", "k", refused)
        with pytest.raises(DataError):
            plain.pack_command("SET", "k", refused)
    latin = aioredis.ConnectionPool.from_url(
        "redis://127.0.0.1:1/0?encoding=latin-1", connection_class=PackedConnection
    ).make_connection()  # another encoding than hiredis writes: redis-py packs
    assert latin.pack_command("SET", "k", "é") == [b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n\xe9\r\n"]


def test_without_hiredis_commands_are_packed_as_redis_py_packs_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An install without hiredis (or one older than redis-py accepts, where its packer
    cannot run) packs in Python, as redis-py does, instead of failing every command."""
    from redis.asyncio.connection import Connection

    from gateway.store.redis import clients as redis_store

    def no_hiredis(*args: object) -> list[bytes]:
        raise NameError("name 'hiredis' is not defined")  # as redis-py's packer without it

    monkeypatch.setattr(redis_store, "HIREDIS", False)
    monkeypatch.setattr(redis_store.PackedConnection._packer, "pack", no_hiredis)
    arguments = ["EVALSHA", "0123abc", 2, "{k}:op", 1.5, "é"]
    packed = redis_store.PackedConnection().pack_command(*arguments)
    assert packed == Connection().pack_command(*arguments)
