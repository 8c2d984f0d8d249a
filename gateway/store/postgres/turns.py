"""The PostgreSQL store's hot statements, one pipeline per turn of the event loop, on
connections of their own (libpq's pipeline mode, through psycopg's ``pq`` wrapper).

``Turns.call(*calls)`` hands a caller's statements (a poll's ``sg_start``, a write-back, a
turn's finds) to the next pipeline and returns the future of their rows. What it guarantees:

- Statements given within one loop turn, and all given while every connection had a
  pipeline out, go together as one pipeline on one connection: written at once, each
  caller's statements in its order (the order among callers: below). With two
  connections a turn's pipeline goes while the one before still waits for its answers.
- A caller's statements are one transaction, and so are its neighbours': the callers of one
  pipeline are grouped, each group one implicit transaction (one Sync, one commit, one WAL
  flush) instead of one each. Those that asked for no flush (``flush=False``: reads, and
  writes a crash may cost) go first as one group, committed with ``synchronous_commit``
  off; the rest after them as another. Callers given in the same turn are concurrent, so
  this order among them is as good as any other (each sees the others' writes or not, as
  it would with any interleaving of its own transaction).
- A statement that fails fails its own caller only, with its error: its group is rolled
  back (the database undid all of it), and its callers are sent again in the next round
  trip on the same connection, one transaction each, so the others are answered as if it
  had not been there. A group waits at most ``GROUP_LOCK_WAIT`` for any one lock
  (``lock_timeout``, local to its transaction) before it is rolled back and sent again so:
  two groups that hold rows the other wants (two replicas polling one operation, a
  provider's pacing row) cannot wait on each other for long, and single transactions
  take their locks one statement at a time, as before grouping.
- Every caller hears within ``timeout`` of its call: a pipeline's deadline is its first
  caller's call plus ``timeout``, one timer a pipeline (none a call). A pipeline past its
  deadline, or whose connection breaks, fails every caller not answered yet. Its
  connection is reset (SO_LINGER 0) and the statement running is cancelled; the backend
  then fails at its next write (the answer to a Sync) and ends, so statements queued
  behind a stuck one mostly never run, though one may still commit. Nothing is ever sent
  twice: a statement whose outcome is unknown (it may have committed: a reservation) is an
  error to its caller. Only a group the database reported rolled back is sent again.
- A connection is opened again by the next pipeline that needs it, within that pipeline's
  deadline; one the server closed while idle (a restart, ``pg_terminate_backend``) is
  noticed before anything is sent on it, so a restarted database costs no caller an error.
- At most ``bound`` statements wait; past that a caller is refused at once (Overloaded).

It never opens a transaction and keeps no session state beyond what ``connect`` sets and
the prepared statements (none with ``prepare`` off, for PgBouncer). Never give it a
statement that waits on purpose (a lock held across statements, an advisory lock).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import capabilities, errors, pq

from gateway.store.shared import TurnQueue, fail

Row = tuple[bytes | None, ...]  # a row in text format: one value a column, None for NULL
Rows = list[Row]
Answer = asyncio.Future[list[Rows]]
BOUND = 1024  # statements waiting for their pipeline
LINKS = 8  # connections (see docs/postgres.md: each commit waits for its own WAL flush)
CANCEL_WAIT = 0.2  # seconds an abandoned pipeline's callers wait for its cancel to land
GROUP_LOCK_WAIT = "100ms"  # a group's lock_timeout (a lone caller waits as long as it must)

_OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
_SYNC = pq.ExecStatus.PIPELINE_SYNC
_BAD = pq.ConnStatus.BAD
_POLL_OK, _POLL_FAILED = pq.PollingStatus.OK, pq.PollingStatus.FAILED
_POLL_WRITING = pq.PollingStatus.WRITING


@dataclass(frozen=True)
class Statement:
    """A statement Turns may run: its SQL with ``$n`` parameters, and the name it is
    prepared under on each connection."""

    name: bytes
    sql: bytes

    @classmethod
    def of(cls, name: str, query: str) -> Statement:
        """From a query written with ``%s`` for each parameter, in order."""
        parts = query.split("%s")
        numbered = "".join(f"{part}${n}" for n, part in enumerate(parts[:-1], 1))
        return cls(name.encode(), (numbered + parts[-1]).encode())


Call = tuple[Statement, Sequence[Any]]
Sent = tuple[Statement, list[bytes | None]]
Waiting = tuple[tuple[Sent, ...], Answer, bool]  # a caller's statements, answer, flush

# A group's first statement: its transaction's settings, local to it (so safe behind
# PgBouncer's transaction pooling). None for a lone caller that needs the flush.
_LAZY = Statement.of("sg_turns_lazy", "SELECT set_config('synchronous_commit', 'off', true)")
_GROUP = Statement.of("sg_turns_group", "SELECT set_config('lock_timeout', %s, true)")
_LAZY_GROUP = Statement.of(
    "sg_turns_lazy_group",
    "SELECT set_config('synchronous_commit', 'off', true), set_config('lock_timeout', %s, true)",
)
_SETTINGS = (_LAZY, _GROUP, _LAZY_GROUP)


class Overloaded(psycopg.OperationalError):
    """More statements are waiting for the database than the bound: refused at once."""


def encode(value: Any) -> bytes | None:
    """A parameter in text format; the server infers its type from the statement. NUL is
    refused, as psycopg refuses it (libpq would cut a text parameter short at it)."""
    kind = type(value)  # the exact types first: a poll encodes ~30 parameters
    if kind is str:
        return _checked(value).encode()
    if kind is float or kind is int:
        return repr(value).encode()  # a float's repr reads back exactly ('inf' too)
    if value is None:
        return None
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, str):
        return _checked(value).encode()
    if isinstance(value, int | float):
        return repr(value).encode()
    if isinstance(value, list | tuple):
        quoted = (_checked(str(v)).replace("\\", "\\\\").replace('"', '\\"') for v in value)
        return ("{" + ",".join(f'"{v}"' for v in quoted) + "}").encode()
    raise TypeError(f"no text form for a parameter of type {type(value).__name__}")


def _checked(value: str) -> str:
    if "\x00" in value:
        raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
    return value


class _Link:
    """One connection of a Turns: in pipeline mode, its statements prepared, once open."""

    __slots__ = ("conn", "ended")

    def __init__(self) -> None:
        self.conn: psycopg.AsyncConnection[Any] | None = None
        self.ended = False  # the server said it is closing this connection

    def notice(self, diagnostic: errors.Diagnostic) -> None:
        """An error from the server while the connection is idle comes as a notice: the
        server's reason for closing it (a shutdown, a terminated backend)."""
        if diagnostic.severity_nonlocalized in ("FATAL", "PANIC"):
            self.ended = True

    def gone(self) -> bool:
        """Whether this idle connection cannot take a pipeline: closed, or closed by the
        server since its last pipeline (read here without waiting)."""
        if self.conn is None or self.ended:
            return True
        pgconn = self.conn.pgconn
        try:
            pgconn.consume_input()
            pgconn.is_busy()  # parses what came: a goodbye reaches ``notice``
        except psycopg.OperationalError:
            return True
        return self.ended or pgconn.status == _BAD


