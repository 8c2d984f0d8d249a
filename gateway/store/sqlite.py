"""``sqlite:///path``: the default store, one file, WAL, one writer.

All SQL runs on one dedicated thread with one connection, so the event loop never blocks on
disk and writes are serialised in this process; every read-modify-write is one
``BEGIN IMMEDIATE`` transaction, which also serialises writers from other processes.
``?synchronous=normal`` trades durability on power loss for speed (a process crash loses
nothing either way); the default is ``full``. ``?busy_timeout=2s`` bounds how long a call
waits for another process's write lock before the gateway fails closed.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from ..errors import StoreError
from ..models import IdempotencyEntry, OperationFilter, OperationRecord
from .base import Mutation, Store

T = TypeVar("T")

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
CREATE TABLE IF NOT EXISTS idempotency (
    key        TEXT PRIMARY KEY,
    expires_at REAL NOT NULL,
    data       TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS leases (
    name       TEXT PRIMARY KEY,
    token      TEXT NOT NULL,
    expires_at REAL NOT NULL
);
"""


def _dump(record: OperationRecord) -> tuple[Any, ...]:
    return (
        record.operation_id,
        record.account,
        record.provider,
        record.provider_job_id,
        record.outcome.value,
        record.started_at,
        record.version,
        json.dumps(record.to_dict(), separators=(",", ":")),
    )


def _load(row: tuple[Any, ...] | None) -> OperationRecord | None:
    return None if row is None else OperationRecord.from_dict(json.loads(row[0]))


