"""The Redis store's completion outbox (SPEC 23): each provider's ``outbox`` sorted set in
every shard, which the CAS script fills in the record's own write (layout.py); read and
marked here. Owed entries are scored by ended_at, sent ones +inf."""

from __future__ import annotations

from typing import Any, Protocol

from gateway.core.models import OperationRecord
from gateway.store.redis.layout import Keys, oldest

SENT = "+inf"


class _Host(Protocol):
    keys: Keys

    async def _call(self, operation: str, work: Any) -> Any: ...

    async def _providers(self, operation: str) -> tuple[str, ...]: ...

    async def get(self, operation_id: str) -> OperationRecord | None: ...

    @property
    def _redis(self) -> Any: ...


class RedisOutbox:
    async def owed_completions(self: _Host, limit: int) -> list[str]:
        """Every provider's outbox in every shard, read in one pipeline (a sender asks
        every second)."""
        providers = await self._providers("owed_completions")
        if not providers:
            return []
        shards = self.keys.every_shard()
        pipe = self._redis.pipeline(transaction=False)
        for provider in providers:
            for shard in shards:
                outbox = self.keys.indexes(provider, shard)[5]
                pipe.zrangebyscore(outbox, "-inf", f"({SENT}", 0, limit, withscores=True)
        answers = await self._call("owed_completions", pipe.execute())
        found = tuple(zip(shards * len(providers), answers, strict=True))
        return [raw.decode() for _, raw in oldest(found, limit)]

    async def completion_owed(self: _Host, operation_id: str) -> bool:
        record = await self.get(operation_id)
        if record is None:
            return False
        key = self.keys.indexes(record.provider, self.keys.shard(operation_id))[5]
        score = await self._call("completion_owed", self._redis.zscore(key, operation_id))
        return score is not None and score != float("inf")

    async def completion_sent(self: _Host, operation_id: str) -> None:
        record = await self.get(operation_id)
        if record is not None:
            key = self.keys.indexes(record.provider, self.keys.shard(operation_id))[5]
            marked = self._redis.zadd(key, {operation_id: float("inf")}, xx=True)
            await self._call("completion_sent", marked)
