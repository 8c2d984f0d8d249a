"""The one small interface every store implements, and the logic they share.

Two parts, as ``limits`` splits its storage: ``Records`` keeps operation records
(compare-and-set on ``version``) and idempotency entries (first writer wins, with an expiry);
``Coordination`` keeps leases (one holder per name until expiry), the providers' pacing
windows and tightening, and the clock. ``Store`` is both, plus a poll's two steps. It
never decides anything about polling: callers pass pure functions to ``mutate``. Backends
translate their driver errors into StoreError; nothing above this layer sees a driver type.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import heapq
import random
import secrets
import time
from collections.abc import Callable
from typing import ClassVar, TypeVar

from gateway import StoreError
from gateway.core.keys import AgentKey
from gateway.core.models import IdempotencyEntry, OperationFilter, OperationRecord, Outcome
from gateway.core.pacing import Pacer
from gateway.settings.config import Quotas
from gateway.store.auditlines import AuditLines

T = TypeVar("T")
Ids = list[str]  # operation ids
Queue = tuple[list[OperationRecord], int]  # the oldest open escalations, and how many
Mutation = Callable[[OperationRecord], tuple[OperationRecord | None, T]]
CAS_ATTEMPTS = 100


class Records(abc.ABC):
    """Operation records and idempotency entries: what a store keeps durably."""

    # -- operations ---------------------------------------------------------------------
    @abc.abstractmethod
    async def create(
        self, record: OperationRecord, idempotency: IdempotencyEntry | None = None
    ) -> OperationRecord:
        """Insert ``record`` (and store ``idempotency`` in the same write).

        If the account already has an operation for this provider job, nothing is written
        and that operation is returned instead.
        """

    @abc.abstractmethod
    async def get(self, operation_id: str) -> OperationRecord | None: ...

    @abc.abstractmethod
    async def find(self, account: str, provider: str, job_id: str) -> OperationRecord | None: ...

    async def find_result(self, account: str, provider: str, value: str) -> OperationRecord | None:
        """The ``account``'s operation of ``provider`` whose stored record lists ``value`` in
        ``result_values`` (SPEC 20: a result addressed by its own value), or None.

        The contract: a record's ``result_values`` are findable once a write of that record
        returned, for as long as the record is kept (``purge`` forgets them with it); a value
        is never found for another account or provider; when two operations list one value,
        either may be returned. Backends keep an index written with the record (or before
        it, checked here against the record); this default pages through ``list``, right
        for any backend and slow for a large one."""
        where = OperationFilter(provider=provider, account=account)
        while True:
            page = await self.list(where)
            for record in page:
                if value in record.result_values:
                    return record
            if len(page) < where.limit:
                return None
            where = dataclasses.replace(where, before=listed_at(page[-1]))

    def known(self, account: str, provider: str, job_id: str) -> OperationRecord | None:
        """The record as this process last wrote or read it, without any I/O, or None; it
        may be older than the stored one, so a caller may act on it only through a
        compare-and-set (a reservation), never refuse or answer from it. Stores whose
        ``find`` is local already (memory, SQLite's cache) keep nothing more here."""
        return None

    @abc.abstractmethod
    async def save(self, record: OperationRecord) -> bool:
        """Write ``record`` as version ``record.version + 1`` if the stored version is still
        ``record.version``; False (and nothing written) if another writer came first."""

    @abc.abstractmethod
    async def list(self, where: OperationFilter) -> list[OperationRecord]:
        """Records matching ``where``, newest first by (started_at, operation_id), at most
        ``where.limit``, only those strictly before ``where.before`` when it is set."""

    @abc.abstractmethod
    async def purge(self, provider: str, ended_before: float, now: float) -> int:
        """Delete ``provider``'s records that stopped waiting before ``ended_before``, and
        idempotency entries expired by ``now``; how many records went (a bounded batch).

        Ended records are found by an index of their own: pending ones, however many, never
        stand in the way."""

    @abc.abstractmethod
    async def overdue(self, provider: str, now: float, limit: int) -> Ids:
        """Ids of ``provider``'s pending operations whose deadline came by ``now``, earliest
        deadline first, at most ``limit``: an indexed read, whatever the store holds."""

    @abc.abstractmethod
    async def open_escalations(self) -> dict[tuple[str, str], int]:
        """Escalated operations waiting on a person, per (provider, reason), across
        everything the store holds (right across replicas and restarts)."""

    async def escalation_queue(self, limit: int) -> Queue:
        """The ``limit`` open escalations waiting longest (oldest escalation first, ties by
        operation id) and how many are open in all: the console's queue.

        This default pages through every escalated record (the memory store's tests hold
        a few); SQLite and Redis read an index and only the records they return."""
        found: list[OperationRecord] = []
        where = OperationFilter(outcome=Outcome.ESCALATED, limit=1000)
        while True:
            page = await self.list(where)
            found += page
            if len(page) < where.limit:
                break
            where = dataclasses.replace(where, before=listed_at(page[-1]))
        return heapq.nsmallest(limit, found, key=queued_at), len(found)

    @abc.abstractmethod
    async def active_counts(self) -> dict[str, int]:
        """Pending operations per provider, across everything the store holds."""

    async def mutate(
        self, operation_id: str, change: Mutation[T], *, known: OperationRecord | None = None
    ) -> T:
        """Read-modify-write one record; ``change`` may run again if another writer won.

        ``change`` returns (new record or None for no write, result); the new record keeps
        the version it was derived from. ``known`` is the caller's best guess of the stored
        record: a write computed from it is tried first (the compare-and-set proves it was
        current), saving a read. Backends that can do this in one transaction override it;
        the default is a compare-and-set loop.
        """
        if known is not None:
            new, result = change(known)
            if new is not None and await self.save(new):
                return result
        for attempt in range(CAS_ATTEMPTS):
            current = await self.get(operation_id)
            if current is None:
                raise StoreError(f"{operation_id} vanished from the store", operation="mutate")
            new, result = change(current)
            if new is None or await self.save(new):
                return result
            # lost a race: back off a little, with jitter, so contenders spread out
            await asyncio.sleep(random.uniform(0, 0.001 * min(attempt + 1, 20)))
        raise StoreError(f"{operation_id}: too many concurrent writers", operation="mutate")

    # -- the completion outbox (SPEC 23) ---------------------------------------------------
    @abc.abstractmethod
    async def owed_completions(self, limit: int) -> Ids:
        """Ids of operations whose ``operation.completed`` event is owed and not marked
        sent, the earliest ended first, at most ``limit``, across everything the store holds.

        The contract: the write that stores a record with a terminal outcome and
        ``announce`` set makes its entry, in that same write (a crash leaves both or
        neither); an operation has at most one entry, so writing the record again never
        owes the event again, nor does it once ``completion_sent`` marked it; the entry
        goes with its record (``purge``)."""

    @abc.abstractmethod
    async def completion_owed(self, operation_id: str) -> bool:
        """True while the operation's completion event is owed and not marked sent: a
        sender asks again after taking the event's lease, so a replica that read the owed
        list before another sent it never sends it twice."""

    @abc.abstractmethod
    async def completion_sent(self, operation_id: str) -> None:
        """Mark the operation's completion event delivered: never owed again."""

    # -- idempotency --------------------------------------------------------------------
    @abc.abstractmethod
    async def claim_idempotency(
        self, entry: IdempotencyEntry, now: float
    ) -> IdempotencyEntry | None:
        """Store ``entry`` unless an unexpired entry has its key: None if claimed, else that.
        An unexpired entry equal to ``entry`` is this same claim (its ``claim`` token made
        by the request), sent again after a broken connection: claimed."""

    async def claim_submission(
        self,
        entry: IdempotencyEntry | None,
        now: float,
        operation_id: str,
        account: str,
        provider: str,
    ) -> IdempotencyEntry | None:
        """What must be written before a submission is forwarded: ``entry`` claimed (as
        ``claim_idempotency``) and, where a store's writes can fail for want of room, the
        operation's record reserved with it, so a full disk refuses the submission before the
        provider sees it. None when claimed (or no key); else the unexpired entry, and
        nothing written. This default claims the key only."""
        return None if entry is None else await self.claim_idempotency(entry, now)

    async def release_submission(self, operation_id: str) -> None:
        """Give up what ``claim_submission`` reserved for ``operation_id`` (the submission
        opened no operation); the default reserves nothing."""
        return None

    @abc.abstractmethod
    async def put_idempotency(self, entry: IdempotencyEntry) -> None: ...

    @abc.abstractmethod
    async def drop_idempotency(self, key: str) -> None: ...


class Coordination:
    """What replicas coordinate through: poll leases, the provider's pacing window and its
    tightening, and the clock decisions use. The defaults keep all of it in this process,
    right for the stores one gateway process owns (memory, SQLite); shared stores override."""

    _pacer: Pacer | None = None
    _held: dict[str, tuple[str, float]] | None = None  # leases in this process
    _prune_at: int = 1024  # expired ones are dropped when there are this many (PRUNE_AT)

    @property
    def _leases(self) -> dict[str, tuple[str, float]]:
        if self._held is None:
            self._held = {}
        return self._held

    # -- leases -------------------------------------------------------------------------
    async def acquire_lease(self, name: str, token: str, now: float, ttl: float) -> bool:
        """Hold ``name`` until ``now + ttl`` unless another unexpired token holds it.

        The default keeps leases in this process: right for the stores one gateway
        process owns (memory, SQLite). Shared stores keep them where every replica sees."""
        held = self._leases.get(name)
        if held is not None and held[0] != token and held[1] > now:
            return False
        self._leases[name] = (token, now + ttl)
        return True

    async def release_lease(self, name: str, token: str) -> None:
        """Release ``name`` only if ``token`` still holds it."""
        held = self._leases.get(name)
        if held is not None and held[0] == token:
            del self._leases[name]

    # -- deliveries seen (SPEC 23) --------------------------------------------------------
    async def claim_delivery(self, key: str, now: float, window: float) -> str | None:
        """A token when ``key`` (a provider push's delivery id) was not claimed within the
        last ``window`` seconds, else None: the replay window of pushes, shared by every
        replica that shares the store. Kept as a lease nobody releases, so it costs each
        backend nothing new; ``release_delivery`` gives it back when the push could not be
        handled (the provider's retry is then handled, not ignored)."""
        token = secrets.token_hex(12)
        if self._held is not None and len(self._held) >= self._prune_at:
            self._forget_expired(now)
        taken = await self.acquire_lease(f"seen:{key}", token, now, window)
        return token if taken else None

    def _forget_expired(self, now: float) -> None:
        """Drops the in-process leases past their time (deliveries seen, polls done), so
        the replay window of pushes does not grow without bound."""
        held = self._leases
        for name in [name for name, (_, until) in held.items() if until <= now]:
            del held[name]
        self._prune_at = max(PRUNE_AT, 2 * len(held))  # amortised: no scan per claim

    async def release_delivery(self, key: str, token: str) -> None:
        """Forget a claimed delivery (it was not handled)."""
        await self.release_lease(f"seen:{key}", token)

    # -- pacing -------------------------------------------------------------------------
    async def pace(self, provider: str, rate: float | None, now: float) -> float:
        """0 if a status call to ``provider`` may go now (it is counted), else seconds to
        wait. The default keeps the window in this process; shared stores share it."""
        if self._pacer is None:
            self._pacer = Pacer()
        return self._pacer.pace(provider, rate, now)

    async def tighten(self, provider: str, rate: float, until: float) -> None:
        """Lower ``provider``'s ceiling to ``rate`` per second (0 pauses it) until ``until``."""
        if self._pacer is None:
            self._pacer = Pacer()
        self._pacer.tighten(provider, rate, until)

    async def bound_pause(self, provider: str, latest: float) -> None:
        """End ``provider``'s tightening at ``latest`` if it is kept longer (one stored by a
        version that did not bound pauses, or under a larger cap than the policy's now)."""
        if self._pacer is not None:
            self._pacer.bound(provider, latest)

    # -- clock --------------------------------------------------------------------------
    def clock(self) -> float:
        """The time decisions should use with this store; shared stores use their own."""
        return time.time()


class AgentKeys(abc.ABC):
    """Agent keys made through the operator API, and the quota counts of submissions
    (SPEC 25). Kept in the store so every replica sees a key, its revocation and the
    counts at once. A key is stored as the sha256 of its token, never the token."""

    @abc.abstractmethod
    async def put_key(self, key: AgentKey) -> None:
        """Store ``key`` (a new id and token digest)."""

    @abc.abstractmethod
    async def key_for(self, token_sha256: str) -> AgentKey | None:
        """The key whose token has this sha256 hex digest, expired or not; None if none."""

    @abc.abstractmethod
    async def agent_keys(self) -> list[AgentKey]:
        """Every stored key, oldest first (by created_at, then id)."""

    @abc.abstractmethod
    async def drop_key(self, key_id: str) -> AgentKey | None:
        """Delete the key ``key_id`` (its quota counts with it, unless another key counts
        under the same holder: a rotated key's successor): the key deleted, or None when
        there was none. Once this returns, ``key_for`` finds it on no replica."""

    @abc.abstractmethod
    async def claim_quota(
        self, holder: str, operation_id: str, quotas: Quotas, now: float, hold: float
    ) -> float:
        """Count a submission of ``holder`` (``key:ID`` or ``account:NAME``) about to be
        forwarded, as operation ``operation_id``, if ``quotas`` allow it: 0 when counted,
        else the seconds to wait (``keys.quota_wait``) and nothing counted. Atomic across
        replicas: two claims never both take the last place.

        Counted: for ``max_active_operations`` a place per operation id, held while its
        record is pending (or reserved), or for ``hold`` seconds while it has no record
        yet (a submission in flight), given back by ``release_quota`` or found free when
        its record ended; for ``submits_per_hour`` the instant, for an hour."""

    @abc.abstractmethod
    async def release_quota(self, holder: str, operation_id: str) -> None:
        """Give back ``operation_id``'s active place (its submission opened no operation);
        the forwarded submission still counts in the hour."""


class LeaseLost(StoreError):
    """A write-back refused because its poll lease expired or went to another holder (a
    pause longer than the lease): the old holder never writes."""


class NewerLayout(StoreError):
    """The store holds a layout newer than this code knows: a gateway never starts on it."""


def newer_layout(kind: str, found: int, known: int) -> NewerLayout:
    """The refusal of a store whose layout is newer than this code: both versions named."""
    return NewerLayout(
        f"the {kind} store holds schema version {found}, newer than this statusgate knows"
        f" ({known}); run a statusgate release that knows version {found}",
        operation="open",
    )


class Store(Records, Coordination, AgentKeys):
    """The one interface every backend implements: records and coordination, a poll's two
    steps that use both (one round trip each on shared stores), and the store's life."""

    shared: ClassVar[bool] = False
    """True when several processes (replicas, ``--workers``) may use one store at once."""
    audit_lines: AuditLines | None = None
    """Every replica's audit lines, where the store keeps them (PostgreSQL)."""

    # -- a poll's two store steps around the provider call ---------------------------------
    async def start_poll(
        self, lease: str, token: str, now: float, ttl: float, provider: str, rate: float | None
    ) -> float | None:
        """Take the poll lease and a place in the provider's pacing window: None when the
        lease is held elsewhere; else the lease is ours, and 0 means the call may go now
        (counted in the window), more than 0 how long the provider's pacing asks to wait.
        Shared stores do both in one round trip."""
        if not await self.acquire_lease(lease, token, now, ttl):
            return None
        return await self.pace(provider, rate, now)

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
        """``start_poll``, then, when the call may go now, ``save(reserve)``: the
        reservation computed from the record in hand. (wait, written, moved); not written
        means the record moved meanwhile and the caller reserves the usual way, under the
        lease it now holds, from ``moved`` when the store handed the stored record back
        (Redis does, saving a read). Raises NotAdmissible like ``save``. Shared stores: one
        round trip."""
        wait = await self.start_poll(lease, token, now, ttl, provider, rate)
        if wait != 0:
            return wait, False, None
        return wait, await self.save(reserve), None

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
        """``mutate`` (trying ``known`` first), then release the poll lease. Shared stores
        write and release in one round trip when ``known`` is current.

        ``durable(result)`` False lets a store answer before the write is durable (SQLite
        answers a still-pending answer before its turn's commit: the reservation before
        it is durable, so a crash in between costs the answer, never a budget, and the
        restarted gateway audits the call as interrupted). Stores that make every write
        durable before answering ignore it; so does this default."""
        try:
            return await self.mutate(operation_id, change, known=known)
        finally:
            await self.release_lease(lease, token)

    # -- life ---------------------------------------------------------------------------
    async def migrate(self) -> tuple[int | None, int]:
        """Bring the stored layout up to the one this code writes, creating it when there is
        none: (version found, None when the store was empty; version now). A layout newer
        than this code knows raises ``newer_layout``. ``open`` does the same; ``statusgate
        migrate`` runs it alone. Stores without a layout (memory) have nothing to do."""
        return 1, 1

    async def inspect(self) -> str:
        """For ``statusgate check``: what the store says about itself, connecting only
        where credentials can be wrong (raises StoreError saying why in one line); ''
        when it has nothing to say."""
        return ""

    async def open(self) -> None:
        """Start background work (clock sync); the default store has none."""
        return None

    @abc.abstractmethod
    async def ping(self) -> None:
        """Raise StoreError unless the store answers."""

    async def close(self) -> None:
        """Release connections; the default store holds none."""
        return None


async def stop(task: asyncio.Task[None] | None) -> None:
    """Cancel a store's background task and wait for it to end. Cancelled again until it
    does: a driver may swallow one cancellation (redis-py did, cancelled in the middle of a
    command), which would leave the task looping and close() waiting for ever."""
    while task is not None and not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=0.1)


