"""What every shared store (Redis, PostgreSQL) repeats, written once: the store's clock
as seen from here (``SharedClock``), the copies of pending records ``known`` answers from
(``Copies``) and the queue of what callers ask for within one turn of the event loop
(``TurnQueue``, and ``Batch`` on it for reads whose callers share an answer).

Owns no connection and no driver: a backend hands in how to read its clock and how to
fetch; nothing here names Redis or PostgreSQL. The local clock and the sleep are injected
so a test drives the resync schedule without waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

from gateway import StoreError
from gateway.core.models import OperationRecord, Outcome
from gateway.store.base import stop

COPIES = 16_384  # pending records a shared store keeps as last written or read (~2 KB each)
COPY_ANSWER = 4096  # ... and only with a replayable answer of at most this many bytes
Job = tuple[str, str, str]  # (account, provider, provider job id)


class Copies:
    """Pending records as this process last wrote or read them, bounded, oldest out first:
    what a shared store's ``known`` answers from. A copy is only ever acted on through a
    compare-and-set (the reservation), never answered from, so a stale one costs a retry,
    never a wrong answer. Ended records are not kept (they carry final bodies)."""

    def __init__(self, limit: int = COPIES) -> None:
        self._limit = limit
        self._records: dict[str, OperationRecord] = {}
        self._jobs: dict[Job, str] = {}

    def keep(self, record: OperationRecord) -> None:
        """``record`` was written or read here; never replaces a newer copy."""
        kept = self._records.pop(record.operation_id, None)
        if kept is not None and kept.version > record.version:
            record = kept  # a read that finished after a write of ours
        job = (record.account, record.provider, record.provider_job_id)
        last = record.last_answer
        if record.outcome is not Outcome.PENDING or (last and len(last.body) > COPY_ANSWER):
            self._jobs.pop(job, None)  # a read starts its next poll instead
            return
        if len(self._records) >= self._limit:
            oldest = self._records.pop(next(iter(self._records)))
            self._jobs.pop((oldest.account, oldest.provider, oldest.provider_job_id), None)
        self._records[record.operation_id] = record
        self._jobs[job] = record.operation_id

    def forget(self, operation_id: str) -> None:
        record = self._records.pop(operation_id, None)
        if record is not None:
            self._jobs.pop((record.account, record.provider, record.provider_job_id), None)

    def known(self, account: str, provider: str, job_id: str) -> OperationRecord | None:
        operation_id = self._jobs.get((account, provider, job_id))
        return None if operation_id is None else self._records.get(operation_id)


CLOCK_SAMPLES = 3  # readings of a shared store's clock per sync
CLOCK_TRIP = 0.01  # seconds: a sync whose best reading took longer keeps the offset there was
CLOCK_RESYNC = 10.0  # seconds between syncs
CLOCK_RETRY = 0.5  # seconds between syncs while no reading has been within CLOCK_TRIP
CLOCK_START_TRIES = 5  # syncs start makes at most, waiting for one within CLOCK_TRIP


async def measure_offset(
    read: Callable[[], Awaitable[float]], local: Callable[[], float] = time.time
) -> tuple[float, float]:
    """(the store's clock minus this one, round trip) from the reading with the shortest
    round trip of CLOCK_SAMPLES: off by at most half that round trip. A reading whose answer
    waited behind a busy event loop is off by up to half of a long one, and a replica's
    schedule by as much, so the caller keeps its old offset past CLOCK_TRIP."""
    best: tuple[float, float] | None = None
    for _ in range(CLOCK_SAMPLES):
        before = local()
        theirs = await read()
        after = local()
        sample = (theirs - (before + after) / 2, after - before)
        if best is None or sample[1] < best[1]:
            best = sample
    assert best is not None
    return best


class SharedClock:
    """The shared store's clock as seen from here: local time plus the best measured offset.

    A reading is off by up to half its round trip, and a replica's leases and schedule by as
    much, so a measurement is taken only when its round trip is within CLOCK_TRIP, or shorter
    than the one the offset in use came from. ``start`` measures until a reading is that good
    (at most CLOCK_START_TRIES times; the first that answers is kept meanwhile, nothing better
    being known); while none has been, the background loop measures again every CLOCK_RETRY
    seconds, then every ``resync`` seconds, sleeping first. A failed sync (StoreError) keeps
    the offset there was.

    Before this, the first reading was kept for ``resync`` seconds however slow: a replica
    that started under load ran 3 s behind, then its resync moved it 3.4 s forward at once,
    its own poll lease looked expired, and it polled the provider twice in 9 ms."""

    def __init__(
        self,
        read: Callable[[], Awaitable[float]],
        *,
        local: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        resync: float = CLOCK_RESYNC,
    ) -> None:
        self._read = read
        self._local = local
        self._sleep = sleep
        self._resync = resync
        self.offset = 0.0
        self.trip = math.inf  # the round trip of the reading the offset came from
        self._task: asyncio.Task[None] | None = None

    @property
    def synced(self) -> bool:
        """An offset measured yet."""
        return self.trip < math.inf

    @property
    def settled(self) -> bool:
        """The offset came from a reading within CLOCK_TRIP."""
        return self.trip <= CLOCK_TRIP

    def now(self) -> float:
        return self._local() + self.offset

    async def sync(self) -> None:
        offset, trip = await measure_offset(self._read, self._local)
        if trip <= CLOCK_TRIP or trip < self.trip:
            self.offset, self.trip = offset, trip

    async def start(self) -> None:
        for _ in range(CLOCK_START_TRIES):
            with contextlib.suppress(StoreError):
                await self.sync()
            if self.settled:
                break
        self._task = asyncio.create_task(self._keep_synced())

    async def _keep_synced(self) -> None:
        while True:
            await self._sleep(self._resync if self.settled else CLOCK_RETRY)
            with contextlib.suppress(StoreError):
                await self.sync()

    async def close(self) -> None:
        await stop(self._task)
        self._task = None


W = TypeVar("W")


class TurnQueue(Generic[W]):
    """What callers ask for while one batch is being gathered (one turn of the event loop,
    or while the previous batch is out), taken as one batch by whoever sends it. Bounded:
    past ``bound`` items a call is refused at once (``overloaded``), unless the queue is
    empty (a call alone goes whatever its size)."""

    def __init__(
        self, bound: int | None = None, overloaded: Callable[[int], Exception] | None = None
    ) -> None:
        self._bound = bound
        self._overloaded = overloaded
        self.items: list[W] = []
        self.count = 0  # the size of what is queued (commands, statements, keys)

    def put(self, item: W, size: int = 1) -> bool:
        """Queue ``item``; True when it is the first (the caller starts the sending)."""
        bound = self._bound
        if bound is not None and self.count and self.count + size > bound:
            assert self._overloaded is not None
            raise self._overloaded(self.count)
        self.items.append(item)
        self.count += size
        return len(self.items) == 1

    def take(self) -> list[W]:
        batch, self.items, self.count = self.items, [], 0
        return batch

    def __bool__(self) -> bool:
        return bool(self.items)


def fail(answers: Iterable[asyncio.Future[Any]], exc: BaseException) -> None:
    """Every answer not yet given becomes ``exc``."""
    for answer in answers:
        if not answer.done():
            answer.set_exception(exc)


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Batch(Generic[K, V]):
    """Reads asked for within one turn of the event loop, sent together by ``fetch`` (one
    query or one pipeline for all of them); callers asking for the same key share its
    answer (records are immutable: one decoded copy serves them all). Linearizable: the
    batch goes once every caller in it has asked, so it sees every write that finished
    before any of them asked. A failure reaches every caller of the batch."""

    def __init__(self, fetch: Callable[[list[K]], Awaitable[dict[K, V]]]) -> None:
        self._fetch = fetch
        self._queue: TurnQueue[tuple[K, asyncio.Future[V | None]]] = TurnQueue()
        self._tasks: set[asyncio.Task[None]] = set()

    def ask(self, key: K) -> asyncio.Future[V | None]:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[V | None] = loop.create_future()
        if self._queue.put((key, answer)):
            loop.call_soon(self._send)
        return answer

    def _send(self) -> None:
        task = asyncio.get_running_loop().create_task(self._answer(self._queue.take()))
        self._tasks.add(task)  # kept until done (the loop holds tasks weakly)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, batch: list[tuple[K, asyncio.Future[V | None]]]) -> None:
        keys = list(dict.fromkeys(key for key, _ in batch))  # each once, in order asked
        try:
            found = await self._fetch(keys)
        except BaseException as exc:
            fail((answer for _, answer in batch), exc)
            if not isinstance(exc, Exception):
                raise
            return
        for key, answer in batch:
            if not answer.done():
                answer.set_result(found.get(key))


WRITTEN, STALE, GONE, REFUSED = 1, 0, -1, -2  # the reservation's answers, as the scripts'


def reservation(
    stored: OperationRecord | None, new: OperationRecord, now: float, tolerance: float
) -> int:
    """The compare-and-set a shared store runs atomically, in Python: the rule
    ``redis/lua/cas.lua`` and ``sg_cas`` (``postgres/sql/layout_1.sql``) keep on the store's
    clock, which tests/store/test_rule_twins.py feeds the same inputs as both. ``new`` is
    the record to write, at the version the writer read. A write that spends a status
    request is refused unless the stored record is pending, before its deadline, within its
    budget and due (``next_poll_at`` at most ``tolerance`` ahead), and spends exactly one."""
    if stored is None:
        return GONE
    if stored.version != new.version:
        return STALE
    if new.status_requests_used <= stored.status_requests_used:
        return WRITTEN
    admissible = (
        stored.outcome is Outcome.PENDING
        and now < stored.deadline_at
        and stored.status_requests_used < stored.max_status_requests
        and stored.next_poll_at <= now + tolerance
        and new.status_requests_used == stored.status_requests_used + 1
    )
    return WRITTEN if admissible else REFUSED
