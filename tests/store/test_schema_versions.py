"""Every store records the layout version of what it keeps (SPEC 18): a new store gets the
current one, the previous release's data (the same layout, no version) is upgraded by
``statusgate migrate`` or at start, and a layout newer than this release stops the gateway
with one line naming both versions."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from gateway.core.models import Escalation, OperationRecord, Outcome, Reason
from gateway.store import Store, store_from_url
from gateway.store.base import NewerLayout
from gateway.store.sqlite.rows import INSERT, LAYOUT, SCHEMA, dump

from conftest import pending_record, run_statusgate, write_config

# SQLite layout 1 as released: the instants the sweeper, the purge and the escalation queue
# look up were indexed as json_extract(data, ...); layout 2 keeps them in columns.
LAYOUT_1_SQLITE = """
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
# Layout 0, the 0.1.0 release's file: layout 1 without the schema_version table.
PREVIOUS_SQLITE = LAYOUT_1_SQLITE.replace(
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);", ""
)
OLD_ROW = "INSERT INTO operations VALUES (?, ?, ?, ?, ?, ?, ?, ?)"


def old_row(record: OperationRecord) -> tuple[object, ...]:
    """``record`` as a row of layouts 0 and 1."""
    return (
        record.operation_id,
        record.account,
        record.provider,
        record.provider_job_id,
        record.outcome.value,
        record.started_at,
        record.version,
        json.dumps(record.to_dict()),
    )


def statusgate(*args: str) -> subprocess.CompletedProcess[str]:
    return run_statusgate(*args, timeout=60)


async def test_every_store_records_its_layout_once(store: Store) -> None:
    """A store opened once holds the current layout; migrating again finds it current."""
    found, now = await store.migrate()
    assert found in (None, 0, now)
    assert await store.migrate() == (now, now)


async def test_the_previous_releases_sqlite_file_is_upgraded(tmp_path: Path) -> None:
    """A file written by the previous release (no schema_version table) is upgraded by
    ``statusgate migrate`` with its records intact; migrating again changes nothing."""
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        conn.executescript(PREVIOUS_SQLITE)
        conn.execute(OLD_ROW, old_row(pending_record()))
    config = write_config(tmp_path, "http://127.0.0.1:1", store=f"sqlite:///{db}")
    done = statusgate("migrate", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"sqlite store: schema version 0 upgraded to {LAYOUT}"
    again = statusgate("migrate", "--config", str(config))
    assert again.stdout.strip() == f"sqlite store: schema version {LAYOUT}, up to date"
    store = store_from_url(f"sqlite:///{db}")
    await store.open()
    try:
        stored = await store.get("op_1")
        assert stored is not None and stored.provider_job_id == "job_1"
    finally:
        await store.close()


async def test_the_previous_releases_sqlite_file_is_upgraded_at_start(tmp_path: Path) -> None:
    """Without ``migrate``, the first start records the version as well."""
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        conn.executescript(PREVIOUS_SQLITE)
    store = store_from_url(f"sqlite:///{db}")
    await store.open()
    await store.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(LAYOUT,)]


async def test_a_layout_1_sqlite_file_gets_its_indexed_instants_as_columns(
    tmp_path: Path,
) -> None:
    """Layout 1 to 2 (``statusgate migrate``, or the first start): each record's deadline,
    end and escalation instants are copied into their columns, the json_extract indexes
    are replaced by indexes on those columns, and the sweeper, the purge and the escalation
    queue find the records the file held."""
    db = tmp_path / "layout1.db"
    now = time.time()
    overdue = pending_record(operation_id="op_late", provider_job_id="j1", deadline_at=now - 60)
    done = pending_record(
        operation_id="op_done",
        provider_job_id="j2",
        outcome=Outcome.SUCCEEDED,
        ended_at=now - 7200,
    )
    escalated = pending_record(
        operation_id="op_esc",
        provider_job_id="j3",
        outcome=Outcome.ESCALATED,
        ended_at=now,
        escalation=Escalation(Reason.DEADLINE_EXCEEDED, now - 5, "late", ("extend",)),
    )
    with sqlite3.connect(db) as conn:
        conn.executescript(LAYOUT_1_SQLITE)
        conn.execute("INSERT INTO schema_version VALUES (1)")
        for record in (overdue, done, escalated):
            conn.execute(OLD_ROW, old_row(record))
    config = write_config(tmp_path, "http://127.0.0.1:1", store=f"sqlite:///{db}")
    migrated = statusgate("migrate", "--config", str(config))
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.strip() == f"sqlite store: schema version 1 upgraded to {LAYOUT}"
    with sqlite3.connect(db) as conn:
        columns = conn.execute(
            "SELECT operation_id, deadline_at, ended_at, escalation_at FROM operations"
            " ORDER BY operation_id"
        ).fetchall()
        indexes = [row[0] for row in conn.execute("SELECT sql FROM sqlite_master")]
    assert columns == [
        ("op_done", done.deadline_at, done.ended_at, None),
        ("op_esc", escalated.deadline_at, escalated.ended_at, now - 5),
        ("op_late", overdue.deadline_at, None, None),
    ]
    assert not [sql for sql in indexes if sql and "json_extract" in sql]
    store = store_from_url(f"sqlite:///{db}")
    await store.open()
    try:
        provider = overdue.provider
        assert await store.overdue(provider, now, 10) == ["op_late"]
        queue, total = await store.escalation_queue(10)
        assert [r.operation_id for r in queue] == ["op_esc"] and total == 1
        assert await store.purge(provider, now - 3600, now) == 1
        assert await store.get("op_done") is None
    finally:
        await store.close()


