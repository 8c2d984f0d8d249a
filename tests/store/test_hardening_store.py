"""Store hardening (SPEC 16) on every backend: overdue operations and ended records are found
by indexes whatever else the store holds, the SQLite record cache is bounded in bytes, and a
SQLite file belongs to one store at a time."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

import gateway.store.sqlite.store as sqlite_module
from gateway import ConfigError, StoreError
from gateway.core import decide
from gateway.core.models import FinalResponse, OperationRecord, Outcome
from gateway.flow.runtime import RUNTIME
from gateway.run.app import create_app
from gateway.settings.config import load_settings
from gateway.store import SQLiteStore, Store, store_from_url
from gateway.store.shared import measure_offset
from gateway.store.sqlite.cache import Cache, footprint
from gateway.store.sqlite.loop_share import WINDOW
from gateway.store.sqlite.store import LAZY_SYNC
from gateway.store.sqlite.wal_sync import WalSyncer

from conftest import PROVIDER_ENV, pending_record, write_config

MiB = 1024 * 1024


def op(number: int, **changes: object) -> OperationRecord:
    return pending_record(operation_id=f"op_{number}", provider_job_id=f"job_{number}", **changes)


def ended(number: int, at: float, **changes: object) -> OperationRecord:
    return op(number, outcome=Outcome.SUCCEEDED, ended_at=at, **changes)


async def create_all(store: Store, records: list[OperationRecord]) -> None:
    """Concurrently, but no more at once than the smallest pool has connections (10 on
    PostgreSQL, 50 on Redis): a store fails closed soon without a free connection (Redis
    after 0.3 s, PostgreSQL after 1 s), by design, and a loaded machine must not trip it."""
    for start in range(0, len(records), 10):
        await asyncio.gather(*(store.create(r) for r in records[start : start + 10]))


async def test_overdue_lists_pending_operations_past_their_deadline(store: Store) -> None:
    """Only pending operations of the provider whose deadline came, earliest first, bounded."""
    now = time.time()
    await store.create(op(1, deadline_at=now - 5))
    await store.create(op(2, deadline_at=now - 50))
    await store.create(op(3, deadline_at=now + 60))
    await store.create(ended(4, now - 1, deadline_at=now - 100))
    await store.create(op(5, deadline_at=now - 500, provider="other"))
    assert await store.overdue("demo-jobs", now, 10) == ["op_2", "op_1"]
    assert await store.overdue("demo-jobs", now, 1) == ["op_2"]
    assert await store.overdue("other", now, 10) == ["op_5"]


async def test_overdue_follows_every_write(store: Store) -> None:
    """A deadline moved by a write, or an operation that stops waiting, moves the answer."""
    now = time.time()
    late = await store.create(op(1, deadline_at=now - 5))
    early = await store.create(op(2, deadline_at=now + 60))
    assert await store.save(early.evolve(deadline_at=now - 1))
    assert await store.save(late.evolve(outcome=Outcome.ESCALATED, ended_at=now))
    assert await store.overdue("demo-jobs", now, 10) == ["op_2"]
    stored = await store.get("op_1")
    assert stored is not None
    assert await store.save(stored.evolve(outcome=Outcome.PENDING, ended_at=None))  # extended
    assert await store.overdue("demo-jobs", now, 10) == ["op_1", "op_2"]


async def test_purge_reaches_ended_records_behind_ten_thousand_pending(store: Store) -> None:
    """10,000 pending operations started first stand in the way of nothing: every ended
    record past retention goes, the rest stay."""
    now = time.time()
    pending = [op(i, started_at=now - 20_000 + i) for i in range(10_000)]
    await create_all(store, pending)
    old = [ended(20_000 + i, now - 100, started_at=now - 10 + i / 10) for i in range(30)]
    await create_all(store, [*old, ended(30_000, now - 1)])
    assert await store.purge("demo-jobs", now - 10, now) == 30
    assert await store.get("op_20000") is None
    assert await store.get("op_30000") is not None
    assert await store.get("op_9999") is not None
    assert (await store.active_counts())["demo-jobs"] == 10_000
    assert await store.purge("demo-jobs", now - 10, now) == 0


async def test_sqlite_cache_is_bounded_in_bytes(tmp_path: Path) -> None:
    """Final bodies worth 8 MiB pass through a 1 MiB cache: it never holds more than 1 MiB,
    and every record still reads back whole (from disk)."""
    store = SQLiteStore(str(tmp_path / "cache.db"), cache_bytes=MiB)
    try:
        now = time.time()
        written = []
        for i in range(40):
            body = bytes([i]) * (200 * 1024)
            final = FinalResponse(200, "application/octet-stream", body)
            written.append(await store.create(ended(i, now, final_response=final)))
            assert store.cached_bytes <= MiB
        for record in written:
            assert await store.get(record.operation_id) == record
            assert store.cached_bytes <= MiB
        assert store.cache_limit == MiB and store.cached_bytes > 0
    finally:
        await store.close()


def test_cache_evicts_least_recently_used_and_skips_what_is_too_big() -> None:
    """The SQLite record cache evicts the least recently used record and never holds one larger
    than its limit."""
    small = [op(i) for i in range(3)]
    cache = Cache(limit=footprint(small[0]) * 2)
    cache.wrote(small[0])
    cache.wrote(small[1])
    assert cache.get("op_0") == small[0]  # now the most recently used
    cache.wrote(small[2])
    assert cache.get("op_1") is None and cache.get("op_0") == small[0]
    huge = op(9, final_response=FinalResponse(200, "text/plain", b"x" * cache.limit))
    cache.wrote(huge)
    assert cache.get("op_9") is None and cache.size <= cache.limit


def test_cache_forgets_a_record_gone_and_keeps_the_job_index_in_step() -> None:
    """A record deleted or rolled back leaves the cache whole: by id, by job, in bytes."""
    cache = Cache(limit=footprint(op(1)) * 3)
    cache.wrote(op(1))
    cache.wrote(op(1).evolve(version=2, early_refusals=1))  # the newer version replaces it
    assert cache.size == footprint(op(1)) and cache.get("op_1").version == 2  # type: ignore[union-attr]
    found = cache.find(op(1).account, op(1).provider, op(1).provider_job_id)
    assert found is not None and found.version == 2
    cache.gone("op_1")
    assert cache.get("op_1") is None and cache.size == 0
    assert cache.find(op(1).account, op(1).provider, op(1).provider_job_id) is None


async def test_sqlite_answers_what_the_file_holds_after_a_turn_the_disk_refused(
    tmp_path: Path,
) -> None:
    """SQLite writes of one turn of the loop share one transaction. When the disk refuses one
    of them (a page limit stands in for a full disk), the store afterwards answers what the
    file holds, and no caller was told of a write the file does not have; once room
    returns, writes go through again."""
    store = SQLiteStore(str(tmp_path / "g.db"))
    await store.open()
    try:
        first = await store.create(op(1))
        conn = store._connections["write"]  # the page limit is the writer connection's own
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")
        big = op(2, final_response=FinalResponse(200, "text/plain", b"x" * 400_000))
        saved, created = await asyncio.gather(
            store.save(first), store.create(big), return_exceptions=True
        )
        assert isinstance(created, StoreError) and "full" in str(created)
        on_file = (
            sqlite3.connect(tmp_path / "g.db")
            .execute("SELECT version FROM operations WHERE operation_id = 'op_1'")
            .fetchone()[0]
        )
        assert on_file == first.version + (1 if saved is True else 0), saved
        answered = await store.get("op_1")
        assert answered is not None and answered.version == on_file
        assert await store.get("op_2") is None
        conn.execute("PRAGMA max_page_count = 1073741823")
        assert await store.save(answered)
        assert (await store.create(big)).operation_id == "op_2"
    finally:
        await store.close()


class ThreadSyncer:
    """A test's fsync of the WAL (gateway/store/wal_sync.Syncer) on a thread, through a
    function the test chooses: a disk that fails, or one that holds an fsync until told.
    The store's own helper process is tested in tests/store/test_wal_sync.py."""

    def __init__(self, path: str, fsync: Callable[[int], None]) -> None:
        self.path = path
        self.fsync = fsync
        self.synced = 0

    def sync(self, done: Callable[[BaseException | None], None]) -> None:
        running = asyncio.get_running_loop().run_in_executor(None, self._sync)
        running.add_done_callback(lambda ran: done(ran.exception()))

    def _sync(self) -> None:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            self.fsync(fd)
        finally:
            os.close(fd)
        self.synced += 1

    async def close(self) -> None:
        pass


