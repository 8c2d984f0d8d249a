"""``redis://host:port/db?prefix=NAME``: one store shared by several gateway replicas;
``redis+cluster://host:port,host:port/?prefix=NAME&shards=64``: the same on a Redis Cluster.

The keys and the Lua scripts are described in gateway/store/redis/layout.py.

Every record write is one Lua script: a compare-and-set on ``v`` that, when the write spends
a status request, also checks outcome, deadline, budget and next_poll_at against Redis
``TIME``, the one clock all replicas share, and keeps the provider's active, deadlines and
ended sets in step with the record in the same atomic step. Readers of an index (the deadline
sweeper, purge, gauges) read it from every shard in one pipeline. On a cluster the pacing
window lives in the provider's slot, apart from the operation's, so a poll's lease, pacing
and reservation are three steps there instead of one script (four round trips a forwarded
poll instead of three); ``TIME`` is each primary's own, so the primaries' clocks must be
synchronized (NTP) to within SYNC_TOLERANCE. The gateway's own
clock for a Redis store is Redis time too (an offset refreshed in the background), so
replicas' clock skew never opens a gap. Scripts are registered, so a Redis restart
(NOSCRIPT) reloads them. Redis errors become StoreError after at most one quick retry: the
gateway fails closed within a second.

On one Redis the hot path (a poll's scripts, its writes' WAIT and the batched record reads)
goes through turns.Turns: one pipeline per loop turn on a connection of its own, so
many polls in flight cost one round trip and no wait for a pooled connection. Everything
else, and everything on a cluster (where a pipeline splits by node), uses the pool.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable
from typing import Any, ClassVar

import orjson

from gateway import NotAdmissible, StoreError
from gateway.core.models import IdempotencyEntry, OperationFilter, OperationRecord, Outcome
from gateway.core.pacing import GUARD, MIN_WAIT
from gateway.store.base import (
    PURGE_BATCH,
    Ids,
    Mutation,
    NewerLayout,
    Queue,
    Store,
    T,
    matches,
    newer_layout,
    owes,
    purgeable,
)
from gateway.store.redis import layout as lua
from gateway.store.redis.clients import call, cluster_client, single_clients
from gateway.store.redis.keys import RedisKeys
from gateway.store.redis.layout import Keys, millis, oldest, record_fields
from gateway.store.redis.outbox import RedisOutbox
from gateway.store.redis.turns import Turns
from gateway.store.redis.wire import Command
from gateway.store.shared import Batch, Copies, SharedClock

# the key layout above; version 0 is the previous release's, without its key; version 2
# added the agent keys and quota counts (redis/keys.py), nothing else changed
LAYOUT = 2


SCAN_PAGE = 500
JOB_IDS = 100_000  # job -> operation id mappings kept per process
Position = tuple[float, str]  # (started_at, operation_id): a place in list order


class RedisStore(RedisKeys, RedisOutbox, Store):
    shared: ClassVar[bool] = True

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "statusgate",
        max_connections: int = 50,
        timeout: float = 0.3,
        wait_replicas: int = 0,
        cluster: list[tuple[str, int]] | None = None,
        shards: int = 64,
    ) -> None:
        """``url`` names one Redis; ``cluster`` instead, the (host, port) of one or more
        cluster nodes to discover the rest from, with operations spread over ``shards``
        hash tags."""
        self.prefix = prefix
        self.keys = Keys(prefix, cluster=cluster is not None, shards=shards)
        self._wait_replicas = wait_replicas
        self._timeout = timeout
        self._cluster = cluster is not None
        self._shards = shards if cluster is not None else 1
        self._redis: Any
        self._turns: Turns | None = None  # the hot path's pipelines, on one Redis
        if cluster is not None:
            self._redis = cluster_client(cluster, max_connections, timeout)
        else:
            self._redis, own = single_clients(url, max_connections, timeout)
            self._turns = Turns(own)
        self._cas = self._redis.register_script(lua.CAS)
        self._claim = self._redis.register_script(lua.CLAIM)
        self._acquire = self._redis.register_script(lua.ACQUIRE)
        self._release = self._redis.register_script(lua.RELEASE)
        self._pace = self._redis.register_script(lua.PACE)
        self._start_poll = self._redis.register_script(lua.START_POLL)
        self._start_reserve = self._redis.register_script(lua.START_RESERVE)
        self._cas_release = self._redis.register_script(lua.CAS_RELEASE)
        self._tighten = self._redis.register_script(lua.TIGHTEN)
        self._bound = self._redis.register_script(lua.BOUND)
        if self._turns is not None:
            for script in (self._cas, self._start_poll, self._start_reserve, self._cas_release):
                sha = self._turns.script(script.script)  # known for reloading after NOSCRIPT
                assert sha == script.sha  # the sha _script sends
        self._clock = SharedClock(self._redis_time)
        self._job_ids: dict[tuple[str, str, str], str] = {}  # job -> operation id, bounded
        self._reads: Batch[str, OperationRecord | StoreError] = Batch(self._fetch)
        self._copies = Copies()  # pending records as last written or read here (``known``)
        self._queues_filled: set[str] = set()  # providers whose queue sets were backfilled

    async def _each_shard(self, operation: str, command: Any) -> tuple[tuple[str, Any], ...]:
        """``command(pipe, shard)`` for every shard, in one pipeline: (shard, answer)."""
        shards = self.keys.every_shard()
        pipe = self._redis.pipeline(transaction=False)
        for shard in shards:
            command(pipe, shard)
        return tuple(zip(shards, await self._call(operation, pipe.execute()), strict=True))

    # -- plumbing -----------------------------------------------------------------------
    async def _call(self, operation: str, work: Any) -> Any:
        """Await one driver call; every failure of the driver becomes StoreError (call)."""
        return await call(operation, work)

    def clock(self) -> float:
        """Redis time as seen from here (shared.SharedClock)."""
        return self._clock.now()

    async def _redis_time(self) -> float:
        seconds, micros = await self._call("time", self._redis.time())
        return float(seconds) + float(micros) / 1e6

    async def open(self) -> None:
        """Check (and record) the keys' layout, then keep the clock synced. An unreachable
        Redis is no reason not to start (the gateway fails closed until it answers); a
        layout newer than this code is."""
        try:
            await self.migrate()
        except NewerLayout:
            raise
        except StoreError:
            pass
        await self._clock.start()

    async def migrate(self) -> tuple[int | None, int]:
        """The keys' layout: (found, now). Found None when no key has this prefix yet, 0
        for the previous release's keys (the same layout, no version key); both are
        recorded as LAYOUT. A newer layout is refused, both versions named."""
        key = f"{self.prefix}:schema_version"
        raw = await self._call("migrate", self._redis.get(key))
        found: int | None = None if raw is None else int(raw)
        if found is None:
            for mark in (f"{self.prefix}:ops", f"{self.prefix}:providers"):  # one slot each
                if await self._call("migrate", self._redis.exists(mark)):
                    found = 0
        if found is not None and found > LAYOUT:
            raise newer_layout("redis", found, LAYOUT)
        if found != LAYOUT:
            await self._call("migrate", self._redis.set(key, LAYOUT))
        return found, LAYOUT

    async def close(self) -> None:
        await self._clock.close()
        if self._turns is not None:
            await self._turns.aclose()
        await self._redis.aclose()

    # -- operations ---------------------------------------------------------------------
    async def create(
        self, record: OperationRecord, idempotency: IdempotencyEntry | None = None
    ) -> OperationRecord:
        job = self.keys.job(record.account, record.provider, record.provider_job_id)
        claimed = await self._call("create", self._redis.set(job, record.operation_id, nx=True))
        if not claimed:
            existing_id = await self._call("create", self._redis.get(job))
            existing = await self.get(existing_id.decode()) if existing_id else None
            if existing is not None:
                return existing
            await self._call("create", self._redis.set(job, record.operation_id))
        pipe = self._redis.pipeline(transaction=False)
        pipe.hset(self.keys.op(record.operation_id), items=record_fields(record))
        pipe.zadd(f"{self.prefix}:ops", {record.operation_id: record.started_at})
        pipe.sadd(f"{self.prefix}:providers", record.provider)
        self._index(pipe, record)
        for command in self._result_sets(record):
            pipe.execute_command(*command)
        if idempotency is not None:
            self._put_idem(pipe, idempotency)
        waited = self._wait_replicas > 0 and not self._cluster
        if waited:  # WAIT answers for its own connection's writes: this pipeline's
            pipe.wait(self._wait_replicas, self._wait_millis)
        answers = await self._call("create", pipe.execute())
        self._job_id((record.account, record.provider, record.provider_job_id), record.operation_id)
        self._copy(record)
        await self._replicated("create", answers[-1] if waited else None)
        return record

    def _index(self, pipe: Any, record: OperationRecord) -> None:
        """What the CAS script does to the provider's sets, for a record created whole."""
        operation_id = record.operation_id
        shard = self.keys.shard(operation_id)
        active, deadlines, ended, escalated, queue, outbox = self.keys.indexes(
            record.provider, shard
        )
        if owes(record):
            pipe.zadd(outbox, {operation_id: record.ended_at or 0.0}, nx=True)
        if record.outcome is Outcome.PENDING:
            pipe.sadd(active, operation_id)
            pipe.zadd(deadlines, {operation_id: record.deadline_at})
        elif record.ended_at is not None:
            pipe.zadd(ended, {operation_id: record.ended_at})
        if record.outcome is Outcome.ESCALATED and record.escalation is not None:
            pipe.hset(escalated, operation_id, record.escalation.reason.value)
            pipe.zadd(queue, {operation_id: record.escalation.at})

    def _result_sets(self, record: OperationRecord) -> list[Command]:
        """The record's result values -> its id. Written before the record (on a cluster
        they live in other slots than the record, so no script can write both): an entry
        whose record write then lost its compare-and-set is harmless, as ``find_result``
        checks the record it leads to."""
        keys = (self.keys.result(record.account, record.provider, v) for v in record.result_values)
        return [("SET", key, record.operation_id) for key in keys]

    async def _script(
        self, operation: str, script: Any, keys: list[str], args: Any, *before: Command
    ) -> Any:
        """A script's answer, after ``before`` (commands of the same caller, sent first):
        on one Redis in this turn's pipeline (Turns), on a cluster from the pool."""
        return (await self._writing(operation, script, keys, args, *before))[0]

    async def _writing(
        self, operation: str, script: Any, keys: list[str], args: Any, *before: Command
    ) -> tuple[Any, Any]:
        """A writing script's answer, and with ``wait_replicas`` on one Redis the answer of
        the WAIT sent in the same pipeline, on the same connection, after it (None
        otherwise: ``_replicated`` then asks): a WAIT sent in a later pipeline could go on
        a connection opened again meanwhile (a failover that moved the address), whose
        WAIT acknowledges nothing of this write."""
        if self._turns is not None:
            command = Turns.evalsha(script.sha, keys, args)
            if self._wait_replicas <= 0:
                answers = await self._call(operation, self._turns.call(*before, command))
                return answers[-1], None
            wait: Command = ("WAIT", self._wait_replicas, self._wait_millis)
            answers = await self._call(operation, self._turns.call(*before, command, wait))
            return answers[-2], answers[-1]
        if before:
            pipe = self._redis.pipeline(transaction=False)
            for command in before:
                pipe.execute_command(*command)
            await self._call(operation, pipe.execute())
        return await self._call(operation, script(keys=keys, args=args)), None

    async def find_result(self, account: str, provider: str, value: str) -> OperationRecord | None:
        key = self.keys.result(account, provider, value)
        operation_id = await self._call("find_result", self._redis.get(key))
        record = None if operation_id is None else await self.get(operation_id.decode())
        if record is None or record.account != account or record.provider != provider:
            return None
        return record if value in record.result_values else None

    async def get(self, operation_id: str) -> OperationRecord | None:
        """Reads in one loop turn share one round trip (base.Batch): many agents polling
        at once, the gateway's whole reason to exist, cost a round trip a turn."""
        found = await self._reads.ask(self.keys.op(operation_id))
        if isinstance(found, StoreError):
            raise found
        return found

    async def _fetch(self, keys: list[str]) -> dict[str, OperationRecord | StoreError]:
        """The records of ``keys``: on one Redis in this turn's pipeline (Turns); on a
        cluster one command for one, else one pipeline. A record that cannot be read fails
        its own callers only."""
        if self._turns is not None:
            reads = (("HGET", key, "d") for key in keys)
            rows = await self._call("get", self._turns.call(*reads))
        elif len(keys) == 1:
            rows = [await self._call("get", self._redis.hget(keys[0], "d"))]
        else:
            pipe = self._redis.pipeline(transaction=False)
            for key in keys:
                pipe.hget(key, "d")
            rows = await self._call("get", pipe.execute())
        found: dict[str, OperationRecord | StoreError] = {}
        for key, row in zip(keys, rows, strict=True):
            if row is None:
                continue
            try:
                record = OperationRecord.from_dict(orjson.loads(row))
            except Exception as exc:
                problem = StoreError(f"redis get: {key} holds no readable record", operation="get")
                problem.__cause__ = exc
                found[key] = problem
                continue
            self._copy(record)
            found[key] = record
        return found

    async def find(self, account: str, provider: str, job_id: str) -> OperationRecord | None:
        """One round trip for a job this process has seen: which operation a job is never
        changes, so that mapping is kept here (bounded); a purged one is looked up again."""
        job = (account, provider, job_id)
        known = self._job_ids.get(job)
        if known is not None:
            record = await self.get(known)
            if record is not None:
                return record
            self._job_ids.pop(job, None)
        operation_id = await self._call(
            "find", self._redis.get(self.keys.job(account, provider, job_id))
        )
        if operation_id is None:
            return None
        record = await self.get(operation_id.decode())
        if record is not None:
            self._job_id(job, record.operation_id)
        return record

    def _job_id(self, job: tuple[str, str, str], operation_id: str) -> None:
        if len(self._job_ids) >= JOB_IDS:
            self._job_ids.pop(next(iter(self._job_ids)))
        self._job_ids[job] = operation_id

    def _copy(self, record: OperationRecord) -> None:
        """Keep ``record`` as this process's copy (shared.Copies), but not on a cluster:
        there a poll's steps are apart, so a copy would save nothing."""
        if not self._cluster:
            self._copies.keep(record)

    def _forget(self, operation_id: str) -> None:
        self._copies.forget(operation_id)

    def known(self, account: str, provider: str, job_id: str) -> OperationRecord | None:
        """The record as this process last wrote or read it, without a round trip."""
        return self._copies.known(account, provider, job_id)

    async def save(self, record: OperationRecord) -> bool:
        keys, args, written = self.keys.cas(record)
        result, acked = await self._writing(
            "save", self._cas, keys, args, *self._result_sets(record)
        )
        if result == -2:
            raise NotAdmissible("by Redis time this status request is not permitted now")
        if result != 1:
            return False
        self._copy(written)
        await self._replicated("save", acked)
        return True

    @property
    def _wait_millis(self) -> int:
        return max(1, int(self._timeout * 500))  # half the socket timeout: WAIT answers first

    async def _replicated(self, operation: str, acked: Any = None) -> None:
        """With ``wait_replicas`` set, a write counts only once that many replicas have it,
        so a failover cannot forget a spent status request. WAIT answers for the writes of
        the connection it is sent on: on one Redis it goes in the write's own pipeline
        (``acked``: that WAIT's answer; see ``_writing``), else after the write on the Turns
        connection."""
        if self._wait_replicas <= 0:
            return
        if acked is None and self._turns is not None:
            wait: Command = ("WAIT", self._wait_replicas, self._wait_millis)
            [acked] = await self._call(operation, self._turns.call(wait))
        elif acked is None:
            wait_on = self._redis.wait(self._wait_replicas, self._wait_millis)
            acked = await self._call(operation, wait_on)
        if int(acked) < self._wait_replicas:
            raise StoreError(
                f"redis {operation}: {acked} of {self._wait_replicas} replicas acknowledged",
                operation=operation,
            )

    async def _page(self, operation: str, before: Position | None) -> list[Position]:
        """Up to SCAN_PAGE (start time, id) entries of the ops set strictly before
        ``before`` in list order: newest first, equal start times by id descending (as
        ZREVRANGEBYSCORE orders them). Positions are entries, not offsets, so inserts and
        purges between pages neither repeat nor skip an operation."""
        ops = f"{self.prefix}:ops"
        top = "+inf" if before is None else repr(before[0])
        skipped = 0
        while True:
            rows = await self._call(
                operation,
                self._redis.zrevrangebyscore(
                    ops, top, "-inf", start=skipped, num=SCAN_PAGE, withscores=True
                ),
            )
            entries = [(float(score), member.decode()) for member, score in rows]
            kept = [e for e in entries if before is None or e < before]
            if kept or len(rows) < SCAN_PAGE:
                return kept
            skipped += len(rows)  # a full page of ties at the position's own start time

    async def _records(self, operation: str, ids: list[bytes]) -> list[OperationRecord | None]:
        read = self._redis.pipeline(transaction=False)
        for operation_id in ids:
            read.hget(self.keys.op(operation_id.decode()), "d")
        rows = await self._call(operation, read.execute())
        return [None if d is None else OperationRecord.from_dict(json.loads(d)) for d in rows]

    async def list(self, where: OperationFilter) -> list[OperationRecord]:
        found: list[OperationRecord] = []
        position = where.before
        while len(found) < where.limit:
            entries = await self._page("list", position)
            if not entries:
                break
            ids = [operation_id.encode() for _, operation_id in entries]
            records = await self._records("list", ids)
            found.extend(r for r in records if r is not None and matches(r, where))
            position = entries[-1]
        return found[: where.limit]

    async def purge(self, provider: str, ended_before: float, now: float) -> int:
        """From the provider's ended sets, oldest first within each shard; idempotency keys
        expire by themselves."""
        found = await self._each_shard(
            "purge",
            lambda pipe, shard: pipe.zrangebyscore(
                self.keys.indexes(provider, shard)[2],
                "-inf",
                f"({ended_before!r}",
                0,
                PURGE_BATCH,
                withscores=True,
            ),
        )
        batch = oldest(found, PURGE_BATCH)
        if not batch:
            return 0
        gone = 0
        delete = self._redis.pipeline(transaction=False)
        records = await self._records("purge", [raw for _, raw in batch])
        scores = self._redis.pipeline(transaction=False)
        for shard, raw in batch:
            scores.zscore(self.keys.indexes(provider, shard)[5], raw)
        owed = await self._call("purge", scores.execute())
        for (shard, raw), record, score in zip(batch, records, owed, strict=True):
            if record is not None and not purgeable(record, provider, ended_before):
                continue  # waiting again: the CAS script took it out of the ended set
            if record is not None and score is not None and float(score) != float("inf"):
                continue  # its completion event is still owed: kept for the sender (SPEC 23)
            active, deadlines, ended, escalated, queue, outbox = self.keys.indexes(provider, shard)
            delete.zrem(ended, raw)
            delete.zrem(outbox, raw)  # before the check: a record deleted already owes nothing
            if record is None:
                continue  # deleted already
            self._forget(record.operation_id)
            delete.delete(self.keys.op(record.operation_id))
            delete.delete(self.keys.job(record.account, record.provider, record.provider_job_id))
            for value in record.result_values:
                delete.delete(self.keys.result(record.account, record.provider, value))
            delete.zrem(f"{self.prefix}:ops", raw)
            delete.srem(active, raw)
            delete.zrem(deadlines, raw)
            delete.hdel(escalated, raw)
            delete.zrem(queue, raw)
            gone += 1
        await self._call("purge", delete.execute())
        return gone

    async def overdue(self, provider: str, now: float, limit: int) -> Ids:
        """From the provider's deadlines sets; ids whose record is gone leave them here."""
        found = await self._each_shard(
            "overdue",
            lambda pipe, shard: pipe.zrangebyscore(
                self.keys.indexes(provider, shard)[1], "-inf", now, 0, limit, withscores=True
            ),
        )
        batch = oldest(found, limit)
        if not batch:
            return []
        read = self._redis.pipeline(transaction=False)
        for _, operation_id in batch:
            read.hget(self.keys.op(operation_id.decode()), "o")
        outcomes = await self._call("overdue", read.execute())
        missing = [item for item, outcome in zip(batch, outcomes, strict=True) if outcome is None]
        if missing:
            drop = self._redis.pipeline(transaction=False)
            for shard, raw in missing:
                drop.zrem(self.keys.indexes(provider, shard)[1], raw)
            await self._call("overdue", drop.execute())
        pending = Outcome.PENDING.value.encode()
        return [raw.decode() for (_, raw), o in zip(batch, outcomes, strict=True) if o == pending]

    async def _providers(self, operation: str) -> tuple[str, ...]:
        providers = await self._call(operation, self._redis.smembers(f"{self.prefix}:providers"))
        return tuple(sorted(raw.decode() for raw in providers))

    async def open_escalations(self) -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for provider in await self._providers("open_escalations"):
            found = await self._each_shard(
                "open_escalations",
                lambda pipe, shard, p=provider: pipe.hvals(self.keys.indexes(p, shard)[3]),
            )
            for _, reasons in found:
                for reason in reasons:
                    pair = (provider, reason.decode())
                    counts[pair] = counts.get(pair, 0) + 1
        return counts

    async def escalation_queue(self, limit: int) -> Queue:
        """The ``limit`` oldest open escalations from each provider's queue sets (one page
        read per shard, then only those records), and how many are open in all."""
        heads: list[tuple[float, bytes]] = []
        total = 0
        for provider in await self._providers("escalation_queue"):
            await self._fill_queue(provider)
            read = self._redis.pipeline(transaction=False)
            for shard in self.keys.every_shard():
                queue = self.keys.indexes(provider, shard)[4]
                read.zrange(queue, 0, limit - 1, withscores=True)
                read.zcard(queue)
            answers = await self._call("escalation_queue", read.execute())
            for page, count in zip(answers[::2], answers[1::2], strict=True):
                heads += [(score, raw) for raw, score in page]
                total += int(count)
        heads.sort()
        records = await self._records("escalation_queue", [raw for _, raw in heads[:limit]])
        waiting = [r for r in records if r is not None and r.outcome is Outcome.ESCALATED]
        return waiting, total

    async def _fill_queue(self, provider: str) -> None:
        """Once per provider and process: escalations written before the queue sets existed
        (an upgrade) are added to them from the open-escalations hash."""
        if provider in self._queues_filled:
            return
        read = self._redis.pipeline(transaction=False)
        for shard in self.keys.every_shard():
            read.hkeys(self.keys.indexes(provider, shard)[3])
            read.zcard(self.keys.indexes(provider, shard)[4])
        answers = await self._call("escalation_queue", read.execute())
        for shard, ids, queued in zip(
            self.keys.every_shard(), answers[::2], answers[1::2], strict=True
        ):
            if len(ids) == int(queued):
                continue
            add = self._redis.pipeline(transaction=False)
            for record in await self._records("escalation_queue", list(ids)):
                if record is not None and record.escalation is not None:
                    at = {record.operation_id: record.escalation.at}
                    add.zadd(self.keys.indexes(provider, shard)[4], at, nx=True)
            await self._call("escalation_queue", add.execute())
        self._queues_filled.add(provider)

    async def active_counts(self) -> dict[str, int]:
        counts = {}
        for provider in await self._providers("active_counts"):
            found = await self._each_shard(
                "active_counts",
                lambda pipe, shard, p=provider: pipe.scard(self.keys.indexes(p, shard)[0]),
            )
            counts[provider] = sum(int(n) for _, n in found)
        return counts

    # -- idempotency --------------------------------------------------------------------
    async def claim_idempotency(
        self, entry: IdempotencyEntry, now: float
    ) -> IdempotencyEntry | None:
        data = json.dumps(entry.to_dict(), separators=(",", ":"))
        seen = await self._call(
            "claim_idempotency",
            self._claim(keys=[self.keys.idem(entry.key)], args=[data, millis(entry.expires_at)]),
        )
        return None if seen is None else IdempotencyEntry.from_dict(json.loads(seen))

    def _put_idem(self, pipe: Any, entry: IdempotencyEntry) -> None:
        data = json.dumps(entry.to_dict(), separators=(",", ":"))
        pipe.set(self.keys.idem(entry.key), data, pxat=millis(entry.expires_at))

    async def put_idempotency(self, entry: IdempotencyEntry) -> None:
        pipe = self._redis.pipeline(transaction=False)
        self._put_idem(pipe, entry)
        await self._call("put_idempotency", pipe.execute())

    async def drop_idempotency(self, key: str) -> None:
        await self._call("drop_idempotency", self._redis.delete(self.keys.idem(key)))

    # -- leases -------------------------------------------------------------------------
    async def acquire_lease(self, name: str, token: str, now: float, ttl: float) -> bool:
        """Expiry runs on Redis time; ``now`` is not needed here."""
        args: list[str | int] = [token, max(1, int(ttl * 1000))]
        held = await self._call(
            "acquire_lease", self._acquire(keys=[self.keys.lease(name)], args=args)
        )
        return bool(held)

    async def start_poll(
        self, lease: str, token: str, now: float, ttl: float, provider: str, rate: float | None
    ) -> float | None:
        """Lease and pacing window in one script (Redis time throughout); on a cluster,
        where the two live in different slots, one after the other."""
        if self._cluster:
            return await super().start_poll(lease, token, now, ttl, provider, rate)
        member = f"{time.time()}:{secrets.token_hex(4)}"
        keys = [self.keys.lease(lease), *self.keys.pace(provider)]
        args = (token, max(1, int(ttl * 1000)), rate or 0.0, GUARD, member, MIN_WAIT)
        wait = float(await self._script("acquire_lease", self._start_poll, keys, args))
        return None if wait < 0 else wait

    async def start_and_reserve(
        self,
        lease: str,
        token: str,
        now: float,
        ttl: float,
        provider: str,
        rate: float | None,
        reserve: OperationRecord,
    ) -> tuple[float | None, bool, OperationRecord | None]:
        """Lease, pacing window and the reservation in one script, which hands back the
        stored record when ``reserve`` was computed from an older one; on a cluster, the
        three steps of the base store."""
        if self._cluster:
            return await super().start_and_reserve(lease, token, now, ttl, provider, rate, reserve)
        member = f"{time.time()}:{secrets.token_hex(4)}"
        cas_keys, cas_args, stored = self.keys.cas(reserve)
        keys = [self.keys.lease(lease), *self.keys.pace(provider), *cas_keys]
        args = [token, max(1, int(ttl * 1000)), rate or 0.0, GUARD, member, MIN_WAIT, *cas_args]
        (raw_wait, written, *current), acked = await self._writing(
            "acquire_lease", self._start_reserve, keys, args
        )
        wait = float(raw_wait)
        if wait < 0:
            return None, False, None
        if int(written) == -2:
            raise NotAdmissible("by Redis time this status request is not permitted now")
        if int(written) != 1:
            moved = OperationRecord.from_dict(orjson.loads(current[0])) if current else None
            if moved is not None:
                self._copy(moved)
            else:
                self._forget(reserve.operation_id)  # gone
            return wait, False, moved
        self._copy(stored)
        await self._replicated("save", acked)
        return wait, True, None

    async def finish_poll(
        self,
        operation_id: str,
        change: Mutation[T],
        *,
        known: OperationRecord,
        lease: str,
        token: str,
        durable: Callable[[T], bool] | None = None,
    ) -> T:
        """The write computed from ``known`` and the lease release in one script; when
        ``known`` was not current, the usual compare-and-set loop, then the release."""
        new, result = change(known)
        if new is not None and self.keys.lease(lease).startswith(
            f"{self.prefix}:lease:{self.keys.shard(operation_id)}"
        ):  # the lease shares the record's slot (always, on one Redis)
            keys, args, stored = self.keys.cas(new)
            keys.append(self.keys.lease(lease))
            args.append(token)
            written, acked = await self._writing(
                "save", self._cas_release, keys, args, *self._result_sets(new)
            )
            if written == 1:
                self._copy(stored)
                await self._replicated("save", acked)
                return result
        return await super().finish_poll(
            operation_id, change, known=known, lease=lease, token=token, durable=durable
        )

    async def release_lease(self, name: str, token: str) -> None:
        await self._call("release_lease", self._release(keys=[self.keys.lease(name)], args=[token]))

    # -- pacing -------------------------------------------------------------------------
    async def pace(self, provider: str, rate: float | None, now: float) -> float:
        """The shared sliding window of pacing.py, on Redis time, for all replicas."""
        member = f"{time.time()}:{secrets.token_hex(4)}"
        args = (rate or 0.0, GUARD, member, MIN_WAIT)
        wait = await self._call("pace", self._pace(keys=self.keys.pace(provider), args=args))
        return max(0.0, float(wait))

    async def tighten(self, provider: str, rate: float, until: float) -> None:
        keys = self.keys.pace(provider)[1:]
        await self._call("tighten", self._tighten(keys=keys, args=(rate, until)))

    async def bound_pause(self, provider: str, latest: float) -> None:
        keys = self.keys.pace(provider)[1:]
        await self._call("tighten", self._bound(keys=keys, args=(latest,)))

    async def ping(self) -> None:
        await self._call("ping", self._redis.ping())
