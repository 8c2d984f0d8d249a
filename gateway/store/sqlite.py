"""``sqlite:///path``: the default store, one file, WAL, one writer, group commit.

Two dedicated threads, each with its own connection: a reader (WAL lets it read while the
writer writes) and the one writer. Writes queue up while the writer is busy and the next
batch runs in one ``BEGIN IMMEDIATE`` transaction, each write in a savepoint of its own, so
concurrent calls share one commit (and one fsync) instead of queueing for one each. Every
read-modify-write (``mutate``) runs whole inside that transaction. The event loop never
blocks on disk.

``?synchronous=full`` (default) fsyncs every commit: nothing acknowledged is lost even on
power loss; ``normal`` survives any process crash but may lose the last commits on power
loss. ``?busy_timeout=2s`` bounds how long a call waits for another process's write lock
before the gateway fails closed.

One gateway process owns a SQLite file: leases live in its memory (base class), and the record
cache trusts that every write passes through it. An exclusive OS lock on ``FILE.lock`` (flock,
released by the OS when the process dies) makes that true: a second store on the file, in this
process or another, gets a StoreError naming the file. The cache is bounded in bytes, final
bodies included (``limits.cache_bytes``); the least recently used records leave first.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import orjson

from gateway.core.models import IdempotencyEntry, OperationFilter, OperationRecord
from gateway.errors import StoreError
from gateway.settings.config import DEFAULT_CACHE_BYTES
from gateway.store.base import PURGE_BATCH, Ids, Mutation, Queue, Store, newer_layout
from gateway.store.cache import Cache

T = TypeVar("T")
Work = Callable[[sqlite3.Connection], Any]
Job = tuple[str, str, str]
MIN_FREE = 64 << 10  # below this much free space on the file's disk the store is not ready
PROBE_KEY = "statusgate readiness probe"
PROBE_BYTES = 4096  # the readiness probe's write: about one record's pages

SCHEMA = """
CREATE TABLE IF NOT EXISTS operations (
    operation_id    TEXT PRIMARY KEY,
    account         TEXT NOT NULL,
    provider        TEXT NOT NULL,
    provider_job_id TEXT NOT NULL,
    outcome         TEXT NOT NULL,
    started_at      REAL NOT NULL,
    version         INTEGER NOT NULL,
    data            TEXT NOT NULL,
    UNIQUE (account, provider, provider_job_id)
);
CREATE INDEX IF NOT EXISTS operations_outcome ON operations (outcome, provider);
CREATE INDEX IF NOT EXISTS operations_started ON operations (started_at, operation_id);
CREATE INDEX IF NOT EXISTS operations_deadline
    ON operations (provider, json_extract(data, '$.deadline_at')) WHERE outcome = 'pending';
CREATE INDEX IF NOT EXISTS operations_ended
    ON operations (provider, json_extract(data, '$.ended_at')) WHERE outcome != 'pending';
CREATE INDEX IF NOT EXISTS operations_queue
    ON operations (json_extract(data, '$.escalation.at'), operation_id)
    WHERE outcome = 'escalated';