def thread_synced(
    fsync: Callable[[int], None],
) -> tuple[Callable[[str], ThreadSyncer], list[ThreadSyncer]]:
    """A ``syncer`` for SQLiteStore fsyncing through ``fsync``, and the syncers it made."""
    made: list[ThreadSyncer] = []

    def make(path: str) -> ThreadSyncer:
        made.append(ThreadSyncer(path, fsync))
        return made[-1]

    return make, made


async def test_sqlite_writes_of_a_turn_share_one_fsync_of_the_wal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit: fifty writes made in one turn of the loop are answered after one
    fsync of the WAL (asked of the store's helper process, counted here), not fifty; with
    synchronous=normal none is asked."""
    asked: list[str] = []
    real_sync = WalSyncer.sync

    def counted(self: WalSyncer, done: Callable[[BaseException | None], None]) -> None:
        asked.append(self._path)
        real_sync(self, done)

    monkeypatch.setattr(WalSyncer, "sync", counted)
    for synchronous, most in (("full", 1), ("normal", 0)):
        store = SQLiteStore(str(tmp_path / f"{synchronous}.db"), synchronous=synchronous)
        await store.open()
        try:
            records = [await store.create(op(i)) for i in range(50)]
            asked.clear()
            assert all(await asyncio.gather(*(store.save(r) for r in records)))
            assert len(asked) <= most, asked
            if most:
                assert asked == [str(tmp_path / "full.db-wal")]
        finally:
            await store.close()


async def test_sqlite_a_pending_answer_alone_is_fsynced_soon(tmp_path: Path) -> None:
    """A pending answer is answered before its fsync, but not left to the next durable
    write: with nothing else written, its turn is fsynced within LAZY_SYNC."""
    make, made = thread_synced(os.fsync)
    store = SQLiteStore(str(tmp_path / "g.db"), syncer=make)
    await store.open()
    try:
        first = await store.create(op(1))
        (syncer,) = made
        before = syncer.synced

        def running(current: OperationRecord) -> tuple[OperationRecord, str]:
            return current.evolve(last_known_state="running"), "pending"

        await store.finish_poll(
            "op_1", running, known=first, lease="l", token="t", durable=lambda r: False
        )
        assert syncer.synced == before  # answered first
        for _ in range(100):
            if syncer.synced > before:
                break
            await asyncio.sleep(LAZY_SYNC)
        assert syncer.synced > before, "the pending answer's turn was never fsynced"
    finally:
        await store.close()


async def test_sqlite_a_pending_answer_fsynced_with_a_durable_write_costs_no_fsync_later(
    tmp_path: Path,
) -> None:
    """A pending answer whose turn a durable write's fsync made durable leaves no fsync (and
    no wake-up) behind for LAZY_SYNC later: one fsync serves both."""
    make, made = thread_synced(os.fsync)
    store = SQLiteStore(str(tmp_path / "g.db"), syncer=make)
    await store.open()
    try:
        first = await store.create(op(1))
        second = await store.create(op(2))
        (syncer,) = made

        def running(current: OperationRecord) -> tuple[OperationRecord, str]:
            return current.evolve(last_known_state="running"), "pending"

        await store.finish_poll(
            "op_1", running, known=first, lease="l", token="t", durable=lambda r: False
        )
        await asyncio.sleep(0)  # its turn commits, fsynced lazily
        before = syncer.synced
        assert await store.save(second.evolve(early_refusals=1))  # durable: fsynced now
        assert syncer.synced == before + 1
        assert store._lazy is None  # no timer left to wake the loop for nothing
        await asyncio.sleep(LAZY_SYNC * 3)
        assert syncer.synced == before + 1, "an fsync for a turn already durable"
    finally:
        await store.close()


class TimedSyncer(ThreadSyncer):
    """A ThreadSyncer that notes the loop time each fsync was asked for and ended."""

    def __init__(self, path: str) -> None:
        super().__init__(path, os.fsync)
        self.asked: list[float] = []
        self.ended: list[float] = []

    def sync(self, done: Callable[[BaseException | None], None]) -> None:
        loop = asyncio.get_running_loop()
        self.asked.append(loop.time())

        def told(error: BaseException | None) -> None:
            self.ended.append(loop.time())
            done(error)

        super().sync(told)


class LoopCpu:
    """The loop thread's CPU clock as a test sets it: idle (it stands still) until ``busy``
    is set, then running as fast as the loop's own clock (a loop always on the CPU)."""

    def __init__(self) -> None:
        self.busy = False

    def __call__(self) -> float:
        return asyncio.get_running_loop().time() if self.busy else 0.0


