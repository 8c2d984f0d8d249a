"""The PostgreSQL hot path's pipelines (gateway/store/postgres/turns.py), on a real server: what
one loop turn asks for goes in one pipeline, each caller gets its own answer or error, a
caller's statements are one transaction, a database that hangs or goes away fails callers
within the timeout and is reconnected by itself, and nothing abandoned runs later or twice."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway import StoreError
from gateway.core.models import OperationRecord
from gateway.store import store_from_url
from gateway.store.postgres import turns as postgres_turns
from gateway.store.postgres.store import PostgresStore
from gateway.store.postgres.turns import Overloaded, Statement, Turns

from conftest import PostgresServer, pending_record

psycopg = pytest.importorskip("psycopg", reason="pip install -e '.[postgres]'")


def record(n: int) -> OperationRecord:
    return pending_record(operation_id=f"op_{n}", provider_job_id=f"job_{n}")


async def opened(url: str, count: int) -> tuple[PostgresStore, list[OperationRecord]]:
    store = store_from_url(url)
    assert isinstance(store, PostgresStore)
    await store.migrate()  # as `statusgate migrate` does before serve
    await store.open()
    return store, [await store.create(record(n)) for n in range(count)]


@pytest.fixture
async def counters(postgres_base_url: str) -> AsyncIterator[tuple[str, str]]:
    """A table of this test's own, ``(id, n)`` with row 1 at 0: (base URL, its name)."""
    base = postgres_base_url.split("?", 1)[0]
    table = f"sgturns_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, n int NOT NULL)")
        conn.execute(f"INSERT INTO {table} VALUES (1, 0)")
    yield base, table
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")


def turns_on(url: str, *statements: Statement, **kw: Any) -> Turns:
    async def connect() -> Any:
        return await psycopg.AsyncConnection.connect(url, autocommit=True)

    return Turns(connect, statements, **kw)


def counted(base: str, table: str) -> int:
    with psycopg.connect(base, autocommit=True) as conn:
        row = conn.execute(f"SELECT n FROM {table} WHERE id = 1").fetchone()
    assert row is not None
    return int(row[0])


async def test_one_turns_statements_go_in_one_pipeline(postgres_url: str) -> None:
    """Twenty record writes and twenty poll starts asked for in one loop turn are one
    pipeline on one connection, and each caller gets its own answer."""
    store, records = await opened(postgres_url, 20)
    try:
        sent = store._turns.pipelines
        writes = [store.save(r.evolve(early_refusals=1)) for r in records]
        starts = [
            store.start_poll(f"poll:op_{n}", "t", time.time(), 5.0, "demo-jobs", None)
            for n in range(20)
        ]
        answers = await asyncio.gather(*writes, *starts)
        assert answers == [True] * 20 + [0.0] * 20
        assert store._turns.pipelines == sent + 1
        again = await asyncio.gather(
            *(
                store.start_poll(f"poll:op_{n}", "u", time.time(), 5.0, "demo-jobs", None)
                for n in range(20)
            )
        )
        assert again == [None] * 20  # the leases are held: each caller saw its own lease
        assert store._turns.pipelines == sent + 2
        stored = await asyncio.gather(*(store.get(r.operation_id) for r in records))
        assert {(r.version, r.early_refusals) for r in stored if r} == {(2, 1)}
    finally:
        await store.close()


async def test_a_failing_statement_fails_its_own_caller_only(postgres_url: str) -> None:
    """A write whose statement fails in the database (a budget out of the integer range)
    raises StoreError for its caller; the reads and writes sent in the same pipeline go
    through (the failed write's group rolled back and sent again, one transaction each,
    in one more round trip). A parameter the database could not take (NUL) is refused
    before sending."""
    store, records = await opened(postgres_url, 5)
    try:
        sent = store._turns.pipelines
        writes = [r.evolve(early_refusals=1) for r in records]
        writes[2] = records[2].evolve(max_status_requests=2**40)
        answers = await asyncio.gather(
            store.get("op_0"),
            store.get("op_\x00"),
            *(store.save(w) for w in writes),
            store.get("op_4"),
            return_exceptions=True,
        )
        assert store._turns.pipelines == sent + 1 and store._turns.resends == 1
        assert answers[0] == records[0]
        assert isinstance(answers[1], StoreError)
        assert isinstance(answers[4], StoreError) and "out of range" in str(answers[4])
        assert answers[2:4] + answers[5:7] == [True] * 4
        assert answers[7] == records[4]  # a read of the same turn: its group went first
        assert await store.get("op_4") == records[4].evolve(early_refusals=1, version=2)
        assert await store.get("op_2") == records[2]
    finally:
        await store.close()


