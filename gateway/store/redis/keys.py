"""The Redis store's agent keys and quota counts (SPEC 25). Keys (layout 2, see layout.py):

    PREFIX:agentkey:{SHA256}        string: the key's JSON, found by its token's digest
    PREFIX:agentkeys                hash: key id -> the key's JSON (the operator's list)
    PREFIX:qactive:{quota:HOLDER}   sorted set: operation id -> claimed at (active places)
    PREFIX:qsubmits:{quota:HOLDER}  sorted set: operation id -> forwarded at (the hour)

A claim is one script (quota.lua) on the holder's two sets, one hash tag, so replicas
never both take the last place. Places whose operations ended are found here, not in the
script (on a cluster the records live in other slots): with max_active_operations set,
the places' records are read first and the free ones (ended, or no record past the hold)
handed to the script, which gives them back, then counts, as every store does. (Reading
them only when the places looked taken let a place freed by time, whose record came later,
count on Redis and not elsewhere: tests/store/test_quota_twins.py found it.)
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.core.keys import ACTIVE_RETRY, HOUR, AgentKey
from gateway.settings.config import Quotas
from gateway.store.redis.layout import Keys, _lua

QUOTA = _lua("quota.lua")


class RedisKeys:
    """The AgentKeys methods of RedisStore, on its client, key names and ``_call``."""

    prefix: str
    keys: Keys
    _redis: Any
    _quota: Any = None  # the registered script, made on first use

    async def _call(self, operation: str, work: Any) -> Any:
        raise NotImplementedError  # RedisStore's

    def _key_name(self, token_sha256: str) -> str:
        return f"{self.prefix}:agentkey:{{{token_sha256}}}"

    def _quota_names(self, holder: str) -> list[str]:
        tag = f"{{quota:{holder}}}"
        return [f"{self.prefix}:qactive:{tag}", f"{self.prefix}:qsubmits:{tag}"]

    async def put_key(self, key: AgentKey) -> None:
        data = orjson.dumps(key.to_dict())
        await self._call("put_key", self._redis.hset(f"{self.prefix}:agentkeys", key.id, data))
        await self._call("put_key", self._redis.set(self._key_name(key.token_sha256), data))

    async def key_for(self, token_sha256: str) -> AgentKey | None:
        raw = await self._call("key_for", self._redis.get(self._key_name(token_sha256)))
        return None if raw is None else AgentKey.from_dict(orjson.loads(raw))

    async def agent_keys(self) -> list[AgentKey]:
        raw = await self._call("agent_keys", self._redis.hvals(f"{self.prefix}:agentkeys"))
        found = [AgentKey.from_dict(orjson.loads(value)) for value in raw]
        return sorted(found, key=lambda k: (k.created_at, k.id))

    async def drop_key(self, key_id: str) -> AgentKey | None:
        listed = f"{self.prefix}:agentkeys"
        raw = await self._call("drop_key", self._redis.hget(listed, key_id))
        if raw is None:
            return None
        key = AgentKey.from_dict(orjson.loads(raw))
        await self._call("drop_key", self._redis.delete(self._key_name(key.token_sha256)))
        await self._call("drop_key", self._redis.hdel(listed, key_id))
        if any(other.holder == key.holder for other in await self.agent_keys()):
            return key  # a rotated key's successor counts on under the same holder
        for name in self._quota_names(key.holder):
            await self._call("drop_key", self._redis.delete(name))
        return key

    async def claim_quota(
        self, holder: str, operation_id: str, quotas: Quotas, now: float, hold: float
    ) -> float:
        if self._quota is None:
            self._quota = self._redis.register_script(QUOTA)
        names = self._quota_names(holder)
        args: list[Any] = [operation_id, repr(now), quotas.max_active_operations or 0]
        args += [quotas.submits_per_hour or 0, HOUR, ACTIVE_RETRY]
        if quotas.max_active_operations is not None:  # freed first, as every store does
            args += await self._free_places(names[0], now - hold)
        return float(await self._call("claim_quota", self._quota(keys=names, args=args)))

    async def _free_places(self, active: str, stale: float) -> list[str]:
        """The places of ``active`` whose operations ended, or that have no record and
        were claimed by ``stale``: read from the records, in one pipeline."""
        places = await self._call("claim_quota", self._redis.zrange(active, 0, -1, withscores=True))
        pipe = self._redis.pipeline(transaction=False)
        for member, _ in places:
            pipe.hget(self.keys.op(member.decode()), "o")
        outcomes = await self._call("claim_quota", pipe.execute()) if places else []
        free = []
        for (member, claimed), outcome in zip(places, outcomes, strict=True):
            if (outcome is None and claimed <= stale) or (
                outcome is not None and outcome != b"pending"
            ):
                free.append(member.decode())
        return free

    async def release_quota(self, holder: str, operation_id: str) -> None:
        active = self._quota_names(holder)[0]
        await self._call("release_quota", self._redis.zrem(active, operation_id))