PURGE_BATCH = 1000
PRUNE_AT = 1024  # in-process leases kept before the expired ones are dropped


def purgeable(record: OperationRecord, provider: str, ended_before: float) -> bool:
    return (
        record.provider == provider
        and record.ended_at is not None
        and record.ended_at < ended_before
        and record.outcome is not Outcome.PENDING
    )


def owes(record: OperationRecord) -> bool:
    """The record, as written, owes an ``operation.completed`` event (SPEC 23)."""
    return record.announce and record.outcome.terminal


def is_overdue(record: OperationRecord, provider: str, now: float) -> bool:
    return (
        record.provider == provider
        and record.outcome is Outcome.PENDING
        and record.deadline_at <= now
    )


def matches(record: OperationRecord, where: OperationFilter) -> bool:
    return (
        (where.outcome is None or record.outcome == where.outcome)
        and (where.provider is None or record.provider == where.provider)
        and (where.account is None or record.account == where.account)
        and (where.before is None or listed_at(record) < where.before)
    )


def listed_at(record: OperationRecord) -> tuple[float, str]:
    """A record's place in ``list`` order (newest first): what paging positions compare."""
    return record.started_at, record.operation_id


def queued_at(record: OperationRecord) -> tuple[float, str]:
    """A record's place in the escalation queue: when it was escalated, then its id."""
    at = record.escalation.at if record.escalation is not None else record.started_at
    return at, record.operation_id
