"""The PostgreSQL store's completion outbox (SPEC 23): the ``completions`` table, whose
rows a trigger makes in the record's own write (sql/layout_4.sql); read and marked here."""

from __future__ import annotations

from typing import Any, Protocol


class _Host(Protocol):
    _s: str

    async def _one(self, operation: str, query: str, args: Any = ()) -> Any: ...

    async def _all(self, operation: str, query: str, args: Any = ()) -> list[Any]: ...


class PostgresOutbox:
    async def owed_completions(self: _Host, limit: int) -> list[str]:
        rows = await self._all(
            "owed_completions",
            f"SELECT operation_id FROM {self._s}.completions WHERE NOT sent"
            " ORDER BY ended_at, operation_id LIMIT %s",
            (limit,),
        )
        return [str(row[0]) for row in rows]

    async def completion_owed(self: _Host, operation_id: str) -> bool:
        row = await self._one(
            "completion_owed",
            f"SELECT 1 FROM {self._s}.completions WHERE operation_id = %s AND NOT sent",
            (operation_id,),
        )
        return row is not None

    async def completion_sent(self: _Host, operation_id: str) -> None:
        await self._one(
            "completion_sent",
            f"UPDATE {self._s}.completions SET sent = true WHERE operation_id = %s RETURNING 1",
            (operation_id,),
        )
