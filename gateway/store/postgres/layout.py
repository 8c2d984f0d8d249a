"""The PostgreSQL store's layout work: the version this code writes (``LAYOUT``), and the
migration that creates or upgrades it in one transaction on a connection it is handed."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from gateway import StoreError
from gateway.store.base import newer_layout
from gateway.store.postgres.statements import found_layout, layout_sql

LAYOUT = 4  # written by this code: sql/layout_1.sql, then _2 (audit lines), _3 (keys), _4 (outbox)


async def migrate_layout(conn: psycopg.AsyncConnection[Any], schema: str) -> int | None:
    """Create or upgrade the layout in one transaction (a transaction-level advisory lock
    keeps two replicas starting at once from both doing it); the version found. A layout
    newer than this code knows is refused, naming both versions."""
    s = sql.Identifier(schema).as_string(None)
    async with conn.transaction():
        key = f"statusgate-layout:{schema}"
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (key,))
        found = await found_layout(conn, schema)
        if found is not None and found > LAYOUT:
            raise newer_layout("postgresql", found, LAYOUT)
        if found == LAYOUT:  # up to date: no DDL, so any role may ask
            return found
        if found == 0:
            raise StoreError(
                f"postgresql: schema {schema} has an operations table that"
                " statusgate did not make (no schema_version); choose another schema=",
                operation="open",
            )
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}".encode())
        versions = (
            f"CREATE TABLE IF NOT EXISTS {s}.schema_version"
            " (version integer NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        await conn.execute(versions.encode())
        for step in range((found or 0) + 1, LAYOUT + 1):
            await conn.execute(layout_sql(schema, step).encode())
        await conn.execute(f"DELETE FROM {s}.schema_version".encode())
        await conn.execute(
            f"INSERT INTO {s}.schema_version (version) VALUES (%s)".encode(), (LAYOUT,)
        )
    return found
