"""Every store records the layout version of what it keeps (SPEC 18): a new store gets the
current one, the previous release's data (the same layout, no version) is upgraded by
``statusgate migrate`` or at start, and a layout newer than this release stops the gateway
with one line naming both versions."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.store import Store, store_from_url
from gateway.store.base import NewerLayout
from gateway.store.sqlite import SCHEMA, dump

from conftest import PROVIDER_KEY, pending_record, write_config

# The previous release's SQLite file: today's tables without the schema_version table.
PREVIOUS_SQLITE = SCHEMA.replace(
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);", ""
)


def statusgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "DEMO_API_KEY": PROVIDER_KEY},
        timeout=60,
        check=False,
    )


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
        conn.execute(
            "INSERT INTO operations VALUES (?, ?, ?, ?, ?, ?, ?, ?)", dump(pending_record())
        )
    config = write_config(tmp_path, "http://127.0.0.1:1", store=f"sqlite:///{db}")
    done = statusgate("migrate", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "sqlite store: schema version 0 upgraded to 1"
    again = statusgate("migrate", "--config", str(config))
    assert again.stdout.strip() == "sqlite store: schema version 1, up to date"
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
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(1,)]


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
        assert len(lines) == 1 and "schema version 5" in lines[0] and "(1)" in lines[0], lines
    store = store_from_url(f"sqlite:///{db}")
    with pytest.raises(NewerLayout):
        await store.open()
    await store.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(5,)]


async def test_the_previous_releases_redis_keys_are_upgraded(redis_url: str) -> None:
    """Keys written by the previous release (no schema_version key) are found as version 0
    and recorded as 1, records intact; a newer version key stops the store."""
    import redis

    first = store_from_url(redis_url)
    await first.open()
    created = await first.create(pending_record())
    await first.close()
    prefix = redis_url.rsplit("prefix=", 1)[1]
    client = redis.Redis.from_url(redis_url.split("?", 1)[0])
    client.delete(f"{prefix}:schema_version")  # as the previous release left them
    second = store_from_url(redis_url)
    try:
        assert await second.migrate() == (0, 1)
        assert await second.get("op_1") == created
        assert await second.migrate() == (1, 1)
    finally:
        await second.close()
    client.set(f"{prefix}:schema_version", 4)
    third = store_from_url(redis_url)
    with pytest.raises(NewerLayout, match=r"schema version 4.*\(1\)"):
        await third.open()
    await third.close()
    client.close()