async def test_a_callers_statements_are_one_transaction(counters: tuple[str, str]) -> None:
    """Two statements of one caller commit together or not at all: when the second fails the
    first is rolled back, and the callers around it are answered as usual."""
    base, table = counters
    bump = Statement.of("bump", f"UPDATE {table} SET n = n + %s WHERE id = 1 RETURNING n")
    divide = Statement.of("divide", "SELECT 1 / %s::int")
    turns = turns_on(base, bump, divide)
    try:
        answers = await asyncio.gather(
            turns.call((bump, (1,))),
            turns.call((bump, (10,)), (divide, (0,))),
            turns.call((bump, (100,)), (divide, (1,))),
            return_exceptions=True,
        )
        assert answers[0] == [[(b"1",)]]
        assert isinstance(answers[1], psycopg.errors.DivisionByZero)
        assert answers[2] == [[(b"101",)], [(b"1",)]]
        assert counted(base, table) == 101
        assert turns.pipelines == 1
    finally:
        await turns.aclose()


async def test_a_pipelines_callers_commit_together(postgres_base_url: str) -> None:
    """The callers of one pipeline are two transactions, not one each: those that need no
    WAL flush commit together with synchronous_commit off, the rest together with it on."""
    xact = Statement.of(
        "xact",
        "SELECT pg_current_xact_id()::text, current_setting('synchronous_commit'),"
        " current_setting('lock_timeout')",
    )
    turns = turns_on(postgres_base_url.split("?", 1)[0], xact, links=1)
    try:
        await turns.open()
        answers = await asyncio.gather(
            *(turns.call((xact, ()), flush=n % 2 == 0) for n in range(6)),
            turns.call((xact, ()), flush=False),
        )
        rows = [answer[0][0] for answer in answers]
        flushed, lazy = {rows[n] for n in (0, 2, 4)}, {rows[n] for n in (1, 3, 5, 6)}
        assert len(flushed) == 1 and len(lazy) == 1 and flushed != lazy
        assert [row[1:] for row in (*flushed, *lazy)] == [(b"on", b"100ms"), (b"off", b"100ms")]
        assert turns.pipelines == 1 and turns.resends == 0
        alone = await turns.call((xact, ()))  # a lone caller: the session's own settings
        assert alone[0][0][1:] == (b"on", b"0")
    finally:
        await turns.aclose()


async def test_a_group_held_up_by_a_lock_is_sent_again_alone(counters: tuple[str, str]) -> None:
    """A group that waits on a row lock longer than GROUP_LOCK_WAIT is rolled back and its
    callers sent again one transaction each; they wait for the lock as long as they must
    and each write commits exactly once."""
    base, table = counters
    bump = Statement.of("bump", f"UPDATE {table} SET n = n + 1 WHERE id = 1 RETURNING n")
    turns = turns_on(base, bump, links=1)
    try:
        await turns.open()
        with psycopg.connect(base, autocommit=True) as holder:
            with holder.transaction():
                holder.execute(f"SELECT 1 FROM {table} WHERE id = 1 FOR UPDATE")
                calls = [asyncio.ensure_future(turns.call((bump, ()))) for _ in range(3)]
                await asyncio.sleep(0.3)  # past the group's lock_timeout, within its deadline
            answers = await asyncio.gather(*calls)
        assert sorted(answer[0][0][0] for answer in answers) == [b"1", b"2", b"3"]
        assert counted(base, table) == 3
        assert turns.pipelines == 1 and turns.resends == 1
    finally:
        await turns.aclose()


async def test_two_groups_locking_in_opposite_orders_both_go_through(
    counters: tuple[str, str],
) -> None:
    """Two replicas' pipelines, each one group taking the same two rows in the opposite
    order, would deadlock until deadlock_timeout (1 s, past every caller's deadline): the
    group's lock_timeout ends the wait at once, and every write commits exactly once."""
    base, table = counters
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {table} VALUES (2, 0)")
    bump = Statement.of(
        "bump", f"UPDATE {table} SET n = n + 1 WHERE id = %s RETURNING pg_sleep(0.05)::text"
    )
    one, two = turns_on(base, bump, links=1), turns_on(base, bump, links=1)
    try:
        await asyncio.gather(one.open(), two.open())
        started = time.perf_counter()
        answers = await asyncio.gather(
            one.call((bump, (1,))),
            one.call((bump, (2,))),
            two.call((bump, (2,))),
            two.call((bump, (1,))),
        )
        assert len(answers) == 4 and time.perf_counter() - started < 0.9
        with psycopg.connect(base, autocommit=True) as conn:
            rows = conn.execute(f"SELECT id, n FROM {table} ORDER BY id").fetchall()
        assert rows == [(1, 2), (2, 2)]
        assert one.resends + two.resends >= 1
    finally:
        await asyncio.gather(one.aclose(), two.aclose())


