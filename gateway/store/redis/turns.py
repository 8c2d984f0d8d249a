"""The hot path's Redis commands, one pipeline per turn of the event loop, on one connection.

``Turns.call(*commands)`` hands a caller's commands (a poll's script, a batch of record
reads) to the one pipeline that goes next. What it guarantees:

- At most one pipeline is in flight, on the one connection of the client given. Commands
  given within one loop turn, and all given while the pipeline before was in flight, go
  together as the next pipeline (``transaction=False``: not atomic together, each command
  is). A caller's commands go in its order, next to each other (WAIT aside, below), and
  only after every command a caller was answered for: Redis runs them in the order asked.
- Each caller gets its own answers, as redis-py's own pipeline would give them (the same
  decoding, the client's response callbacks); a command that fails in Redis (a script's
  error, WRONGTYPE) fails its own caller only, with the exception redis-py raises for it.
- Scripts go as EVALSHA with the sha computed here (``script``), never SCRIPT EXISTS or
  LOAD per pipeline. After NOSCRIPT (Redis restarted or its scripts flushed) the scripts are
  loaded and only the commands that got NOSCRIPT are sent again, once, in one more round
  trip, with the pipeline's WAITs after them (the first WAITs ran before those writes); so a
  script should be its caller's last command but for a WAIT (the others ran before it).
- A pipeline that fails as a whole (no complete answer within the connection's
  ``socket_timeout``: redis-py's TimeoutError; refused, reset or closed: its
  ConnectionError) fails every caller in it, and every caller that queued behind it:
  nobody waits through two timeouts of a Redis that does not answer.
- Nothing is sent twice. A pipeline's bytes go to the socket once: whatever happens after
  (a timeout, a reset, the server closing), Redis may have run it (a script spends a
  status request), so its callers get the error. Only opening the connection is tried
  again, by redis-py's ``connect`` under the client's Retry (the store's: once, on a
  ConnectionError), before anything is written. A connection the server closed while idle
  (a restart, CLIENT KILL) is noticed before the next pipeline is written on it and opened
  again, so a restarted Redis costs no caller an error (unless the close reaches us in the
  very turn a pipeline goes out). redis-py's pipeline sent the whole pipeline again on a
  ConnectionError while reading its answers too, which could run its scripts twice.
- A pipeline that fails as a whole drops its connection (the socket aborted, its parser
  thrown away): a late answer is never read, let alone given to a later caller.
- At most ``bound`` commands wait for their pipeline; past that a caller is refused at once
  (``Overloaded``) instead of queueing behind a Redis that cannot keep up. A call that
  finds nothing waiting is taken whatever its size (one turn's batch of reads can be
  larger than the bound).
- WAIT answers for the writes sent before it on its connection, and blocks that connection
  until it answers: the WAITs of one pipeline are sent once each (the same replicas and
  timeout), after its other commands, and their callers share the answer. A replica that
  does not acknowledge holds up one pipeline by WAIT's timeout, not one per caller.

How it talks (wire.py): redis-py's own connection connects and does the handshake;
the pipeline's I/O is one write of the packed commands and one hiredis reader for every
answer, with one timeout a pipeline rather than one a reply.

It never opens a transaction and must not be given blocking commands other than WAIT.
Redis Cluster is not served here: its pipelines split by node (the store keeps its pool
path). RESP3 push messages are skipped, not handled: nothing here subscribes, and the
maintenance notifications redis-py asks a server for at connect (where it has them) go
unheeded, so a node that moves breaks the connection and the next pipeline reopens it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable
from typing import Any, cast

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.store.redis.wire import Command, Connection, Link, packed
from gateway.store.shared import TurnQueue, fail

Waiting = tuple[tuple[Command, ...], asyncio.Future[list[Any]]]
BOUND = 1024  # commands waiting for their pipeline


class Overloaded(RedisError):
    """More commands are waiting for Redis than the bound: refused without waiting."""


class Turns:
    def __init__(self, client: aioredis.Redis, *, bound: int = BOUND) -> None:
        """``client`` should have a connection pool of one: it is this class's alone."""
        self._client = client
        self._scripts: dict[str, str] = {}  # sha -> source, for reloading after NOSCRIPT
        self._queued: TurnQueue[Waiting] = TurnQueue(bound, _overloaded)  # commands
        self._sender: asyncio.Task[None] | None = None
        self._conn: Connection | None = None  # taken from the pool once, kept
        self._link: Link | None = None  # _conn while open and in step

    def script(self, source: str) -> str:
        """Register a script; its sha, for ``evalsha``."""
        sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()
        self._scripts[sha] = source
        return sha

    @staticmethod
    def evalsha(sha: str, keys: list[str], args: list[Any] | tuple[Any, ...]) -> Command:
        return ("EVALSHA", sha, len(keys), *keys, *args)

    async def call(self, *commands: Command) -> list[Any]:
        """The answers to ``commands``, sent with the rest of this turn's; raises the first
        error among them, or the pipeline's."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[list[Any]] = loop.create_future()
        self._queued.put((commands, answer), len(commands))
        if self._sender is None:
            self._sender = loop.create_task(self._send_all())
        return await answer

    async def _send_all(self) -> None:
        try:
            while self._queued:
                batch = self._take()
                try:
                    await self._send(batch)
                except Exception as exc:
                    _fail(batch, exc)
                    _fail(self._take(), exc)  # queued behind a pipeline that failed
                except BaseException:
                    closing = RedisConnectionError("the store is closing")
                    _fail(batch, closing)
                    _fail(self._take(), closing)
                    raise
        finally:
            self._sender = None

    def _take(self) -> list[Waiting]:
        return self._queued.take()

    async def _send(self, batch: list[Waiting]) -> None:
        commands = [command for group, _ in batch for command in group]
        answers = await self._waits_last(commands)
        unloaded = [n for n, a in enumerate(answers) if self._reloadable(commands[n], a)]
        if unloaded:
            shas = dict.fromkeys(str(commands[n][1]) for n in unloaded)
            loads: list[Command] = [("SCRIPT", "LOAD", self._scripts[sha]) for sha in shas]
            # the WAITs again, after the scripts sent again: the first ones answered for
            # writes made before these scripts ran, not for theirs
            waits = list(dict.fromkeys(c for c in commands if c[0] == "WAIT"))
            resent = [commands[n] for n in unloaded]
            again = await self._pipeline(loads + resent + waits)
            after = len(loads) + len(resent)
            for n, answer in zip(unloaded, again[len(loads) : after], strict=True):
                answers[n] = answer
            acked = dict(zip(waits, again[after:], strict=True))
            for n, command in enumerate(commands):
                if command[0] == "WAIT":
                    answers[n] = acked[command]
        start = 0
        for group, future in batch:
            mine = answers[start : start + len(group)]
            start += len(group)
            if future.done():
                continue  # its caller was cancelled
            error = next((a for a in mine if isinstance(a, Exception)), None)
            if error is None:
                future.set_result(mine)
            else:
                future.set_exception(error)

    async def _waits_last(self, commands: list[Command]) -> list[Any]:
        """The answers to ``commands``, each distinct WAIT sent once, after the rest."""
        waits = list(dict.fromkeys(c for c in commands if c[0] == "WAIT"))
        if not waits:
            return await self._pipeline(commands)
        rest = [c for c in commands if c[0] != "WAIT"]
        answers = await self._pipeline(rest + waits)
        shared = dict(zip(waits, answers[len(rest) :], strict=True))
        others = iter(answers[: len(rest)])
        return [shared[c] if c[0] == "WAIT" else next(others) for c in commands]

    def _reloadable(self, command: Command, answer: Any) -> bool:
        return (
            isinstance(answer, NoScriptError)
            and command[0] == "EVALSHA"
            and command[1] in self._scripts
        )

    async def _pipeline(self, commands: list[Command]) -> list[Any]:
        """One round trip: the answers to ``commands``, error replies in place."""
        link = self._link
        if link is None or link.broken():
            link = await self._open()
        conn = cast(Connection, self._conn)
        wire = packed(link, conn, commands)  # before the timeout: nothing sent yet
        try:
            async with asyncio.timeout(link.timeout):
                link.writer.writelines(wire)
                await link.writer.drain()
                replies = await link.replies(len(commands))
        except TimeoutError:  # asyncio's, for the whole round trip
            self._drop(link)
            raise RedisTimeoutError(f"no complete answer from Redis in {link.timeout} s") from None
        except OSError as exc:
            self._drop(link)
            raise RedisConnectionError(f"Error talking to Redis: {exc!r}") from exc
        except BaseException:
            self._drop(link)  # a protocol error, a server close, a cancel: out of step
            raise
        return self._decoded(commands, replies)

    async def _open(self) -> Link:
        """The connection, opened (again) by redis-py: handshake, AUTH, SELECT, TLS."""
        self._link = None
        if self._conn is None:
            take = cast(
                Callable[[], Awaitable[Connection]], self._client.connection_pool.get_connection
            )
            self._conn = await take()  # connected by the pool; never given back
        else:
            with contextlib.suppress(RedisError, OSError):
                await self._conn.disconnect(nowait=True)  # what is left of the old socket
            await self._conn.connect()
        self._link = Link(self._conn)
        return self._link

    def _drop(self, link: Link) -> None:
        link.abort()
        if self._link is link:
            self._link = None

    def _decoded(self, commands: list[Command], replies: list[Any]) -> list[Any]:
        """Replies as redis-py's pipeline returns them: through the client's callbacks
        (redis-py's own, plain functions all; one set on the client must not be async)."""
        callbacks = self._client.response_callbacks
        for n, reply in enumerate(replies):
            name = commands[n][0]
            if isinstance(reply, Exception) or not isinstance(name, str | bytes):
                continue
            callback = callbacks.get(name)
            if callback is not None:
                replies[n] = callback(reply)
        return replies

    async def aclose(self) -> None:
        """Stop sending (callers still waiting fail) and close the connection."""
        sender = self._sender
        while sender is not None and not sender.done():
            sender.cancel()
            await asyncio.wait([sender], timeout=0.1)
        _fail(self._take(), RedisConnectionError("the store is closed"))
        self._link = None
        await self._client.aclose(close_connection_pool=True)  # the pool is ours alone


def _overloaded(count: int) -> Overloaded:
    return Overloaded(f"{count} commands already waiting for Redis")


def _fail(batch: list[Waiting], exc: BaseException) -> None:
    fail((answer for _, answer in batch), exc)