class Turns:
    def __init__(
        self,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
        statements: Sequence[Statement],
        *,
        prepare: bool = True,
        timeout: float = 1.0,
        links: int = LINKS,
        bound: int = BOUND,
    ) -> None:
        """``connect`` opens one connection (autocommit, its session set up); ``statements``
        are prepared on each connection when ``prepare``, else sent unnamed every time."""
        self._connect = connect
        self._statements = (*statements, *_SETTINGS)
        self._prepare = prepare
        self._timeout = timeout
        self._links = [_Link() for _ in range(links)]
        self._idle = list(self._links)
        self._queued: TurnQueue[Waiting] = TurnQueue(bound, _overloaded)  # statements
        self._since = 0.0  # loop time of the first call in _queued
        self._starting = False  # a link's task is created and has not taken its batch yet
        self._tasks: set[asyncio.Task[None]] = set()
        self.pipelines = 0  # pipelines sent so far (one round trip each)
        self.resends = 0  # rounds of callers sent again, one transaction each

    async def open(self) -> None:
        """Open every connection now, so the first calls do not wait for it; one that
        fails is left for the first pipeline that needs it."""
        await asyncio.gather(*(self._open(link) for link in self._links))

    async def _open(self, link: _Link) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                link.conn = await self._opened(link)
        except (psycopg.Error, OSError, TimeoutError):
            link.conn = None

    def call(self, *calls: Call, flush: bool = True) -> Answer:
        """The future of each statement's rows, sent with the rest of this turn's; it
        raises the first error among them, or the pipeline's. ``flush=False``: the commit
        need not wait for the WAL flush (a read, or a write a database crash may cost)."""
        loop = asyncio.get_running_loop()
        answer: Answer = loop.create_future()
        sent = tuple((statement, [encode(a) for a in args]) for statement, args in calls)
        if self._queued.put((sent, answer, flush), len(calls)):
            self._since = loop.time()
        if self._idle and not self._starting:
            self._start(loop)
        return answer

    async def _serve(self, link: _Link) -> None:
        self._starting = False
        try:
            while self._queued:
                batch = self._queued.take()
                await self._round(link, batch, self._since + self._timeout)
        finally:
            self._idle.append(link)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._starting = True
        task = loop.create_task(self._serve(self._idle.pop()))
        self._tasks.add(task)  # kept until done (the loop holds tasks weakly)
        task.add_done_callback(self._tasks.discard)

    async def _round(self, link: _Link, batch: list[Waiting], deadline: float) -> None:
        try:
            async with asyncio.timeout_at(deadline):
                conn = link.conn
                if conn is None or link.gone():
                    await self._drop(link)
                    link.ended = False
                    conn = link.conn = await self._opened(link)
                await self._exchange(conn.pgconn, batch)
        except Exception as exc:
            try:
                await self._drop(link, abandon=True)  # what it still runs is unknown
            finally:  # answered even when aclose cancels the drop's wait for its cancel
                _fail(batch, exc)
        except BaseException:
            try:
                await self._drop(link, abandon=True)
            finally:
                _fail(batch, psycopg.OperationalError("the store is closing"))
            raise

    async def _opened(self, link: _Link) -> psycopg.AsyncConnection[Any]:
        """A new connection for ``link``, in pipeline mode with the statements prepared."""
        conn = await self._connect()
        conn.add_notice_handler(link.notice)
        try:
            pgconn = conn.pgconn
            pgconn.enter_pipeline_mode()
            if self._prepare and self._statements:
                for statement in self._statements:
                    pgconn.send_prepare(statement.name, statement.sql)
                pgconn.pipeline_sync()
                await _flush(pgconn)
                for _ in self._statements:
                    result = await _result(pgconn)
                    if result is None or result.status not in _OK:
                        raise _error(result, pgconn)
                    await _end(pgconn)
                await _synced(pgconn)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _exchange(self, pgconn: pq.abc.PGconn, batch: list[Waiting]) -> None:
        """Send the batch as one pipeline of at most two groups (no flush first), answer
        each caller when its group has committed, and send the callers of a group that was
        rolled back again, one transaction each."""
        batch = [waiting for waiting in batch if not waiting[1].done()]  # cancelled: unsent
        if not batch:
            return
        groups = [g for g in ([w for w in batch if not w[2]], [w for w in batch if w[2]]) if g]
        for group in groups:
            self._send(pgconn, group)
        self.pipelines += 1
        await _flush(pgconn)
        again = [w for group in groups if not await self._answer(pgconn, group) for w in group]
        again = [waiting for waiting in again if not waiting[1].done()]
        if again:
            for waiting in again:
                self._send(pgconn, [waiting])
            self.resends += 1
            await _flush(pgconn)
            for waiting in again:
                await self._answer(pgconn, [waiting])

    def _send(self, pgconn: pq.abc.PGconn, group: list[Waiting]) -> None:
        """One group's statements, after its settings, and its Sync (queued, not flushed)."""
        settings = _settings(group)
        if settings is not None:
            self._queue(pgconn, settings)
        for sent, _, _ in group:
            for statement, params in sent:
                self._queue(pgconn, (statement, params))
        pgconn.pipeline_sync()

    def _queue(self, pgconn: pq.abc.PGconn, sent: Sent) -> None:
        statement, params = sent
        if self._prepare:
            pgconn.send_query_prepared(statement.name, params)
        else:
            pgconn.send_query_params(statement.sql, params)

    async def _answer(self, pgconn: pq.abc.PGconn, group: list[Waiting]) -> bool:
        """Read one group's results through its Sync and answer its callers; False, with
        nobody answered, when a group of several failed (rolled back: send it again)."""
        failed = False
        if _settings(group) is not None:
            failed = (await _outcome(pgconn))[1] is not None
        outcomes: list[tuple[list[Rows], Exception | None]] = []
        for sent, _, _ in group:
            rows: list[Rows] = []
            error: Exception | None = None
            for _ in sent:
                got, problem = await _outcome(pgconn)
                if got is not None:
                    rows.append(got)
                elif error is None:  # the statements after it in its Sync were not run
                    error = problem
            failed = failed or error is not None
            outcomes.append((rows, error))
        await _synced(pgconn)
        if failed and len(group) > 1:
            return False
        for (_, answer, _), (rows, error) in zip(group, outcomes, strict=True):
            if answer.done():  # its caller was cancelled
                continue
            if error is None:
                answer.set_result(rows)
            else:
                answer.set_exception(error)
        return True

    async def _drop(self, link: _Link, *, abandon: bool = False) -> None:
        """Close the link's connection; when ``abandon``ed with statements out, reset it
        and then cancel the statement running (waiting up to CANCEL_WAIT for the cancel
        to be delivered, so a lock released right after its callers heard cannot let it
        commit, as psycopg waits for its own cancel)."""
        conn, link.conn = link.conn, None
        if conn is None:
            return
        pgconn = conn.pgconn
        cancel = None
        if abandon and pgconn.status != _BAD:
            with contextlib.suppress(psycopg.Error, OSError):
                _reset_on_close(pgconn.socket)
                if capabilities.has_cancel_safe():
                    cancel = pgconn.cancel_conn()
                    cancel.start()
        await conn.close()
        if cancel is not None:
            await _cancel(cancel)

    async def aclose(self) -> None:
        """Stop sending (callers still waiting fail) and close the connections."""
        while self._tasks:
            for task in self._tasks:
                task.cancel()
            await asyncio.wait(self._tasks, timeout=0.1)
        _fail(self._queued.take(), psycopg.OperationalError("the store is closed"))
        for link in self._links:
            await self._drop(link)