async def timed_store(
    path: Path, group_commit: float, cpu: LoopCpu
) -> tuple[SQLiteStore, TimedSyncer, list[OperationRecord]]:
    """An open SQLite store fsyncing through a TimedSyncer, its loop made busy (``cpu``)
    and its first record written: from the next fsync's end on, fsyncs are spaced."""
    made: list[TimedSyncer] = []

    def make(wal: str) -> TimedSyncer:
        made.append(TimedSyncer(wal))
        return made[-1]

    store = SQLiteStore(str(path), syncer=make, group_commit=group_commit, cpu_clock=cpu)
    await store.open()
    first = await store.create(op(0))  # a window of the loop's share begins at its fsync
    cpu.busy = True
    await asyncio.sleep(WINDOW * 1.2)
    return store, made[0], [first]


async def test_sqlite_a_busy_loop_spaces_its_fsyncs_by_group_commit(tmp_path: Path) -> None:
    """Group commit under load: while the loop's thread is busy, an fsync starts no sooner
    than ``group_commit`` after the last one ended, and every durable write made meanwhile,
    in whichever turn of the loop, shares it; a durable write after a quiet spell is
    fsynced at once."""
    spacing = 0.05
    store, syncer, records = await timed_store(tmp_path / "g.db", spacing, LoopCpu())
    loop = asyncio.get_running_loop()
    try:
        records += [await store.create(op(i)) for i in range(1, 6)]  # one after the other
        gaps = [b - e for e, b in zip(syncer.ended[2:-1], syncer.asked[3:], strict=True)]
        assert len(gaps) == 4 and all(gap >= spacing - 0.001 for gap in gaps), gaps
        before = len(syncer.asked)
        saves = []
        for record in records:  # in six turns of the loop, within one spacing
            saves.append(asyncio.ensure_future(store.save(record)))
            await asyncio.sleep(spacing / 20)
        assert all(await asyncio.gather(*saves))
        assert len(syncer.asked) == before + 1  # the six writes made meanwhile: one fsync
        await asyncio.sleep(spacing * 2)  # quiet: the next durable write is not held back
        called = loop.time()
        assert await store.save(records[0].evolve(version=2))
        assert syncer.asked[-1] - called < spacing / 2
    finally:
        await store.close()


