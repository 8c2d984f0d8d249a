"""The PostgreSQL store's agent keys and quota counts (SPEC 25): tables ``agent_keys``,
``quota_active``, ``quota_submits`` and the function ``sg_quota`` (sql/layout_3.sql), one
round trip a claim, serialized per holder by a transaction advisory lock."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.core.keys import ACTIVE_RETRY, HOUR, AgentKey
from gateway.settings.config import Quotas
from gateway.store.postgres.rows import CASArgs


class PostgresKeys:
    """The AgentKeys methods of PostgresStore, on its ``_one``, ``_all`` and schema."""

    _s: str

    async def _one(self, operation: str, query: str, args: CASArgs = ()) -> Any:
        raise NotImplementedError  # PostgresStore's

    async def _all(self, operation: str, query: str, args: CASArgs = ()) -> list[Any]:
        raise NotImplementedError  # PostgresStore's

    async def put_key(self, key: AgentKey) -> None:
        await self._one(
            "put_key",
            f"INSERT INTO {self._s}.agent_keys VALUES (%s, %s, %s, %s) RETURNING 1",
            (key.id, key.token_sha256, key.created_at, orjson.dumps(key.to_dict()).decode()),
        )

    async def key_for(self, token_sha256: str) -> AgentKey | None:
        row = await self._one(
            "key_for",
            f"SELECT data FROM {self._s}.agent_keys WHERE token_sha256 = %s",
            (token_sha256,),
        )
        return None if row is None else AgentKey.from_dict(orjson.loads(row[0]))

    async def agent_keys(self) -> list[AgentKey]:
        rows = await self._all(
            "agent_keys", f"SELECT data FROM {self._s}.agent_keys ORDER BY created_at, id"
        )
        return [AgentKey.from_dict(orjson.loads(row[0])) for row in rows]

    async def drop_key(self, key_id: str) -> AgentKey | None:
        s = self._s
        # the counts go unless another key counts under the same holder (a rotated key's
        # successor); keys stored before quota_id existed count under their own id
        holder = "'key:' || coalesce(data::jsonb ->> 'quota_id', id)"
        row = await self._one(
            "drop_key",
            f"WITH k AS (DELETE FROM {s}.agent_keys WHERE id = %s RETURNING data, {holder} AS h),"
            f" gone AS (SELECT h FROM k WHERE NOT EXISTS (SELECT 1 FROM {s}.agent_keys"
            f" WHERE id <> %s AND {holder} = k.h)),"
            f" a AS (DELETE FROM {s}.quota_active WHERE holder IN (SELECT h FROM gone)),"
            f" b AS (DELETE FROM {s}.quota_submits WHERE holder IN (SELECT h FROM gone))"
            " SELECT data FROM k",
            (key_id, key_id),
        )
        return None if row is None else AgentKey.from_dict(orjson.loads(row[0]))

    async def claim_quota(
        self, holder: str, operation_id: str, quotas: Quotas, now: float, hold: float
    ) -> float:
        row = await self._one(
            "claim_quota",
            f"SELECT {self._s}.sg_quota(%s, %s, %s, %s, %s, %s, %s, %s)",
            (
                holder,
                operation_id,
                now,
                quotas.max_active_operations,
                quotas.submits_per_hour,
                HOUR,
                ACTIVE_RETRY,
                hold,
            ),
        )
        return float(row[0])

    async def release_quota(self, holder: str, operation_id: str) -> None:
        await self._one(
            "release_quota",
            f"DELETE FROM {self._s}.quota_active WHERE holder = %s AND operation_id = %s"
            " RETURNING 1",
            (holder, operation_id),
        )
