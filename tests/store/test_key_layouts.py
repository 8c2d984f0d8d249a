"""A store written by the layout before agent keys (PostgreSQL layout 1, SQLite layout 2) is
upgraded by ``migrate`` to the one that keeps them, its records intact, and then keeps
keys (SPEC 25; CHANGELOG, "Upgrading")."""

from __future__ import annotations

import sqlite3
import time
import uuid
from pathlib import Path

import psycopg

from gateway.core.keys import AgentKey
from gateway.store import store_from_url
from gateway.store.postgres.layout import LAYOUT as POSTGRES_LAYOUT
from gateway.store.postgres.statements import layout_sql
from gateway.store.sqlite.rows import LAYOUT as SQLITE_LAYOUT
from gateway.store.sqlite.rows import SCHEMA

from conftest import drop_schema, pending_record

KEY = AgentKey("key_up", "team-u", ("*",), "e" * 64, 1.0)


async def test_postgres_layout_1_is_upgraded_to_keep_keys(postgres_base_url: str) -> None:
    """Layout 1 as the release before wrote it, with a record: migrate answers (1, now),
    the record reads back and a key is kept and found."""
    schema = f"sgtest_{uuid.uuid4().hex[:12]}"
    base = postgres_base_url.split("?", 1)[0]
    url = f"{postgres_base_url}{'&' if '?' in postgres_base_url else '?'}schema={schema}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"'.encode())
        conn.execute(
            f'CREATE TABLE "{schema}".schema_version (version integer NOT NULL,'
            " applied_at timestamptz NOT NULL DEFAULT now())".encode()
        )
        conn.execute(layout_sql(schema, 1).encode())
        conn.execute(f'INSERT INTO "{schema}".schema_version (version) VALUES (1)'.encode())
    try:
        old = store_from_url(url)
        assert await old.migrate() == (1, POSTGRES_LAYOUT)
        await old.close()
        store = store_from_url(url)
        await store.open()
        try:
            created = await store.create(pending_record())
            await store.put_key(KEY)
            assert await store.key_for("e" * 64) == KEY
            assert await store.get(created.operation_id) == created
        finally:
            await store.close()
    finally:
        drop_schema(base, schema)


async def test_sqlite_layout_2_is_upgraded_to_keep_keys(tmp_path: Path) -> None:
    """A layout 2 file (no key tables) opens as the current layout and keeps keys."""
    path = tmp_path / "old.db"
    old_schema = SCHEMA.split("CREATE TABLE IF NOT EXISTS agent_keys")[0]
    with sqlite3.connect(path) as conn:
        conn.executescript(old_schema + "CREATE TABLE schema_version (version INTEGER);")
        conn.execute("INSERT INTO schema_version VALUES (2)")
    store = store_from_url(f"sqlite:///{path}")
    try:
        assert await store.migrate() == (2, SQLITE_LAYOUT)
        await store.put_key(KEY)
        assert await store.key_for("e" * 64) == KEY
        assert await store.claim_quota("key:key_up", "op_1", KEY.quotas, time.time(), 60) == 0
    finally:
        await store.close()