async def test_sqlite_an_idle_loop_fsyncs_at_once(tmp_path: Path) -> None:
    """At low load (the loop's thread rarely on the CPU) fsyncs are not spaced: a durable
    write right after an fsync starts its own at once; so with ``group_commit`` 0 on a busy
    loop."""
    for spaced, busy in ((30.0, False), (0.0, True)):
        cpu = LoopCpu()
        store, syncer, records = await timed_store(tmp_path / f"{spaced}.db", spaced, cpu)
        cpu.busy = busy
        try:
            assert await store.save(records[0])
            assert await store.save(records[0].evolve(version=2))
            assert syncer.asked[-1] - syncer.ended[-2] < 0.5, (spaced, syncer.asked)
        finally:
            await store.close()


async def test_sqlite_close_does_not_wait_for_a_held_back_fsync(tmp_path: Path) -> None:
    """A store closed while its next fsync is held back for ``group_commit`` fsyncs at once:
    the write is durable and close returns well before the spacing would have ended."""
    store, _, (record,) = await timed_store(tmp_path / "g.db", 30.0, LoopCpu())
    record = await store.create(op(1))  # a busy loop's fsync just ended: the next is held
    saving = asyncio.ensure_future(store.save(record.evolve(early_refusals=3)))
    await asyncio.sleep(0.05)
    assert not saving.done()
    started = time.perf_counter()
    await store.close()
    assert time.perf_counter() - started < 5.0
    assert await saving
    again = SQLiteStore(str(tmp_path / "g.db"))
    await again.open()
    try:
        stored = await again.get("op_1")
        assert stored is not None and stored.early_refusals == 3
    finally:
        await again.close()


