"""The SQLite store's fsync of its WAL, made by a helper process (fsync_helper.py).

Owns that process: started with the store's first durable write, asked through one pipe and
answered through another that the event loop watches. Neither side takes a thread of the
gateway: a thread needed the interpreter lock before and after each fsync, and under load
waited for it while the loop ran (measured: p50 ~2.4 ms a hand-off, against 0.2-0.5 ms for
the fsync itself). One fsync in flight at a time; the store's group commit asks for the next
when one ends.

It never decides what an fsync means for the store's data. A failed fsync is an ``OSError``
with the disk's errno. A helper that ended with an fsync asked of it is ``HelperLost`` with
``in_flight``: that fsync's outcome, and any error it met, are unknown (Linux reports a
write-back error once per file description: a new helper may never hear of it). A helper
that ended idle, or before it said it was ready, was asked nothing: it is replaced without
anyone hearing of it. While none can be started or reached (no memory, no process slots)
the fsync is made on a thread of the gateway's instead (slower under load, never refused),
and a helper is tried again after RESTART_WAIT. All the store hears is the fsync's outcome,
or ``HelperLost`` once it is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from gateway.store.sqlite.fsync_helper import WalFile

PROGRAM = Path(__file__).with_name("fsync_helper.py")
EXIT_WAIT = 2.0  # seconds ``close`` waits for the helper to end before killing it
RESTART_WAIT = 0.5  # seconds after a helper failed to start before one is tried again
REAP_EVERY = 0.05  # seconds between looks at a killed helper until it has ended
log = logging.getLogger("statusgate")
# Told how an fsync ended: None when it succeeded, else the OSError or HelperLost.
Done = Callable[[BaseException | None], None]


class HelperLost(Exception):
    """No fsync process to answer: it ended with an fsync asked of it (``in_flight``: that
    fsync may or may not have run), or none could be started or reached (nothing was
    asked)."""

    def __init__(self, reason: str, *, in_flight: bool) -> None:
        super().__init__(reason)
        self.in_flight = in_flight


class Syncer(Protocol):
    """What the SQLite store needs of an fsync of its WAL."""

    def sync(self, done: Done) -> None:
        """An fsync that begins after this call; ``done`` is called on the event loop when
        it ends: None, the ``OSError`` it met, or ``HelperLost`` when its outcome is unknown
        or the syncer is closed."""

    async def close(self) -> None:
        """No more fsyncs; release what ``start`` took."""


class WalSyncer:
    """fsyncs of one file (a WAL) by a helper process, one at a time, for one event loop."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._process: subprocess.Popen[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._asked: Done | None = None  # told when the fsync asked for ends
        self._closed = False
        self._failed_at: float | None = None  # when a helper last failed to start
        self._ready = False  # the helper said it is ready (whatever it was asked may have run)
        self._thread: asyncio.Future[None] | None = None  # an fsync made without a helper
        self._file = WalFile(path)  # that fsync's descriptor
        self._without_helper = False  # fsyncs are made in the gateway (logged once)

    @property
    def pid(self) -> int | None:
        """The helper's process id while one runs."""
        return self._process.pid if self._process is not None else None

    def start(self) -> None:
        """Start the helper unless one runs for this event loop (HelperLost when it cannot
        start); one started under another loop (which watched its answers) is ended."""
        if self._process is not None:
            if self._loop is asyncio.get_running_loop():
                return
            lost = "the fsync process was started under another event loop"
            self._lose(HelperLost(lost, in_flight=True))
        if self._closed:
            raise HelperLost("the fsync process was stopped with its store", in_flight=False)
        failed = self._failed_at
        if failed is not None and time.monotonic() - failed < RESTART_WAIT:
            raise HelperLost("the fsync process could not be started just now", in_flight=False)
        try:
            process = subprocess.Popen(  # a session of its own: no terminal's signals
                [sys.executable, "-I", "-S", str(PROGRAM), self._path],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            self._failed_at = time.monotonic()
            reason = f"cannot start the fsync process: {exc.strerror or exc}"
            raise HelperLost(reason, in_flight=False) from None
        self._failed_at = None
        self._ready = False
        if self._without_helper:
            self._without_helper = False
            log.info("the fsync process of %s started again", self._path)
        assert process.stdout is not None
        os.set_blocking(process.stdout.fileno(), False)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(process.stdout.fileno(), self._answered)
        self._process = process

    def sync(self, done: Done) -> None:
        if self._asked is not None or self._thread is not None:
            raise RuntimeError("one fsync at a time")
        for attempt in range(2):  # a helper that ended idle is replaced once, unheard of
            try:
                self.start()
                assert self._process is not None and self._process.stdin is not None
                os.write(self._process.stdin.fileno(), b"s")
            except HelperLost as exc:
                self._in_thread(done, exc)
                return
            except OSError as exc:  # it ended while idle: the request never reached it
                self._lose()
                if attempt:
                    self._in_thread(done, _unreachable(exc))
                    return
                continue
            self._asked = done
            return

    def _in_thread(self, done: Done, why: HelperLost) -> None:
        """No helper to ask (none could be started or reached): the fsync is made on a
        thread of the gateway's, so the writes waiting for it are delayed, never refused
        (they are committed: refusing them would tell an agent that a saved write failed);
        where not even a thread can start, on the loop itself. A warning when this begins,
        an info line when a helper serves again. A closed syncer makes no more fsyncs."""
        if self._closed:
            done(why)
            return
        if not self._without_helper:
            self._without_helper = True
            log.warning(
                "%s; fsyncs of %s are made in the gateway until one starts", why, self._path
            )
        loop = asyncio.get_running_loop()
        try:
            thread = self._thread = loop.run_in_executor(None, self._file.sync)
        except RuntimeError:  # no thread can start either (the machine is out of them)
            self._thread = None
            try:
                self._file.sync()
            except OSError as exc:
                loop.call_soon(done, exc)
            else:
                loop.call_soon(done, None)
            return

        def ended(future: asyncio.Future[None]) -> None:
            self._thread = None
            if self._closed:  # close stopped waiting for it: the descriptor is free now
                self._file.close()
            error = future.exception()
            if error is None or isinstance(error, OSError):
                done(error)
            else:  # not a disk's answer: whether the fsync ran is unknown
                done(HelperLost(f"the fsync thread failed: {error!r}", in_flight=True))

        thread.add_done_callback(ended)

    def _answered(self) -> None:
        """The helper wrote: its ready byte, an answer (its last byte is the one asked
        for), or EOF."""
        process = self._process
        assert process is not None and process.stdout is not None
        try:
            data = os.read(process.stdout.fileno(), 64)
        except BlockingIOError:
            return
        except OSError as exc:
            self._lose(HelperLost(f"the fsync process cannot be read: {exc}", in_flight=True))
            return
        if not data:
            code = process.poll()
            how = f"exited with status {code}" if code is not None else "closed its output"
            if self._ready:
                self._lose(HelperLost(f"the fsync process {how}", in_flight=True))
                return
            asked, self._asked = self._asked, None  # it never read the request: not made
            self._lose()
            if asked is not None:
                lost = HelperLost(f"the fsync process {how} as it started", in_flight=False)
                self._in_thread(asked, lost)
            return
        if not self._ready:  # its first byte says it is ready (READY)
            self._ready, data = True, data[1:]
            if not data:
                return
        asked, self._asked = self._asked, None
        if asked is None:
            return
        status = data[-1]
        asked(None if status == 0 else OSError(status, os.strerror(status)))

    def _lose(self, error: HelperLost | None = None) -> None:
        """Forget the helper (ended, or unusable): the fsync asked of it, if any, fails with
        ``error``; the next ``sync`` starts another."""
        process, self._process = self._process, None
        if process is not None:
            self._stop(process, kill=True)
        asked, self._asked = self._asked, None
        if asked is not None:
            asked(error or HelperLost("the fsync process was lost", in_flight=True))

    def _stop(self, process: subprocess.Popen[bytes], *, kill: bool) -> None:
        assert process.stdout is not None and process.stdin is not None
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(process.stdout.fileno())
        with contextlib.suppress(OSError):
            process.stdin.close()
        process.stdout.close()
        if kill and process.poll() is None:
            process.kill()
            self._reap(process)

    def _reap(self, process: subprocess.Popen[bytes]) -> None:
        """Wait for a killed helper without blocking the loop (one in an fsync on a hung
        disk ends only when the disk answers); outside a running loop, wait for it."""
        if process.poll() is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            process.wait()
            return
        loop.call_later(REAP_EVERY, self._reap, process)

    async def close(self) -> None:
        """End the helper: its input closed, it exits (after an fsync it was making); killed
        if it has not within EXIT_WAIT. An fsync made on a thread is waited for as long."""
        self._closed = True
        if self._thread is not None:
            await asyncio.wait([self._thread], timeout=EXIT_WAIT)
        if self._thread is None:  # else it still holds the descriptor (a hung disk)
            self._file.close()
        process, self._process = self._process, None
        if process is None:
            return
        self._stop(process, kill=False)
        for _ in range(int(EXIT_WAIT / 0.01)):
            if process.poll() is not None:
                break
            await asyncio.sleep(0.01)
        else:
            process.kill()
            self._reap(process)
        asked, self._asked = self._asked, None
        if asked is not None:
            asked(HelperLost("the fsync process was stopped with its store", in_flight=True))


def _unreachable(exc: OSError) -> HelperLost:
    return HelperLost(
        f"the fsync process cannot be reached: {exc.strerror or exc}", in_flight=False
    )
