"""The PostgreSQL store's copy of every replica's audit lines (``audit_chains`` and
``audit_lines``, ``sql/layout_2.sql``): the AuditLines capability.

One statement a call on a pooled connection the store hands in (its ``_connection``, which
turns driver errors into StoreError and bounds the call by the store's timeout). A batch of
lines is one INSERT of arrays, with the chain's last shipped seq moved in the same
statement; a line shipped again is kept once.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg

from gateway.store.auditlines import AuditLines, Chain, KeptLine, RowLine, ShippedLine

Connect = Callable[[str], AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]]


class AuditRows(AuditLines):
    def __init__(self, connection: Connect, schema: str, clock: Callable[[], float]) -> None:
        self._connection = connection
        self._s = schema  # quoted
        self._clock = clock

    async def _rows(self, operation: str, query: str, args: tuple[Any, ...]) -> list[Any]:
        async with self._connection(operation) as conn:
            cursor = await conn.execute(query.encode(), args)
            return await cursor.fetchall()

    async def ship(self, chain: str, replica: str, lines: list[ShippedLine]) -> None:
        s = self._s
        query = (
            f"WITH kept AS (INSERT INTO {s}.audit_lines (chain, seq, at, operation_id, line)"
            " SELECT %s::text, * FROM unnest(%b::bigint[], %b::double precision[], %b::text[],"
            " %b::text[]) ON CONFLICT DO NOTHING RETURNING 1)"
            f" INSERT INTO {s}.audit_chains AS c (chain, replica, last_seq, shipped_at)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT (chain) DO UPDATE SET"
            " replica = excluded.replica, shipped_at = excluded.shipped_at,"
            " last_seq = greatest(c.last_seq, excluded.last_seq)"
            " RETURNING (SELECT count(*) FROM kept)"
        )
        args = (
            chain,
            [line.seq for line in lines],
            [line.at for line in lines],
            [line.operation_id for line in lines],
            [line.line for line in lines],
            chain,
            replica,
            lines[-1].seq,
            self._clock(),
        )
        await self._rows("audit_ship", query, args)

    async def last_seq(self, chain: str) -> int | None:
        rows = await self._rows(
            "audit_ship", f"SELECT last_seq FROM {self._s}.audit_chains WHERE chain = %s", (chain,)
        )
        return int(rows[0][0]) if rows else None

    async def of_operation(self, operation_id: str) -> list[KeptLine]:
        s = self._s
        rows = await self._rows(
            "audit_story",
            f"SELECT l.chain, c.replica, l.seq, l.line FROM {s}.audit_lines l"
            f" JOIN {s}.audit_chains c USING (chain) WHERE l.operation_id = %s"
            " ORDER BY l.at, c.replica, l.seq",
            (operation_id,),
        )
        return [KeptLine(str(c), str(r), int(q), str(t)) for c, r, q, t in rows]

    async def chains(self) -> list[Chain]:
        rows = await self._rows(
            "audit_verify",
            f"SELECT chain, replica, last_seq FROM {self._s}.audit_chains ORDER BY replica, chain",
            (),
        )
        return [Chain(str(c), str(r), int(q)) for c, r, q in rows]

    async def lines(self, chain: str, after: int, limit: int) -> list[RowLine]:
        rows = await self._rows(
            "audit_verify",
            f"SELECT seq, operation_id, line FROM {self._s}.audit_lines"
            " WHERE chain = %s AND seq > %s ORDER BY seq LIMIT %s",
            (chain, after, limit),
        )
        return [RowLine(int(q), None if o is None else str(o), str(t)) for q, o, t in rows]

    async def purge(self, written_before: float, limit: int) -> int:
        gone = 0
        for chain in await self.chains():
            gone += await self._purge_chain(chain.chain, written_before, limit)
        return gone

    async def _purge_chain(self, chain: str, written_before: float, limit: int) -> int:
        """The chain's first ``limit`` lines up to the first one still kept: one written
        since ``written_before``, or about an operation the store still holds."""
        s = self._s
        query = (
            "WITH head AS (SELECT l.seq, (l.at >= %s OR EXISTS (SELECT 1 FROM"
            f" {s}.operations o WHERE o.operation_id = l.operation_id)) AS keep"
            f" FROM {s}.audit_lines l WHERE l.chain = %s ORDER BY l.seq LIMIT %s),"
            " stop AS (SELECT coalesce(min(seq) FILTER (WHERE keep), max(seq) + 1) AS seq"
            " FROM head),"
            f" gone AS (DELETE FROM {s}.audit_lines WHERE chain = %s"
            " AND seq < (SELECT seq FROM stop)"
            f" AND seq < (SELECT last_seq FROM {s}.audit_chains WHERE chain = %s)"
            " RETURNING 1)"
            " SELECT count(*) FROM gone"
        )
        rows = await self._rows("purge", query, (written_before, chain, limit, chain, chain))
        return int(rows[0][0])