async def test_a_newer_sqlite_layout_stops_the_gateway(tmp_path: Path) -> None:
    """A file of a later release: serve, migrate, check and the store itself refuse it, naming
    both versions, in one line; the file is left as it was."""
    db = tmp_path / "new.db"
    with sqlite3.connect(db) as conn:
        conn.executescript(SCHEMA)
        conn.execute("INSERT INTO schema_version VALUES (5)")
    config = write_config(tmp_path, "http://127.0.0.1:1", store=f"sqlite:///{db}")
    for command in ("serve", "migrate", "check"):
        done = statusgate(command, "--config", str(config))
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1, command
        assert len(lines) == 1 and "schema version 5" in lines[0], lines
        assert f"({LAYOUT})" in lines[0], lines
    store = store_from_url(f"sqlite:///{db}")
    with pytest.raises(NewerLayout):
        await store.open()
    await store.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(5,)]


async def test_the_previous_releases_redis_keys_are_upgraded(redis_url: str) -> None:
    """Keys written by the previous release (no schema_version key) are found as version 0
    and recorded as the current layout, records intact; a newer version key stops the
    store."""
    import redis

    from gateway.store.redis.store import LAYOUT as REDIS_LAYOUT

    first = store_from_url(redis_url)
    await first.open()
    created = await first.create(pending_record())
    await first.close()
    prefix = redis_url.rsplit("prefix=", 1)[1]
    client = redis.Redis.from_url(redis_url.split("?", 1)[0])
    client.delete(f"{prefix}:schema_version")  # as the previous release left them
    second = store_from_url(redis_url)
    try:
        assert await second.migrate() == (0, REDIS_LAYOUT)
        assert await second.get("op_1") == created
        assert await second.migrate() == (REDIS_LAYOUT, REDIS_LAYOUT)
    finally:
        await second.close()
    client.set(f"{prefix}:schema_version", 4)
    third = store_from_url(redis_url)
    with pytest.raises(NewerLayout, match=rf"schema version 4.*\({REDIS_LAYOUT}\)"):
        await third.open()
    await third.close()
    client.close()


async def test_a_layout_2_sqlite_file_gets_the_completion_outbox(tmp_path: Path) -> None:
    """Layout 2 to 3: the completions table is created, the records stay as they were,
    and a record that ends after the upgrade owes its completion event."""
    db = tmp_path / "layout2.db"
    layout_2 = SCHEMA.split("CREATE TABLE IF NOT EXISTS completions")[0]
    waiting = pending_record(operation_id="op_w", provider_job_id="j1")
    with sqlite3.connect(db) as conn:
        conn.executescript(layout_2)
        conn.execute("INSERT INTO schema_version VALUES (2)")
        conn.execute(INSERT, dump(waiting))
    config = write_config(tmp_path, "http://127.0.0.1:1", store=f"sqlite:///{db}")
    migrated = statusgate("migrate", "--config", str(config))
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.strip() == f"sqlite store: schema version 2 upgraded to {LAYOUT}"
    store = store_from_url(f"sqlite:///{db}")
    await store.open()
    try:
        stored = await store.get("op_w")
        assert stored == waiting
        ended = waiting.evolve(outcome=Outcome.SUCCEEDED, ended_at=time.time(), announce=True)
        assert await store.save(ended)
        assert await store.owed_completions(10) == ["op_w"]
    finally:
        await store.close()