class SQLiteStore(Store):
    def __init__(self, path: str, *, synchronous: str = "full", busy_timeout: float = 2.0):
        self._path = path
        self._synchronous = synchronous.upper()
        self._busy_timeout = busy_timeout
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite")
        self._conn: sqlite3.Connection | None = None

    # -- plumbing -----------------------------------------------------------------------
    async def _run(self, operation: str, work: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._call, work)
        except sqlite3.Error as exc:
            raise StoreError(f"sqlite {operation}: {exc}", operation=operation) from exc
        except RuntimeError as exc:  # executor shut down
            raise StoreError("sqlite store is closed", operation=operation) from exc

    def _call(self, work: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            self._conn = self._open()
        return work(self._conn)

    def _open(self) -> sqlite3.Connection:
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
        conn.executescript(SCHEMA)
        return conn

    @staticmethod
    def _write(conn: sqlite3.Connection, work: Callable[[sqlite3.Connection], T]) -> T:
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = work(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    # -- operations ---------------------------------------------------------------------
    async def create(
        self, record: OperationRecord, idempotency: IdempotencyEntry | None = None
    ) -> OperationRecord:
        def work(conn: sqlite3.Connection) -> OperationRecord:
            existing = _load(
                conn.execute(
                    "SELECT data FROM operations"
                    " WHERE account = ? AND provider = ? AND provider_job_id = ?",
                    (record.account, record.provider, record.provider_job_id),
                ).fetchone()
            )
            if existing is not None:
                return existing
            conn.execute("INSERT INTO operations VALUES (?, ?, ?, ?, ?, ?, ?, ?)", _dump(record))
            if idempotency is not None:
                _put_idem(conn, idempotency)
            return record

        return await self._run("create", lambda conn: self._write(conn, work))

    async def get(self, operation_id: str) -> OperationRecord | None:
        return await self._run("get", lambda conn: _get(conn, operation_id))

    async def find(self, account: str, provider: str, job_id: str) -> OperationRecord | None:
        sql = (
            "SELECT data FROM operations WHERE account = ? AND provider = ? AND provider_job_id = ?"
        )
        return await self._run(
            "find", lambda conn: _load(conn.execute(sql, (account, provider, job_id)).fetchone())
        )

    async def save(self, record: OperationRecord) -> bool:
        return await self._run("save", lambda conn: self._write(conn, lambda c: _cas(c, record)))

    async def mutate(self, operation_id: str, change: Mutation[T]) -> T:
        def work(conn: sqlite3.Connection) -> T:
            current = _get(conn, operation_id)
            if current is None:
                raise StoreError(f"{operation_id} vanished from the store", operation="mutate")
            new, result = change(current)
            if new is not None and not _cas(conn, new):
                raise StoreError(
                    f"{operation_id}: version moved in a transaction", operation="mutate"
                )
            return result

        return await self._run("mutate", lambda conn: self._write(conn, work))

    async def list(self, where: OperationFilter) -> list[OperationRecord]:
        clauses, args = [], []
        for column, value in (
            ("outcome", where.outcome),
            ("provider", where.provider),
            ("account", where.account),
        ):
            if value is not None:
                clauses.append(f"{column} = ?")
                args.append(str(value))
        sql = "SELECT data FROM operations"
        if clauses:
            sql += " WHERE " + " AND ".join(clauses)
        sql += " ORDER BY started_at DESC LIMIT ?"

        def work(conn: sqlite3.Connection) -> list[OperationRecord]:
            rows = conn.execute(sql, (*args, where.limit)).fetchall()
            return [OperationRecord.from_dict(json.loads(row[0])) for row in rows]

        return await self._run("list", work)

    async def active_counts(self) -> dict[str, int]:
        sql = (
            "SELECT provider, count(*) FROM operations WHERE outcome = 'pending' GROUP BY provider"
        )
        rows = await self._run("active_counts", lambda conn: conn.execute(sql).fetchall())
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

        return await self._run("claim_idempotency", lambda conn: self._write(conn, work))

    async def put_idempotency(self, entry: IdempotencyEntry) -> None:
        await self._run(
            "put_idempotency", lambda conn: self._write(conn, lambda c: _put_idem(c, entry))
        )

    async def drop_idempotency(self, key: str) -> None:
        await self._run(
            "drop_idempotency",
            lambda conn: conn.execute("DELETE FROM idempotency WHERE key = ?", (key,)),
        )

    # -- leases -------------------------------------------------------------------------
    async def acquire_lease(self, name: str, token: str, now: float, ttl: float) -> bool:
        sql = (
            "INSERT INTO leases VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE"
            " SET token = excluded.token, expires_at = excluded.expires_at"
            " WHERE leases.token = excluded.token OR leases.expires_at <= ?"
        )
        return await self._run(
            "acquire_lease",
            lambda conn: conn.execute(sql, (name, token, now + ttl, now)).rowcount == 1,
        )

    async def release_lease(self, name: str, token: str) -> None:
        sql = "DELETE FROM leases WHERE name = ? AND token = ?"
        await self._run("release_lease", lambda conn: conn.execute(sql, (name, token)))

    # -- life ---------------------------------------------------------------------------
    async def ping(self) -> None:
        """Ready means writable: the write lock can be taken within the busy timeout."""
        await self._run("ping", lambda conn: self._write(conn, lambda c: c.execute("SELECT 1")))

    async def close(self) -> None:
        def shut(conn: sqlite3.Connection) -> None:
            conn.close()
            self._conn = None

        if self._conn is not None:
            await self._run("close", shut)
        self._executor.shutdown(wait=True)


def _get(conn: sqlite3.Connection, operation_id: str) -> OperationRecord | None:
    row = conn.execute(
        "SELECT data FROM operations WHERE operation_id = ?", (operation_id,)
    ).fetchone()
    return _load(row)


def _cas(conn: sqlite3.Connection, record: OperationRecord) -> bool:
    values = _dump(record.evolve(version=record.version + 1))
    cursor = conn.execute(
        "UPDATE operations SET outcome = ?, version = ?, data = ?"
        " WHERE operation_id = ? AND version = ?",
        (values[4], values[6], values[7], record.operation_id, record.version),
    )
    return cursor.rowcount == 1


def _put_idem(conn: sqlite3.Connection, entry: IdempotencyEntry) -> None:
    conn.execute(
        "INSERT OR REPLACE INTO idempotency VALUES (?, ?, ?)",
        (entry.key, entry.expires_at, json.dumps(entry.to_dict(), separators=(",", ":"))),
    )