class FailingCommit:
    """The store's writer connection, with its next COMMIT failing as a full disk's does."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.fail = True

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "COMMIT" and self.fail:
            self.fail = False
            raise sqlite3.OperationalError("database or disk is full")
        return self.conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


async def test_sqlite_a_failed_commit_of_a_held_back_fsyncs_turn_leaves_none_waiting(
    tmp_path: Path,
) -> None:
    """When the held-back fsync comes and the turn open then fails to commit, that turn's
    write fails, and the writes committed before it, waiting for the same fsync, get it."""
    store, _, (record,) = await timed_store(tmp_path / "g.db", 30.0, LoopCpu())
    try:
        other = await store.create(op(1))  # a busy loop's fsync just ended: the next is held
        committed = asyncio.ensure_future(store.save(record))
        await asyncio.sleep(0.01)  # its turn committed, waiting for the held-back fsync
        failing = asyncio.ensure_future(store.save(other))
        await asyncio.sleep(0)  # written in the turn open now, not committed yet
        writer = store._connections["write"]
        store._connections["write"] = FailingCommit(writer)  # type: ignore[assignment]
        assert store._spaced is not None
        store._spaced.cancel()
        assert store._synced_at is not None
        store._synced_at -= 60.0  # the hold's end, now
        store._spaced_sync()
        with pytest.raises(StoreError, match="disk is full"):
            await failing
        assert await asyncio.wait_for(committed, 5)
        store._connections["write"] = writer
    finally:
        await store.close()


async def test_sqlite_a_failed_fsync_stops_the_store_until_a_restart(tmp_path: Path) -> None:
    """A disk that fails the WAL's fsync (EIO) fails the writes that waited for it with a
    StoreError (503 store-unavailable upstream), and every call after it: Linux may drop
    the pages that failed and report the next fsync clean, so nothing this process holds
    can be trusted durable. A restart (a new store on the file) serves again, from what
    the disk holds."""
    failing = threading.Event()

    def fsync(fd: int) -> None:
        if failing.is_set():
            raise OSError(errno.EIO, "Input/output error")
        os.fsync(fd)

    make, _ = thread_synced(fsync)
    store = SQLiteStore(str(tmp_path / "g.db"), syncer=make)
    await store.open()
    first = await store.create(op(1))
    failing.set()
    with pytest.raises(StoreError, match=r"fsync.*Input/output error"):
        await store.save(first)
    failing.clear()
    for call in (store.get("op_1"), store.save(first), store.ping(), store.create(op(2))):
        with pytest.raises(StoreError, match="until the gateway restarts"):
            await call
    await store.close()
    again = SQLiteStore(str(tmp_path / "g.db"))
    await again.open()
    try:
        current = await again.get("op_1")
        assert current is not None and await again.save(current)
    finally:
        await again.close()


@contextlib.asynccontextmanager
async def fsync_held(
    tmp_path: Path,
) -> AsyncIterator[tuple[SQLiteStore, OperationRecord, threading.Event]]:
    """A SQLite store, its record op_1 (created, leased), and an event: every fsync after
    op_1's creation waits until the event is set (at the end, whatever happens)."""
    held = threading.Event()
    holding = threading.Event()

    def slow(fd: int) -> None:
        if holding.is_set():
            held.wait(10)
        os.fsync(fd)

    make, _ = thread_synced(slow)
    store = SQLiteStore(str(tmp_path / "g.db"), syncer=make)
    await store.open()
    try:
        first = await store.create(op(1))
        await store.acquire_lease("lease", "t", 0.0, 60.0)
        holding.set()
        yield store, first, held
    finally:
        held.set()
        await store.close()