async def test_a_caller_cancelled_before_its_pipeline_went_sends_nothing(
    counters: tuple[str, str],
) -> None:
    """A caller that gave up (cancelled) while its statements waited for a pipeline: they
    are never sent (a reservation nobody waits for would spend a budget for nothing)."""
    base, table = counters
    bump = Statement.of("bump", f"UPDATE {table} SET n = n + %s WHERE id = 1 RETURNING n")
    turns = turns_on(base, bump, links=1)
    try:
        await turns.open()
        first = turns.call((bump, (1,)))
        second = turns.call((bump, (10,)))
        second.cancel()  # before the turn ends: its pipeline has not gone yet
        assert await first == [[(b"1",)]]
        assert counted(base, table) == 1
    finally:
        await turns.aclose()


async def test_prepare_off_sends_unnamed_statements(postgres_url: str) -> None:
    """With prepare=off (PgBouncer) nothing is prepared on the turns' connections, and a
    poll's statements answer as with prepared ones."""
    store, records = await opened(postgres_url.replace("?", "?prepare=off&"), 3)
    try:
        assert not store._turns._prepare
        reserved = records[0].evolve(status_requests_used=1, inflight_at=time.time())
        started = await store.start_and_reserve(
            "poll:op_0", "t", time.time(), 5.0, "demo-jobs", None, reserved
        )
        assert started == (0.0, True, None)
        assert await store.find("team-a", "demo-jobs", "job_1") == records[1]
        prepared = Statement.of("prepared", "SELECT count(*) FROM pg_prepared_statements")
        answers = await asyncio.gather(*(store._turns.call((prepared, ())) for _ in range(8)))
        assert answers == [[[(b"0",)]]] * 8
    finally:
        await store.close()


async def test_past_the_bound_callers_are_refused_at_once(postgres_base_url: str) -> None:
    """With more statements waiting than the bound, a caller is refused without waiting;
    a call that finds nothing waiting is taken whatever its size."""
    one = Statement.of("one", "SELECT 1")
    turns = turns_on(postgres_base_url.split("?", 1)[0], one, links=1, bound=3)
    try:
        asked = [turns.call((one, ())) for _ in range(3)]
        with pytest.raises(Overloaded):
            turns.call((one, ()))
        assert await asyncio.gather(*asked) == [[[(b"1",)]]] * 3
        alone = await turns.call(*[(one, ())] * 5)
        assert alone == [[(b"1",)]] * 5
    finally:
        await turns.aclose()


async def test_an_abandoned_pipeline_never_runs_later(counters: tuple[str, str]) -> None:
    """Callers whose statements wait on a lock past the timeout all fail within it (those
    queued behind too); their statements do not run once the lock is released (the
    connection is reset and the one running cancelled) and are never sent again."""
    base, table = counters
    bump = Statement.of("bump", f"UPDATE {table} SET n = n + 1 WHERE id = 1 RETURNING n")
    turns = turns_on(base, bump, links=1, timeout=0.4)
    try:
        with psycopg.connect(base, autocommit=True) as holder, holder.transaction():
            holder.execute(f"SELECT 1 FROM {table} WHERE id = 1 FOR UPDATE")
            started = time.perf_counter()
            first = [turns.call((bump, ())) for _ in range(5)]
            await asyncio.sleep(0.1)  # the first pipeline is out, waiting for the lock
            behind = [turns.call((bump, ())) for _ in range(5)]
            answers = await asyncio.gather(*first, *behind, return_exceptions=True)
            took = time.perf_counter() - started
        assert all(isinstance(a, TimeoutError) for a in answers), answers
        assert took < 0.8, took
        await asyncio.sleep(0.5)
        assert counted(base, table) == 0
        assert await turns.call((bump, ())) == [[(b"1",)]]  # a new connection
        await asyncio.sleep(0.2)
        assert counted(base, table) == 1 and turns.pipelines <= 3
    finally:
        await turns.aclose()


