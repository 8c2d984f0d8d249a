"""The Redis hot path's pipelines (gateway/store/redis/turns.py, its wire wire.py): what
one loop turn asks for goes in one round trip, each caller gets its own answer or error,
NOSCRIPT costs one more round trip, and a Redis that cannot answer or keep up fails callers
at once."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hiredis
import pytest
import redis as sync_redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway import StoreError
from gateway.core.models import OperationRecord
from gateway.store import store_from_url
from gateway.store.redis import layout as lua
from gateway.store.redis.clients import PackedConnection
from gateway.store.redis.store import RedisStore
from gateway.store.redis.turns import Overloaded, Turns
from gateway.store.redis.wire import Command, Link, packed, redis_py_wire

from conftest import RedisServer, pending_record

Sends = list[asyncio.StreamWriter]


@pytest.fixture
def sends(monkeypatch: pytest.MonkeyPatch) -> Sends:
    """Every write to a Redis socket from here on (one a round trip), by stream: redis-py's
    own (the pool, a handshake) and Turns' alike go through StreamWriter.writelines."""
    seen: Sends = []
    writelines = asyncio.StreamWriter.writelines

    def counted(self: asyncio.StreamWriter, data: Any) -> None:
        seen.append(self)
        writelines(self, data)

    monkeypatch.setattr(asyncio.StreamWriter, "writelines", counted)
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


# -- the wire: Turns' own I/O against redis-py's pipeline ------------------------------------


class PipelineTurns(Turns):
    """Turns as it was, each pipeline sent by redis-py's Pipeline.execute: the reference
    that answers must match."""

    async def _pipeline(self, commands: list[Command]) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        answers: list[Any] = await pipe.execute(raise_on_error=False)
        return answers


NESTED = """return {1, 'two', {3, 'four', {}}, false, redis.call('GET', KEYS[1]),
    tonumber(ARGV[1]) * 2, 'é'}"""
SCRIPTS = (
    NESTED,
    "return redis.call('GET', KEYS[1])",  # nil when the key is missing
    "return {ok = 'fine'}",
    "return redis.error_reply('MYERR a script refused')",
    "return redis.call('HGET', KEYS[1], 'x')",  # WRONGTYPE on a string key
    "return {1, redis.error_reply('inner')}",  # an error reply inside an array
    "return 2^53",
)


def mixed(prefix: str, shas: list[str]) -> list[Command]:
    """One of each kind of answer the store and its tests get, with keys under ``prefix``."""
    text, h, n, z, s = (f"{prefix}:{kind}" for kind in ("text", "hash", "n", "z", "set"))
    scripts = [Turns.evalsha(sha, [text], ["21"]) for sha in shas]
    return [
        ("SET", text, "v1"),
        ("GET", text),
        ("GET", f"{prefix}:missing"),
        ("HSET", h, "a", "1", "b", "é"),
        ("HGET", h, "a"),
        ("HGETALL", h),
        ("INCRBY", n, 5),
        ("ZADD", z, 1.5, "m"),
        ("ZSCORE", z, "m"),
        ("ZRANGE", z, 0, -1, "WITHSCORES"),
        ("SADD", s, "x", "y"),
        ("SMEMBERS", s),
        ("PING",),
        ("WAIT", 0, 0),
        ("HGET", text, "x"),  # WRONGTYPE
        ("NOSUCHCOMMAND", "x"),
        ("EVALSHA", "0" * 40, 0),  # NOSCRIPT for a script nobody registered
        *scripts,
        Turns.evalsha(shas[1], [f"{prefix}:missing"], []),
        ("DEL", text, h, n, z, s),
    ]


def shape(answer: Any) -> Any:
    """An answer comparable with ==: an exception as its type and arguments."""
    if isinstance(answer, BaseException):
        return (type(answer), answer.args)
    if isinstance(answer, list | tuple):
        return [shape(a) for a in answer]
    if isinstance(answer, dict):
        return {k: shape(v) for k, v in answer.items()}
    return answer


async def answers_of(turns: Turns, commands: list[Command]) -> list[Any]:
    """Each command's answer (or error) as its own caller gets it, all in one turn."""
    asked = [turns.call(command) for command in commands]
    got = await asyncio.gather(*asked, return_exceptions=True)
    return [a if isinstance(a, BaseException) else a[0] for a in got]


