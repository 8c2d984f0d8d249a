"""``sqlite:///path``: the default store, one file, WAL, one process, one commit per loop turn.

Writes run on the event loop itself, at once, inside the transaction of the current turn of
the loop (``BEGIN IMMEDIATE`` at the turn's first write); one callback at the start of the
next turn commits them all together, and no write hops to a thread (a hop cost ~190 us even
idle). SQLite itself never fsyncs at commit (``PRAGMA synchronous=NORMAL``): with
``?synchronous=full`` (default) the store has the WAL fsynced by a helper process of its own
(gateway/store/sqlite/wal_sync.py: no thread of this process, so no wait for the interpreter lock)
and answers a durable write only after an fsync that began after its commit, so the loop
never waits for the disk and one fsync serves every turn committed while the one before ran
(group commit, as PostgreSQL does; the loop waits for the disk only when the WAL starts
over, about once per WAL_LIMIT written: the writer's checkpoint of its last few turns and
SQLite's rewrite of the WAL header). While the loop's thread is busy (loop_share.py),
the next fsync starts no sooner than ``?group_commit=`` (GROUP_COMMIT) after the last one
ended, so each fsync serves more writes: an fsync costs the machine far more CPU than a
write (docs/benchmarks.md); at low load they start at once. A turn of pending answers alone
is fsynced with the next fsync, or after LAZY_SYNC (and a group_commit) at most. A caller
of a write waits for that, except where it says the result need not be durable yet
(``finish_poll`` of an answer that leaves the operation pending:
its reservation is durable already, so a crash before the fsync costs the answer, never a
budget; the restarted gateway audits the call as interrupted). Every read-modify-write
(``mutate``) runs whole on the loop with no await inside, so it is atomic by construction;
the compare-and-set on ``version`` still proves it.

``?synchronous=normal`` makes no fsync of its own: what was committed survives the process
dying (the pending answers of the last turn aside), but the last commits may be lost on
power loss (SQLite syncs the WAL at checkpoints). A record that stopped waiting is handed
to a reader only once the write that ended it is durable (``_durable``). A failed fsync
stops the store until a restart: Linux may drop the pages that failed and report the next
fsync clean. A helper process that ended while idle is replaced at the next fsync, unheard of; one
that ended with an fsync in flight stops the store as a failed fsync does (that fsync's
outcome, and any error it met, are unknown); one that cannot be started fails the writes
waiting for it with a StoreError, and the store serves on.
``?busy_timeout=2s`` bounds how long a write waits for another process's write lock before
the gateway fails closed; it waits on the loop, so only a foreign writer (the sqlite3 shell)
can make it wait at all: a statusgate process never shares its file.

One gateway process owns a SQLite file: leases live in its memory (base class), and the
record cache is authoritative because every write passes through it. An exclusive OS lock
on ``FILE.lock`` (flock, released by the OS when the process dies) makes that true: a second
store on the file, in this process or another, gets a StoreError naming the file. The cache
is bounded in bytes, final bodies included (``limits.cache_bytes``); the least recently used
records leave first, and a miss reads the file on the loop (a primary-key read, no thread).
Lists and counts (the console, the sweeper, gauges) read committed rows on a reader thread;
the WAL is checkpointed there too. Once the WAL holds more than WAL_LIMIT, the writer copies
the few turns that checkpoint did not reach between two turns, on the loop, so that the WAL
starts over (``_catch_up``): under steady load it otherwise grows without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import orjson

from gateway import StoreError
from gateway.core.models import IdempotencyEntry, OperationFilter, OperationRecord, Outcome
from gateway.settings.config import DEFAULT_CACHE_BYTES
from gateway.store.base import PURGE_BATCH, Ids, Mutation, Queue, Store, newer_layout
from gateway.store.sqlite.cache import Cache
from gateway.store.sqlite.commit import GroupCommit, _Turn
from gateway.store.sqlite.keys import SQLiteKeys
from gateway.store.sqlite.loop_share import LoopShare
from gateway.store.sqlite.outbox import SQLiteOutbox
from gateway.store.sqlite.rows import (
    INSERT,
    LAYOUT,
    OVERDUE,
    PURGEABLE,
    _atomic,
    _cas,
    _find,
    _found,
    _get,
    _index,
    _io_error,
    _migrate,
    _probe,
    _put_idem,
    dump,
    lock_file,
)
from gateway.store.sqlite.wal_sync import Syncer, WalSyncer

log = logging.getLogger("statusgate")
T = TypeVar("T")
Job = tuple[str, str, str]
MIN_FREE = 64 << 10  # below this much free space on the file's disk the store is not ready
CHECKPOINT_EVERY = 256  # commits between WAL checkpoints (on the reader thread)
PURGE_CHUNK = 64  # records a turn of the loop deletes
LAZY_SYNC = 0.01  # seconds a committed pending answer waits at most for an fsync
GROUP_COMMIT = 0.0005  # seconds from one fsync's end to the next one's start, at least (busy)
MAX_GROUP_COMMIT = LAZY_SYNC  # the most ``?group_commit=`` may say
CATCH_UP = 8 << 20  # bytes of WAL the writer's checkpoint may copy at most (on the loop)
WAL_LIMIT = 64 << 20  # bytes the WAL file is truncated to after a checkpoint resets it


class SQLiteStore(GroupCommit, SQLiteKeys, SQLiteOutbox, Store):
    def __init__(
        self,
        path: str,
        *,
        synchronous: str = "full",
        busy_timeout: float = 2.0,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        syncer: Callable[[str], Syncer] = WalSyncer,
        group_commit: float = GROUP_COMMIT,
        cpu_clock: Callable[[], float] = time.thread_time,
    ):
        self._path = path
        self._fsync = synchronous.lower() == "full" and path != ":memory:"
        self._group_commit = group_commit
        self._cpu_clock = cpu_clock  # the loop thread's CPU time: is the loop busy?
        self._loop_share = LoopShare()
        self._busy_timeout = busy_timeout
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-read")
        # fsyncs of FILE-wal (``synchronous=full``), by a helper process unless a test says
        self._syncer: Syncer | None = syncer(path + "-wal") if self._fsync else None
        self._unsynced: list[asyncio.Future[None]] = []  # committed, waiting for an fsync
        self._syncing: asyncio.Future[None] | None = None  # the fsync running
        self._lazy: asyncio.TimerHandle | None = None  # an fsync due for pending answers
        self._synced_at: float | None = None  # loop time the last fsync ended
        self._spaced: asyncio.TimerHandle | None = None  # the next fsync, held back to it
        self._turns = 0  # turns begun
        self._committed_through = 0  # every turn up to this number is committed ...
        self._durable_through = 0  # ... and durable (fsynced, where the store fsyncs)
        self._last_turn: dict[str, int] = {}  # operation id -> the turn that last wrote it
        self._broken: str | None = None  # why the store refuses everything (a failed fsync)
        self._connections: dict[str, sqlite3.Connection] = {}
        self._turn: _Turn | None = None  # the transaction open in this turn of the loop
        self._commits = 0
        self._checkpoint: asyncio.Future[None] | None = None  # running on the reader thread
        self._restart_due = False  # the WAL is past WAL_LIMIT: the writer catches up
        self._frame_bytes = 4096 + 24  # a WAL frame: a page and its header (read at open)
        self._cache = Cache(cache_bytes)
        self._lock: int | None = None  # the descriptor holding FILE.lock
        self._closed = False
        self._migrated: tuple[int | None, int] | None = None  # what the first connection found

    @property
    def cache_limit(self) -> int:
        """The record cache's bound in bytes (limits.cache_bytes)."""
        return self._cache.limit

    @property
    def group_commit(self) -> float:
        """Seconds from one fsync's end to the next one's start, at least."""
        return self._group_commit

    @property
    def cached_bytes(self) -> int:
        """What the record cache holds now, in bytes as ``footprint`` counts them."""
        return self._cache.size

    # -- ownership ----------------------------------------------------------------------
    def _claim(self) -> None:
        """Hold the file's OS lock from first use until close: one process per file."""
        if self._closed:
            raise StoreError("sqlite store is closed", operation="open")
        if self._broken is not None:
            raise StoreError(self._broken, operation="open")
        if self._lock is not None or self._path == ":memory:":
            return
        self._lock = lock_file(self._path)

    async def open(self) -> None:
        """Claim the file and check its layout: a newer one refuses to start. The fsync
        helper starts with the first durable write (the layout's, here), so one that cannot
        run stops the start in one line."""
        self._claim()
        await self.migrate()

    # -- plumbing -----------------------------------------------------------------------
    def _connection(self, role: str) -> sqlite3.Connection:
        """The connection of ``role``, opened on first use: "write" on the event loop (it
        writes and reads single records), "read" on the reader thread (lists, counts and
        WAL checkpoints)."""
        conn = self._connections.get(role)
        if conn is None:
            if self._path != ":memory:":
                Path(self._path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self._path,
                timeout=self._busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
            if self._path != ":memory:" and (mode is None or str(mode[0]).lower() != "wal"):
                conn.close()
                raise sqlite3.OperationalError(f"cannot use WAL (journal mode {mode})")
            conn.execute("PRAGMA synchronous=NORMAL")  # the WAL's fsync is the store's own
            if role == "write":  # the layout is the writer's (``open`` writes first)
                conn.execute("PRAGMA wal_autocheckpoint=0")  # checkpoints run on the reader
                conn.execute(f"PRAGMA journal_size_limit={WAL_LIMIT}")  # a burst's WAL shrinks
                page = conn.execute("PRAGMA page_size").fetchone()
                self._frame_bytes = (int(page[0]) if page else 4096) + 24  # page and header
                try:
                    migrated = _migrate(conn)
                except BaseException:
                    conn.close()
                    raise
                self._migrated = self._migrated or migrated
            self._connections[role] = conn
        return conn

    async def inspect(self) -> str:
        """The file's layout, read without writing (``statusgate check``)."""
        if self._path == ":memory:" or not Path(self._path).exists():
            return " (no file yet: created at first start)"
        try:
            with contextlib.closing(
                sqlite3.connect(f"{Path(self._path).resolve().as_uri()}?mode=ro", uri=True)
            ) as conn:
                found = _found(conn)
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite: {self._path}: {exc}", operation="open") from None
        if found is not None and found > LAYOUT:
            raise newer_layout("sqlite", found, LAYOUT)
        if found is None or found < LAYOUT:
            return f" (schema version {found or 0}; upgraded at start or by statusgate migrate)"
        return f" (schema version {found})"

    async def migrate(self) -> tuple[int | None, int]:
        """Create or upgrade the file's layout (done by the first connection anyway): the
        version the first connection found (current on later calls), and the version now."""
        await self._write("migrate", lambda conn: None)
        assert self._migrated is not None
        found, self._migrated = self._migrated, (LAYOUT, LAYOUT)  # told once; current now
        return found

    def _now(self, operation: str, work: Callable[[sqlite3.Connection], T]) -> T:
        """``work`` on the writer connection, on the loop, now: a read of single records
        (which sees this turn's writes, as the cache does)."""
        self._claim()
        try:
            return work(self._connection("write"))
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite {operation}: {exc}", operation=operation) from exc

    async def _read(self, operation: str, work: Callable[[sqlite3.Connection], T]) -> T:
        """``work`` on the reader thread, over committed rows: this turn's writes are
        committed first, so a caller reads its own writes."""
        self._claim()
        try:
            self._connection("write")  # the layout first (a read may come before any write)
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite {operation}: {exc}", operation=operation) from exc
        self._commit_turn()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._reader, lambda: work(self._connection("read")))
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite {operation}: {exc}", operation=operation) from exc
        except RuntimeError as exc:  # executor shut down
            raise StoreError("sqlite store is closed", operation=operation) from exc

    async def _write(
        self,
        operation: str,
        work: Callable[[sqlite3.Connection], T],
        durable: Callable[[T], bool] | None = None,
    ) -> T:
        """Run ``work`` now in this turn's transaction, then wait for the turn's commit,
        unless ``durable`` says the result need not wait for it."""
        result = self._apply(operation, work)
        if durable is None or durable(result):
            await self._committed(operation)
        return result

    def _apply(self, operation: str, work: Callable[[sqlite3.Connection], T]) -> T:
        self._claim()
        try:
            conn = self._connection("write")
            if self._turn is None:
                conn.execute("BEGIN IMMEDIATE")
                self._turns += 1
                self._turn = _Turn(self._turns)
                asyncio.get_running_loop().call_soon(self._commit_turn)
            return work(conn)
        except sqlite3.Error as exc:
            if self._turn is not None and not conn.in_transaction:
                self._abort(self._turn, exc)  # SQLite rolled the whole turn back (full disk)
            raise StoreError(f"sqlite {operation}: {exc}", operation=operation) from exc

    def _committed(self, operation: str) -> asyncio.Future[None]:
        """Resolved once this turn's writes are committed (StoreError if they are not)."""
        if self._turn is None:  # committed early (a list read asked for it) or aborted
            raise StoreError(f"sqlite {operation}: the write was rolled back", operation=operation)
        waiter = asyncio.get_running_loop().create_future()
        self._turn.waiters.append(waiter)
        return waiter

    def _wrote(self, record: OperationRecord) -> None:
        """``record`` is the newest version now (uncommitted until the turn ends)."""
        assert self._turn is not None
        self._turn.written.append(record.operation_id)
        self._last_turn[record.operation_id] = self._turn.number
        self._cache.wrote(record)

    def _commit_turn(self) -> None:
        """Commit the turn's transaction (at the next turn's start, or before a read on the
        reader thread) and tell every waiter."""
        turn, self._turn = self._turn, None
        if turn is None:
            return
        conn = self._connections["write"]
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._abort(turn, exc)
            return
        self._committed_through = turn.number
        if not self._fsync:
            self._durable_through = turn.number
            for waiter in turn.waiters:
                if not waiter.done():
                    waiter.set_result(None)
        elif turn.waiters:  # a durable write waits: fsync now (with every turn before it)
            self._unsynced += turn.waiters
            self._sync_soon()
        elif self._lazy is None:  # pending answers only: the next fsync, LAZY_SYNC at most
            self._lazy = asyncio.get_running_loop().call_later(LAZY_SYNC, self._lazy_sync)
        self._commits += 1
        if self._restart_due:
            self._catch_up(conn)
        if self._commits % CHECKPOINT_EVERY == 0 and self._checkpoint is None:
            self._checkpoint = asyncio.ensure_future(self._checkpoint_wal())

    async def _checkpoint_wal(self) -> None:
        """Copy the WAL into the file on the reader thread (PASSIVE: writers never wait).
        Past WAL_LIMIT of frames with little left to copy, the file is fsynced there too
        and the writer catches up between two turns (``_catch_up``). An I/O error stops the
        store as a failed fsync does: the pages copied may never reach the disk, and the
        WAL that still holds them would be written over."""
        try:
            rows = await self._read("checkpoint", self._checkpoint_here)
        except StoreError as exc:
            if _io_error(exc.__cause__):
                self._break(f"sqlite checkpoint: {self._path}: {exc.__cause__}", [])
            # else tried again after the next CHECKPOINT_EVERY commits
        else:
            self._restart_due = rows is not None
        finally:
            self._checkpoint = None

    def _checkpoint_here(self, conn: sqlite3.Connection) -> tuple[int, int] | None:
        """On the reader thread: the checkpoint; when the WAL is past WAL_LIMIT and at most
        CATCH_UP of it is left to copy, the file fsynced (so the writer's checkpoint
        fsyncs only its own pages) and (log, checkpointed) frames; else None."""
        row = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if row is None or len(row) != 3:
            return None
        log, copied = int(row[1]), int(row[2])
        if log * self._frame_bytes < WAL_LIMIT or (log - copied) * self._frame_bytes > CATCH_UP:
            return None
        descriptor = os.open(self._path, os.O_RDONLY)
        try:
            os.fsync(descriptor)  # OSError: a StoreError from _read, an I/O error
        except OSError as exc:
            raise sqlite3.OperationalError(f"fsync: {exc}") from exc
        finally:
            os.close(descriptor)
        return log, copied

    def _catch_up(self, conn: sqlite3.Connection) -> None:
        """Checkpoint on the writer, between two turns: the frames committed since the
        reader's checkpoint (a few turns'; the file's older pages were fsynced there), so
        the next turn's transaction starts on a WAL copied whole and its first write
        starts the WAL over (truncated to WAL_LIMIT). Without it a loop that commits every
        turn always has frames the reader's checkpoint has not reached, and the WAL grows
        without bound (392 MB in a minute of make bench). Once a reader's checkpoint at
        most: a read in the way (busy) waits for the next one."""
        self._restart_due = False
        try:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:
            if _io_error(exc):
                self._break(f"sqlite checkpoint: {self._path}: {exc}", [])
            else:
                log.warning(
                    "sqlite: %s: the WAL checkpoint failed (%s); tried again", self._path, exc
                )

    # -- operations ---------------------------------------------------------------------
    async def create(
        self, record: OperationRecord, idempotency: IdempotencyEntry | None = None
    ) -> OperationRecord:
        def work(conn: sqlite3.Connection) -> OperationRecord:
            existing = self._cache.find(record.account, record.provider, record.provider_job_id)
            existing = existing or _find(
                conn, record.account, record.provider, record.provider_job_id
            )
            if existing is not None:
                return existing
            with _atomic(conn):
                conn.execute(INSERT, dump(record))
                _index(conn, record)
                if idempotency is not None:
                    _put_idem(conn, idempotency)
            self._wrote(record)
            return record

        return await self._write("create", work)

    async def get(self, operation_id: str) -> OperationRecord | None:
        record = self._cache.get(operation_id)
        if record is None:
            record = self._remember(self._now("get", lambda conn: _get(conn, operation_id)))
        if record is not None and not await self._durable(record):
            return await self.get(operation_id)  # its turn was rolled back: as the file is
        return record

    async def find(self, account: str, provider: str, job_id: str) -> OperationRecord | None:
        record = self._cache.find(account, provider, job_id)
        if record is None:
            read = self._now("find", lambda conn: _find(conn, account, provider, job_id))
            record = self._remember(read)
        if record is not None and not await self._durable(record):
            return await self.find(account, provider, job_id)
        return record

    async def _durable(self, record: OperationRecord) -> bool:
        """A record that stopped waiting (an outcome, an escalation) is never handed out
        before the write that ended it is durable: whoever reads it may answer from it.
        Waits for that when it is not yet; False when that write was rolled back instead.
        Pending records are handed out at once (what is answered from them is the next
        poll time, which a lost write only moves)."""
        if self._broken is not None:
            raise StoreError(self._broken, operation="get")
        number = self._last_turn.get(record.operation_id, 0)
        if record.outcome is Outcome.PENDING or number <= self._durable_through:
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._turn is not None and self._turn.number == number:
            self._turn.waiters.append(waiter)
        else:  # committed, its fsync to come: the next one that begins covers it
            self._unsynced.append(waiter)
            self._sync_soon()
        try:
            await waiter
        except StoreError:
            if self._broken is not None or self._closed:
                raise
            if self._last_turn.get(record.operation_id) == number:
                raise  # not rolled back: its turn stands, unconfirmed
            return False
        return True

    def _remember(self, record: OperationRecord | None) -> OperationRecord | None:
        if record is not None:
            self._cache.wrote(record)
        return record

    async def find_result(self, account: str, provider: str, value: str) -> OperationRecord | None:
        """From the result_values table, written in the record's own transaction."""
        sql = (
            "SELECT operation_id FROM result_values"
            " WHERE account = ? AND provider = ? AND value = ?"
        )
        row = self._now(
            "find_result", lambda conn: conn.execute(sql, (account, provider, value)).fetchone()
        )
        record = None if row is None else await self.get(str(row[0]))
        return record if record is not None and value in record.result_values else None

    async def save(self, record: OperationRecord) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            written = _cas(conn, record, self._cache.get(record.operation_id))
            if written is not None:
                self._wrote(written)
            return written is not None

        return await self._write("save", work)

    async def mutate(
        self, operation_id: str, change: Mutation[T], *, known: OperationRecord | None = None
    ) -> T:
        """On the loop with no await inside; ``known`` is not needed (the cache is current)."""
        return await self._write("mutate", self._mutation(operation_id, change))

    async def finish_poll(
        self,
        operation_id: str,
        change: Mutation[T],
        *,
        known: OperationRecord,
        lease: str,
        token: str,
        durable: Callable[[T], bool] | None = None,
    ) -> T:
        """The answer's write, the lease released with it; a result ``durable`` calls not
        durable yet (a pending answer) is answered before the turn's commit."""
        try:
            return await self._write("finish_poll", self._mutation(operation_id, change), durable)
        finally:
            await self.release_lease(lease, token)

    def _mutation(
        self, operation_id: str, change: Mutation[T]
    ) -> Callable[[sqlite3.Connection], T]:
        def work(conn: sqlite3.Connection) -> T:
            # The cache holds the newest version (this turn's writes included); the
            # compare-and-set proves it, and a miss falls back to reading the file.
            known = self._cache.get(operation_id)
            for current in (known, None):
                current = current or _get(conn, operation_id)
                if current is None:
                    raise StoreError(f"{operation_id} vanished from the store", operation="mutate")
                new, result = change(current)
                if new is None:
                    return result
                written = _cas(conn, new, current)
                if written is not None:
                    self._wrote(written)
                    return result
                if known is None:
                    break
            raise StoreError(f"{operation_id}: version moved in a transaction", operation="mutate")

        return work

    async def list(self, where: OperationFilter) -> list[OperationRecord]:
        clauses: list[str] = []
        args: list[str | float] = []
        for column, value in (
            ("outcome", where.outcome),
            ("provider", where.provider),
            ("account", where.account),
        ):
            if value is not None:
                clauses.append(f"{column} = ?")
                args.append(str(value))
        sql = "SELECT data FROM operations"
        if where.before is not None:  # a page's position: strictly older in list order
            clauses.append("(started_at < ? OR (started_at = ? AND operation_id < ?))")
            started, operation_id = where.before
            args += [started, started, operation_id]
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        sql += " ORDER BY started_at DESC, operation_id DESC LIMIT ?"

        def work(conn: sqlite3.Connection) -> list[OperationRecord]:
            rows = conn.execute(sql, (*args, where.limit)).fetchall()
            return [OperationRecord.from_dict(orjson.loads(row[0])) for row in rows]

        return await self._read("list", work)

    async def purge(self, provider: str, ended_before: float, now: float) -> int:
        """In chunks of PURGE_CHUNK records, one turn of the loop each: deleting a record
        frees its body's pages and updates its indexes on the loop (measured: 1,000
        records with 200 KB bodies held the loop half a second in one go)."""

        def chunk(conn: sqlite3.Connection) -> int:
            ids = [row[0] for row in conn.execute(PURGEABLE, (provider, ended_before, PURGE_CHUNK))]
            with _atomic(conn):
                gone = [(i,) for i in ids]
                conn.executemany("DELETE FROM operations WHERE operation_id = ?", gone)
                conn.executemany("DELETE FROM result_values WHERE operation_id = ?", gone)
                conn.executemany("DELETE FROM completions WHERE operation_id = ?", gone)
            for operation_id in ids:
                self._cache.gone(operation_id)
            return len(ids)

        purged = 0
        while purged < PURGE_BATCH:
            done = await self._write("purge", chunk)
            purged += done
            if done < PURGE_CHUNK:
                break
        sql = "DELETE FROM idempotency WHERE rowid IN"
        sql += " (SELECT rowid FROM idempotency WHERE expires_at <= ? LIMIT ?)"
        await self._write("purge", lambda conn: conn.execute(sql, (now, PURGE_CHUNK * 16)))
        return purged

    async def overdue(self, provider: str, now: float, limit: int) -> Ids:
        def work(conn: sqlite3.Connection) -> list[str]:
            return [str(row[0]) for row in conn.execute(OVERDUE, (provider, now, limit))]

        return await self._read("overdue", work)

    async def open_escalations(self) -> dict[tuple[str, str], int]:
        sql = (
            "SELECT provider, json_extract(data, '$.escalation.reason'), count(*)"
            " FROM operations WHERE outcome = 'escalated' GROUP BY 1, 2"
        )
        rows = await self._read("open_escalations", lambda conn: conn.execute(sql).fetchall())
        return {(str(p), str(r)): int(n) for p, r, n in rows if r is not None}

    async def escalation_queue(self, limit: int) -> Queue:
        """The oldest open escalations from the queue index, and the count of them all."""
        page = (
            "SELECT data FROM operations WHERE outcome = 'escalated'"
            " ORDER BY escalation_at, operation_id LIMIT ?"
        )
        count = "SELECT count(*) FROM operations WHERE outcome = 'escalated'"

        def work(conn: sqlite3.Connection) -> Queue:
            rows = conn.execute(page, (limit,)).fetchall()
            total = int(conn.execute(count).fetchone()[0])
            return [OperationRecord.from_dict(json.loads(row[0])) for row in rows], total

        return await self._read("escalation_queue", work)

    async def active_counts(self) -> dict[str, int]:
        sql = (
            "SELECT provider, count(*) FROM operations WHERE outcome = 'pending' GROUP BY provider"
        )
        rows = await self._read("active_counts", lambda conn: conn.execute(sql).fetchall())
        return {str(provider): int(count) for provider, count in rows}

    # -- idempotency --------------------------------------------------------------------
    async def claim_idempotency(
        self, entry: IdempotencyEntry, now: float
    ) -> IdempotencyEntry | None:
        def work(conn: sqlite3.Connection) -> IdempotencyEntry | None:
            row = conn.execute(
                "SELECT data FROM idempotency WHERE key = ? AND expires_at > ?", (entry.key, now)
            ).fetchone()
            if row is not None:
                seen = IdempotencyEntry.from_dict(json.loads(row[0]))
                return None if seen == entry else seen  # equal: this same claim again
            _put_idem(conn, entry)
            return None

        return await self._write("claim_idempotency", work)

    async def put_idempotency(self, entry: IdempotencyEntry) -> None:
        await self._write("put_idempotency", lambda conn: _put_idem(conn, entry))

    async def drop_idempotency(self, key: str) -> None:
        sql = "DELETE FROM idempotency WHERE key = ?"
        await self._write("drop_idempotency", lambda conn: conn.execute(sql, (key,)))

    # -- life ---------------------------------------------------------------------------
    async def ping(self) -> None:
        """Ready means writable: the file's disk has ``MIN_FREE`` bytes left, the write lock
        can be taken within the busy timeout, and a write that needs room commits (a probe
        row written and deleted in one transaction). A full disk fails every write with
        "database or disk is full" while a bare lock still succeeds."""
        self._check_room()
        await self._write("ping", _probe)

    def _check_room(self) -> None:
        if self._path == ":memory:":
            return
        try:
            stats = os.statvfs(Path(self._path).parent)
        except OSError:
            return  # the write below says what is wrong
        if stats.f_bavail * stats.f_frsize < MIN_FREE:
            message = f"sqlite ping: {self._path}: less than {MIN_FREE} bytes free on its disk"
            raise StoreError(message, operation="ping")

    async def close(self) -> None:
        """Commit what this turn wrote, then close both connections and release the file."""
        if self._closed:
            return
        if "write" in self._connections:
            self._commit_turn()
        self._closed = True
        if self._checkpoint is not None:
            with contextlib.suppress(StoreError):
                await self._checkpoint
        for timer in (self._lazy, self._spaced):
            if timer is not None:
                timer.cancel()
        self._lazy = self._spaced = None
        self._sync_soon()  # closed: not held back
        while self._syncing is not None:  # each fsync may start the next
            await asyncio.shield(self._syncing)
        conn = self._connections.pop("write", None)
        if conn is not None:
            conn.close()
        reader = self._connections.pop("read", None)
        if reader is not None:
            await asyncio.get_running_loop().run_in_executor(self._reader, reader.close)
        self._reader.shutdown(wait=True)
        if self._syncer is not None:
            await self._syncer.close()
        if self._lock is not None:
            os.close(self._lock)  # releases the file's lock
            self._lock = None