CREATE TABLE IF NOT EXISTS result_values (
    account      TEXT NOT NULL,
    provider     TEXT NOT NULL,
    value        TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    PRIMARY KEY (account, provider, value)
);
CREATE INDEX IF NOT EXISTS result_values_operation ON result_values (operation_id);
CREATE TABLE IF NOT EXISTS idempotency (
    key        TEXT PRIMARY KEY,
    expires_at REAL NOT NULL,
    data       TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
"""
# The layout SCHEMA creates. Version 0 is the previous release's file: the same tables, no
# schema_version table; upgrading it only records the version.
LAYOUT = 1


def dump(record: OperationRecord) -> tuple[Any, ...]:
    """A record as a row of the operations table."""
    return (
        record.operation_id,
        record.account,
        record.provider,
        record.provider_job_id,
        record.outcome.value,
        record.started_at,
        record.version,
        orjson.dumps(record.to_dict()).decode(),
    )


def _load(row: tuple[Any, ...] | None) -> OperationRecord | None:
    return None if row is None else OperationRecord.from_dict(orjson.loads(row[0]))


class _Pending:
    __slots__ = ("future", "operation", "work", "written")

    def __init__(self, operation: str, work: Work, future: asyncio.Future[Any]) -> None:
        self.operation = operation
        self.work = work
        self.future = future
        self.written: OperationRecord | None = None  # set by the work, cached once committed


class _WriteFailed(Exception):
    """A write failed in a batch tried without savepoints: run it again with them."""


class SQLiteStore(Store):
    def __init__(
        self,
        path: str,
        *,
        synchronous: str = "full",
        busy_timeout: float = 2.0,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ):
        self._path = path
        self._synchronous = synchronous.upper()
        self._busy_timeout = busy_timeout
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-write")
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-read")
        self._connections: dict[str, sqlite3.Connection] = {}
        self._queue: list[_Pending] = []
        self._flushing = False
        self._flusher: asyncio.Task[None] | None = None
        self._cache = Cache(cache_bytes)
        self._writing: _Pending | None = None  # the write running now (writer thread)
        self._batch: dict[str, OperationRecord] = {}  # written in the batch being committed
        self._lock: int | None = None  # the descriptor holding FILE.lock
        self._closed = False
        self._migrated: tuple[int | None, int] | None = None  # what the first connection found

    @property
    def cache_limit(self) -> int:
        """The record cache's bound in bytes (limits.cache_bytes)."""
        return self._cache.limit

    @property
    def cached_bytes(self) -> int:
        """What the record cache holds now, in bytes as ``footprint`` counts them."""
        return self._cache.size

    # -- ownership ----------------------------------------------------------------------
    def _claim(self) -> None:
        """Hold the file's OS lock from first use until close: one process per file."""
        if self._lock is not None or self._path == ":memory:":
            return
        if self._closed:
            raise StoreError("sqlite store is closed", operation="open")
        lock_path = self._path + ".lock"
        try:
            Path(lock_path).parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StoreError(
                f"{lock_path}: cannot open ({exc.strerror})", operation="open"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StoreError(
                f"{self._path}: already in use by another statusgate process"
                f" (one process per SQLite file; it holds {lock_path})",
                operation="open",
            ) from None
        self._lock = fd

    async def open(self) -> None:
        """Claim the file and check its layout: a newer one refuses to start."""
        self._claim()
        await self.migrate()

    # -- plumbing -----------------------------------------------------------------------
    def _connection(self, role: str) -> sqlite3.Connection:
        """The connection of the calling thread's role, opened on first use there."""
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
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
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

    async def _read(self, operation: str, work: Callable[[sqlite3.Connection], T]) -> T:
        self._claim()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._reader, lambda: work(self._connection("read")))
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite {operation}: {exc}", operation=operation) from exc
        except RuntimeError as exc:  # executor shut down
            raise StoreError("sqlite store is closed", operation=operation) from exc

    async def _write(self, operation: str, work: Callable[[sqlite3.Connection], T]) -> T:
        """Queue ``work`` for the writer; it runs in the next batch's transaction."""
        self._claim()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.append(_Pending(operation, work, future))
        if not self._flushing:
            self._flushing = True
            self._flusher = loop.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                try:
                    outcomes = await loop.run_in_executor(self._writer, self._commit, batch)
                except (sqlite3.Error, RuntimeError, StoreError) as exc:
                    for pending in batch:
                        _fail(pending, exc)
                    continue
                for pending, (ok, value) in zip(batch, outcomes, strict=True):
                    if ok and pending.written is not None:
                        self._cache.wrote(pending.written)
                    if pending.future.done():
                        continue
                    if ok:
                        pending.future.set_result(value)
                    else:
                        _fail(pending, value)
        finally:
            self._flushing = False

    def _commit(self, batch: list[_Pending]) -> list[tuple[bool, Any]]:
        """One transaction for the batch. Tried first without savepoints (two statements
        fewer a write, measured ~30% of a commit); when a write fails, the batch is rolled
        back and run again with each write in a savepoint, so the failing one is rolled back
        alone. Runs on the writer thread."""
        conn = self._connection("write")
        try:
            return self._transaction(conn, batch, savepoints=False)
        except _WriteFailed:
            for pending in batch:
                pending.written = None
            return self._transaction(conn, batch, savepoints=True)

    def _transaction(
        self, conn: sqlite3.Connection, batch: list[_Pending], *, savepoints: bool
    ) -> list[tuple[bool, Any]]:
        self._batch = {}
        conn.execute("BEGIN IMMEDIATE")
        outcomes: list[tuple[bool, Any]] = []
        try:
            for pending in batch:
                if savepoints:
                    conn.execute("SAVEPOINT one")
                self._writing = pending
                try:
                    outcomes.append((True, pending.work(conn)))
                except Exception as exc:
                    if not savepoints:
                        raise _WriteFailed from exc
                    conn.execute("ROLLBACK TO one")
                    if pending.written is not None:  # undone: later writes must not see it
                        self._batch.pop(pending.written.operation_id, None)
                    pending.written = None
                    outcomes.append((False, exc))
                if savepoints:
                    conn.execute("RELEASE one")
            self._writing = None
            conn.execute("COMMIT")
        except BaseException:
            self._writing = None
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return outcomes

    # -- operations ---------------------------------------------------------------------
    async def create(
        self, record: OperationRecord, idempotency: IdempotencyEntry | None = None
    ) -> OperationRecord:
        def work(conn: sqlite3.Connection) -> OperationRecord:
            existing = _find(conn, record.account, record.provider, record.provider_job_id)
            if existing is not None:
                return existing
            conn.execute("INSERT INTO operations VALUES (?, ?, ?, ?, ?, ?, ?, ?)", dump(record))
            _index(conn, record)
            if idempotency is not None:
                _put_idem(conn, idempotency)
            self._wrote(record)
            return record

        return await self._write("create", work)

    def _wrote(self, record: OperationRecord) -> None:
        """Called on the writer thread: ``record`` is in the write being done now."""
        assert self._writing is not None
        self._writing.written = record
        self._batch[record.operation_id] = record

    async def get(self, operation_id: str) -> OperationRecord | None:
        cached = self._cache.get(operation_id)
        if cached is not None:
            return cached
        since = self._cache.writes
        record = await self._read("get", lambda conn: _get(conn, operation_id))
        if record is not None:
            self._cache.read(record, since)
        return record

    async def find(self, account: str, provider: str, job_id: str) -> OperationRecord | None:
        cached = self._cache.find(account, provider, job_id)
        if cached is not None:
            return cached
        since = self._cache.writes
        record = await self._read("find", lambda conn: _find(conn, account, provider, job_id))
        if record is not None:
            self._cache.read(record, since)
        return record

    async def find_result(self, account: str, provider: str, value: str) -> OperationRecord | None:
        """From the result_values table, written in the record's own transaction."""
        sql = (
            "SELECT operation_id FROM result_values"
            " WHERE account = ? AND provider = ? AND value = ?"
        )
        row = await self._read(
            "find_result", lambda conn: conn.execute(sql, (account, provider, value)).fetchone()
        )
        record = None if row is None else await self.get(str(row[0]))
        return record if record is not None and value in record.result_values else None

    async def save(self, record: OperationRecord) -> bool:
        def work(conn: sqlite3.Connection) -> bool:
            written = _cas(conn, record)
            if written:
                self._wrote(record.evolve(version=record.version + 1))
            return written

        return await self._write("save", work)

    async def mutate(
        self, operation_id: str, change: Mutation[T], *, known: OperationRecord | None = None
    ) -> T:
        """In one transaction; ``known`` is not needed (the read is local)."""

        def work(conn: sqlite3.Connection) -> T:
            # The newest version this process knows (written earlier in this batch, or
            # cached; the cache is current when a batch starts) spares a read and a parse;
            # the compare-and-set proves it, and a miss falls back to reading the file.
            known = self._batch.get(operation_id) or self._cache.peek(operation_id)
            for current in (known, None):
                current = current or _get(conn, operation_id)
                if current is None:
                    raise StoreError(f"{operation_id} vanished from the store", operation="mutate")
                new, result = change(current)
                if new is None:
                    return result
                if _cas(conn, new):
                    self._wrote(new.evolve(version=new.version + 1))
                    return result
                if known is None:
                    break
            raise StoreError(f"{operation_id}: version moved in a transaction", operation="mutate")

        return await self._write("mutate", work)

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
            return [OperationRecord.from_dict(json.loads(row[0])) for row in rows]

        return await self._read("list", work)

    async def purge(self, provider: str, ended_before: float, now: float) -> int:
        def work(conn: sqlite3.Connection) -> list[str]:
            ids = [row[0] for row in conn.execute(PURGEABLE, (provider, ended_before, PURGE_BATCH))]
            conn.executemany("DELETE FROM operations WHERE operation_id = ?", [(i,) for i in ids])
            conn.executemany(
                "DELETE FROM result_values WHERE operation_id = ?", [(i,) for i in ids]
            )
            conn.execute("DELETE FROM idempotency WHERE expires_at <= ?", (now,))
            return ids

        ids = await self._write("purge", work)
        for operation_id in ids:
            self._cache.gone(operation_id)
        return len(ids)

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
            " ORDER BY json_extract(data, '$.escalation.at'), operation_id LIMIT ?"
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
                return IdempotencyEntry.from_dict(json.loads(row[0]))
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
        self._closed = True
        while self._flushing:
            await asyncio.sleep(0.001)
        loop = asyncio.get_running_loop()
        for role, executor in (("read", self._reader), ("write", self._writer)):
            conn = self._connections.pop(role, None)
            if conn is not None:
                await loop.run_in_executor(executor, conn.close)
            executor.shutdown(wait=True)
        if self._lock is not None:
            os.close(self._lock)  # releases the file's lock
            self._lock = None


# Both use the partial expression indexes of SCHEMA (operations_ended, operations_deadline).
PURGEABLE = (
    "SELECT operation_id FROM operations WHERE provider = ? AND outcome != 'pending'"
    " AND json_extract(data, '$.ended_at') < ? LIMIT ?"
)
OVERDUE = (
    "SELECT operation_id FROM operations WHERE provider = ? AND outcome = 'pending'"
    " AND json_extract(data, '$.deadline_at') <= ?"
    " ORDER BY json_extract(data, '$.deadline_at') LIMIT ?"
)


def _probe(conn: sqlite3.Connection) -> None:
    """A write that needs room, leaving nothing behind (an idempotency key never has this
    form: theirs are ``account\\nprovider\\nkey``)."""
    sql = "INSERT OR REPLACE INTO idempotency (key, expires_at, data) VALUES (?, 0, ?)"
    conn.execute(sql, (PROBE_KEY, "0" * PROBE_BYTES))
    conn.execute("DELETE FROM idempotency WHERE key = ?", (PROBE_KEY,))


def _fail(pending: _Pending, exc: BaseException) -> None:
    """Driver errors become StoreError here; anything else (a bug) is raised as it is."""
    if pending.future.done():
        return
    if not isinstance(exc, sqlite3.Error | RuntimeError):
        pending.future.set_exception(exc)
        return
    operation = pending.operation
    closed = isinstance(exc, RuntimeError)
    message = "sqlite store is closed" if closed else f"sqlite {operation}: {exc}"
    error = StoreError(message, operation=operation)
    error.__cause__ = exc
    pending.future.set_exception(error)


def _migrate(conn: sqlite3.Connection) -> tuple[int | None, int]:
    """The file's layout brought up to LAYOUT in one write transaction: (found, now); found
    None for a new file, 0 for the previous release's (no schema_version table). A newer
    layout is refused, both versions named, and nothing is written."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        found = _found(conn)
        if found is not None and found > LAYOUT:
            raise newer_layout("sqlite", found, LAYOUT)
        if found != LAYOUT:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("DELETE FROM schema_version")
            conn.execute("INSERT INTO schema_version VALUES (?)", (LAYOUT,))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return found, LAYOUT


def _found(conn: sqlite3.Connection) -> int | None:
    tables = {
        str(row[0]) for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    if "schema_version" not in tables:
        return 0 if "operations" in tables else None
    row = conn.execute("SELECT max(version) FROM schema_version").fetchone()
    return None if row is None or row[0] is None else int(row[0])


def _get(conn: sqlite3.Connection, operation_id: str) -> OperationRecord | None:
    row = conn.execute(
        "SELECT data FROM operations WHERE operation_id = ?", (operation_id,)
    ).fetchone()
    return _load(row)


def _find(
    conn: sqlite3.Connection, account: str, provider: str, job_id: str
) -> OperationRecord | None:
    row = conn.execute(
        "SELECT data FROM operations WHERE account = ? AND provider = ? AND provider_job_id = ?",
        (account, provider, job_id),
    ).fetchone()
    return _load(row)


def _cas(conn: sqlite3.Connection, record: OperationRecord) -> bool:
    values = dump(record.evolve(version=record.version + 1))
    cursor = conn.execute(
        "UPDATE operations SET outcome = ?, version = ?, data = ?"
        " WHERE operation_id = ? AND version = ?",
        (values[4], values[6], values[7], record.operation_id, record.version),
    )
    if cursor.rowcount != 1:
        return False
    _index(conn, record)
    return True


def _index(conn: sqlite3.Connection, record: OperationRecord) -> None:
    """The record's result values, in the transaction that writes it (SPEC 20)."""
    if record.result_values:
        conn.executemany(
            "INSERT OR REPLACE INTO result_values VALUES (?, ?, ?, ?)",
            [
                (record.account, record.provider, v, record.operation_id)
                for v in record.result_values
            ],
        )


def _put_idem(conn: sqlite3.Connection, entry: IdempotencyEntry) -> None:
    conn.execute(
        "INSERT OR REPLACE INTO idempotency VALUES (?, ?, ?)",
        (entry.key, entry.expires_at, json.dumps(entry.to_dict(), separators=(",", ":"))),
    )