@pytest.mark.parametrize("protocol", [2, 3])
@pytest.mark.parametrize("decode", [False, True])
async def test_answers_are_those_of_redis_pys_pipeline(
    redis_base_url: str, protocol: int, decode: bool
) -> None:
    """For one of each kind of command and answer (bulk, nil, int, float, map, set, nested
    script arrays, status, error replies in place and nested, NOSCRIPT), Turns' own wire
    gives every caller what redis-py's pipeline gave, decoded or not, in RESP2 and RESP3."""
    prefix = f"sgtest-{uuid.uuid4().hex[:12]}"

    def client() -> aioredis.Redis:
        return aioredis.Redis.from_url(
            redis_base_url, max_connections=1, protocol=protocol, decode_responses=decode
        )

    new, old = Turns(client()), PipelineTurns(client())
    shas = [new.script(source) for source in SCRIPTS]
    assert [old.script(source) for source in SCRIPTS] == shas
    loader = sync_redis.Redis.from_url(redis_base_url)
    for source in SCRIPTS:
        loader.script_load(source)
    loader.close()
    try:
        expected = await answers_of(old, mixed(f"{prefix}:old", shas))
        got = await answers_of(new, mixed(f"{prefix}:new", shas))
        assert shape(got) == shape(expected)
        assert got[0] is True and got[12] is True  # SET and PING through their callbacks
        assert got[2] is None and isinstance(got[14], ResponseError)
        assert isinstance(got[16], NoScriptError)
    finally:
        await new.aclose()
        await old.aclose()


async def test_a_script_unknown_to_redis_is_loaded_once_and_answers_as_before(
    redis_base_url: str, sends: Sends
) -> None:
    """A script Redis has never seen (NOSCRIPT) is loaded and sent again in one more round
    trip, and its caller's answer is the one redis-py's pipeline gives after the same."""
    answers = []
    for kind in (PipelineTurns, Turns):
        turns = kind(aioredis.Redis.from_url(redis_base_url, max_connections=1))
        try:
            await turns.call(("PING",))  # the connection opened
            source = f"-- {uuid.uuid4().hex}\n{NESTED}"
            sha = turns.script(source)
            key = f"sgtest-{uuid.uuid4().hex[:12]}:text"
            sends.clear()
            answers.append(await turns.call(("SET", key, "v"), turns.evalsha(sha, [key], [4])))
            assert len(sends) == 2
            await turns.call(("DEL", key))
        finally:
            await turns.aclose()
    assert (
        answers[0]
        == answers[1]
        == [True, [1, b"two", [3, b"four", []], None, b"v", 8, "é".encode()]]
    )