async def _flush(pgconn: pq.abc.PGconn) -> None:
    """Write out what was queued; answers that arrive meanwhile are taken in, so a large
    pipeline cannot stall against a server waiting for its results to be read."""
    while pgconn.flush():
        if await _ready(pgconn.socket, write=True):
            pgconn.consume_input()


async def _result(pgconn: pq.abc.PGconn) -> pq.abc.PGresult | None:
    while pgconn.is_busy():
        await _ready(pgconn.socket, write=False)
        pgconn.consume_input()
    return pgconn.get_result()


async def _outcome(pgconn: pq.abc.PGconn) -> tuple[Rows | None, Exception | None]:
    """One statement's rows, or its error; raised when the connection broke (every
    answer left is unknown)."""
    result = await _result(pgconn)
    if result is not None and result.status in _OK:
        outcome: tuple[Rows | None, Exception | None] = (_rows(result), None)
    else:
        error = _error(result, pgconn)
        if pgconn.status == _BAD:
            raise error
        outcome = (None, error)
    await _end(pgconn)
    return outcome


def _settings(group: list[Waiting]) -> Sent | None:
    """The statement that opens ``group``'s transaction, if any."""
    lazy, several = not group[0][2], len(group) > 1
    if several:
        return (_LAZY_GROUP if lazy else _GROUP), [GROUP_LOCK_WAIT.encode()]
    return (_LAZY, []) if lazy else None


