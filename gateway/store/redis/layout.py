"""What the Redis store keeps in Redis: every key, and the Lua scripts that write them.

Key layout (every key starts with the prefix; ``{...}`` is the Redis Cluster hash tag, the
part of a key that picks its slot). SHARD is empty on one Redis; on a cluster it is
``{sN}:`` with N = crc32(operation id) mod ``shards``, so an operation's record, its poll
lease and its entries in the per-provider indexes share one slot, and every script that
writes a record touches keys of that one slot:

    PREFIX:op:SHARD{OPERATION_ID}     hash: v (version), d (record JSON), o (outcome)
    PREFIX:job:{SHA1(account, provider, job id)}   string: operation id
    PREFIX:result:{SHA1(account, provider, value)}   string: operation id (a result value)
    PREFIX:idem:{SHA1(scope)}         string: idempotency entry JSON, expires at its retention
    PREFIX:lease:SHARD{NAME}          string: the holder's random token, PX = lease time
                                      (SHARD from the part of NAME after its last colon:
                                      poll:OPERATION_ID shares the operation's slot)
    PREFIX:ops                        sorted set: operation ids by start time (operator list)
    PREFIX:active:SHARDPROVIDER       set: pending operation ids (the active gauge)
    PREFIX:deadlines:SHARDPROVIDER    sorted set: pending operation ids by deadline (overdue)
    PREFIX:ended:SHARDPROVIDER        sorted set: ended operation ids by ended_at (purge)
    PREFIX:open:SHARDPROVIDER         hash: open escalations, operation id -> reason
    PREFIX:queue:SHARDPROVIDER        sorted set: open escalations by escalation time
                                      (the console's queue, oldest first, read a page
                                      at a time)
    PREFIX:outbox:SHARDPROVIDER       sorted set: operation.completed events (SPEC 23),
                                      owed ones by ended_at, sent ones at +inf (kept
                                      so a later write never owes one again)
    PREFIX:providers                  set: providers seen
    PREFIX:pace:{pace:PROVIDER}       sorted set: recent status calls (the pacing window)
    PREFIX:tight:{pace:PROVIDER}      hash: rate, until (the provider asked to slow down)
    PREFIX:schema_version             string: the layout version of these keys (LAYOUT)
    PREFIX:agentkey..., agentkeys, qactive..., qsubmits...   agent keys and quota counts
                                      (layout 2: gateway/store/redis/keys.py)

A key's name is built here and nowhere else (``Keys``); the scripts are composed from the
``.lua`` files in gateway/store/redis/lua/ (shared functions first).
"""

from __future__ import annotations

import hashlib
import json
import zlib
from importlib import resources
from typing import Any

import orjson

from gateway.core.models import OperationRecord

# Tolerance for next_poll_at between a replica's Redis-synced clock and Redis TIME.
SYNC_TOLERANCE = 0.05
LUA = resources.files("gateway.store.redis") / "lua"


def _lua(*names: str) -> str:
    """A script from the .lua files beside this module (shared functions first)."""
    return "\n".join((LUA / name).read_text(encoding="utf-8") for name in names)


CAS = _lua("cas.lua", "cas_write.lua")
CAS_RELEASE = _lua("cas.lua", "cas_release.lua")
CLAIM = _lua("claim.lua")
ACQUIRE = _lua("acquire.lua")
RELEASE = _lua("release.lua")
PACE = _lua("pacing.lua", "pace.lua")
START_POLL = _lua("pacing.lua", "start_poll.lua")
START_RESERVE = _lua("pacing.lua", "cas.lua", "start_reserve.lua")
TIGHTEN = _lua("tighten.lua")
BOUND = _lua("bound.lua")


def tag(*parts: str) -> str:
    return hashlib.sha1("\0".join(parts).encode(), usedforsecurity=False).hexdigest()


class Keys:
    """The names of the store's keys under ``prefix``; on a cluster an operation's keys
    share the hash tag of its shard (crc32 of the id mod ``shards``)."""

    def __init__(self, prefix: str, *, cluster: bool, shards: int) -> None:
        self.prefix = prefix
        self.cluster = cluster
        self.shards = shards if cluster else 1

    def shard(self, operation_id: str) -> str:
        """The hash tag an operation's keys share on a cluster ('' on one Redis)."""
        if not self.cluster:
            return ""
        return f"{{s{zlib.crc32(operation_id.encode()) % self.shards}}}:"

    def every_shard(self) -> list[str]:
        if not self.cluster:
            return [""]
        return [f"{{s{n}}}:" for n in range(self.shards)]

    def op(self, operation_id: str) -> str:
        return f"{self.prefix}:op:{self.shard(operation_id)}{{{operation_id}}}"

    def job(self, account: str, provider: str, job_id: str) -> str:
        return f"{self.prefix}:job:{{{tag(account, provider, job_id)}}}"

    def result(self, account: str, provider: str, value: str) -> str:
        return f"{self.prefix}:result:{{{tag(account, provider, value)}}}"

    def idem(self, key: str) -> str:
        return f"{self.prefix}:idem:{{{tag(key)}}}"

    def lease(self, name: str) -> str:
        shard = self.shard(name.rsplit(":", 1)[-1])
        return f"{self.prefix}:lease:{shard}{{{name}}}"

    def indexes(self, provider: str, shard: str) -> list[str]:
        """The provider's active set, deadlines and ended sorted sets, open-escalations
        hash, escalation queue and completion outbox in one shard, in CAS's KEYS order."""
        kinds = ("active", "deadlines", "ended", "open", "queue", "outbox")
        return [f"{self.prefix}:{kind}:{shard}{provider}" for kind in kinds]

    def cas(
        self, record: OperationRecord
    ) -> tuple[list[str], list[str | int | float], OperationRecord]:
        """The KEYS and ARGV of the CAS script for writing ``record``, and the record as it
        is stored when the write goes through."""
        written = record.evolve(version=record.version + 1)
        data = orjson.dumps(written.to_dict()).decode()
        shard = self.shard(record.operation_id)
        keys = [self.op(record.operation_id), *self.indexes(record.provider, shard)]
        ended = "" if record.ended_at is None else repr(record.ended_at)
        args: list[str | int | float] = [record.version, data, SYNC_TOLERANCE]
        args += [record.operation_id, repr(record.deadline_at), ended]
        return keys, args, written

    def pace(self, provider: str) -> tuple[str, str]:
        """The provider's pacing window and tightening, in a slot of their own."""
        hashed = f"{{pace:{provider}}}"
        return f"{self.prefix}:pace:{hashed}", f"{self.prefix}:tight:{hashed}"


def oldest(found: tuple[tuple[str, Any], ...], limit: int) -> list[tuple[str, bytes]]:
    """The ``limit`` lowest-scored (shard, id) of per-shard ZRANGEBYSCORE WITHSCORES answers,
    in score order (then id): one sorted set's order, across shards."""
    entries = sorted((score, raw, shard) for shard, rows in found for raw, score in rows)
    return [(shard, raw) for _, raw, shard in entries[:limit]]


def record_fields(record: OperationRecord) -> list[str | int]:
    data = json.dumps(record.to_dict(), separators=(",", ":"))
    return ["v", record.version, "d", data, "o", record.outcome.value]


def millis(instant: float) -> int:
    return max(1, int(instant * 1000))