class FakeRedis:
    """A server on loopback that answers RESP2 commands as ``answer`` says: (seconds to
    wait, reply bytes), or None to close the connection. Records each command it got."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.got: list[tuple[int, list[bytes]]] = []  # (connection number, command)
        self.connections = 0
        self.closed_by_client: list[int] = []
        self.server: asyncio.Server | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        parser = hiredis.Reader()
        while chunk := await reader.read(65536):
            parser.feed(chunk)
            commands = []
            while (command := parser.gets()) is not False:
                commands.append(command)
            self.got += [(number, command) for command in commands]
            answers = [self.answer(number, command) for command in commands]
            if None in answers:
                writer.close()
                return
            for delay, reply in answers:
                asyncio.get_running_loop().call_later(delay, _write, writer, reply)
        self.closed_by_client.append(number)

    async def __aenter__(self) -> aioredis.Redis:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return aioredis.Redis(
            port=port,
            protocol=2,  # no HELLO: nothing to answer before the commands
            socket_connect_timeout=0.3,
            socket_timeout=0.3,
            max_connections=1,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            driver_info=None,
        )

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.server.wait_closed(), 1)


def _write(writer: asyncio.StreamWriter, reply: bytes) -> None:
    if not writer.is_closing():
        writer.write(reply)


def bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


async def test_a_late_answer_is_never_given_to_a_later_caller() -> None:
    """A pipeline answered after the timeout fails its caller with redis-py's TimeoutError
    and drops its connection: the answer arriving later on it reaches nobody, and the next
    callers, on a new connection, get their own answers."""

    def answer(number: int, command: list[bytes]) -> tuple[float, bytes]:
        return (0.6 if command[1] == b"slow" else 0.0), bulk(command[1])

    fake = FakeRedis(answer)
    async with fake as client:
        turns = Turns(client)
        try:
            started = time.perf_counter()
            with pytest.raises(RedisTimeoutError):
                await turns.call(("GET", "slow"))
            assert 0.25 < time.perf_counter() - started < 0.55
            assert await turns.call(("GET", "next")) == [b"next"]
            await asyncio.sleep(0.5)  # the slow answer is written to the first connection
            assert await turns.call(("GET", "after"), ("GET", "more")) == [b"after", b"more"]
            assert fake.connections == 2
            assert fake.closed_by_client == [1]
            assert [c for _, c in fake.got].count([b"GET", b"slow"]) == 1
        finally:
            await turns.aclose()


async def test_one_timeout_a_pipeline_not_one_a_reply() -> None:
    """Answers that trickle in, each within the timeout but all of them not, fail the
    pipeline at the timeout: a caller never waits longer than it."""

    def answer(number: int, command: list[bytes]) -> tuple[float, bytes]:
        return 0.2 * int(command[1]), bulk(command[1])

    async with FakeRedis(answer) as client:
        turns = Turns(client)
        try:
            started = time.perf_counter()
            with pytest.raises(RedisTimeoutError):
                await turns.call(("GET", "1"), ("GET", "2"), ("GET", "3"))
            assert time.perf_counter() - started < 0.45
        finally:
            await turns.aclose()


async def test_a_pipeline_whose_connection_breaks_is_never_sent_again() -> None:
    """The server closes the connection after taking a pipeline: its callers get redis-py's
    ConnectionError and it is not sent again (it may have run); the next pipeline goes on a
    new connection."""

    def answer(number: int, command: list[bytes]) -> tuple[float, bytes] | None:
        return None if number == 1 else (0.0, b"+OK\r\n")

    fake = FakeRedis(answer)
    async with fake as client:
        turns = Turns(client)
        try:
            first = [turns.call(("SET", "x", str(n))) for n in range(3)]
            answers = await asyncio.gather(*first, return_exceptions=True)
            assert all(isinstance(a, RedisConnectionError) for a in answers), answers
            assert await turns.call(("SET", "x", "again")) == [True]
            assert [n for n, _ in fake.got] == [1, 1, 1, 2]  # each SET once
        finally:
            await turns.aclose()


async def test_a_connection_killed_while_idle_is_reopened_first(redis_base_url: str) -> None:
    """CLIENT KILL of Turns' connection between pipelines: the next pipeline notices before
    it writes anything, opens a new connection and is answered; no caller sees an error."""
    turns = Turns(aioredis.Redis.from_url(redis_base_url, max_connections=1))
    killer = sync_redis.Redis.from_url(redis_base_url)
    try:
        [before] = await turns.call(("CLIENT", "ID"))
        assert killer.client_kill_filter(_id=before) == 1
        await asyncio.sleep(0.05)  # the loop reads the close
        [after] = await turns.call(("CLIENT", "ID"))
        assert after != before
    finally:
        killer.close()
        await turns.aclose()


async def test_a_restarted_redis_is_reopened_for_the_next_pipeline(tmp_path: Path) -> None:
    """Redis stopped: a pipeline while it is down fails with a connection error, and the
    next one once it is back goes through on a new connection; Redis restarted between two
    pipelines: the next one goes through, no caller sees an error."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH: cannot restart a private Redis")
    server = RedisServer(tmp_path / "redis")
    server.start()
    turns = Turns(
        aioredis.Redis.from_url(
            server.url,
            max_connections=1,
            socket_timeout=0.3,
            socket_connect_timeout=0.3,
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        )
    )
    try:
        assert await turns.call(("SET", "k", "v")) == [True]
        server.stop()
        await asyncio.sleep(0.05)
        with pytest.raises(RedisConnectionError):
            await turns.call(("GET", "k"))
        server.start()
        assert await turns.call(("GET", "k"), ("PING",)) == [b"v", True]
        server.stop()
        server.start()
        await asyncio.sleep(0.05)  # the loop reads the old connection's close
        assert await turns.call(("GET", "k")) == [b"v"]
    finally:
        await turns.aclose()
        server.stop()


async def test_redis_py_still_has_what_turns_reads_of_it(redis_base_url: str) -> None:
    """The private members of redis-py 8.1 that Turns reads (a connection's streams, its
    parser's error mapping) are there on a connected connection of the store's kind."""
    pool = aioredis.ConnectionPool.from_url(
        redis_base_url, connection_class=PackedConnection, max_connections=1
    )
    conn = await pool.get_connection()
    try:
        reader, writer, parse_error = redis_py_wire(conn)
        assert isinstance(reader, asyncio.StreamReader)
        assert isinstance(writer, asyncio.StreamWriter)
        assert isinstance(parse_error("NOSCRIPT No matching script."), NoScriptError)
        assert type(parse_error("WRONGTYPE Operation")) is ResponseError
        assert issubclass(hiredis.PushNotification, list)
    finally:
        await pool.aclose()