async def test_closing_answers_a_pipeline_whose_cancel_is_slow(
    counters: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store closed while a pipeline waits on a lock, its cancel slow to reach the server
    (aclose cancels the sender again every 0.1 s, longer than that): the caller is answered
    all the same, never left waiting."""
    base, table = counters
    real = postgres_turns._cancel

    async def slow(cancel: Any) -> None:
        await asyncio.sleep(0.15)
        await real(cancel)

    monkeypatch.setattr(postgres_turns, "_cancel", slow)
    bump = Statement.of("bump", f"UPDATE {table} SET n = n + 1 WHERE id = 1 RETURNING n")
    turns = turns_on(base, bump, links=1, timeout=5.0)
    await turns.open()
    with psycopg.connect(base, autocommit=True) as holder, holder.transaction():
        holder.execute(f"SELECT 1 FROM {table} WHERE id = 1 FOR UPDATE")
        waiting = turns.call((bump, ()))
        await asyncio.sleep(0.2)  # its pipeline is out, held by the lock
        await turns.aclose()
        await asyncio.sleep(0.3)
        assert waiting.done()
        assert isinstance(waiting.exception(), psycopg.OperationalError)


def server_pids(server: PostgresServer) -> list[int]:
    """The postmaster and its children (backends and helpers)."""
    postmaster = int((server.folder / "data" / "postmaster.pid").read_text().split()[0])
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == postmaster:
            children.append(int(stat.parent.name))
    return [postmaster, *children]


def signal_all(server: PostgresServer, number: signal.Signals) -> None:
    if not (server.folder / "data" / "postmaster.pid").exists():
        return
    for pid in server_pids(server):
        with contextlib.suppress(ProcessLookupError):  # a backend that just ended
            os.kill(pid, number)


def pause(server: PostgresServer) -> None:
    signal_all(server, signal.SIGSTOP)


def resume(server: PostgresServer) -> None:
    signal_all(server, signal.SIGCONT)


async def recovered(call: Any, seconds: float = 5.0) -> float:
    """Seconds until ``call()`` succeeds, retrying every 0.1 s."""
    started = time.perf_counter()
    while True:
        try:
            await call()
            return time.perf_counter() - started
        except StoreError:
            assert time.perf_counter() - started < seconds, "the store never recovered"
            await asyncio.sleep(0.1)


async def test_a_database_that_stops_answering_fails_callers_within_the_timeout(
    private_postgres: PostgresServer,
) -> None:
    """The server paused (SIGSTOP) under pipelines in flight: their callers and those
    queued behind fail within 1.5 s; each abandoned write runs at most once, never sent
    again; when the server resumes, calls succeed without reopening the store."""
    store, records = await opened(private_postgres.url, 10)
    try:
        pause(private_postgres)

        async def timed(call: Any) -> float:
            started = time.perf_counter()
            with pytest.raises(StoreError):
                await call
            return time.perf_counter() - started

        first = [
            asyncio.ensure_future(timed(store.save(r.evolve(early_refusals=1)))) for r in records
        ]
        await asyncio.sleep(0.2)
        behind = [asyncio.ensure_future(timed(store.get(r.operation_id))) for r in records]
        took = await asyncio.gather(*first, *behind)
        assert max(took) < 1.5, took
        resume(private_postgres)
        await recovered(lambda: store.get("op_0"))
        stored = await asyncio.gather(*(store.get(r.operation_id) for r in records))
        assert {r.version for r in stored if r} <= {1, 2}  # at most once each
    finally:
        resume(private_postgres)
        await store.close()


async def test_a_database_restarted_fails_fast_and_is_reconnected(
    private_postgres: PostgresServer,
) -> None:
    """The server stopped: every call is a StoreError within 1.5 s; started again, the
    store answers within a few seconds with no reopening; a server that closes the idle
    connections (a restart) costs no caller an error: they are replaced before use."""
    store, records = await opened(private_postgres.url, 5)
    try:
        private_postgres.stop("fast")
        for _ in range(3):
            started = time.perf_counter()
            answers = await asyncio.gather(
                *(store.get(r.operation_id) for r in records), return_exceptions=True
            )
            assert all(isinstance(a, StoreError) for a in answers), answers
            assert time.perf_counter() - started < 1.5
        private_postgres.start()
        assert await recovered(lambda: store.get("op_0")) < 3.0
        await asyncio.gather(*(store.get(r.operation_id) for r in records))
        links = [link.conn for link in store._turns._links if link.conn is not None]
        pids = [conn.pgconn.backend_pid for conn in links]
        with psycopg.connect(private_postgres.url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))
        await asyncio.sleep(0.2)  # the server's goodbye reaches the idle connections
        for _ in range(3):
            answers = await asyncio.gather(*(store.get(r.operation_id) for r in records))
            assert answers == records
    finally:
        await store.close()
