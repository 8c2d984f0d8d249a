"""The SQLite store's agent keys and quota counts (SPEC 25): tables ``agent_keys``,
``quota_active`` and ``quota_submits`` (layout 3, gateway/store/sqlite/rows.py).

Each claim runs whole on the loop inside the turn's transaction, with no await in it, so
it is atomic by construction (one process owns the file).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TypeVar

import orjson

from gateway.core.keys import HOUR, AgentKey, quota_wait
from gateway.settings.config import Quotas

T = TypeVar("T")
Work = Callable[[sqlite3.Connection], T]

# a place is free when its record ended, or, with no record, when it was claimed too long ago
PRUNE_ACTIVE = (
    "DELETE FROM quota_active WHERE holder = ? AND operation_id IN ("
    " SELECT q.operation_id FROM quota_active q LEFT JOIN operations o"
    " ON o.operation_id = q.operation_id WHERE q.holder = ?"
    " AND ((o.operation_id IS NULL AND q.claimed_at <= ?)"
    " OR (o.operation_id IS NOT NULL AND o.outcome != 'pending')))"
)


def _load(row: tuple[object, ...] | None) -> AgentKey | None:
    return None if row is None else AgentKey.from_dict(orjson.loads(str(row[0])))


def _shared(conn: sqlite3.Connection, holder: str) -> bool:
    """Whether a stored key counts under ``holder`` (a rotated key's successor)."""
    rows = conn.execute("SELECT data FROM agent_keys").fetchall()
    return any(AgentKey.from_dict(orjson.loads(str(r[0]))).holder == holder for r in rows)


class SQLiteKeys:
    """The AgentKeys methods of SQLiteStore, on its ``_write`` and ``_now``."""

    async def _write(
        self, operation: str, work: Work[T], durable: Callable[[T], bool] | None = None
    ) -> T:
        raise NotImplementedError  # SQLiteStore's

    def _now(self, operation: str, work: Work[T]) -> T:
        raise NotImplementedError  # SQLiteStore's

    async def put_key(self, key: AgentKey) -> None:
        sql = "INSERT INTO agent_keys VALUES (?, ?, ?, ?)"
        data = orjson.dumps(key.to_dict()).decode()
        values = (key.id, key.token_sha256, key.created_at, data)
        await self._write("put_key", lambda conn: conn.execute(sql, values))

    async def key_for(self, token_sha256: str) -> AgentKey | None:
        sql = "SELECT data FROM agent_keys WHERE token_sha256 = ?"
        return self._now(
            "key_for", lambda conn: _load(conn.execute(sql, (token_sha256,)).fetchone())
        )

    async def agent_keys(self) -> list[AgentKey]:
        sql = "SELECT data FROM agent_keys ORDER BY created_at, id"
        rows = self._now("agent_keys", lambda conn: conn.execute(sql).fetchall())
        return [AgentKey.from_dict(orjson.loads(str(row[0]))) for row in rows]

    async def drop_key(self, key_id: str) -> AgentKey | None:
        def work(conn: sqlite3.Connection) -> AgentKey | None:
            row = conn.execute("DELETE FROM agent_keys WHERE id = ? RETURNING data", (key_id,))
            key = _load(row.fetchone())
            if key is None or _shared(conn, key.holder):
                return key
            conn.execute("DELETE FROM quota_active WHERE holder = ?", (key.holder,))
            conn.execute("DELETE FROM quota_submits WHERE holder = ?", (key.holder,))
            return key

        return await self._write("drop_key", work)

    async def claim_quota(
        self, holder: str, operation_id: str, quotas: Quotas, now: float, hold: float
    ) -> float:
        def work(conn: sqlite3.Connection) -> float:
            conn.execute(PRUNE_ACTIVE, (holder, holder, now - hold))
            conn.execute(
                "DELETE FROM quota_submits WHERE holder = ? AND at <= ?", (holder, now - HOUR)
            )
            active = conn.execute("SELECT count(*) FROM quota_active WHERE holder = ?", (holder,))
            count = int(active.fetchone()[0])
            recent = conn.execute("SELECT at FROM quota_submits WHERE holder = ?", (holder,))
            wait = quota_wait(quotas, count, [float(r[0]) for r in recent.fetchall()], now)
            if wait == 0:
                row = (holder, operation_id, now)
                if quotas.max_active_operations is not None:
                    conn.execute("INSERT OR REPLACE INTO quota_active VALUES (?, ?, ?)", row)
                if quotas.submits_per_hour is not None:
                    conn.execute("INSERT OR REPLACE INTO quota_submits VALUES (?, ?, ?)", row)
            return wait

        return await self._write("claim_quota", work)

    async def release_quota(self, holder: str, operation_id: str) -> None:
        sql = "DELETE FROM quota_active WHERE holder = ? AND operation_id = ?"
        await self._write("release_quota", lambda conn: conn.execute(sql, (holder, operation_id)))
