"""The SQL the PostgreSQL store sends: the layout files (``sql/layout_N.sql``), the named
statements of the hot path (``Statements``, prepared on each pipelined connection) and the
few queries it runs on a connection it hands in (a lease check, the layout version), plus
how a driver error is said in one line.

Text and small queries only: no pool, no transaction of its own; the store decides when.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg
from psycopg import sql

from gateway.store.postgres.turns import Statement

SQL = resources.files("gateway.store.postgres") / "sql"

# (wait, written, stored JSON) as sg_start answers; 1 written, 0 stale, -1 gone, -2 refused
_START = "SELECT * FROM {s}.sg_start(%s, %s, %s, %s, %s, %s, %s, {cas})"
_CAS = "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s"


def layout_sql(schema: str, version: int) -> str:
    """The DDL of one layout step with the schema filled in (``@`` in the file)."""
    text = (SQL / f"layout_{version}.sql").read_text(encoding="utf-8")
    return text.replace("@.", sql.Identifier(schema).as_string(None) + ".")


@dataclass(frozen=True)
class Statements:
    """The hot path's statements for one schema (``s``, quoted): their text and names."""

    start_sql: str
    finish_sql: str
    cas_sql: str
    index_sql: str
    start: Statement
    finish: Statement
    cas: Statement
    index: Statement
    get: Statement
    find: Statement
    finds: Statement

    @classmethod
    def of(cls, s: str) -> Statements:
        start_sql = _START.format(s=s, cas=_CAS)
        finish_sql = f"SELECT {s}.sg_finish(%s, %s, {_CAS})"
        cas_sql = f"SELECT {s}.sg_cas({_CAS})"
        index_sql = (
            f"INSERT INTO {s}.result_values SELECT %s::text, %s::text, v, %s::text"
            " FROM unnest(%s::text[]) AS v ON CONFLICT DO NOTHING"
        )
        return cls(
            start_sql,
            finish_sql,
            cas_sql,
            index_sql,
            Statement.of("sg_start", start_sql),
            Statement.of("sg_finish", finish_sql),
            Statement.of("sg_cas", cas_sql),
            Statement.of("sg_index", index_sql),
            Statement.of(
                "sg_get",
                f"SELECT data FROM {s}.operations WHERE operation_id = %s"
                " AND outcome <> 'reserved'",  # a submission's reservation is no record
            ),
            Statement.of(
                "sg_find",
                f"SELECT data FROM {s}.operations"
                " WHERE account = %s AND provider = %s AND provider_job_id = %s",
            ),
            Statement.of(
                "sg_finds",
                f"SELECT o.data FROM {s}.operations o JOIN"
                " unnest(%s::text[], %s::text[], %s::text[]) AS j (a, p, k)"
                " ON o.account = j.a AND o.provider = j.p AND o.provider_job_id = j.k",
            ),
        )


async def holds(conn: psycopg.AsyncConnection[Any], s: str, name: str, token: str) -> bool:
    """Whether ``token`` holds lease ``name`` by the database clock; the row stays locked
    until the transaction ends, so no one takes the lease meanwhile."""
    cursor = await conn.execute(
        f"SELECT 1 FROM {s}.leases WHERE name = %s AND token = %s"
        f" AND expires_at > {s}.sg_now() FOR UPDATE".encode(),
        (name, token),
    )
    return await cursor.fetchone() is not None


async def found_layout(conn: psycopg.AsyncConnection[Any], schema: str) -> int | None:
    """The recorded layout version; None when the schema holds no Statusgate tables."""
    cursor = await conn.execute(
        "SELECT to_regclass(%s), to_regclass(%s)",
        (_qualified(schema, "schema_version"), _qualified(schema, "operations")),
    )
    versions, operations = await cursor.fetchone() or (None, None)
    if versions is None:
        return None if operations is None else 0
    cursor = await conn.execute(
        sql.SQL("SELECT max(version) FROM {}.schema_version").format(sql.Identifier(schema))
    )
    row = await cursor.fetchone()
    return None if row is None or row[0] is None else int(row[0])


def _qualified(schema: str, table: str) -> str:
    return f"{sql.Identifier(schema).as_string(None)}.{table}"


def describe(exc: BaseException) -> str:
    """A driver error in one line, without the connection string (never a password)."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    lines = [" ".join(line.split()) for line in str(exc).splitlines() if line.strip()]
    return lines[0].removeprefix("connection failed: ") if lines else type(exc).__name__
