"""The SQLite store's group commit: one transaction per turn of the event loop (``_Turn``)
and the WAL's fsync that makes committed turns durable, shared by every turn committed
while the one before ran (``GroupCommit``, a base of ``SQLiteStore``).

Owns the bookkeeping between commit and durability: which turns are durable, who waits
for which fsync, when the next fsync may start (``group_commit`` apart while the loop is
busy) and the store's stop after a failed one. It never opens the file or runs SQL beyond
a rollback; ``SQLiteStore`` commits, and its ``Syncer`` fsyncs.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from functools import partial

from gateway import StoreError
from gateway.store.sqlite.cache import Cache
from gateway.store.sqlite.loop_share import LoopShare
from gateway.store.sqlite.wal_sync import HelperLost, Syncer

LAST_TURNS = 16_384  # operations remembered with the turn that last wrote them


class _Turn:
    """The transaction of one turn of the event loop: its number, what it wrote (forgotten
    from the cache if it is rolled back) and who waits for it to be durable."""

    __slots__ = ("number", "waiters", "written")

    def __init__(self, number: int) -> None:
        self.number = number
        self.written: list[str] = []
        self.waiters: list[asyncio.Future[None]] = []


class GroupCommit:
    """Group commit and durability for ``SQLiteStore``, whose ``__init__`` sets each
    attribute declared here."""

    _path: str
    _closed: bool
    _broken: str | None  # why the store refuses everything (a failed fsync)
    _cache: Cache
    _connections: dict[str, sqlite3.Connection]
    _turn: _Turn | None
    _syncer: Syncer | None
    _unsynced: list[asyncio.Future[None]]
    _syncing: asyncio.Future[None] | None
    _lazy: asyncio.TimerHandle | None
    _synced_at: float | None
    _spaced: asyncio.TimerHandle | None
    _committed_through: int
    _durable_through: int
    _last_turn: dict[str, int]
    _group_commit: float
    _loop_share: LoopShare
    _cpu_clock: Callable[[], float]

    def _commit_turn(self) -> None:
        raise NotImplementedError  # SQLiteStore's

    def _abort(self, turn: _Turn, exc: sqlite3.Error) -> None:
        """The turn's writes are lost (a failed commit, or SQLite rolled back): the cache
        forgets them and every waiter hears why."""
        if self._turn is turn:
            self._turn = None
        conn = self._connections["write"]
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        for operation_id in turn.written:
            self._cache.gone(operation_id)
            if self._last_turn.get(operation_id) == turn.number:
                # the file's version is an earlier turn's, committed, perhaps not yet durable
                self._last_turn[operation_id] = self._committed_through
        for waiter in turn.waiters:
            if not waiter.done():
                error = StoreError(f"sqlite commit: {exc}", operation="commit")
                error.__cause__ = exc
                waiter.set_exception(error)

    def _lazy_sync(self) -> None:
        self._lazy = None
        self._sync_soon()

    def _sync_soon(self) -> None:
        """Group commit: unless one is running or held back, ask for an fsync of the WAL
        (the helper process) for every turn committed so far; its waiters are answered
        when it ends, in the callback that hears it (no Future hop: a turn of the loop less
        before a reservation's provider call), and turns committed meanwhile share the next
        one, which starts ``group_commit`` after it ended at the soonest. The loop never
        waits for the disk."""
        if self._syncing is not None or self._spaced is not None:
            return
        if self._broken is not None:
            self._break(self._broken, [])
            return
        if not self._unsynced and self._durable_through >= self._committed_through:
            return
        if self._synced_at is not None and self._loop_share.busy and not self._closed:
            loop = asyncio.get_running_loop()
            held = self._synced_at + self._group_commit - loop.time()
            if held > 0:
                self._spaced = loop.call_later(held, self._spaced_sync)
                return
        waiters, self._unsynced = self._unsynced, []
        through = self._committed_through
        if self._syncer is None:  # committed is durable here (only a power cut can cost it)
            self._synced(waiters, through, None, None)
            return
        syncing = self._syncing = asyncio.get_running_loop().create_future()  # for ``close``
        self._syncer.sync(partial(self._synced, waiters, through, syncing))

    def _spaced_sync(self) -> None:
        """The held-back fsync, with the durable writes of the turn open now in it."""
        self._spaced = None
        if self._turn is not None and self._turn.waiters:
            self._commit_turn()
        self._sync_soon()  # also when that commit failed: the turns before it still wait

    def _synced(
        self,
        waiters: list[asyncio.Future[None]],
        through: int,
        syncing: asyncio.Future[None] | None,
        failure: BaseException | None,
    ) -> None:
        if syncing is not None:
            syncing.set_result(None)
            if self._syncing is syncing:
                self._syncing = None
        if isinstance(failure, HelperLost):
            self._helper_lost(failure, waiters)
            return
        if failure is not None:
            reason = failure.strerror if isinstance(failure, OSError) else None
            self._break(f"sqlite fsync: {self._path}-wal: {reason or failure!r}", waiters)
            return
        if syncing is not None:  # an fsync was made: the next one is spaced from now
            self._synced_at = asyncio.get_running_loop().time()
            self._loop_share.seen(self._synced_at, self._cpu_clock())
        self._durable_through = max(self._durable_through, through)
        if self._lazy is not None and self._durable_through >= self._committed_through:
            self._lazy.cancel()  # what it was for is durable: no wake-up for nothing
            self._lazy = None
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        if len(self._last_turn) > LAST_TURNS:
            durable = self._durable_through
            self._last_turn = {k: n for k, n in self._last_turn.items() if n > durable}
        self._sync_soon()

    def _helper_lost(self, lost: HelperLost, waiters: list[asyncio.Future[None]]) -> None:
        """The fsync process ended with the fsync in flight: its outcome is unknown, and
        Linux reports a write-back error once per file description, so a new helper might
        never hear it: the store stops, as after a failed fsync. (One that could not be
        started or reached was asked nothing: the syncer made that fsync on a thread.)
        Waiters of a closing store hear that it closed."""
        if self._closed:
            self._fail_waiting(waiters, StoreError("sqlite store is closed", operation="commit"))
        else:
            self._break(f"sqlite fsync: {self._path}-wal: {lost}", waiters)

    def _break(self, reason: str, waiters: list[asyncio.Future[None]]) -> None:
        """A failed fsync: what it should have made durable may never reach the disk (Linux
        may drop the failed pages and report the next fsync clean), while SQLite already
        counts those frames committed. Nothing more is written or answered from this
        process: every waiter, now and later, hears ``reason``; a restart recovers the file
        from what the disk holds."""
        if self._broken is None:
            self._broken = f"{reason} (the store refuses every call until the gateway restarts)"
        self._fail_waiting(waiters, StoreError(self._broken, operation="commit"))

    def _fail_waiting(self, waiters: list[asyncio.Future[None]], error: StoreError) -> None:
        """``waiters`` and every write waiting for the next fsync hear ``error``."""
        for waiter in [*waiters, *self._unsynced]:
            if not waiter.done():
                waiter.set_exception(error)
        self._unsynced = []
