"""The PostgreSQL store's writes that must find room for a record: the readiness probe (a
row about a record's size written, changed and deleted in a transaction rolled back) and
the submission reservation (the idempotency claim and a record-sized row reserved in one
statement, and the statement that turns that row into the record).

Statement text and arguments, and the probe's run on a connection it is handed: no pool,
no clock; the store decides when.
"""

from __future__ import annotations

import secrets
from typing import Any

import psycopg

from gateway.core.models import IdempotencyEntry, OperationRecord
from gateway.store.postgres.rows import COLUMNS, idem_row, operation_row

PROBE_ID = "statusgate readiness probe"  # no operation id or idempotency key has this form
PROBE_BYTES = 1536  # the probe row's data: about one record

Query = tuple[str, tuple[Any, ...]]  # a statement's text and its arguments


def _pad() -> str:
    """Incompressible data about a record's size: the room a row really takes."""
    return secrets.token_hex(PROBE_BYTES // 2)


async def write_probe(conn: psycopg.AsyncConnection[Any], s: str) -> None:
    """Write, change and delete a probe row in the tables a submit writes (operations,
    idempotency) in a transaction rolled back: a role without INSERT, UPDATE or DELETE, or
    a full disk under empty tables, fails here where ``SELECT 1`` would answer."""
    pad = _pad()
    probe = (PROBE_ID, "", "", PROBE_ID, "probe", 0.0, 0.0, 0.0, None, 0, 0, 0.0, 0, pad)
    async with conn.transaction(force_rollback=True):
        for query, args in (
            (f"INSERT INTO {s}.operations VALUES ({', '.join(['%s'] * 14)})", probe),
            (f"UPDATE {s}.operations SET version = 1 WHERE operation_id = %s", (PROBE_ID,)),
            (f"DELETE FROM {s}.operations WHERE operation_id = %s", (PROBE_ID,)),
            (f"INSERT INTO {s}.idempotency VALUES (%s, 0, %s)", (PROBE_ID, pad)),
            (f"DELETE FROM {s}.idempotency WHERE key = %s", (PROBE_ID,)),
        ):
            await conn.execute(query.encode(), args)


def reserve_query(
    s: str,
    entry: IdempotencyEntry | None,
    now: float,
    operation_id: str,
    account: str,
    provider: str,
) -> Query:
    """The claim (when there is an entry) and the reserved row (outcome ``reserved``, data
    about a record's size) in one statement, answering the entry already held, if any."""
    claim = "SELECT NULL::text AS seen"
    args: tuple[Any, ...] = ()
    if entry is not None:
        claim = f"SELECT {s}.sg_claim(%s, %s, %s, %s) AS seen"
        args = (*idem_row(entry), now)
    query = (
        f"WITH c AS ({claim}), r AS (INSERT INTO {s}.operations"
        " SELECT %s::text, %s::text, %s::text, %s::text, 'reserved', %s::float8,"
        " %s::float8, %s::float8, NULL, 0, 0, 0, 0, %s::text FROM c WHERE c.seen IS NULL"
        " RETURNING 1) SELECT seen FROM c"
    )
    job = f"(reserved) {operation_id}"  # no provider's job id has this form
    reserved = (operation_id, account, provider, job, now, now, now, _pad())
    return query, (*args, *reserved)


def create_query(s: str, record: OperationRecord, idempotency: IdempotencyEntry | None) -> Query:
    """The reserved row turned into the record (an UPDATE on the page the reservation found
    room on), else the record inserted, and the idempotency entry written only when one of
    them was; the one column answered says whether the record was written."""
    columns = ", ".join(COLUMNS[1:])
    query = (
        f"WITH up AS (UPDATE {s}.operations SET ({columns}) ="
        " (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
        " WHERE operation_id = %s AND outcome = 'reserved' AND NOT EXISTS"
        f" (SELECT 1 FROM {s}.operations WHERE account = %s AND provider = %s"
        " AND provider_job_id = %s) RETURNING 1),"
        f" op AS (INSERT INTO {s}.operations VALUES"
        " (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
        " ON CONFLICT DO NOTHING RETURNING 1),"
        " done AS (SELECT 1 FROM up UNION ALL SELECT 1 FROM op),"
        f" idem AS (INSERT INTO {s}.idempotency (key, expires_at, data)"
        " SELECT %s, %s, %s WHERE %s AND EXISTS (SELECT 1 FROM done)"
        " ON CONFLICT (key) DO UPDATE SET expires_at = excluded.expires_at,"
        " data = excluded.data)"
        " SELECT EXISTS (SELECT 1 FROM done)"
    )
    idem = idem_row(idempotency) if idempotency is not None else ("", 0.0, "")
    row_values = operation_row(record)
    job = (record.account, record.provider, record.provider_job_id)
    args = (*row_values[1:], record.operation_id, *job, *row_values, *idem)
    return query, (*args, idempotency is not None)