@pytest.mark.parametrize("connection_class", [PackedConnection, aioredis.Connection])
def test_commands_go_as_redis_pys_packing_writes_them(connection_class: type[Any]) -> None:
    """Turns packs with hiredis where it can: the bytes are those of the connection's own
    packing (hiredis or Python), for every kind of argument and a command name with a
    space in it."""
    conn = connection_class()
    commands: list[Command] = [
        ("EVALSHA", "a" * 40, 2, "k1", "k:é", 0.1, 1e-7, -0.0, float("inf"), 2**70, -5),
        ("SET", b"\x00\xff", "x" * 10_000),
        ("SCRIPT LOAD", "return 1"),
        ("HGET", memoryview(b"key"), bytearray(b"field")),  # type: ignore[arg-type]
    ]
    link = Link.__new__(Link)
    link.hiredis_packs = True
    assert b"".join(packed(link, conn, commands)) == b"".join(conn.pack_commands(commands))


async def test_a_writes_wait_goes_in_the_writes_own_pipeline(
    primary_and_replica: tuple[RedisServer, RedisServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With wait_replicas, every write of the poll path (reservation, answer, record save)
    sends its WAIT in its own call, so on the same connection as the write: a WAIT sent in
    a later pipeline could go on a connection opened again after a failover moved the
    address, and acknowledge nothing of the write."""
    primary, _ = primary_and_replica
    sent: list[list[str]] = []
    call = Turns.call

    async def recording(self: Turns, *commands: Command) -> list[Any]:
        sent.append([str(command[0]) for command in commands])
        return await call(self, *commands)

    monkeypatch.setattr(Turns, "call", recording)
    store = store_from_url(f"{primary.url}?prefix=waitsown&wait_replicas=1")
    assert isinstance(store, RedisStore)
    try:
        created = await store.create(record(1))
        assert await store.save(created.evolve(early_refusals=1))
        stored = await store.get(created.operation_id)
        assert stored is not None
        now = time.time()
        reserve = stored.evolve(status_requests_used=1, last_polled_at=now)
        started = await store.start_and_reserve("poll:w", "t", now, 5.0, "p", None, reserve)
        assert started[1] is True
        reserved = await store.get(created.operation_id)
        assert reserved is not None
        await store.finish_poll(
            created.operation_id,
            lambda current: (current.evolve(early_refusals=2), True),
            known=reserved,
            lease="poll:w",
            token="t",
        )
        stored = await store.get(created.operation_id)
        assert stored is not None and stored.early_refusals == 2
        writes = [commands for commands in sent if "EVALSHA" in commands]
        assert len(writes) == 3
        assert all(commands[-1] == "WAIT" for commands in writes), writes
        assert not [commands for commands in sent if commands == ["WAIT"]]
    finally:
        await store.close()


async def test_a_write_sent_again_after_noscript_is_waited_for_again(
    primary_and_replica: tuple[RedisServer, RedisServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """After NOSCRIPT (Redis restarted, its scripts flushed, a failover) the write is sent
    again with its WAIT after it: the WAIT of the first pipeline ran before the write
    existed, so a stalled replica still fails the write closed (it once returned True)."""
    primary, replica = primary_and_replica
    pipelines: list[list[str]] = []
    pipeline = Turns._pipeline

    async def recorded(self: Turns, commands: list[Command]) -> list[Any]:
        pipelines.append([str(command[0]) for command in commands])
        return await pipeline(self, commands)

    monkeypatch.setattr(Turns, "_pipeline", recorded)
    store = store_from_url(f"{primary.url}?prefix=noscriptwait&wait_replicas=1")
    assert isinstance(store, RedisStore)
    client = sync_redis.Redis(port=primary.port)
    try:
        created = await store.create(record(1))
        assert await store.save(created.evolve(early_refusals=1))
        client.script_flush()
        deadline = time.monotonic() + 10  # the replica acknowledges what it has (each second)
        while client.wait(1, 100) < 1:
            assert time.monotonic() < deadline, "the replica never caught up"
        assert replica.process is not None
        os.kill(replica.process.pid, signal.SIGSTOP)
        pipelines.clear()
        with pytest.raises(StoreError, match="0 of 1 replicas acknowledged"):
            await store.save(created.evolve(early_refusals=2, version=2))
        assert pipelines == [["EVALSHA", "WAIT"], ["SCRIPT", "EVALSHA", "WAIT"]]
    finally:
        client.close()
        await store.close()