def finish(store: SQLiteStore, known: OperationRecord, outcome: Outcome) -> asyncio.Future[str]:
    """finish_poll of op_1 with an answer that leaves it ``outcome`` (pending answers are
    not awaited for durability, as the poll flow passes them)."""

    def answered(current: OperationRecord) -> tuple[OperationRecord, str]:
        if outcome is Outcome.PENDING:
            return current.evolve(last_known_state="running"), "pending"
        return current.evolve(outcome=outcome, ended_at=1.0), "ended"

    durable = outcome is not Outcome.PENDING
    return asyncio.ensure_future(
        store.finish_poll(
            "op_1", answered, known=known, lease="lease", token="t", durable=lambda r: durable
        )
    )


async def test_sqlite_hands_out_an_ended_record_only_once_it_is_durable(tmp_path: Path) -> None:
    """The answer that ends an operation is written and answered only once durable; a
    reader of that record meanwhile (another agent's status call) waits for the same
    fsync, never answering from an outcome the disk may not hold. A still-pending answer
    (finish_poll's ``durable`` says so) is answered before its fsync."""
    async with fsync_held(tmp_path) as (store, first, held):
        pending = await asyncio.wait_for(finish(store, first, Outcome.PENDING), 1.0)
        assert pending == "pending"  # answered with its fsync still held
        finishing = finish(store, first, Outcome.SUCCEEDED)
        reading = asyncio.ensure_future(store.get("op_1"))
        await asyncio.sleep(0.2)
        assert not finishing.done() and not reading.done()
        held.set()
        assert await asyncio.wait_for(finishing, 5) == "ended"
        read = await asyncio.wait_for(reading, 5)
        assert read is not None and read.outcome is Outcome.SUCCEEDED


async def test_sqlite_a_rolled_back_write_leaves_the_last_ones_fsync_to_wait_for(
    tmp_path: Path,
) -> None:
    """A turn that ended an operation is committed and its fsync is still running when the
    next turn, writing the same record again, is rolled back (a full disk): a reader then
    gets the file's version, the ended one, only once that fsync is done, as before the
    rollback."""
    async with fsync_held(tmp_path) as (store, first, held):
        finishing = finish(store, first, Outcome.SUCCEEDED)
        await asyncio.sleep(0.05)  # committed; its fsync is held
        current = store._cache.get("op_1")
        assert current is not None and current.outcome is Outcome.SUCCEEDED
        saving = asyncio.ensure_future(store.save(current))
        await asyncio.sleep(0)  # the save wrote in this turn; its commit is queued after us
        assert store._turn is not None
        store._abort(store._turn, sqlite3.OperationalError("database or disk is full"))
        with pytest.raises(StoreError, match="full"):
            await saving
        reading = asyncio.ensure_future(store.get("op_1"))
        await asyncio.sleep(0.2)
        assert not finishing.done() and not reading.done()
        held.set()
        assert await asyncio.wait_for(finishing, 5) == "ended"
        read = await asyncio.wait_for(reading, 5)
        assert read is not None and read.outcome is Outcome.SUCCEEDED
        assert read.version == current.version


