"""The SQLite store's fsync of its WAL, made by a helper process (gateway/store/fsync_helper.py).

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
that ended idle is replaced at the next ``sync`` without anyone hearing of it; one that
cannot be started (or reached) is ``HelperLost`` without ``in_flight``, and starting is not
tried again for RESTART_WAIT. All of it is the store's to handle.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

PROGRAM = Path(__file__).with_name("fsync_helper.py")
EXIT_WAIT = 2.0  # seconds ``close`` waits for the helper to end before killing it
RESTART_WAIT = 0.5  # seconds after a helper failed to start before one is tried again
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
        it ends (at once when it cannot be asked for)."""

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
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", str(PROGRAM), self._path],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        except OSError as exc:
            self._failed_at = time.monotonic()
            reason = f"cannot start the fsync process: {exc.strerror or exc}"
            raise HelperLost(reason, in_flight=False) from None
        self._failed_at = None
        assert process.stdout is not None
        os.set_blocking(process.stdout.fileno(), False)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(process.stdout.fileno(), self._answered)
        self._process = process

    def sync(self, done: Done) -> None:
        if self._asked is not None:
            raise RuntimeError("one fsync at a time")
        for attempt in range(2):  # a helper that ended idle is replaced once, unheard of
            try:
                self.start()
                assert self._process is not None and self._process.stdin is not None
                os.write(self._process.stdin.fileno(), b"s")
            except HelperLost as exc:
                done(exc)
                return
            except OSError as exc:  # it ended while idle: the request never reached it
                self._lose()
                if attempt:
                    done(_unreachable(exc))
                    return
                continue
            self._asked = done
            return

    def _answered(self) -> None:
        """The helper wrote: an answer (its last byte is the one asked for), or EOF."""
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
            self._lose(HelperLost(f"the fsync process {how}", in_flight=True))
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
            process.wait()

    async def close(self) -> None:
        """End the helper: its input closed, it exits (after an fsync it was making); killed
        if it has not within EXIT_WAIT."""
        self._closed = True
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
            process.wait()
        asked, self._asked = self._asked, None
        if asked is not None:
            asked(HelperLost("the fsync process was stopped with its store", in_flight=True))


def _unreachable(exc: OSError) -> HelperLost:
    return HelperLost(
        f"the fsync process cannot be reached: {exc.strerror or exc}", in_flight=False
    )
