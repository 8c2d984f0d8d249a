"""The SQLite store's file: the OS lock one process holds on it (``lock_file``), its
layout (``SCHEMA``, ``UPGRADE``, ``LAYOUT``), how a record is a row (``dump``, ``_load``)
and the statements the store runs on a connection it hands in (reads, the
compare-and-set, the migration, the readiness probe).

Pure SQL on a ``sqlite3.Connection``: no event loop, no cache, no transaction of its own
beyond a savepoint (``_atomic``); the store decides when and on which connection.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from gateway import StoreError
from gateway.core.models import IdempotencyEntry, OperationRecord
from gateway.store.base import newer_layout, owes

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
    deadline_at     REAL,
    ended_at        REAL,
    escalation_at   REAL,
    UNIQUE (account, provider, provider_job_id)
);
CREATE INDEX IF NOT EXISTS operations_outcome ON operations (outcome, provider);
CREATE INDEX IF NOT EXISTS operations_started ON operations (started_at, operation_id);
CREATE INDEX IF NOT EXISTS operations_deadline
    ON operations (provider, deadline_at) WHERE outcome = 'pending';
CREATE INDEX IF NOT EXISTS operations_ended
    ON operations (provider, ended_at) WHERE outcome != 'pending';
CREATE INDEX IF NOT EXISTS operations_queue
    ON operations (escalation_at, operation_id) WHERE outcome = 'escalated';
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
CREATE TABLE IF NOT EXISTS agent_keys (
    id           TEXT PRIMARY KEY,
    token_sha256 TEXT NOT NULL UNIQUE,
    created_at   REAL NOT NULL,
    data         TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS quota_active (
    holder       TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    claimed_at   REAL NOT NULL,
    PRIMARY KEY (holder, operation_id)
);
CREATE TABLE IF NOT EXISTS quota_submits (
    holder       TEXT NOT NULL,
    operation_id TEXT NOT NULL,
    at           REAL NOT NULL,
    PRIMARY KEY (holder, operation_id)
);
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS completions (
    operation_id TEXT PRIMARY KEY,
    ended_at     REAL NOT NULL,
    sent         INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS completions_owed
    ON completions (ended_at, operation_id) WHERE sent = 0;
"""
# Indexes that only make the store faster, created at every start (older files too, no
# new layout): purge deletes expired idempotency entries on the loop, found by this one.
INDEXES = "CREATE INDEX IF NOT EXISTS idempotency_expires ON idempotency (expires_at)"
# The layout SCHEMA creates. Version 0 is the 0.1.0 release's file: no schema_version table.
# Version 1 added that table. Version 2 keeps the instants the sweeper, the purge and the
# escalation queue look up in columns of their own (``COLUMNS``), so a poll's write, which
# changes none of them, updates no index; versions 0 and 1 indexed them as
# ``json_extract(data, ...)``, evaluated again at every write (``UPGRADE`` moves them).
# Version 3 added the agent keys made through the operator API and the quota counts
# (``agent_keys``, ``quota_active``, ``quota_submits``; SCHEMA creates them in a version 2
# file, nothing else changes).
# Version 4 added the completions table: the outbox of operation.completed events (SPEC 23).
LAYOUT = 4
COLUMNS = ("deadline_at", "ended_at", "escalation_at")
UPGRADE = (
    *(f"ALTER TABLE operations ADD COLUMN {column} REAL" for column in COLUMNS),
    "UPDATE operations SET deadline_at = json_extract(data, '$.deadline_at'),"
    " ended_at = json_extract(data, '$.ended_at'),"
    " escalation_at = json_extract(data, '$.escalation.at')",
    "DROP INDEX IF EXISTS operations_deadline",
    "DROP INDEX IF EXISTS operations_ended",
    "DROP INDEX IF EXISTS operations_queue",
)
INSERT = (
    "INSERT INTO operations (operation_id, account, provider, provider_job_id, outcome,"
    " started_at, version, data, deadline_at, ended_at, escalation_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# A write that moves none of the indexed columns (every poll that leaves the record pending
# with its deadline) sets the version and the data alone: SQLite then touches no index.
WRITE_DATA = "UPDATE operations SET version = ?, data = ? WHERE operation_id = ? AND version = ?"
WRITE_ALL = (
    "UPDATE operations SET version = ?, data = ?, outcome = ?, deadline_at = ?, ended_at = ?,"
    " escalation_at = ? WHERE operation_id = ? AND version = ?"
)


def dump(record: OperationRecord) -> tuple[Any, ...]:
    """A record as a row of the operations table, in INSERT's order."""
    return (
        record.operation_id,
        record.account,
        record.provider,
        record.provider_job_id,
        record.outcome.value,
        record.started_at,
        record.version,
        orjson.dumps(record.to_dict()).decode(),
        *_indexed(record),
    )


def _indexed(record: OperationRecord) -> tuple[float, float | None, float | None]:
    """The record's instants kept in columns of their own (``COLUMNS``)."""
    escalation = record.escalation
    return record.deadline_at, record.ended_at, escalation.at if escalation else None


def _load(row: tuple[Any, ...] | None) -> OperationRecord | None:
    return None if row is None else OperationRecord.from_dict(orjson.loads(row[0]))


# Both use the partial indexes of SCHEMA (operations_ended, operations_deadline).
PURGEABLE = (
    "SELECT operation_id FROM operations WHERE provider = ? AND outcome != 'pending'"
    " AND ended_at < ? AND NOT EXISTS (SELECT 1 FROM completions c"
    " WHERE c.operation_id = operations.operation_id AND c.sent = 0) LIMIT ?"
)
OVERDUE = (
    "SELECT operation_id FROM operations WHERE provider = ? AND outcome = 'pending'"
    " AND deadline_at <= ? ORDER BY deadline_at LIMIT ?"
)


def _probe(conn: sqlite3.Connection) -> None:
    """A write that needs room, leaving nothing behind (an idempotency key never has this
    form: theirs are ``account\\nprovider\\nkey``)."""
    sql = "INSERT OR REPLACE INTO idempotency (key, expires_at, data) VALUES (?, 0, ?)"
    with _atomic(conn):
        conn.execute(sql, (PROBE_KEY, "0" * PROBE_BYTES))
        conn.execute("DELETE FROM idempotency WHERE key = ?", (PROBE_KEY,))


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
            if found is not None and found < 2:
                for statement in UPGRADE:
                    conn.execute(statement)
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("DELETE FROM schema_version")
            conn.execute("INSERT INTO schema_version VALUES (?)", (LAYOUT,))
        conn.execute(INDEXES)  # not part of the layout: any version reads the file with it
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


def _cas(
    conn: sqlite3.Connection, record: OperationRecord, stored: OperationRecord | None
) -> OperationRecord | None:
    """Write ``record`` as its next version if the file still holds ``record.version``: the
    version written, or None. ``stored`` is the record as the file holds it (the cache's
    copy; None when not known): when the write leaves its indexed columns as they are, it
    writes the version and the data alone."""
    written = record.evolve(version=record.version + 1)
    data = orjson.dumps(written.to_dict()).decode()
    indexed = _indexed(written)
    key = (record.operation_id, record.version)
    with _atomic(conn) if record.result_values or owes(record) else contextlib.nullcontext():
        if (
            stored is not None
            and stored.version == record.version
            and stored.outcome is written.outcome
            and _indexed(stored) == indexed
        ):
            cursor = conn.execute(WRITE_DATA, (written.version, data, *key))
        else:
            values = (written.version, data, written.outcome.value, *indexed, *key)
            cursor = conn.execute(WRITE_ALL, values)
        if cursor.rowcount != 1:
            return None
        _index(conn, record)
    return written


def _io_error(exc: BaseException | None) -> bool:
    """An I/O error of SQLite's (a failed write or fsync), or of our own fsync."""
    code = getattr(exc, "sqlite_errorcode", None)  # absent on one raised by hand
    if isinstance(exc, sqlite3.Error) and isinstance(code, int):
        return code & 0xFF == sqlite3.SQLITE_IOERR
    return isinstance(exc, sqlite3.OperationalError) and isinstance(exc.__cause__, OSError)


@contextlib.contextmanager
def _atomic(conn: sqlite3.Connection) -> Iterator[None]:
    """The statements inside as one: a failure rolls back these alone, not the turn's other
    writes (one statement is atomic by itself and needs no savepoint)."""
    conn.execute("SAVEPOINT one")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK TO one")
            conn.execute("RELEASE one")
        raise
    conn.execute("RELEASE one")


def _index(conn: sqlite3.Connection, record: OperationRecord) -> None:
    """The record's result values (SPEC 20) and its completion event when it owes one
    (SPEC 23: once; kept, marked sent, until the record goes), in the transaction that
    writes it."""
    if owes(record):
        conn.execute(
            "INSERT OR IGNORE INTO completions (operation_id, ended_at) VALUES (?, ?)",
            (record.operation_id, record.ended_at or 0.0),
        )
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


def lock_file(path: str) -> int:
    """The descriptor holding ``path``.lock exclusively (released by the OS when the
    process dies): one statusgate process per SQLite file, a clear error otherwise."""
    lock_path = path + ".lock"
    try:
        Path(lock_path).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise StoreError(f"{lock_path}: cannot open ({exc.strerror})", operation="open") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise StoreError(
            f"{path}: already in use by another statusgate process"
            f" (one process per SQLite file; it holds {lock_path})",
            operation="open",
        ) from None
    return fd