async def test_sqlite_killed_after_a_pending_answer_before_its_commit(tmp_path: Path) -> None:
    """The window the pending answer's early reply opens: the gateway answered "running"
    and died before the turn's commit. What the disk then holds (the files copied in that
    same turn of the loop, as a SIGKILL would leave them) is the durable reservation: the
    budget counts the call, and recovery reports it as a call cut short (the audited
    ``polled``/``interrupted``), never a lost or doubled request."""
    store = SQLiteStore(str(tmp_path / "g.db"))
    await store.open()
    try:
        created = await store.create(op(1))
        reserved = decide.reserve(created, 100.0)
        assert await store.save(reserved)  # durable: the provider is called after this
        await store.acquire_lease("lease", "t", 100.0, 60.0)

        def running(current: OperationRecord) -> tuple[OperationRecord, str]:
            answered = current.evolve(inflight_at=None, last_known_state="running")
            return answered, "pending"

        answered = await store.finish_poll(
            "op_1", running, known=reserved, lease="lease", token="t", durable=lambda r: False
        )
        assert answered == "pending"  # the agent hears this now ...
        crashed = tmp_path / "crashed"  # ... and the process dies in this very turn
        crashed.mkdir()
        for name in ("g.db", "g.db-wal"):
            if (tmp_path / name).exists():
                shutil.copy(tmp_path / name, crashed / name)
    finally:
        await store.close()
    again = SQLiteStore(str(crashed / "g.db"))
    await again.open()
    try:
        record = await again.get("op_1")
        assert record is not None
        assert record.status_requests_used == 1  # the call sent is counted
        assert record.last_known_state != "running" and record.inflight_at == 100.0
        recovered = decide.recover(record)
        assert recovered is not None and recovered.cut_at == 100.0
    finally:
        await again.close()


async def test_cache_bytes_reaches_the_store_from_the_url_helper(tmp_path: Path) -> None:
    """limits.cache_bytes reaches the SQLite store through store_from_url (64 MiB by default)."""
    default = store_from_url(f"sqlite:///{tmp_path}/a.db")
    tuned = store_from_url(f"sqlite:///{tmp_path}/b.db", cache_bytes=3 * MiB)
    assert isinstance(default, SQLiteStore) and isinstance(tuned, SQLiteStore)
    assert (default.cache_limit, tuned.cache_limit) == (64 * MiB, 3 * MiB)
    store_from_url("memory://", cache_bytes=1)  # stores without a cache take it too


def test_group_commit_comes_from_the_url(tmp_path: Path) -> None:
    """``?group_commit=`` spaces the SQLite store's fsyncs (0.5 ms unless given, 0 turns it
    off); anything but a duration is a config error naming the option."""
    spaced = [
        store_from_url(f"sqlite:///{tmp_path}/a.db{query}")
        for query in ("", "?group_commit=2ms", "?group_commit=0ms")
    ]
    assert [s.group_commit for s in spaced if isinstance(s, SQLiteStore)] == [0.0005, 0.002, 0]
    with pytest.raises(ConfigError, match="store: group_commit must be at most 10ms"):
        store_from_url(f"sqlite:///{tmp_path}/a.db?group_commit=20ms")
    with pytest.raises(ConfigError, match="store: group_commit must be a duration"):
        store_from_url(f"sqlite:///{tmp_path}/a.db?group_commit=soon")


async def test_one_sqlite_store_per_file(tmp_path: Path) -> None:
    """A second store on a file in use is refused with the file's name, until the first
    closes; a separate file is fine."""
    path = tmp_path / "owned.db"
    first = SQLiteStore(str(path))
    second = SQLiteStore(str(path))
    elsewhere = SQLiteStore(str(tmp_path / "other.db"))
    try:
        await first.open()
        await first.create(op(1))
        with pytest.raises(StoreError, match=f"{path}: already in use"):
            await second.open()
        with pytest.raises(StoreError, match="already in use"):
            await second.get("op_1")
        await elsewhere.ping()
        await first.close()
        assert await second.get("op_1") is not None
    finally:
        for store in (first, second, elsewhere):
            await store.close()


