"""The SQLite store's completion outbox (SPEC 23): the ``completions`` table, whose rows
the record's own write makes (rows.py ``_index``); read and marked here."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Protocol, TypeVar

T = TypeVar("T")

OWED = "SELECT operation_id FROM completions WHERE sent = 0 ORDER BY ended_at, operation_id LIMIT ?"


class _Host(Protocol):
    async def _read(self, operation: str, work: Callable[[sqlite3.Connection], T]) -> T: ...

    async def _write(
        self,
        operation: str,
        work: Callable[[sqlite3.Connection], T],
        durable: Callable[[T], bool] | None = None,
    ) -> T: ...


class SQLiteOutbox:
    async def owed_completions(self: _Host, limit: int) -> list[str]:
        def work(conn: sqlite3.Connection) -> list[str]:
            return [str(row[0]) for row in conn.execute(OWED, (limit,))]

        return await self._read("owed_completions", work)

    async def completion_owed(self: _Host, operation_id: str) -> bool:
        sql = "SELECT 1 FROM completions WHERE operation_id = ? AND sent = 0"
        return await self._read(
            "completion_owed",
            lambda conn: conn.execute(sql, (operation_id,)).fetchone() is not None,
        )

    async def completion_sent(self: _Host, operation_id: str) -> None:
        sql = "UPDATE completions SET sent = 1 WHERE operation_id = ?"
        await self._write("completion_sent", lambda conn: conn.execute(sql, (operation_id,)))
