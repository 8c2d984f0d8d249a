"""The SQLite store's fsync of its WAL, made by a helper process (gateway/store/fsync_helper.py).

Owns that process: started when the store opens, asked through one pipe and answered through
another that the event loop watches. Neither side takes a thread of the gateway: a thread
needed the interpreter lock before and after each fsync, and under load waited for it while
the loop ran (measured: p50 ~2.4 ms a hand-off, against 0.2-0.5 ms for the fsync itself). One
fsync in flight at a time; the store's group commit asks for the next when one ends.

It never decides what an fsync means for the store's data. A failed fsync is an ``OSError``
with the disk's errno; a helper that exited or could not start is ``HelperLost``: that fsync's
outcome is unknown, and the next ``sync`` starts a new helper. Both are the store's to handle.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

PROGRAM = Path(__file__).with_name("fsync_helper.py")
EXIT_WAIT = 2.0  # seconds ``close`` waits for the helper to end before killing it
# Told how an fsync ended: None when it succeeded, else the OSError or HelperLost.
Done = Callable[[BaseException | None], None]


class HelperLost(Exception):
    """The fsync process exited or could not be started; the fsync asked of it may or may
    not have run."""


class Syncer(Protocol):
    """What the SQLite store needs of an fsync of its WAL."""

    def start(self) -> None:
        """Be ready before the first ``sync`` (called on the event loop)."""

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
            self._lose(HelperLost("the fsync process was started under another event loop"))
        if self._closed:
            raise HelperLost("the fsync process was stopped with its store")
        try:
            process = subprocess.Popen(
                [sys.executable, "-I", "-S", str(PROGRAM), self._path],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        except OSError as exc:
            raise HelperLost(f"cannot start the fsync process: {exc.strerror or exc}") from None
        assert process.stdout is not None
        os.set_blocking(process.stdout.fileno(), False)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(process.stdout.fileno(), self._answered)
        self._process = process

    def sync(self, done: Done) -> None:
        if self._asked is not None:
            raise RuntimeError("one fsync at a time")
        try:
            self.start()
            assert self._process is not None and self._process.stdin is not None
            os.write(self._process.stdin.fileno(), b"s")
        except (HelperLost, OSError) as exc:
            self._lose()
            done(exc if isinstance(exc, HelperLost) else _lost(exc))
            return
        self._asked = done

    def _answered(self) -> None:
        """The helper wrote: an answer (its last byte is the one asked for), or EOF."""
        process = self._process
        assert process is not None and process.stdout is not None
        try:
            data = os.read(process.stdout.fileno(), 64)
        except BlockingIOError:
            return
        except OSError as exc:
            self._lose(_lost(exc))
            return
        if not data:
            code = process.poll()
            how = f"exited with status {code}" if code is not None else "closed its output"
            self._lose(HelperLost(f"the fsync process {how}"))
            return
        asked, self._asked = self._asked, None
        if asked is None:
            return
        status = data[-1]
        asked(None if status == 0 else OSError(status, os.strerror(status)))

    def _lose(self, error: HelperLost | None = None) -> None:
        """Forget the helper (ended, or unusable): the fsync asked of it fails with
        ``error``; the next ``sync`` starts another."""
        process, self._process = self._process, None
        if process is not None:
            self._stop(process, kill=True)
        asked, self._asked = self._asked, None
        if asked is not None:
            asked(error or HelperLost("the fsync process was lost"))

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
            asked(HelperLost("the fsync process was stopped with its store"))


def _lost(exc: OSError) -> HelperLost:
    return HelperLost(f"the fsync process cannot be reached: {exc.strerror or exc}")
