"""The Redis hot path's wire (for turns.Turns): one connection's packed commands out in
one write, every answer in through one ``hiredis.Reader``.

redis-py's own ``Connection`` (the client's pool's: any URL the store takes, TCP, TLS, unix
socket) connects and does the handshake (HELLO, AUTH, SELECT, the connect timeout); the I/O
of a pipeline is done here on that connection's streams, not by redis-py's Pipeline and
Retry. The reader is built as redis-py builds its own (its error mapping, its decoding), so
answers and error classes are redis-py's. The streams and the error mapping are private
members of redis-py: ``redis_py_wire`` is the one place reaching for them, and a test fails
if they are gone. Never here: timeouts, retries, or deciding what a failure means (Turns').
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol, cast

import hiredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse

Command = tuple[str | int | float | bytes, ...]
READ_SIZE = 65536  # bytes a read from the socket, as redis-py's socket_read_size
_MORE = object()  # hiredis: no complete reply buffered (False and None are replies)
_CLOSED = "Connection closed by server."  # redis-py's words for it


class Encoder(Protocol):
    encoding: str
    encoding_errors: str
    decode_responses: bool


class Connection(Protocol):
    """What is used of redis-py's asyncio connection, typed (redis-py leaves these bare)."""

    encoder: Encoder
    socket_timeout: float | None

    async def connect(self) -> None: ...
    async def disconnect(self, nowait: bool = ...) -> None: ...
    def pack_command(self, *args: Any) -> list[bytes]: ...


def redis_py_wire(
    conn: object,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Callable[[str], Exception]]:
    """A connected redis-py connection's streams, and the function its parser maps an error
    reply with (``BaseParser.parse_error``, which redis-py hands its own hiredis.Reader).

    Private in redis-py 8.1.0 (``_reader``, ``_writer``, ``_parser``, there since aioredis
    became redis.asyncio in 4.2); tests/store/test_redis_turns.py fails if they go."""
    reader = getattr(conn, "_reader", None)
    writer = getattr(conn, "_writer", None)
    parse_error = getattr(getattr(conn, "_parser", None), "parse_error", None)
    if (
        not isinstance(reader, asyncio.StreamReader)
        or not isinstance(writer, asyncio.StreamWriter)
        or not callable(parse_error)
    ):
        raise RedisConnectionError("redis-py's connection has no streams or parser here")
    return reader, writer, cast(Callable[[str], Exception], parse_error)


class Link:
    """One open connection: its streams and the parser of its answers."""

    __slots__ = ("hiredis_packs", "parser", "stream", "timeout", "writer")

    def __init__(self, conn: Connection) -> None:
        self.stream, self.writer, parse_error = redis_py_wire(conn)
        encoder = conn.encoder
        decoding: dict[str, str] = {}
        if encoder.decode_responses:
            decoding = {"encoding": encoder.encoding, "errors": encoder.encoding_errors}
        self.parser = hiredis.Reader(
            protocolError=InvalidResponse, replyError=parse_error, notEnoughData=_MORE, **decoding
        )
        self.timeout = conn.socket_timeout or None  # redis-py: 0 or None, no timeout
        # hiredis writes strings as UTF-8, strictly: the encoder's defaults
        self.hiredis_packs = encoder.encoding == "utf-8" and encoder.encoding_errors == "strict"

    def broken(self) -> bool:
        """Closed by the server, or reset, since its last pipeline: open another first."""
        stream = self.stream
        return stream.at_eof() or stream.exception() is not None or self.writer.is_closing()

    def abort(self) -> None:
        """Drop the socket now, unread answers and all (a sync step: safe on cancel)."""
        self.writer.transport.abort()

    async def replies(self, count: int) -> list[Any]:
        """The next ``count`` replies; error replies as redis-py's exceptions, in place."""
        parser, stream = self.parser, self.stream
        replies: list[Any] = []
        while len(replies) < count:
            reply = parser.gets()
            if reply is _MORE:
                chunk = await stream.read(READ_SIZE)
                if not chunk:
                    raise RedisConnectionError(_CLOSED)
                parser.feed(chunk)
            elif isinstance(reply, hiredis.PushNotification):
                continue  # not an answer: nothing here asks for pushes
            elif isinstance(reply, RedisConnectionError) or (
                type(reply) is list and reply and isinstance(reply[0], RedisConnectionError)
            ):
                raise reply if isinstance(reply, Exception) else reply[0]  # as redis-py
            else:
                replies.append(reply)
        return replies


def packed(link: Link, conn: Connection, commands: list[Command]) -> list[bytes]:
    """The commands in RESP. hiredis.pack_command takes only str, int, float, bytes (and
    memoryview) and writes them as both of redis-py's packers do; anything else, and a
    command name with a space in it (redis-py splits it), is packed by the connection."""
    pieces: list[bytes] = []
    for command in commands:
        name = command[0]
        if link.hiredis_packs and type(name) is str and " " not in name:
            try:
                pieces.append(hiredis.pack_command(cast(Any, command)))  # its stub: 1-tuple
                continue
            except TypeError:
                pass
        pieces += conn.pack_command(*command)
    return pieces