async def _end(pgconn: pq.abc.PGconn) -> None:
    """The end of one statement's results (libpq gives None after them)."""
    if await _result(pgconn) is not None:
        raise psycopg.OperationalError("postgresql pipeline out of step: more results")


async def _synced(pgconn: pq.abc.PGconn) -> None:
    result = await _result(pgconn)
    if result is None or result.status != _SYNC:
        raise _error(result, pgconn)


def _error(result: pq.abc.PGresult | None, pgconn: pq.abc.PGconn) -> Exception:
    if result is not None and result.status == pq.ExecStatus.FATAL_ERROR:
        return errors.error_from_result(result)
    if result is not None and result.status == pq.ExecStatus.PIPELINE_ABORTED:
        return errors.PipelineAborted("an earlier statement of the same caller failed")
    message = pgconn.get_error_message() if pgconn.status == _BAD else "out of step"
    return psycopg.OperationalError(f"postgresql pipeline: {message}")


def _rows(result: pq.abc.PGresult) -> Rows:
    columns = range(result.nfields)
    return [tuple(result.get_value(n, c) for c in columns) for n in range(result.ntuples)]


def _when_ready(ready: asyncio.Future[bool], readable: bool) -> None:
    if not ready.done():
        ready.set_result(readable)


async def _ready(fd: int, *, write: bool) -> bool:
    """Until ``fd`` can be read (or, with ``write``, written): True when readable."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[bool] = loop.create_future()
    loop.add_reader(fd, _when_ready, ready, True)
    if write:
        loop.add_writer(fd, _when_ready, ready, False)
    try:
        return await ready
    finally:
        loop.remove_reader(fd)
        if write:
            loop.remove_writer(fd)


async def _cancel(cancel: pq.abc.PGcancelConn) -> None:
    try:
        async with asyncio.timeout(CANCEL_WAIT):
            while (status := cancel.poll()) not in (_POLL_OK, _POLL_FAILED):
                await _ready(cancel.socket, write=status == _POLL_WRITING)
    except (psycopg.Error, OSError, TimeoutError):
        pass  # the reset ends the backend anyway, at its next read, write or check
    finally:
        cancel.finish()


def _reset_on_close(fd: int) -> None:
    """Have closing ``fd`` reset the connection (SO_LINGER 0) rather than end it in order."""
    sock = socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM)  # a duplicate of fd
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()


def _overloaded(count: int) -> Overloaded:
    return Overloaded(f"{count} statements already waiting for the database")


def _fail(batch: list[Waiting], exc: BaseException) -> None:
    fail((answer for _, answer, _ in batch), exc)