def test_limits_cache_bytes_reaches_the_gateway_store(tmp_path: Path) -> None:
    """``limits.cache_bytes`` in the gateway config bounds the store create_app builds."""
    limits = {"limits": {"cache_bytes": "2MiB"}}
    path = write_config(
        tmp_path, "http://127.0.0.1:9", store="sqlite:///g.db", config_changes=limits
    )
    settings = load_settings(path, env=PROVIDER_ENV)
    store = create_app(settings)[RUNTIME].store
    assert isinstance(store, SQLiteStore) and store.cache_limit == 2 * MiB


async def test_a_shared_stores_clock_offset_comes_from_its_quickest_reading() -> None:
    """Replicas decide on the store's clock: of a sync's readings, the one with the shortest
    round trip sets the offset (one that waited behind a busy loop is off by half its wait),
    and its round trip is reported so a slow sync can keep the offset there was."""
    delays = iter([0.2, 0.0, 0.1])

    async def read() -> float:
        now = time.time()
        await asyncio.sleep(next(delays))
        return now + 5.0  # the store's clock: 5 s ahead, read at the start of each wait

    offset, trip = await measure_offset(read)
    assert trip < 0.05  # the quick one
    assert offset == pytest.approx(5.0, abs=0.03)


def wal_restarts(wal: Path) -> int:
    """The WAL header's checkpoint sequence number: one more each time the WAL starts over."""
    with wal.open("rb") as handle:
        header = handle.read(16)
    return int.from_bytes(header[12:16], "big") if len(header) == 16 else 0


async def test_sqlite_wal_starts_over_under_steady_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes in every turn of the loop, as a loaded gateway makes them, with the reader's
    checkpoints running meanwhile: the WAL still starts over again and again once it holds
    more than WAL_LIMIT (the writer copies what the checkpoint did not reach between two
    turns), so the file stays within a few times the limit; without that it grew on."""
    limit = 128 << 10
    monkeypatch.setattr(sqlite_module, "WAL_LIMIT", limit)
    monkeypatch.setattr(sqlite_module, "CHECKPOINT_EVERY", 8)
    path = tmp_path / "steady.db"
    store = SQLiteStore(str(path), synchronous="normal")
    await store.open()
    wal = Path(f"{path}-wal")
    largest = 0
    try:
        records = [await store.create(op(i)) for i in range(10)]
        first = wal_restarts(wal)

        async def writer(record: OperationRecord) -> None:
            for _ in range(400):
                assert await store.save(record)
                record = record.evolve(version=record.version + 1)

        tasks = [asyncio.ensure_future(writer(r)) for r in records]
        while not all(t.done() for t in tasks):
            largest = max(largest, wal.stat().st_size)
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        assert wal_restarts(wal) - first >= 3  # without the catch-up: none, or one by chance
    finally:
        await store.close()
    assert largest < 16 * limit, largest  # without: ~40 times the limit


async def test_sqlite_a_checkpoint_fsync_that_fails_stops_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file's fsync after a checkpoint that copied a large WAL fails (EIO): the pages
    copied may never reach the disk while the WAL that holds them would start over, so the
    store refuses every call from then on, as after a failed fsync of the WAL."""
    monkeypatch.setattr(sqlite_module, "WAL_LIMIT", 16 << 10)
    path = tmp_path / "eio.db"
    store = SQLiteStore(str(path), synchronous="normal")
    await store.open()
    try:
        records = [await store.create(op(i)) for i in range(20)]
        real = os.fsync

        def failing(descriptor: int) -> None:
            if os.path.realpath(f"/proc/self/fd/{descriptor}") == str(path.resolve()):
                raise OSError(errno.EIO, "Input/output error")
            real(descriptor)

        monkeypatch.setattr(sqlite_module.os, "fsync", failing)
        await store._checkpoint_wal()  # as after CHECKPOINT_EVERY commits
        with pytest.raises(StoreError, match=r"checkpoint.*refuses every call"):
            await store.save(records[0])
    finally:
        await store.close()
