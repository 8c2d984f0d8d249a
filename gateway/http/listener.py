"""The agent listener's sockets, and the accepting of every connection waiting on them.

Why it exists: uvloop's servers accept one connection per turn of the event loop (libuv
stopped accepting in a loop in 1.45, "unix: don't accept() connections in a loop", #3696,
trusting level-triggered polling for the next one). A busy loop turns every 5-10 ms, so a
burst of new connections waited in the kernel's accept queue at ~150 a second: measured
against the gateway past its in-flight bound, 180 connections queued and the last caller
waited 0.9 s for a ``503 overloaded`` that is otherwise answered in ~10 ms; a bare uvloop
server with a loop busy in 5 ms slices took 1.05 s to accept 200 connections, this module
27 ms. Here each readiness of a listening socket accepts every waiting connection (up to
PER_TURN, as asyncio's own loop does up to its backlog), each handed to the loop as a
transport of its own (``loop.connect_accepted_socket``, in a task: ~90 us more CPU a
connection than libuv's accept, and its first request read a turn of the loop later; paid
once per connection, not per request).

What it owns: binding (the addresses ``getaddrinfo`` gives for the host, SO_REUSEADDR,
SO_REUSEPORT for ``--workers``, IPv6 sockets IPv6-only, a family the host cannot make
skipped, as ``loop.create_server`` binds), accepting, and closing the sockets (``close``: no
new connection is accepted; ``handed_over`` waits until the connections accepted before are
the server's, which stops them as it stops the others). Out of descriptors or memory (EMFILE,
ENFILE, ENOBUFS, ENOMEM) it stops accepting for RETRY seconds with one warning, as asyncio
does, rather than spin on a socket that stays readable; the kernel keeps the waiting
connections meanwhile. A connection that failed before it was accepted (the network errors
``accept`` reports for it, ECONNABORTED among them) is skipped.

With TLS (``tls``, asked for the context in force as each connection is accepted, so a
reload's new certificate is served to the connections accepted after it) the handshake is
the transport's, within HANDSHAKE seconds; a connection whose handshake fails (no client
certificate where one is required, a client that does not trust the certificate) is closed
and logged at debug level. At ``handed_over`` a handshake still in progress is cut: no
request was read on it.

What it never does: read or write a byte of a connection.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
from collections.abc import Callable

log = logging.getLogger("statusgate")
PER_TURN = 512  # connections accepted at most per readiness of one socket
RETRY = 1.0  # seconds accepting pauses when the process is out of descriptors or memory
HANDSHAKE = 10.0  # seconds a TLS handshake may take (a stalled client holds only its socket)
EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# accept(2) on Linux: a pending network error of the new connection, "treat like EAGAIN"
GONE = frozenset(
    {
        errno.ECONNABORTED,
        errno.EPROTO,
        errno.ENOPROTOOPT,
        errno.EHOSTDOWN,
        errno.ENONET,
        errno.EHOSTUNREACH,
        errno.EOPNOTSUPP,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.EPERM,  # a firewall refused it
    }
)


def bind(host: str | None, port: int, *, reuse_port: bool = False) -> list[socket.socket]:
    """Bound, non-blocking TCP sockets (not yet listening) for ``host`` and ``port``, one
    per address the host resolves to (every interface for "" or None; an address family
    this machine cannot make, IPv6 on a kernel without it, is skipped); OSError naming the
    address that cannot be bound."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    unmade: OSError | None = None
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            try:
                sock = socket.socket(family, kind, proto)
            except OSError as exc:  # the family is not supported here
                unmade = exc
                continue
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:  # one socket a family, as create_server binds
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                why = (exc.strerror or str(exc)).lower()
                message = f"error while attempting to bind on {address}: {why}"
                raise OSError(exc.errno, message) from None
            sock.setblocking(False)
        if not sockets:
            raise unmade or OSError(errno.EADDRNOTAVAIL, f"no address to listen on for {host}")
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class Listener:
    """Listening sockets whose waiting connections are all accepted at each readiness, each
    handed to ``protocol`` on a transport of the loop's. What aiohttp's runner uses of a
    site's server: ``sockets`` and ``close`` (the rest of ``asyncio.Server``'s face too)."""

    def __init__(
        self,
        sockets: list[socket.socket],
        protocol: Callable[[], asyncio.Protocol],
        *,
        backlog: int,
        tls: Callable[[], ssl.SSLContext | None] = lambda: None,
    ) -> None:
        self._sockets = sockets
        self._protocol = protocol
        self._tls = tls
        self._handshaking: set[asyncio.Task[None]] = set()  # of _starting: TLS ones
        self._loop = asyncio.get_running_loop()
        self._closed = False
        self._starting: set[asyncio.Task[None]] = set()  # transports being made (held here:
        # the loop keeps only weak references to tasks)
        self._exhausted = False  # a warning was logged for the spell of EMFILE/ENFILE
        try:
            for sock in sockets:
                sock.listen(backlog)
        except BaseException:
            for sock in sockets:
                sock.close()
            raise
        for sock in sockets:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        """The listening sockets; none once closed (as ``asyncio.Server.sockets``)."""
        return () if self._closed else tuple(self._sockets)

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return not self._closed

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(PER_TURN):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in GONE:  # that connection failed before it was accepted
                    log.debug("a connection failed before it was accepted: %s", exc)
                    continue
                if exc.errno in EXHAUSTED:
                    self._pause(sock, exc)
                    return
                log.warning("accepting a connection failed: %s", exc)
                return
            self._exhausted = False
            conn.setblocking(False)
            context = self._tls()
            task = self._loop.create_task(self._start(conn, context))
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)
            if context is not None:
                self._handshaking.add(task)
                task.add_done_callback(self._handshaking.discard)

    async def _start(self, conn: socket.socket, context: ssl.SSLContext | None) -> None:
        """The accepted connection on a transport of its own (after the TLS handshake, with
        ``context``), its protocol told (``connection_made``) by the time this returns."""
        try:
            if context is None:
                await self._loop.connect_accepted_socket(self._protocol, conn)
            else:
                await self._loop.connect_accepted_socket(
                    self._protocol, conn, ssl=context, ssl_handshake_timeout=HANDSHAKE
                )
        except (OSError, TimeoutError) as exc:  # reset, or a failed TLS handshake: no request
            log.debug("an accepted connection ended before it was served: %s", exc)
            conn.close()
        except BaseException:
            conn.close()  # a no-op once a transport took it (uvloop detaches it at close)
            raise

    def _pause(self, sock: socket.socket, exc: OSError) -> None:
        """Out of descriptors or memory: the socket stays readable, so accepting pauses
        (the kernel keeps the connections waiting) and resumes after RETRY."""
        if not self._exhausted:
            self._exhausted = True
            log.warning(
                "cannot accept connections (%s): pausing %g s; raise the open-files limit"
                " (ulimit -n) if this repeats",
                exc.strerror or exc,
                RETRY,
            )
        self._loop.remove_reader(sock.fileno())
        self._loop.call_later(RETRY, self._resume, sock)

    def _resume(self, sock: socket.socket) -> None:
        if not self._closed:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def close(self) -> None:
        """Stop accepting and close the sockets (the connections accepted before are not
        touched: ``handed_over``)."""
        if self._closed:
            return
        self._closed = True
        for sock in self._sockets:
            self._loop.remove_reader(sock.fileno())
            sock.close()

    async def handed_over(self) -> None:
        """Every connection accepted so far has its transport and its protocol has been
        told: the server it registered with stops it from here on. A TLS handshake still
        in progress is cut (no request was read on it)."""
        for task in self._handshaking:
            task.cancel()
        while self._starting:
            await asyncio.gather(*self._starting, return_exceptions=True)

    async def wait_closed(self) -> None:
        await self.handed_over()
